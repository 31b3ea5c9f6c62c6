// sample_draw.cu: the temperature / top-p pick of sampled rows, operation for operation the CPU draw
// (runtime/batching/sampling.py draw_rows), with its generator (runtime/batching/philox.py) and its exp
// (runtime/jit/exp32.py), so a row draws the same candidate on either backend (numpy reference:
// kernels/reference_draw.py).
//
// Per row b, over its allowed candidates i (valid[b, i] != 0, i < width) in column order, with
// a = min(inv_temperature[b], FLT_MAX):
//   e_i = exp32((logits[b, i] - max) * a);  total = e_0 + e_1 + ... in that order;
//   the kept prefix, most likely first (stable: equal e in column order): the first member always,
//   then taken while the mass before the next member is below top_p[b] * total; before = the kept
//   prefix's mass (top_p[b] == 0, e.g. a tiny top_p narrowed to float32, keeps the first: greedy);
//   u = top 24 bits of Philox4x32-10(counter (token[b], 0, 0, 0), key (seed lo, seed hi)) * 2^-24;
//   out[b] = the column of the first kept member whose running mass exceeds u * before (the last
//   kept member if rounding leaves none). One allowed candidate: that column, no draw.
// out[b] = -1, no draw, for: a greedy row (!(inv_temperature[b] > 0): grammar_advance picks its
// argmax); a row with nothing allowed; a refused row: an allowed logit is NaN or infinite (never
// used in arithmetic or as an index; the host then refuses the step, numerics_invalid), or
// width > DRAW_MAX_CANDIDATES (the host never launches one: runtime/cuda/device_step.py refuses it,
// and builds and loads refuse bundles whose candidate columns exceed it).
// Every float operation is an explicit round-to-nearest intrinsic (no FMA contraction); the max and
// the ranks are exact in any order; the sums run on one lane in column order.
//
// logits: float32 [B, stride] (first width used); valid: uint8 [B, stride]; inv_temperature,
// top_p: float32 [B]; seed: uint64 [B]; token: int32 [B] (the answer token's index); out: int32 [B].
// width <= DRAW_MAX_CANDIDATES (the row's candidates live in shared memory), width <= stride.
// Launch: grid (B), block DRAW_THREADS (one warp a row).
#include "common.cuh"

#define DRAW_THREADS 32
// a row's candidates in shared memory (kernels/declarations.py reads it: the host's limit)
#define DRAW_MAX_CANDIDATES 512
// the largest float32: an inverse temperature above it (inf) counts as it
#define DRAW_FLT_MAX 0x1.fffffep+127f

// exp(x) in float32 by runtime/jit/exp32.py's operations and constants (float32 values, as hex).
__device__ __forceinline__ float exp32(float x) {
    x = x < -0x1.5d3334p+6f ? -0x1.5d3334p+6f : x;  // -87.3
    x = x > 0x1.613334p+6f ? 0x1.613334p+6f : x;    // 88.3
    const float n = floorf(__fadd_rn(__fmul_rn(x, 0x1.715476p+0f), 0.5f));  // log2(e)
    const float r = __fsub_rn(__fsub_rn(x, __fmul_rn(n, 0x1.63p-1f)), __fmul_rn(n, -0x1.bd0106p-13f));  // ln 2 hi, lo
    float p = 0x1.6c16c2p-10f;                       // 1/720
    p = __fadd_rn(__fmul_rn(p, r), 0x1.111112p-7f);  // 1/120
    p = __fadd_rn(__fmul_rn(p, r), 0x1.555556p-5f);  // 1/24
    p = __fadd_rn(__fmul_rn(p, r), 0x1.555556p-3f);  // 1/6
    p = __fadd_rn(__fmul_rn(p, r), 0.5f);
    p = __fadd_rn(__fmul_rn(p, r), 1.0f);
    p = __fadd_rn(__fmul_rn(p, r), 1.0f);
    return __fmul_rn(p, __int_as_float(((int)n + 127) << 23));
}

