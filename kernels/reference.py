"""numpy references of every kernel, argument for argument (float32 math).

Each function takes the arrays its kernel reads, in the kernel's layout (bf16 as
``ml_dtypes.bfloat16``, e4m3 as uint8 codes, NVFP4 as packed uint8), and returns what the
kernel writes; arrays a kernel updates in place (KV cache, grammar state) are updated in place
here too. Sizes the kernels take as scalars come from the shapes. The GPU parity tests compare
each kernel with its function here; the formulas follow runtime/cpu/model.py. The rope and attention
kernels' references are in kernels/reference_attention.py, the sampled pick's in kernels/reference_draw.py.
"""
from __future__ import annotations

import ml_dtypes
import numpy as np

from toolcall.common.formats import WeightFormat
from toolcall.common.nvfp4 import E2M1_VALUES
from toolcall.kernels.geometry import (
    KERNEL_FAMILIES,
    MATVEC_FORMATS,
    MMA,
    PLAIN,
    RMSNORM,
    SWIGLU,
    KernelFamily,
    matvec_kernel,
)
from toolcall.kernels.weight_args import weight_args

F32 = np.float32
BF16 = np.dtype(ml_dtypes.bfloat16)


def f32(a) -> np.ndarray:
    return np.asarray(a).astype(F32)


# ---- dequantization: through the registry (common/formats.py), exact ----

def dequant(fmt: WeightFormat, w, *scales) -> np.ndarray:
    """float32 [out, in] of one matvec's weight arguments (``w``, then ``scales``: ``fmt``'s kernel
    layout, kernels/weight_args.py) by the registry's ``dequantize``. A per-row scale (a stored scalar
    the kernels take per output row) goes in as a column [out, 1], which multiplies its row as the
    stored scalar multiplies them all."""
    stored = {"w" + a.suffix: f32(v)[:, None] if a.per_row else v for a, v in zip(weight_args(fmt), (w, *scales))}
    return fmt.dequantize(stored.get, "w")


def e2m1_half_bits(codes: np.ndarray) -> np.ndarray:
    """uint16 fp16 bit patterns the kernels build from e2m1 codes (matvec.cuh): the magnitude
    bits shifted into exponent and mantissa, the sign to bit 15; as fp16 that is e2m1 x 2^-14
    (common/nvfp4.py E2M1_VALUES[code] x 2^-14)."""
    c = np.asarray(codes).astype(np.uint16)
    return ((c & 7) << 9) | ((c & 8) << 12)


def e2m1_scaled_half(codes: np.ndarray, scale_codes: np.ndarray, hardware: bool) -> np.ndarray:
    """float16 [codes, scales]: e2m1(c) x 2^-14 x e4m3(s), as common.cuh e2m1x2_scaled computes it: the
    bit-placed codes times the scale (plain targets), or the hardware's e2m1(c) times the scale x 2^-14
    (sm_100a / sm_120a). numpy rounds each fp16 product to nearest even, as __hmul2 does."""
    scales = np.asarray(scale_codes, np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float16)
    if hardware:
        values = np.asarray(E2M1_VALUES, np.float32)[np.asarray(codes)].astype(np.float16)  # cvt: exact
        return values[:, None] * (scales * np.float16(2.0 ** -14))[None, :]
    return e2m1_half_bits(codes).view(np.float16)[:, None] * scales[None, :]


# ---- row kernels ----

def embed_gather(tokens: np.ndarray, table: np.ndarray) -> np.ndarray:
    """float32 [T, hidden]: table rows of the tokens, zeros for ids outside [0, vocab)."""
    ok = (tokens >= 0) & (tokens < len(table))
    return np.where(ok[:, None], f32(table[np.where(ok, tokens, 0)]), F32(0))


def rmsnorm(x: np.ndarray, w: np.ndarray, eps: float, rows: np.ndarray | None = None) -> np.ndarray:
    """(x[r] / sqrt(mean(x[r]^2) + eps)) * w with r = rows[b] (or b); zeros where r < 0."""
    src = x if rows is None else x[np.maximum(rows, 0)]
    var = np.mean(src * src, axis=-1, keepdims=True, dtype=F32)
    y = (src / np.sqrt(var + F32(eps))) * f32(w)
    return y if rows is None else np.where((rows >= 0)[:, None], y, F32(0))


