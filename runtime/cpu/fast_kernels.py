"""numba kernels of the fast CPU backend beside the linear layers (runtime/cpu/linear_kernels.py):
embedding gather, rms_norm, q/k norm + rope + KV store, silu * up (attention:
runtime/cpu/attention_kernels.py; the process-wide numba target: common/numba_target.py).

Every kernel computes a row independently of the step's other rows with one fixed reduction
order: each sum here is one call of the one compiled ``_dot`` (vector lanes fixed at compile time
from n alone, see ``_dot``) or a sequential loop. Threads split rows or (row, head) pairs (prange),
never a sum. So a row's bits do not depend on what else shares the step. float32 throughout,
fastmath off everywhere but ``_dot``'s reassociation (no FMA contraction), compiled once and
cached beside this file (numba ``cache=True``; numba falls back to its user-wide cache dir, or
NUMBA_CACHE_DIR, when __pycache__ is not writable). Every kernel the model calls (here, panel_kernels,
linear_kernels, linear_high, attention_kernels) is ``nogil``: the server's event loop runs on
another core while the engine thread computes.
"""
from __future__ import annotations

import math

import numpy as np
from numba import njit, prange

from toolcall.runtime.jit.exp32 import bits_to_f32, exp32, f32_to_bits


@njit(parallel=True, nogil=True, cache=True)
def e4m3_nan_codes(codes):
    """How many bytes of ``codes`` (any shape, uint8) are E4M3 NaN (0x7F, 0xFF). The kernels decode
    those by bit arithmetic to +-480, so a bundle holding one is refused at load instead."""
    flat = codes.reshape(-1)
    n = 0
    for i in prange(flat.size):
        if (flat[i] & 0x7F) == 0x7F:
            n += 1
    return n


@njit(cache=True)
def _bf16(bits):
    return bits_to_f32(np.int32(bits) << 16)


@njit(cache=True)
def e4m3_over_256(code):
    """An E4M3 code (int8 bits) -> e4m3 / 256 as float32, exactly (simd_ir._e4m3_by_bits, one element)."""
    u = np.int32(code) & 0xFF
    mag = u & 0x7F
    if mag < 8:
        value = np.float32(mag) * np.float32(2.0 ** -17)
    else:
        value = bits_to_f32((mag << 20) + (112 << 23))
    return -value if u & 0x80 else value


@njit(fastmath={"reassoc"}, cache=True)
def _dot(x, w, n):
    """sum_i x[i] * w[i] over i < n in float32.

    The only kernel allowed to reassociate (and nothing else: no FMA contraction, no other
    fast-math): LLVM vectorizes the sum into fixed lanes (here 4 x 8 float32 partial sums
    over i mod 32, a fixed tree, a fixed remainder loop), chosen at compile time from ``n``
    alone. Every dot product of the norms goes through this one compiled
    function, one call per output element, so the order is the same whatever the batch (the
    linear layers and attention's q.k have their own, written lane by lane: runtime/cpu/simd_ir.py). A separate function (not
    inlined by numba) so the flag stays on these instructions only.
    """
    s = np.float32(0.0)
    for i in range(n):
        s += x[i] * w[i]
    return s


@njit(parallel=True, nogil=True, cache=True)
def gather_rows_bf16(wbits, ids, out):
    """out[t] = float32(wbits[ids[t]]) (embedding rows), exact."""
    n = wbits.shape[1]
    for t in prange(ids.shape[0]):
        src = wbits[ids[t]]
        for i in range(n):
            out[t, i] = _bf16(src[i])


@njit(parallel=True, nogil=True, cache=True)
def rms_norm(x, weight, eps, out):
    """out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight over the last axis; x (R, d) f32."""
    d = x.shape[1]
    for r in prange(x.shape[0]):
        xr = x[r]
        var = _dot(xr, xr, d) / np.float32(d)
        inv = np.float32(math.sqrt(var + eps))
        for i in range(d):
            out[r, i] = (xr[i] / inv) * weight[i]


@njit(inline="always")
def _norm_rope_row(x, weight, eps, cos, sin):
    """In place on one head row x (head_dim,): rms_norm (rms_norm's arithmetic, weight may be empty: none),
    then rope (runtime/bundle/rope.py apply_rope's arithmetic)."""
    d = x.shape[0]
    if weight.shape[0]:
        var = _dot(x, x, d) / np.float32(d)
        inv = np.float32(math.sqrt(var + eps))
        for i in range(d):
            x[i] = (x[i] / inv) * weight[i]
    half = d // 2
    for i in range(half):
        a = x[i]
        b = x[i + half]
        x[i] = a * cos[i] - b * sin[i]
        x[i + half] = b * cos[i + half] + a * sin[i + half]


