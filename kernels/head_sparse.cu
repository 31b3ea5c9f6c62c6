// head_sparse.cu: the grammar-bounded LM head, logits only for candidate token ids.
//
//   head_sparse: out[b, e] = sum_k xn[b, k] * table[cand[b, e], k]   if valid[b, e]
//                          = -inf                                    otherwise
//   head_gather: out[b, e] = logits[b, cand[b, e]] if valid[b, e] else -inf
//                (the dense head's logits at the same candidates: the cross-check path)
//
// xn: float32 [B, x_stride], rows already through the final RMSNorm (rmsnorm.cu);
// cand: int32 [B, n_cand]; valid: uint8 [B, n_cand]; table: bf16 [vocab, hidden];
// logits: float32 [B, vocab]; out: float32 [B, n_cand]. hidden % 8 == 0.
// head_sparse: one warp per candidate; lane l reads 16-byte vectors l, l+32, ... of the
// row and sums them in the order bf16_matvec / head_dense use (lane-sequential fmaf, then
// warp_sum), so a candidate's logit equals head_dense's logit bit for bit.
// Launch: head_sparse grid (ceil(n_cand / 8), B), block HEAD_THREADS;
//         head_gather grid (ceil(n_cand / HEAD_THREADS), B), block HEAD_THREADS.
#include "common.cuh"

#define HEAD_THREADS 256
#define HEAD_CANDS_PER_BLOCK 8

extern "C" __global__ void __launch_bounds__(HEAD_THREADS)
head_sparse(const float* xn, int x_stride, const int* cand, const u8* valid,
            const __nv_bfloat16* table, int hidden, int vocab, int n_cand, int B, float* out) {
    pdl_enter();
    const int lane = threadIdx.x & 31;
    const int b = blockIdx.y, e = blockIdx.x * HEAD_CANDS_PER_BLOCK + (threadIdx.x >> 5);
    if (b >= B || e >= n_cand) return;
    const size_t i = (size_t)b * n_cand + e;
    const int tok = cand[i];
    if (!valid[i] || tok < 0 || tok >= vocab) {
        if (lane == 0) out[i] = NEG_INF;
        return;
    }
    const uint4* row = reinterpret_cast<const uint4*>(table + (size_t)tok * hidden);
    const float4* x4 = reinterpret_cast<const float4*>(xn + (size_t)b * x_stride);
    float acc = 0.f;
#pragma unroll 4
    for (int v = lane; v < hidden / 8; v += 32) {
        float w[8];
        bf16x8_to_float(__ldg(row + v), w);
        const float4 xa = x4[2 * v], xb = x4[2 * v + 1];
        acc = fmaf(w[0], xa.x, acc); acc = fmaf(w[1], xa.y, acc);
        acc = fmaf(w[2], xa.z, acc); acc = fmaf(w[3], xa.w, acc);
        acc = fmaf(w[4], xb.x, acc); acc = fmaf(w[5], xb.y, acc);
        acc = fmaf(w[6], xb.z, acc); acc = fmaf(w[7], xb.w, acc);
    }
    acc = warp_sum(acc);
    if (lane == 0) out[i] = acc;
}

extern "C" __global__ void __launch_bounds__(HEAD_THREADS)
head_gather(const float* logits, const int* cand, const u8* valid, int vocab, int n_cand, int B,
            float* out) {
    pdl_enter();
    const int b = blockIdx.y, e = blockIdx.x * HEAD_THREADS + threadIdx.x;
    if (b >= B || e >= n_cand) return;
    const size_t i = (size_t)b * n_cand + e;
    const int tok = cand[i];
    out[i] = (valid[i] && tok >= 0 && tok < vocab) ? logits[(size_t)b * vocab + tok] : NEG_INF;
}
