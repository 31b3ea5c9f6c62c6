// matvec_fp8_e4m3.cu: FP8 e4m3 linear layer for small batches (see matvec.cuh for the tiling).
//
//   y[t, o] (+)= w_scale[o] * sum_k prologue(x)[t, k] * e4m3(w[o, k])  (+ bias[o])
//
// w: uint8 e4m3 codes [n_out, n_in] row-major; w_scale: float32 [n_out]; bias: float32 [n_out] or
// null (qwen2 q/k/v); x: float32 [T, x_stride]; y: float32 [T, n_out]; accumulate != 0 adds
// into y (the residual stream after o_proj / down_proj). n_in % 16 == 0.
// Launch: grid (ceil(n_out / R), ceil(T / 8)), block 256, no dynamic shared memory; R = 16 rows
// for fp8_e4m3_matvec_rmsnorm, 8 for fp8_e4m3_matvec and fp8_e4m3_matvec_swiglu.
#include "matvec.cuh"

extern "C" __global__ void __launch_bounds__(MV_THREADS)
fp8_e4m3_matvec(const float* x, int x_stride, const u8* w, const float* w_scale, const float* bias,
                float* y, int T, int n_in, int n_out, int accumulate) {
    matvec_tile<FmtFP8, PRO_PLAIN, 1>(x, nullptr, x_stride, nullptr, 0.f, w, w_scale, nullptr, bias, y,
                                      T, n_in, n_out, accumulate);
}

// Input RMSNorm fused: x is the raw residual stream, norm_w bf16 [n_in].
extern "C" __global__ void __launch_bounds__(MV_THREADS)
fp8_e4m3_matvec_rmsnorm(const float* x, int x_stride, const __nv_bfloat16* norm_w, float eps,
                        const u8* w, const float* w_scale, const float* bias, float* y, int T,
                        int n_in, int n_out, int accumulate) {
    matvec_tile<FmtFP8, PRO_RMSNORM, MV_ROWS_PER_WARP>(x, nullptr, x_stride, norm_w, eps, w, w_scale, nullptr,
                                                       bias, y, T, n_in, n_out, accumulate);
}

// SwiGLU fused: the input is silu(gate) * up, both float32 [T, x_stride].
extern "C" __global__ void __launch_bounds__(MV_THREADS)
fp8_e4m3_matvec_swiglu(const float* gate, const float* up, int x_stride, const u8* w,
                       const float* w_scale, const float* bias, float* y, int T, int n_in, int n_out,
                       int accumulate) {
    matvec_tile<FmtFP8, PRO_SWIGLU, 1>(gate, up, x_stride, nullptr, 0.f, w, w_scale, nullptr, bias, y,
                                       T, n_in, n_out, accumulate);
}
