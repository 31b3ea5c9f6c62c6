// swiglu.cu: the MLP activation, silu(gate) * up, elementwise in float32.
//
//   y[t, i] = (gate[t, i] / (1 + exp(-gate[t, i]))) * up[t, i]
//
// gate, up: float32 [T, in_stride] (they may be the two halves of one fused gate_up
// output); y: float32 [T, y_stride]; n % 4 == 0, strides % 4 == 0. Same expression as
// the *_matvec_swiglu prologue (silu_mul in common.cuh), so both paths give equal bits.
// Launch: grid (ceil(n / (4 * SWIGLU_THREADS)), T), block SWIGLU_THREADS.
#include "common.cuh"

#define SWIGLU_THREADS 256

extern "C" __global__ void __launch_bounds__(SWIGLU_THREADS)
swiglu(const float* gate, const float* up, int in_stride, float* y, int y_stride, int T, int n) {
    pdl_enter();
    const int t = blockIdx.y;
    const int i = blockIdx.x * SWIGLU_THREADS + threadIdx.x;  // float4 index
    if (t >= T || i >= n / 4) return;
    const float4 g = reinterpret_cast<const float4*>(gate + (size_t)t * in_stride)[i];
    const float4 u = reinterpret_cast<const float4*>(up + (size_t)t * in_stride)[i];
    reinterpret_cast<float4*>(y + (size_t)t * y_stride)[i] =
        make_float4(silu_mul(g.x, u.x), silu_mul(g.y, u.y), silu_mul(g.z, u.z), silu_mul(g.w, u.w));
}
