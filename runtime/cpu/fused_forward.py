"""The fast backend's layer loop as one numba call, on serial kernels for one thread: a forward that takes no GIL.

``FastCpuModel.forward`` launches some 45 numba kernels a step, and numba's parallel launch takes the GIL,
even from ``nogil`` code (100 launches from a thread beside one running Python: 1.66 s from Python, 1.06 s
from inside one nogil function, 0.15 s with the GIL free). In a server the GIL is busy (the event loop, the
engine thread's picks), so a lane's forward of 2.2 s of CPU took 3.4 s. Here the same kernels, in the same order on the same buffers (so the same bits:
tests/test_cpu_fused_forward.py), are called from one ``nogil`` function, ``fused_layers``; with one kernel
thread ``fused_layers_serial`` calls them compiled without ``parallel`` (``serial``), and nothing takes the
GIL between the call and its return. Python only lays out the views before and reads the result after.
Opt-in (``FastCpuModel.enable_fused``; runtime/batching/lanes.py turns it on): each weight format and pool layout
compiles its own copy of the kernels into it, tens of seconds each.

Linear layers run on output panels (panel_kernels.linear_panels, compiled per panel dtype: int8 fp8 E4M3
bytes with ``a`` = the panels' scales, uint16 bf16 bits or float32 with ``a`` empty). Models with weights
not in panels (NVFP4), biases or separate q/k/v or gate/up matrices keep the Python loop.
"""
from __future__ import annotations

import types as pytypes

import numpy as np
from numba import njit
from numba.typed import List
from numpy.lib.stride_tricks import as_strided

from toolcall.runtime.cpu import attention_kernels as ak
from toolcall.runtime.cpu import fast_kernels as fk
from toolcall.runtime.cpu import panel_kernels as pk


def serial(kernel, name: str):
    """A numba kernel compiled without ``parallel`` (prange runs as range: the same iterations, each with
    the same operations, in order, so the same bits), under its own name (its own cache entries).
    Launching a parallel region takes the GIL, even from nogil code: 100 launches from a thread took
    1.06 s instead of 0.15 s while another thread ran Python. One kernel thread needs no region."""
    f = kernel.py_func
    g = pytypes.FunctionType(f.__code__, f.__globals__, name, f.__defaults__, f.__closure__)
    g.__qualname__, g.__doc__ = name, f.__doc__
    # numpy's error model, as parallel regions are compiled: a float division checked for zero in
    # Python's model is a branch per element, and silu's loop no longer vectorizes (6.6x slower)
    return njit(nogil=True, cache=True, error_model="numpy")(g)


def _module(name: str, **kernels) -> pytypes.ModuleType:
    m = pytypes.ModuleType(name)
    for key, value in kernels.items():
        setattr(m, key, value)
    return m


# the kernels fused_layers calls, serial (fused_layers_serial's globals: the same source, these kernels)
pk_serial = _module("pk_serial", linear_panels=serial(pk.linear_panels, "linear_panels_1t"))
fk_serial = _module("fk_serial", **{n: serial(getattr(fk, n), n + "_1t") for n in
                                    ("rms_norm", "qk_norm_rope_kv", "silu_times", "gather_rows_bf16")})
ak_serial = _module("ak_serial", attention=serial(ak.attention, "attention_1t"))


@njit(nogil=True, cache=True, inline="always")
def _q_heads(qkv, heads, head_dim):
    """(T, heads, head_dim) f32: the q columns of qkv (T, q_dim + 2 kv_dim), rows strided (a view)."""
    return as_strided(qkv, shape=(qkv.shape[0], heads, head_dim), strides=(qkv.strides[0], 4 * head_dim, 4))


