"""numba kernels of the fast CPU backend: linear layers on the stored weight formats, norms, rope, attention.

Every kernel computes each output element with ONE fixed reduction order, whatever the number
of rows in the step: every dot product is one call of the one compiled dot function of its
format (``_dot``, ``_dot_fp8``, ``_dot_bf16``: vector lanes fixed at compile time, see ``_dot``).
Rows are never mixed: threads split the OUTPUT rows (prange), never a sum. So a row's bits do
not depend on what else shares the step. float32 accumulate, fastmath off everywhere but the
dot functions' reassociation (no FMA contraction), compiled once and cached beside this file (numba ``cache=True``; numba falls
back to its user-wide cache dir, or NUMBA_CACHE_DIR, when __pycache__ is not writable).

Weight formats (DESIGN.md "Weight formats"), decoded in registers:
- fp8_e4m3: q int8 view of the E4M3 bytes [out, in], scale f32 [out]:
  y = (sum_i x_i * e4m3(q_i)) * scale. e4m3(q) by bit arithmetic: the sign-extended byte << 20,
  masked to bit 31 and bits 20..26, is a float32 equal to e4m3(q) * 2^-120 (code exponent 0
  lands in float32 subnormals, which scale the same way), times 2^120 exact. That needs
  subnormals kept (no DAZ); ``lut`` variants gather from the 256-entry table instead.
  The NaN codes 0x7F/0xFF decode to +-480 (the builder never writes them: it clamps to 448).
- nvfp4: packed u8 [out, in/2] (element 2k low nibble), block scales E4M3 bytes [out, in/16],
  global f32: y = (sum_i x_i * (e2m1(c_i) * block(i // 16))) * global; e2m1 * block is exact;
  rows decoded to float32 per 16-row block (table lookups), then ``_dot``.
- bf16: u16 bits [out, in], read as u32 pairs: float32 bits = u16 << 16, exact.
- f32: float32 [out, in] (checkpoints read in float32).
"""
from __future__ import annotations

import math
import os

import llvmlite.binding as llvm
import ml_dtypes
import numba
import numpy as np
from llvmlite import ir
from numba import njit, prange, types


def _use_512_bit_vectors() -> None:
    """Compile for this CPU with 512-bit vectors where it has AVX-512.

    LLVM tunes recent Xeons to "prefer 256-bit" vectors; for these kernels (integer decode plus a
    float32 multiply-add per weight, no frequency-heavy FMA storms) zmm measured 2-4x faster on
    this machine (bench/RESULTS.md). Set before numba's first compile (its target machine is made
    then; the cache key includes the features, so cached code always matches). An explicit
    NUMBA_CPU_NAME / NUMBA_CPU_FEATURES in the environment wins. Only speed depends on it: the
    kernels' bits are batch-independent either way.
    """
    if os.environ.get("NUMBA_CPU_NAME") or os.environ.get("NUMBA_CPU_FEATURES"):
        return
    features = llvm.get_host_cpu_features().flatten()
    if "+avx512f" not in features.split(","):
        return
    os.environ["NUMBA_CPU_NAME"] = "generic"  # generic tuning with the host features; a named Xeon re-imposes 256-bit
    os.environ["NUMBA_CPU_FEATURES"] = features + ",-prefer-256-bit"
    numba.config.reload_config()


_use_512_bit_vectors()
from numba.extending import intrinsic, overload

ROW_BLOCK = 16  # NVFP4: output rows decoded together into float32, then reused by every row of the step
NVFP4_BLOCK = 16
E4M3_LUT = np.arange(256, dtype=np.uint8).view(ml_dtypes.float8_e4m3fn).astype(np.float32)
E2M1_LUT = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6], np.float32)
_E4M3_MASK = np.int32(0x87F0_0000 - (1 << 32))  # bit 31 and bits 20..26
_TWO_120 = np.float32(2.0 ** 120)


@intrinsic
def _bits_to_f32(typingctx, bits):
    """int32 -> the float32 with those bits (a register bitcast)."""
    sig = types.float32(types.int32)

    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], ir.FloatType())

    return sig, codegen