// Philox4x32-10 (Salmon et al., SC 2011): the first output word of counter (c0, c1, 0, 0) under (k0, k1).
__device__ __forceinline__ u32 philox_first_word(u32 c0, u32 c1, u32 k0, u32 k1) {
    u32 c2 = 0, c3 = 0;
#pragma unroll
    for (int r = 0; r < 10; ++r) {
        if (r) { k0 += 0x9E3779B9u; k1 += 0xBB67AE85u; }
        const u32 hi0 = __umulhi(0xD2511F53u, c0), lo0 = 0xD2511F53u * c0;
        const u32 hi1 = __umulhi(0xCD9E8D57u, c2), lo1 = 0xCD9E8D57u * c2;
        c0 = hi1 ^ c1 ^ k0; c1 = lo1; c2 = hi0 ^ c3 ^ k1; c3 = lo0;
    }
    return c0;
}

extern "C" __global__ void __launch_bounds__(DRAW_THREADS)
sample_draw(const float* logits, const u8* valid, int stride, int width, const float* inv_temperature,
            const float* top_p, const u64* seed, const int* token, int B, int* out) {
    pdl_enter();
    __shared__ float e[DRAW_MAX_CANDIDATES];
    __shared__ short column[DRAW_MAX_CANDIDATES];  // the allowed columns, in order
    __shared__ short order[DRAW_MAX_CANDIDATES];   // positions into column, most likely first
    const int b = blockIdx.x, lane = threadIdx.x;
    if (b >= B) return;
    if (!(inv_temperature[b] > 0.0f)) {
        if (lane == 0) out[b] = -1;
        return;
    }
    const float* row = logits + (size_t)b * stride;
    const u8* ok = valid + (size_t)b * stride;
    if (width > DRAW_MAX_CANDIDATES) {  // refused: column/e/order hold DRAW_MAX_CANDIDATES
        if (lane == 0) out[b] = -1;
        return;
    }
    const float a = fminf(inv_temperature[b], DRAW_FLT_MAX);
    int n = 0;  // allowed so far (every lane holds the same count)
    float top = NEG_INF;
    bool finite = true;  // every allowed logit so far is finite (every lane agrees)
    if (lane == 0) column[0] = -1;  // written before any read: a row with nothing allowed reads it below
    __syncwarp();
    for (int i0 = 0; i0 < width; i0 += 32) {  // compaction in column order: ballot, then each lane's rank
        const int i = i0 + lane;
        const bool allowed = i < width && ok[i] != 0;
        const u32 mask = __ballot_sync(FULL_MASK, allowed);
        const bool bad = allowed && !isfinite(row[i]);
        finite = finite && !__any_sync(FULL_MASK, bad);
        if (allowed) {
            column[n + __popc(mask & ((1u << lane) - 1u))] = (short)i;
            if (!bad) top = fmaxf(top, row[i]);
        }
        n += __popc(mask);
    }
    top = warp_max(top);
    __syncwarp();
    if (n <= 1 || !finite) {
        if (lane == 0) out[b] = n == 1 && finite ? column[0] : -1;
        return;
    }
    for (int i = lane; i < n; i += 32) e[i] = exp32(__fmul_rn(__fsub_rn(row[column[i]], top), a));
    __syncwarp();
    for (int i = lane; i < n; i += 32) {  // stable descending rank: larger first, equal ones in column order
        int rank = 0;  // e is finite here (finite logits, finite a), so the ranks are a permutation of 0..n-1
        for (int j = 0; j < n; ++j) rank += e[j] > e[i] || (e[j] == e[i] && j < i);
        order[rank] = (short)i;
    }
    __syncwarp();
    if (lane != 0) return;
    float total = 0.0f;
    for (int i = 0; i < n; ++i) total = __fadd_rn(total, e[i]);
    const float limit = __fmul_rn(top_p[b], total);
    int kept = 1;  // the most likely always: 0 + e is e, so any limit > 0 keeps what it kept before
    float before = e[order[0]];
    while (kept < n && before < limit) before = __fadd_rn(before, e[order[kept++]]);
    const u64 s = seed[b];
    const u32 x = philox_first_word((u32)token[b], 0u, (u32)s, (u32)(s >> 32));
    const float threshold = __fmul_rn(__fmul_rn((float)(x >> 8), 0x1p-24f), before);
    float running = 0.0f;
    int pick = kept - 1;  // >= 0: kept >= 1
    for (int i = 0; i < kept; ++i) {
        running = __fadd_rn(running, e[order[i]]);
        if (running > threshold) { pick = i; break; }
    }
    out[b] = column[order[pick]];
}