def swiglu(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    return (gate / (F32(1) + np.exp(-gate))) * up


def linear(x: np.ndarray, w: np.ndarray, bias=None, y=None, accumulate: bool = False) -> np.ndarray:
    """x [T, in] @ w[out, in].T (+ bias), added to y when ``accumulate`` (float32)."""
    r = (f32(x) @ f32(w).T).astype(F32)
    if bias is not None:
        r = r + f32(bias)
    return (f32(y) + r) if accumulate else r


def bf16_hi_lo(x: np.ndarray) -> np.ndarray:
    """float32 hi + lo with hi = bf16(x), lo = bf16(x - hi): the activations linear_mma.cuh multiplies
    (16 significant bits; exact in float32)."""
    hi = f32(np.asarray(x, F32).astype(BF16))
    return hi + f32((np.asarray(x, F32) - hi).astype(BF16))


def _matvec_family(fmt: WeightFormat, family: KernelFamily) -> dict[str, object]:
    seen = bf16_hi_lo if family is MMA else f32  # what the family's products see of the activations

    def plain(x, w, *scales, bias=None, y=None, accumulate=False):
        return linear(seen(x), dequant(fmt, w, *scales), bias, y, accumulate)

    def with_rmsnorm(x, norm_w, eps, w, *scales, bias=None, y=None, accumulate=False):
        return linear(seen(rmsnorm(x, norm_w, eps)), dequant(fmt, w, *scales), bias, y, accumulate)

    def with_swiglu(gate, up, w, *scales, bias=None, y=None, accumulate=False):
        return linear(seen(swiglu(gate, up)), dequant(fmt, w, *scales), bias, y, accumulate)
    return {matvec_kernel(fmt, p, family): f
            for p, f in zip((PLAIN, RMSNORM, SWIGLU), (plain, with_rmsnorm, with_swiglu))}


# kernel name -> reference, for every linear-layer kernel of every family: (x, w, *scales, ...) plain, (x,
# norm_w, eps, w, *scales, ...) with the input RMSNorm, (gate, up, w, *scales, ...) with SwiGLU; scales as
# the kernel's
MATVEC_REFERENCES = {fn: ref for fam in KERNEL_FAMILIES.values() for f in MATVEC_FORMATS
                     for fn, ref in _matvec_family(f, fam).items()}


def head_dense(x: np.ndarray, norm_w: np.ndarray, eps: float, table: np.ndarray) -> np.ndarray:
    """float32 [T, vocab]: the final RMSNorm, then every row of the head."""
    return linear(rmsnorm(x, norm_w, eps), table)


# ---- heads and sampling ----

def head_sparse(xn: np.ndarray, cand: np.ndarray, valid: np.ndarray, table: np.ndarray) -> np.ndarray:
    """float32 [B, E]: xn[b] . table[cand[b, e]] where valid, -inf elsewhere."""
    ok = valid.astype(bool) & (cand >= 0) & (cand < len(table))
    rows = f32(table[np.where(ok, cand, 0)])  # [B, E, hidden]
    return np.where(ok, np.einsum("beh,bh->be", rows, f32(xn)), F32(-np.inf)).astype(F32)


def head_gather(logits: np.ndarray, cand: np.ndarray, valid: np.ndarray) -> np.ndarray:
    ok = valid.astype(bool) & (cand >= 0) & (cand < logits.shape[1])
    picked = np.take_along_axis(logits, np.where(ok, cand, 0), axis=1)
    return np.where(ok, picked, F32(-np.inf)).astype(F32)


def argmax_rows(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(int32 [T], float32 [T]): lowest index of the row maximum, NaN counted as -inf."""
    clean = np.where(np.isnan(logits), F32(-np.inf), logits)
    idx = np.argmax(clean, axis=1).astype(np.int32)
    return idx, clean[np.arange(len(clean)), idx].astype(F32)


# ---- grammar (arrays as runtime/grammar/trie.py; state uint64 [S, 1 + W], see state_words) ----

def state_words(states: np.ndarray) -> np.ndarray:
    """A toolcall.runtime.grammar.stepper state record array [S] viewed as the kernels' uint64 [S, 1+W]."""
    return np.ascontiguousarray(states).view(np.uint64).reshape(len(states), -1)


def _node_count(word0: np.uint64) -> tuple[int, int]:
    w = int(word0)
    return w & 0xFFFFFFFF, w >> 32


def grammar_candidates(sample_seq, state, status, g, max_edges, max_tools, allow_empty) -> tuple[np.ndarray, np.ndarray]:
    """(cand int32 [B, max_edges], valid uint8 [B, max_edges]) for grammar ``g`` (a
    toolcall.runtime.grammar.trie.Grammar: its arrays and num_tools) under each sequence's rules
    ``max_tools`` int32 [max_seqs] and ``allow_empty`` uint8 [max_seqs]."""
    B, n_tools = len(sample_seq), g.num_tools
    cand = np.full((B, max_edges), -1, np.int32)
    valid = np.zeros((B, max_edges), np.uint8)
    for b, s in enumerate(sample_seq):
        if s < 0 or status[s] != 0:
            continue
        node, count = _node_count(state[s, 0])
        lo, hi = int(g.node_edge_start[node]), int(g.node_edge_start[node + 1])
        for e in range(min(hi - lo, max_edges)):
            ed = lo + e
            cand[b, e] = g.edge_token[ed]
            kind = int(g.edge_kind[ed])
            if kind == 3:
                ok = count == 0 and bool(allow_empty[s])
            else:
                ok = bool((g.edge_bits[ed] & ~state[s, 1:]).any())
                used = sum(bin(int(w)).count("1") for w in state[s, 1:])  # a subset's tools outside it included
                ok = ok and (kind != 1 or (count + 1 < int(max_tools[s]) and used + 1 < n_tools))
            valid[b, e] = ok
    return cand, valid


def grammar_advance(cand_logits, cand, valid, sample_seq, token_in, pos_in, g, max_out, state,
                    status, out_tokens, out_len, pick=None) -> tuple[np.ndarray, np.ndarray, int]:
    """The pick (``pick[b]`` where given and >= 0, else greedy: ties to the lowest token id), transition and
    bookkeeping as grammar_advance.cu; updates state/status/out_tokens/out_len in place; returns
    (token_out, pos_out, cond)."""
    token_out, pos_out = np.array(token_in, np.int32), np.array(pos_in, np.int32)
    terminal = len(g.node_edge_start) - 2
    running = 0
    for b, s in enumerate(sample_seq):
        if s < 0 or status[s] != 0:
            continue
        slots = np.flatnonzero(valid[b])
        drawn = -1 if pick is None else int(pick[b])
        if len(slots) == 0 or (drawn >= 0 and drawn not in slots):
            status[s] = 3
            continue
        if drawn >= 0:
            e = drawn
        else:
            logits = np.where(np.isnan(cand_logits[b, slots]), -np.inf, cand_logits[b, slots])
            tied = slots[logits == logits.max()]
            e = int(tied[np.argmin(cand[b, tied])])
        length = int(out_len[s])
        if length >= max_out:
            status[s] = 2
            continue
        node, count = _node_count(state[s, 0])
        ed = int(g.node_edge_start[node]) + e
        if g.edge_kind[ed] in (1, 2):
            tool = int(g.edge_tool[ed])
            state[s, 1 + tool // 64] |= np.uint64(1 << (tool % 64))
            count += 1
        node = int(g.edge_child[ed])
        state[s, 0] = np.uint64(node | (count << 32))
        out_tokens[s, length] = cand[b, e]
        out_len[s] = length + 1
        token_out[b], pos_out[b] = cand[b, e], pos_in[b] + 1
        status[s] = 1 if node == terminal else (2 if length + 1 >= max_out else 0)
        running += int(status[s] == 0)
    return token_out, pos_out, int(running > 0)
