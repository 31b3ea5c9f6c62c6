// rmsnorm.cu: RMSNorm of float32 rows, optionally gathering the rows first.
//
//   y[b, :] = (x[r, :] / sqrt(mean(x[r, :]^2) + eps)) * w      with r = rows ? rows[b] : b
//
// x: float32 [*, x_stride]; rows: int32 [B] or null (r < 0 writes zeros); w: bf16 [n];
// y: float32 [B, y_stride]; y may alias x when rows is null. n % 4 == 0, strides % 4 == 0.
// One warp per output row (row_rms in common.cuh: the same bits as the fused matvec
// prologue, so head_sparse over this output matches head_dense exactly).
// Launch: grid (ceil(B / 8)), block NORM_THREADS.
#include "common.cuh"

#define NORM_THREADS 256
#define NORM_ROWS_PER_BLOCK 8

extern "C" __global__ void __launch_bounds__(NORM_THREADS)
rmsnorm(const float* x, int x_stride, const int* rows, const __nv_bfloat16* w, float eps,
        float* y, int y_stride, int B, int n) {
    pdl_enter();
    const int lane = threadIdx.x & 31;
    const int b = blockIdx.x * NORM_ROWS_PER_BLOCK + (threadIdx.x >> 5);
    if (b >= B) return;
    const int r = rows != nullptr ? rows[b] : b;
    float4* dst = reinterpret_cast<float4*>(y + (size_t)b * y_stride);
    if (r < 0) {
        for (int i = lane; i < n / 4; i += 32) dst[i] = make_float4(0.f, 0.f, 0.f, 0.f);
        return;
    }
    const float* src = x + (size_t)r * x_stride;
    const float rms = row_rms(src, n, eps, lane);  // reads the whole row before any write
    const float4* s4 = reinterpret_cast<const float4*>(src);
    const uint2* w4 = reinterpret_cast<const uint2*>(w);  // 4 bf16 per 8 bytes
    for (int i = lane; i < n / 4; i += 32) {
        const float4 v = s4[i];
        const uint2 wr = __ldg(w4 + i);
        const float2 wa = bf16x2_to_float2(wr.x), wb = bf16x2_to_float2(wr.y);
        dst[i] = make_float4(rms_apply(v.x, rms, wa.x), rms_apply(v.y, rms, wa.y),
                             rms_apply(v.z, rms, wb.x), rms_apply(v.w, rms, wb.y));
    }
}
