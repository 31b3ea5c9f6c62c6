// matvec_nvfp4.cu: NVFP4 linear layer for small batches (see matvec.cuh for the tiling).
//
//   y[t, o] (+)= global[o] * sum_k prologue(x)[t, k] * e2m1(w, o, k) * e4m3(w_scale[o, k / 16])
//                (+ bias[o])
//
// w: uint8 [n_out, n_in/2], element 2k in the low nibble, 2k+1 in the high nibble;
// w_scale: uint8 e4m3 codes [n_out, n_in/16]; global_scale: float32 [n_out], each row's source
// tensor's weight_scale_2 (fused q|k|v, gate|up: one value per tensor, repeated over its rows);
// bias: float32 [n_out] or null; x: float32 [T, x_stride]; y: float32 [T, n_out];
// accumulate != 0 adds into y. n_in % 32 == 0.
// Codes are decoded by bit placement, not cuda_fp4.h (an emulation on sm_90): see matvec.cuh.
// Launch: grid (ceil(n_out / R), ceil(T / 8)), block 256, no dynamic shared memory; R = 16 rows
// for nvfp4_matvec_rmsnorm, 8 for nvfp4_matvec and nvfp4_matvec_swiglu.
#include "matvec.cuh"

extern "C" __global__ void __launch_bounds__(MV_THREADS)
nvfp4_matvec(const float* x, int x_stride, const u8* w, const u8* w_scale, const float* global_scale,
             const float* bias, float* y, int T, int n_in, int n_out, int accumulate) {
    matvec_tile<FmtNVFP4, PRO_PLAIN, 1>(x, nullptr, x_stride, nullptr, 0.f, w, w_scale,
                                        global_scale, bias, y, T, n_in, n_out, accumulate);
}

// Input RMSNorm fused: x is the raw residual stream, norm_w bf16 [n_in].
extern "C" __global__ void __launch_bounds__(MV_THREADS)
nvfp4_matvec_rmsnorm(const float* x, int x_stride, const __nv_bfloat16* norm_w, float eps,
                     const u8* w, const u8* w_scale, const float* global_scale, const float* bias,
                     float* y, int T, int n_in, int n_out, int accumulate) {
    matvec_tile<FmtNVFP4, PRO_RMSNORM, MV_ROWS_PER_WARP>(x, nullptr, x_stride, norm_w, eps, w, w_scale,
                                                         global_scale, bias, y, T, n_in, n_out, accumulate);
}

// SwiGLU fused: the input is silu(gate) * up, both float32 [T, x_stride].
extern "C" __global__ void __launch_bounds__(MV_THREADS)
nvfp4_matvec_swiglu(const float* gate, const float* up, int x_stride, const u8* w,
                    const u8* w_scale, const float* global_scale, const float* bias, float* y, int T,
                    int n_in, int n_out, int accumulate) {
    matvec_tile<FmtNVFP4, PRO_SWIGLU, 1>(gate, up, x_stride, nullptr, 0.f, w, w_scale,
                                         global_scale, bias, y, T, n_in, n_out, accumulate);
}
