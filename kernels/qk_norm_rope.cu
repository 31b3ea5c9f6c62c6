// qk_norm_rope.cu: per-head RMSNorm of q and k (Qwen3's q_norm / k_norm; skipped when the
// weight pointer is null) followed by rotary embedding, rotate-half convention, in place.
//
//   xn = (x / sqrt(mean(x^2) + eps)) * norm_w                       (over one head's head_dim)
//   angle_i = float(pos[t]) * inv_freq[i]   (float32 product, as HF / runtime/rope.py)
//   out[i]        = xn[i] * cos(angle_i) - xn[i + half] * sin(angle_i)
//   out[i + half] = xn[i + half] * cos(angle_i) + xn[i] * sin(angle_i),   i < half
//
// q: float32 [T, q_stride], head h at columns h * head_dim; k: float32 [T, k_stride];
// pos: int32 [T]; q_norm_w, k_norm_w: bf16 [head_dim] or null; inv_freq: float32
// [head_dim / 2] (llama3 scaling is the host's job). head_dim % 64 == 0, <= ROPE_MAX_HEAD_DIM.
// One warp per (row, head); lane owns pairs (i, i + half) for i = lane, lane + 32, ...
// Launch: grid (ceil((n_heads + n_kv_heads) / 4), T), block ROPE_THREADS.
#include "common.cuh"

#define ROPE_THREADS 128
#define ROPE_HEADS_PER_BLOCK 4
#define ROPE_MAX_HEAD_DIM 256

extern "C" __global__ void __launch_bounds__(ROPE_THREADS)
qk_norm_rope(float* q, int q_stride, float* k, int k_stride, const int* pos,
             const __nv_bfloat16* q_norm_w, const __nv_bfloat16* k_norm_w,
             const float* inv_freq, float eps, int T, int n_heads, int n_kv_heads, int head_dim) {
    constexpr int MAXP = ROPE_MAX_HEAD_DIM / 64;  // pairs per lane, at most
    const int lane = threadIdx.x & 31;
    const int t = blockIdx.y, hh = blockIdx.x * ROPE_HEADS_PER_BLOCK + (threadIdx.x >> 5);
    if (t >= T || hh >= n_heads + n_kv_heads) return;
    const bool is_q = hh < n_heads;
    float* v = is_q ? q + (size_t)t * q_stride + (size_t)hh * head_dim
                    : k + (size_t)t * k_stride + (size_t)(hh - n_heads) * head_dim;
    const __nv_bfloat16* nw = is_q ? q_norm_w : k_norm_w;
    const int half = head_dim / 2, np = half / 32;

    float x1[MAXP], x2[MAXP];
#pragma unroll
    for (int j = 0; j < MAXP; ++j) {
        if (j < np) { x1[j] = v[lane + 32 * j]; x2[j] = v[half + lane + 32 * j]; }
    }
    if (nw != nullptr) {
        float s = 0.f;
#pragma unroll
        for (int j = 0; j < MAXP; ++j) {
            if (j < np) { s = fmaf(x1[j], x1[j], s); s = fmaf(x2[j], x2[j], s); }
        }
        s = warp_sum(s);
        const float rms = sqrtf(__fadd_rn(__fdiv_rn(s, (float)head_dim), eps));
#pragma unroll
        for (int j = 0; j < MAXP; ++j) {
            if (j < np) {
                const int i = lane + 32 * j;
                x1[j] = rms_apply(x1[j], rms, __bfloat162float(nw[i]));
                x2[j] = rms_apply(x2[j], rms, __bfloat162float(nw[i + half]));
            }
        }
    }
    const float p = (float)pos[t];
#pragma unroll
    for (int j = 0; j < MAXP; ++j) {
        if (j < np) {
            const int i = lane + 32 * j;
            float sn, cs;
            sincosf(__fmul_rn(p, inv_freq[i]), &sn, &cs);
            v[i] = __fsub_rn(__fmul_rn(x1[j], cs), __fmul_rn(x2[j], sn));
            v[i + half] = __fadd_rn(__fmul_rn(x2[j], cs), __fmul_rn(x1[j], sn));
        }
    }
}
