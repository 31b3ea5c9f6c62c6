// matvec_bf16.cu: bf16 linear layer for small batches (the unquantized `bf16` build);
// see matvec.cuh for the tiling.
//
//   y[t, o] (+)= sum_k prologue(x)[t, k] * w[o, k]  (+ bias[o])
//
// w: bf16 [n_out, n_in]; bias: float32 [n_out] or null; x: float32 [T, x_stride];
// y: float32 [T, n_out]; accumulate != 0 adds into y. n_in % 8 == 0.
// Launch: grid (ceil(n_out / R), ceil(T / 8)), block 256, no dynamic shared memory; R = 16 rows
// for bf16_matvec_rmsnorm, 8 for bf16_matvec and bf16_matvec_swiglu.
#include "matvec.cuh"

extern "C" __global__ void __launch_bounds__(MV_THREADS)
bf16_matvec(const float* x, int x_stride, const __nv_bfloat16* w, const float* bias, float* y,
            int T, int n_in, int n_out, int accumulate) {
    matvec_tile<FmtBF16, PRO_PLAIN, 1>(x, nullptr, x_stride, nullptr, 0.f,
                                       reinterpret_cast<const u8*>(w), nullptr, nullptr, bias, y, T, n_in,
                                       n_out, accumulate);
}

// Input RMSNorm fused: x is the raw residual stream, norm_w bf16 [n_in].
extern "C" __global__ void __launch_bounds__(MV_THREADS)
bf16_matvec_rmsnorm(const float* x, int x_stride, const __nv_bfloat16* norm_w, float eps,
                    const __nv_bfloat16* w, const float* bias, float* y, int T, int n_in, int n_out,
                    int accumulate) {
    matvec_tile<FmtBF16, PRO_RMSNORM, MV_ROWS_PER_WARP>(x, nullptr, x_stride, norm_w, eps,
                                                        reinterpret_cast<const u8*>(w), nullptr, nullptr, bias,
                                                        y, T, n_in, n_out, accumulate);
}

// SwiGLU fused: the input is silu(gate) * up, both float32 [T, x_stride].
extern "C" __global__ void __launch_bounds__(MV_THREADS)
bf16_matvec_swiglu(const float* gate, const float* up, int x_stride, const __nv_bfloat16* w,
                   const float* bias, float* y, int T, int n_in, int n_out, int accumulate) {
    matvec_tile<FmtBF16, PRO_SWIGLU, 1>(gate, up, x_stride, nullptr, 0.f,
                                        reinterpret_cast<const u8*>(w), nullptr, nullptr, bias, y, T,
                                        n_in, n_out, accumulate);
}