# Decoders are separate functions, not numba-inlined: LLVM inlines them with their own
# instruction flags, so _dot_*'s reassociation never reaches the decode arithmetic (it could
# otherwise hoist the 2^120 out of the sum and underflow the products).
@njit(parallel=True, cache=True)
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
def _e4m3(code):
    """E4M3 byte as int8 -> float32 (bit arithmetic, see module docstring)."""
    return _bits_to_f32((np.int32(code) << 20) & _E4M3_MASK) * _TWO_120


@njit(cache=True)
def _e4m3_lut(code):
    return E4M3_LUT[np.uint8(code)]


@njit(cache=True)
def _bf16(bits):
    return _bits_to_f32(np.int32(bits) << 16)


@njit(fastmath={"reassoc"}, cache=True)
def _dot(x, w, n):
    """sum_i x[i] * w[i] over i < n in float32.

    The only kernel allowed to reassociate (and nothing else: no FMA contraction, no other
    fast-math): LLVM vectorizes the sum into fixed lanes (here 4 x 8 float32 partial sums
    over i mod 32, a fixed tree, a fixed remainder loop), chosen at compile time from ``n``
    alone. Every dot product of the backend goes through this one compiled function, one call
    per output element, so the order is the same whatever the batch. A separate function (not
    inlined by numba) so the flag stays on these instructions only.
    """
    s = np.float32(0.0)
    for i in range(n):
        s += x[i] * w[i]
    return s


@njit(fastmath={"reassoc"}, cache=True)
def _dot_fp8(x, q, n):
    """sum_i x[i] * e4m3(q[i]): _dot's order, the weights decoded in registers (q int8 E4M3 bytes)."""
    s = np.float32(0.0)
    for i in range(n):
        s += x[i] * _e4m3(q[i])
    return s


@njit(fastmath={"reassoc"}, cache=True)
def _dot_fp8_lut(x, q, n):
    s = np.float32(0.0)
    for i in range(n):
        s += x[i] * _e4m3_lut(q[i])
    return s


@njit(cache=True)
def _bf16_low(pair):
    """The even element of two bf16 packed in a u32 (little-endian: element 2k in the low half)."""
    return _bits_to_f32(np.int32(pair << np.uint32(16)))


@njit(cache=True)
def _bf16_high(pair):
    return _bits_to_f32(np.int32(pair & np.uint32(0xFFFF_0000)))


