// argmax.cu: per-row argmax of float32 logits with a fixed tie-break.
//
//   out_idx[t] = the lowest index i with logits[t, i] maximal; out_val[t] = that value
//
// NaN counts as -inf; a row of all -inf (or NaN) gives index 0. The order (value desc,
// index asc) is total, so the tree below gives the same answer whatever its shape.
// logits: float32 [T, stride] (first n used); out_idx: int32 [T]; out_val: float32 [T] or null.
// Launch: grid (T), block ARGMAX_THREADS.
#include "common.cuh"

#define ARGMAX_THREADS 256

__device__ __forceinline__ void better(float& bv, int& bi, float v, int i) {
    if (v > bv || (v == bv && i < bi)) { bv = v; bi = i; }
}

extern "C" __global__ void __launch_bounds__(ARGMAX_THREADS)
argmax_rows(const float* logits, int stride, int n, int T, int* out_idx, float* out_val) {
    pdl_enter();
    __shared__ float sv[ARGMAX_THREADS / 32];
    __shared__ int si[ARGMAX_THREADS / 32];
    const int t = blockIdx.x, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    if (t >= T) return;
    const float* row = logits + (size_t)t * stride;
    float bv = NEG_INF;
    int bi = 0x7fffffff;
#pragma unroll 8
    for (int i = threadIdx.x; i < n; i += ARGMAX_THREADS) {
        float v = row[i];
        if (v != v) v = NEG_INF;
        better(bv, bi, v, i);
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const float v = __shfl_xor_sync(FULL_MASK, bv, off);
        const int i = __shfl_xor_sync(FULL_MASK, bi, off);
        better(bv, bi, v, i);
    }
    if (lane == 0) { sv[warp] = bv; si[warp] = bi; }
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int w = 1; w < ARGMAX_THREADS / 32; ++w) better(bv, bi, sv[w], si[w]);
        out_idx[t] = bi < n ? bi : 0;
        if (out_val != nullptr) out_val[t] = bv;
    }
}