@njit(nogil=True, cache=True)
def fused_layers(layers, kpools, vpools, kv_mult, block_table, eps, scale, heads, cos, sin, pages, offsets,
                 slots, positions, rows, x, h, qkv, attn, gate_up, scores,
                 slots_r, positions_r, x_r, h_r, qkv_r, attn_r, gate_up_r, scores_r, final_norm, out):
    """Every layer of FastCpuModel.forward over T rows, then the final norm of the R rows ``rows`` into
    ``out`` (R, hidden). x/h/qkv/attn/gate_up (T, .) f32 are the workspace's first T rows (C-contiguous),
    scores (T, heads, context); the ``_r`` arrays are the same buffers' first R rows: the last layer stores
    every row's K/V, then compacts the rows ``rows`` (ascending) to the top and runs attention, o_proj and
    the MLP on them alone. R == T with rows = 0..T-1 is the full pass. kpools/vpools: a tuple per layer of
    (pages, page_size, kv_heads, head_dim) u16 (bf16 bits), int8 (E4M3 codes) or f32, kv_mult (4, layers,
    kv_heads) f32 their inverse K and V scales and K and V read multipliers (PagedKVPool.kernel_scales);
    layers and the pools are typed lists
    (``as_list``). Every argument is C-contiguous whatever T and R are (the q and gate views are made
    here), so the loop compiles once: numba types a one-row strided view C-contiguous, a view of more rows
    not, and compiles (~0.1 s, holding the GIL) at the first call of each signature."""
    head_dim = kpools[0].shape[3]
    q3, gate = _q_heads(qkv, heads, head_dim), gate_up[:, :gate_up.shape[1] // 2]
    q3_r, gate_r = _q_heads(qkv_r, heads, head_dim), gate_up_r[:, :gate_up_r.shape[1] // 2]
    last = len(layers) - 1
    layer = 0
    for w in layers:
        in_norm, post_norm, q_norm, k_norm, w_qkv, a_qkv, w_o, a_o, w_gu, a_gu, w_down, a_down = w
        fk.rms_norm(x, in_norm, eps, h)
        pk.linear_panels(h, w_qkv, a_qkv, qkv)
        fk.qk_norm_rope_kv(qkv, heads, q_norm, k_norm, eps, cos, sin, kpools[layer], vpools[layer], pages, offsets,
                           kv_mult[0, layer], kv_mult[1, layer])
        if layer == last:  # from here on, the rows ``rows`` alone
            for i in range(rows.shape[0]):  # ascending: row i takes rows[i] >= i, never one already moved
                src = rows[i]
                if src != i:
                    x_r[i] = x[src]
                    qkv_r[i] = qkv[src]
            b = (q3_r, slots_r, positions_r, scores_r, attn_r, x_r, h_r, gate_up_r, gate_r)
        else:
            b = (q3, slots, positions, scores, attn, x, h, gate_up, gate)
        q3_b, slots_b, positions_b, scores_b, attn_b, x_b, h_b, gate_up_b, gate_b = b
        ak.attention(q3_b, kpools[layer], vpools[layer], block_table, slots_b, positions_b, scale, scores_b, attn_b,
                     kv_mult[2, layer], kv_mult[3, layer])
        pk.linear_panels(attn_b, w_o, a_o, h_b)
        x_b += h_b
        fk.rms_norm(x_b, post_norm, eps, h_b)
        pk.linear_panels(h_b, w_gu, a_gu, gate_up_b)
        fk.silu_times(gate_up_b)
        pk.linear_panels(gate_b, w_down, a_down, h_b)
        x_b += h_b
        layer += 1
    fk.rms_norm(x_r, final_norm, eps, out)
    return out


def _serial_twin(f, name: str):
    g = dict(f.py_func.__globals__, fk=fk_serial, ak=ak_serial, pk=pk_serial)
    h = pytypes.FunctionType(f.py_func.__code__, g, name, f.py_func.__defaults__, f.py_func.__closure__)
    h.__qualname__, h.__doc__ = name, f.py_func.__doc__
    return njit(nogil=True, cache=True, error_model="numpy")(h)


# fused_layers on serial kernels: for one kernel thread (a lane's, runtime/batching/lanes.py), no GIL taken at all
fused_layers_serial = _serial_twin(fused_layers, "fused_layers_1t")


def layer_arrays(layers: list[dict], no_norm: np.ndarray) -> List | None:
    """``fused_layers``' layers (a typed list of per-layer tuples) from FastCpuModel.layers, or None where the Python loop must run
    (weights not in output panels (NVFP4) or of mixed formats, biases, separate q/k/v or gate/up)."""
    out, formats = [], set()
    empty = np.empty(0, np.float32)
    for w in layers:
        lins = (w["qkv"], w["o"], w["gate_up"], w["down"])
        if any(lin is None or lin.panel != pk.PANEL or lin.bias is not None for lin in lins):
            return None
        formats.update(lin.fmt for lin in lins)
        q_norm = w["q_norm"] if w["q_norm"] is not None else no_norm
        k_norm = w["k_norm"] if w["k_norm"] is not None else no_norm
        row = [w["in_norm"], w["post_norm"], q_norm, k_norm]
        for lin in lins:
            row += [lin.weight, lin.scale if lin.scale is not None else empty]
        out.append(tuple(row))
    return as_list(out) if len(formats) == 1 else None


def as_list(items) -> List:
    """A numba typed list: its type does not depend on its length (a tuple's does), so models of any depth
    share one compiled ``fused_layers`` (a new one per depth cost ~100 MB of compiler memory)."""
    out = List()
    for item in items:
        out.append(item)
    return out
