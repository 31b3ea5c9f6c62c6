// linear_mma_fp8_e4m3.cu: FP8 e4m3 linear layer on tensor cores, every T (see linear_mma.cuh for the tiling
// and the reduction order; the same parameters as matvec_fp8_e4m3.cu).
//
//   y[t, o] (+)= w_scale[o] * sum_k prologue(x)[t, k] * e4m3(w[o, k])  (+ bias[o])
//
// w: uint8 e4m3 codes [n_out, n_in] row-major; w_scale: float32 [n_out]. n_in % 16 == 0.
// bias: float32 [n_out] or null; x: float32 [T, x_stride]; y: float32 [T, n_out]; accumulate != 0 adds
// into y (the residual stream after o_proj / down_proj).
// Launch: grid (ceil(n_out / (16 RG)), ceil(T / 16)), block 256, no dynamic shared memory; RG = 4 row
// groups when T >= 64, else 1. __launch_bounds__(256, 1): ptxas may use up to 255 registers (left to
// itself it keeps 128 and spills on sm_80 and sm_120).
#include "linear_mma.cuh"

extern "C" __global__ void __launch_bounds__(LM_THREADS, 1)
fp8_e4m3_linear_mma(const float* x, int x_stride, const u8* w, const float* w_scale, const float* bias,
                    float* y, int T, int n_in, int n_out, int accumulate) {
    linear_mma<FmtFP8, PRO_PLAIN>(x, nullptr, x_stride, nullptr, 0.f, w, w_scale, nullptr, bias, y, T, n_in, n_out,
                                 accumulate);
}

// Input RMSNorm fused: x is the raw residual stream, norm_w bf16 [n_in].
extern "C" __global__ void __launch_bounds__(LM_THREADS, 1)
fp8_e4m3_linear_mma_rmsnorm(const float* x, int x_stride, const __nv_bfloat16* norm_w, float eps,
                            const u8* w, const float* w_scale, const float* bias, float* y, int T, int n_in,
                            int n_out, int accumulate) {
    linear_mma<FmtFP8, PRO_RMSNORM>(x, nullptr, x_stride, norm_w, eps, w, w_scale, nullptr, bias, y, T, n_in,
                                   n_out, accumulate);
}

// SwiGLU fused: the input is silu(gate) * up, both float32 [T, x_stride].
extern "C" __global__ void __launch_bounds__(LM_THREADS, 1)
fp8_e4m3_linear_mma_swiglu(const float* gate, const float* up, int x_stride, const u8* w, const float* w_scale,
                           const float* bias, float* y, int T, int n_in, int n_out, int accumulate) {
    linear_mma<FmtFP8, PRO_SWIGLU>(gate, up, x_stride, nullptr, 0.f, w, w_scale, nullptr, bias, y, T, n_in, n_out,
                                  accumulate);
}