@njit(fastmath={"reassoc"}, cache=True)
def _dot_bf16(x, pairs, n):
    """sum_i x[i] * bf16(w[i]) over even n, the row read as u32 pairs (3.4x faster measured than
    widening each u16), in the lanes LLVM fixes for this one function."""
    s = np.float32(0.0)
    for k in range(n // 2):
        u = pairs[k]
        s += x[2 * k] * _bf16_low(u) + x[2 * k + 1] * _bf16_high(u)
    return s


@njit(parallel=True, cache=True)
def linear_fp8(x, q, scale, y):
    """x (T, in) f32, q (out, in) int8 (E4M3 bytes), scale (out,) f32 -> y (T, out) f32.
    y[t, o] = _dot_fp8(x[t], q[o]) * scale[o], the same call for every row t."""
    out, n = q.shape
    for o in prange(out):
        qo = q[o]
        s = scale[o]
        for t in range(x.shape[0]):
            y[t, o] = _dot_fp8(x[t], qo, n) * s


@njit(parallel=True, cache=True)
def linear_fp8_lut(x, q, scale, y):
    """linear_fp8 by table gather (for a process that flushes float32 subnormals)."""
    out, n = q.shape
    for o in prange(out):
        qo = q[o]
        s = scale[o]
        for t in range(x.shape[0]):
            y[t, o] = _dot_fp8_lut(x[t], qo, n) * s


@njit(parallel=True, cache=True)
def linear_nvfp4(x, packed, block, global_scale, y):
    """x (T, in) f32, packed (out, in/2) u8, block (out, in/16) u8 (E4M3 bytes), global f32 -> y (T, out)."""
    out, half = packed.shape
    n = 2 * half
    e4m3 = E4M3_LUT
    e2m1 = E2M1_LUT  # a 16-entry table: measured 3x faster here than bit arithmetic with selects
    for b in prange((out + ROW_BLOCK - 1) // ROW_BLOCK):
        lo = b * ROW_BLOCK
        rows = min(ROW_BLOCK, out - lo)
        w = np.empty((ROW_BLOCK, n), np.float32)
        for r in range(rows):
            pr = packed[lo + r]
            br = block[lo + r]
            wr = w[r]
            for k in range(n // NVFP4_BLOCK):
                s = e4m3[br[k]]
                for j in range(NVFP4_BLOCK // 2):  # element 2i in the low nibble of byte i
                    byte = pr[k * 8 + j]
                    wr[k * 16 + 2 * j] = e2m1[byte & 15] * s  # exact: 2 x 4 significant bits
                    wr[k * 16 + 2 * j + 1] = e2m1[byte >> 4] * s
        nt = x.shape[0]
        for t in range(nt):
            xt = x[t]
            for r in range(rows):
                y[t, lo + r] = _dot(xt, w[r], n) * global_scale


@njit(parallel=True, cache=True)
def linear_bf16(x, wbits, y):
    """x (T, in) f32, wbits (out, in) u16 (bf16), in even -> y (T, out) f32; y[t, o] = _dot_bf16(x[t], wbits[o])."""
    out, n = wbits.shape
    pairs = wbits.view(np.uint32)
    for o in prange(out):
        wo = pairs[o]
        for t in range(x.shape[0]):
            y[t, o] = _dot_bf16(x[t], wo, n)


@njit(parallel=True, cache=True)
def linear_f32(x, w, y):
    """x (T, in) f32, w (out, in) f32 -> y (T, out) f32."""
    out, n = w.shape
    for o in prange(out):
        wo = w[o]
        for t in range(x.shape[0]):
            y[t, o] = _dot(x[t], wo, n)


@njit(parallel=True, cache=True)
def gather_rows_bf16(wbits, ids, out):
    """out[t] = float32(wbits[ids[t]]) (embedding rows), exact."""
    n = wbits.shape[1]
    for t in prange(ids.shape[0]):
        src = wbits[ids[t]]
        for i in range(n):
            out[t, i] = _bf16(src[i])


@njit(parallel=True, cache=True)
def candidate_logits_bf16(hidden, wbits, cand, out):
    """out[t, k] = _dot(hidden[t], float32(wbits[cand[t, k]])): the sparse head, bit-equal to linear_bf16's rows."""
    n = wbits.shape[1]
    pairs = wbits.view(np.uint32)
    for t in prange(cand.shape[0]):
        for k in range(cand.shape[1]):
            out[t, k] = _dot_bf16(hidden[t], pairs[cand[t, k]], n)


@njit(parallel=True, cache=True)
def candidate_logits_f32(hidden, w, cand, out):
    n = w.shape[1]
    for t in prange(cand.shape[0]):
        for k in range(cand.shape[1]):
            out[t, k] = _dot(hidden[t], w[cand[t, k]], n)


@njit(parallel=True, cache=True)
def rms_norm(x, weight, eps, out):
    """out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight over the last axis; x (R, d) f32."""
    d = x.shape[1]
    for r in prange(x.shape[0]):
        xr = x[r]
        var = _dot(xr, xr, d) / np.float32(d)
        inv = np.float32(math.sqrt(var + eps))
        for i in range(d):
            out[r, i] = (xr[i] / inv) * weight[i]


@njit(parallel=True, cache=True)
def rope(x, cos, sin):
    """In place: x (T, heads, head_dim) -> x*cos + rotate_half(x)*sin, rotate_half(x) = (-x2, x1)."""
    half = x.shape[2] // 2
    for t in prange(x.shape[0]):
        for h in range(x.shape[1]):
            for i in range(half):
                a = x[t, h, i]
                b = x[t, h, i + half]
                x[t, h, i] = a * cos[t, i] - b * sin[t, i]  # rotated first half: -x2
                x[t, h, i + half] = b * cos[t, i + half] + a * sin[t, i + half]


_LOG2E = np.float32(1.4426950408889634)
_LN2_HI, _LN2_LO = np.float32(0.693359375), np.float32(-2.12194440e-4)  # ln 2 = hi + lo, hi exact in 9 bits


@njit(inline="always", cache=True)
def _exp(x):
    """exp(x) in float32 within 5 ulp on [-87.3, 88.3] (clamped to it outside), by mul/add and bits only, so
    LLVM vectorizes the loops calling it (math.exp is a scalar libm call per element: 9x slower in silu).
    x = n ln2 + r, |r| <= ln2/2; exp(r) by its degree-6 Taylor polynomial (error < 2e-7); 2^n by exponent bits."""
    x = min(max(x, np.float32(-87.3)), np.float32(88.3))
    n = np.float32(math.floor(x * _LOG2E + np.float32(0.5)))
    r = (x - n * _LN2_HI) - n * _LN2_LO
    p = np.float32(1.0 / 720)
    p = p * r + np.float32(1.0 / 120)
    p = p * r + np.float32(1.0 / 24)
    p = p * r + np.float32(1.0 / 6)
    p = p * r + np.float32(0.5)
    p = p * r + np.float32(1.0)
    p = p * r + np.float32(1.0)
    return p * _bits_to_f32((np.int32(n) + np.int32(127)) << 23)


@njit(parallel=True, cache=True)
def silu_times(gate, up):
    """In place: gate = silu(gate) * up, (T, intermediate) f32; silu(g) = g / (1 + exp(-g))."""
    for t in prange(gate.shape[0]):
        for i in range(gate.shape[1]):
            g = gate[t, i]
            gate[t, i] = (g / (np.float32(1.0) + _exp(-g))) * up[t, i]


def _to_f32(v):
    """A K/V pool element as float32: bf16 pools are passed as their u16 bits, fp32 pools as is."""
    raise NotImplementedError  # numba only, see the overload below


@overload(_to_f32, inline="always")
def _to_f32_numba(v):
    if isinstance(v, types.Integer):
        return lambda v: _bf16(v)
    return lambda v: np.float32(v)


@njit(inline="always", cache=True)
def _kv(a, page, off, head, d):
    return _to_f32(a[page, off, head, d])


@njit(parallel=True, cache=True)
def attention(q, kpool, vpool, block_table, slots, positions, scale, scores, out):
    """Causal grouped-query attention of each row over its own sequence's positions 0..pos.

    q (T, heads, head_dim) f32; kpool/vpool (pages, page_size, kv_heads, head_dim) u16 (bf16)
    or f32; block_table (max_seqs, pages_per_seq); scores (T, heads, max_ctx) f32 scratch;
    out (T, heads * head_dim) f32. Per (row, head): s_j = _dot(q, k_j) * scale over j <= pos in
    order, softmax with its max subtracted (``_exp``) and a sequential sum, o = sum_j p_j v_j in order,
    then / sum. Threads split (row, kv head) pairs: each K/V row is widened to float32 once for
    the query heads of its group. Rows only read the pool: a row's result does not depend on
    the others.
    """
    t_rows, heads, hd = q.shape
    kv_heads = kpool.shape[2]
    page_size = kpool.shape[1]
    group = heads // kv_heads
    for tk in prange(t_rows * kv_heads):
        t = tk // kv_heads
        kvh = tk % kv_heads
        h0 = kvh * group
        slot = slots[t]
        length = positions[t] + 1
        row = np.empty(hd, np.float32)  # one K or V row widened to float32
        m = np.full(group, -np.inf, np.float32)
        for j in range(length):
            page = block_table[slot, j // page_size]
            off = j % page_size
            for d in range(hd):
                row[d] = _kv(kpool, page, off, kvh, d)
            for g in range(group):
                sj = _dot(q[t, h0 + g], row, hd) * scale
                scores[t, h0 + g, j] = sj
                if sj > m[g]:
                    m[g] = sj
        total = np.zeros(group, np.float32)
        for g in range(group):
            s = scores[t, h0 + g]
            mg = m[g]
            for j in range(length):  # vectorized
                s[j] = _exp(s[j] - mg)
            for j in range(length):  # the sum in order
                total[g] += s[j]
        o = out[t, h0 * hd:(h0 + group) * hd]
        for i in range(group * hd):
            o[i] = np.float32(0.0)
        for j in range(length):
            page = block_table[slot, j // page_size]
            off = j % page_size
            for d in range(hd):
                row[d] = _kv(vpool, page, off, kvh, d)
            for g in range(group):
                p = scores[t, h0 + g, j]
                for d in range(hd):
                    o[g * hd + d] += p * row[d]
        for g in range(group):
            for d in range(hd):
                o[g * hd + d] = o[g * hd + d] / total[g]
