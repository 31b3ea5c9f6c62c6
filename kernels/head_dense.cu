// head_dense.cu: the dense LM head with the final RMSNorm fused: logits for every vocab row.
//
//   logits[t, v] = sum_k ((x[t, k] / rms(x[t])) * norm_w[k]) * table[v, k]
//
// x: float32 [T, x_stride] (residual stream before the final norm); norm_w: bf16 [hidden];
// table: bf16 [vocab, hidden] (lm_head, or the tied embedding); logits: float32 [T, vocab].
// This is bf16_matvec_rmsnorm with no bias: per (t, v) the same operations in the same order
// as head_sparse over rmsnorm's output, so the dense and sparse heads agree bit for bit.
// Launch: grid (ceil(vocab / 16), ceil(T / 8)), block 256.
#include "matvec.cuh"

extern "C" __global__ void __launch_bounds__(MV_THREADS)
head_dense(const float* x, int x_stride, const __nv_bfloat16* norm_w, float eps,
           const __nv_bfloat16* table, float* logits, int T, int hidden, int vocab) {
    matvec_tile<FmtBF16, PRO_RMSNORM, MV_ROWS_PER_WARP>(x, nullptr, x_stride, norm_w, eps,
                                      reinterpret_cast<const u8*>(table), nullptr, nullptr, nullptr,
                                      logits, T, hidden, vocab, 0);
}
