// rope.cuh: one head's RMSNorm (Qwen3 q_norm / k_norm; skipped for a null weight) and
// rotate-half rotary embedding, by one warp, in place; shared by qk_norm_rope.cu (prefill rows)
// and attention_decode.cu (the decode row, inside attention), so both give the same bits.
//
//   xn = (x / sqrt(mean(x^2) + eps)) * norm_w                 (over the head's head_dim)
//   out[i]        = xn[i] * cos_i - xn[i + half] * sin_i
//   out[i + half] = xn[i + half] * cos_i + xn[i] * sin_i,   i < half
// (cos_i, sin_i) of angle float(pos) * inv_freq[i]: the row's entry of the step's table, which
// embedding.cu makes once a step (sincosf of that float32 product).
//
// v: float32 [head_dim] (global or shared memory); norm_w: bf16 [head_dim] or null;
// rope: float32 [head_dim / 2, 2], the row's (cos, sin) pairs. head_dim even, <=
// ROPE_MAX_HEAD_DIM (32, 64, 128, 256).
// Lane l owns the pairs (i, i + half) for i = l, l + 32, ... below half (head_dim 32: lanes
// 0..15; the others add zeros to the norm's sum). cache: bf16 [head_dim] or null; when given,
// the result is also stored there, rounded to nearest even (the KV cache's format).
#pragma once
#include "common.cuh"

#define ROPE_MAX_HEAD_DIM 256

__device__ __forceinline__ void warp_norm_rope(float* v, const __nv_bfloat16* __restrict__ nw,
                                               const float* __restrict__ rope, float eps, int head_dim, int lane,
                                               __nv_bfloat16* cache) {
    constexpr int MAXP = ROPE_MAX_HEAD_DIM / 64;  // pairs per lane, at most
    const int half = head_dim / 2;
    float x1[MAXP], x2[MAXP];
#pragma unroll
    for (int j = 0; j < MAXP; ++j) {
        const int i = lane + 32 * j;
        x1[j] = i < half ? v[i] : 0.f;
        x2[j] = i < half ? v[half + i] : 0.f;
    }
    if (nw != nullptr) {
        float s = 0.f;
#pragma unroll
        for (int j = 0; j < MAXP; ++j) { s = fmaf(x1[j], x1[j], s); s = fmaf(x2[j], x2[j], s); }
        s = warp_sum(s);
        const float rms = sqrtf(__fadd_rn(__fdiv_rn(s, (float)head_dim), eps));
#pragma unroll
        for (int j = 0; j < MAXP; ++j) {
            const int i = lane + 32 * j;
            if (i < half) {
                x1[j] = rms_apply(x1[j], rms, __bfloat162float(nw[i]));
                x2[j] = rms_apply(x2[j], rms, __bfloat162float(nw[i + half]));
            }
        }
    }
#pragma unroll
    for (int j = 0; j < MAXP; ++j) {
        const int i = lane + 32 * j;
        if (i < half) {
            const float2 r = reinterpret_cast<const float2*>(rope)[i];
            const float cs = r.x, sn = r.y;
            const float a = __fsub_rn(__fmul_rn(x1[j], cs), __fmul_rn(x2[j], sn));
            const float b = __fadd_rn(__fmul_rn(x2[j], cs), __fmul_rn(x1[j], sn));
            v[i] = a;
            v[i + half] = b;
            if (cache != nullptr) {
                cache[i] = __float2bfloat16_rn(a);
                cache[i + half] = __float2bfloat16_rn(b);
            }
        }
    }
}

// The cache row of (seq, pos) for kv head kvh: k_cache + this offset, or -1 when the row is
// padding (seq < 0 or pos < 0) or its page is unassigned (< 0).
// block_table: int32 [max_seqs, max_pages_per_seq]; cache: [pages, page_size, n_kv_heads, head_dim].
__device__ __forceinline__ long long kv_row_offset(const int* __restrict__ block_table,
                                                   int max_pages_per_seq, int page_size, int s,
                                                   int p, int n_kv_heads, int head_dim, int kvh) {
    if (s < 0 || p < 0) return -1;
    const int page = block_table[(size_t)s * max_pages_per_seq + p / page_size];
    if (page < 0) return -1;
    return (((long long)page * page_size + p % page_size) * n_kv_heads + kvh) * head_dim;
}