@njit(inline="always")
def _bf16_bits(v):
    """float32 -> bf16 bits, round to nearest even (as ml_dtypes); NaN -> a quiet NaN of its sign."""
    bits = np.uint32(f32_to_bits(v))
    if (bits & np.uint32(0x7FFFFFFF)) > np.uint32(0x7F800000):
        return np.uint16((bits >> np.uint32(16)) | np.uint32(0x40))
    return np.uint16((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16))


@njit(inline="always")
def _e4m3_code(v):
    """float32 -> its E4M3 code (int8 bits), round to nearest even, saturated at +-448 (NaN: 0x7F); the bytes
    common/fp8.py ``encode_e4m3`` gives. Normal range: the float32 bits rounded to 3 mantissa bits and
    rebiased (127 - 7 = 120); below 2^-6, multiples of 2^-9 (np.rint: ties to even)."""
    bits = np.uint32(f32_to_bits(v))
    sign = np.uint32((bits >> np.uint32(24)) & np.uint32(0x80))
    mag = bits & np.uint32(0x7FFFFFFF)
    if mag > np.uint32(0x7F800000):
        code = np.uint32(0x7F)
    elif mag >= np.uint32(0x43E80000):  # 464: rounds past 448, the largest finite E4M3
        code = np.uint32(0x7E)
    elif mag >= np.uint32(0x3C800000):  # 2^-6, the smallest normal
        rounded = (mag + np.uint32(0x7FFFF) + ((mag >> np.uint32(20)) & np.uint32(1))) >> np.uint32(20)
        code = rounded - np.uint32(120 << 3)
    else:
        code = np.uint32(np.rint(abs(v) * np.float32(512.0)))
    return np.int8(np.int32(code | sign) - (256 if (code | sign) > 127 else 0))


@njit(parallel=True, nogil=True, cache=True)
def qk_norm_rope_kv(qkv, heads, q_norm, k_norm, eps, cos, sin, kpool, vpool, pages, offsets, k_inv, v_inv):
    """One step's attention inputs, in one call. qkv (T, (heads + 2 kv_heads) * hd) f32, C-contiguous: q|k|v
    of each row side by side (so every head row below is a C-contiguous slice, whatever T: ``_dot``'s
    vector code, hence the norm's bits, depends on the layout it is compiled for). q and k are normed per
    head (q_norm/k_norm (hd,); empty: no norm) and rotated in place; then k and v are stored at row t's
    (pages[t], offsets[t]) of kpool/vpool (pages, page_size, kv_heads, hd): u16 pools take bf16 bits
    (rounded to nearest even), int8 pools the E4M3 codes of k * k_inv[h] and v * v_inv[h] (k_inv, v_inv
    (kv_heads,) f32: the inverse per-head scales), f32 pools the values. The same values as rms_norm,
    apply_rope and PagedKVPool.write."""
    bits = kpool.itemsize == 2  # u16: bf16 bits
    codes = kpool.itemsize == 1  # int8: E4M3 codes
    kv_heads, hd = kpool.shape[2], kpool.shape[3]
    assert qkv.shape[1] == (heads + 2 * kv_heads) * hd and qkv.flags.c_contiguous
    k0, v0 = heads * hd, (heads + kv_heads) * hd
    for t in prange(qkv.shape[0]):
        row = qkv[t]
        for h in range(heads):
            _norm_rope_row(row[h * hd:(h + 1) * hd], q_norm, eps, cos[t], sin[t])
        for h in range(kv_heads):
            k = row[k0 + h * hd:k0 + (h + 1) * hd]
            v = row[v0 + h * hd:v0 + (h + 1) * hd]
            _norm_rope_row(k, k_norm, eps, cos[t], sin[t])
            for i in range(hd):
                if bits:
                    kpool[pages[t], offsets[t], h, i] = _bf16_bits(k[i])
                    vpool[pages[t], offsets[t], h, i] = _bf16_bits(v[i])
                elif codes:
                    kpool[pages[t], offsets[t], h, i] = _e4m3_code(k[i] * k_inv[h])
                    vpool[pages[t], offsets[t], h, i] = _e4m3_code(v[i] * v_inv[h])
                else:
                    kpool[pages[t], offsets[t], h, i] = k[i]
                    vpool[pages[t], offsets[t], h, i] = v[i]


@njit(parallel=True, nogil=True, cache=True)
def silu_times(gate_up):
    """In place: gate = silu(gate) * up, gate_up (T, 2 intermediate) f32 C-contiguous, gate|up side by side
    (contiguous rows: the loop vectorizes; strided views of them would not); silu(g) = g / (1 + exp(-g))."""
    inter = gate_up.shape[1] // 2
    for t in prange(gate_up.shape[0]):
        row = gate_up[t]
        for i in range(inter):
            g = row[i]
            row[i] = (g / (np.float32(1.0) + exp32(-g))) * row[inter + i]
