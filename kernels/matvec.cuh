// matvec.cuh: the linear layer on CUDA cores (float32 FMAs), shared by matvec_{fp8_e4m3,nvfp4,bf16}.cu
// and head_dense.cu; the "fma" family of kernels/geometry.py KERNEL_FAMILIES.
//
//   y[t, o] (+)= scale(o) * sum_k prologue(x)[t, k] * Wq[o, k]  (+ bias[o])
//
// x: float32 [T, x_stride] (first `in` columns used); y: float32 [T, out], must not alias x.
// W: one 16-byte vector = ELEMS consecutive elements of one row (the formats and the prologues:
// linear.cuh); the prologue is applied while staging x into shared memory.
//
// Launch: grid (ceil(out / rows per block), ceil(T / MV_TILE_T)), block MV_THREADS; rows per
// block = MV_WARPS x R (R below: 16 for *_rmsnorm and head_dense, 8 for plain and *_swiglu).
// Each warp owns R output rows and all MV_TILE_T activation rows of the block,
// so one 16-byte weight load feeds 8 rows of x (read from shared memory, conflict-free thanks
// to a 16-byte pad after every vector's columns). Lane l reads vectors l, l+32, l+64, ... of
// each weight row: a warp reads 512 contiguous bytes per load instruction. The next chunk's
// weights are loaded into registers before the current chunk is computed (loads in flight
// across the chunk's arithmetic and barriers).
//
// Graphs with programmatic edges (common.cuh): the first chunk's weight loads are issued before
// pdl_wait, so they overlap the previous kernel's tail.
//
// Determinism: for each (o, t) the products are summed in the same order (lane's vectors in
// order, elements in order, fmaf), then one warp_sum; T and the tile a row lands in never
// change its bits. Requires in % ELEMS == 0, x_stride % 4 == 0, 16-byte aligned bases.
#pragma once
#include "linear.cuh"

#define MV_THREADS 256
#define MV_WARPS 8
#define MV_ROWS_PER_WARP 2
// rows per block: R = 2 (*_matvec_rmsnorm, head_dense), R = 1 (plain and *_swiglu)
#define MV_ROWS_PER_BLOCK 16
#define MV_ROWS_PER_BLOCK_NARROW 8
#define MV_TILE_T 8

// Loads chunk c's weight vectors of this warp's rows into registers (zeros past the edges).
template <class F, int R, int VPL>
__device__ __forceinline__ void mv_load_chunk(const u8* __restrict__ w, const void* wscale,
                                              size_t rb, int in, int out, int obase, int nvec,
                                              int c, int lane, uint4 (&raw)[R][VPL],
                                              u32 (&aux)[R][VPL]) {
    constexpr int VPC = F::K_CHUNK / F::ELEMS;
#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int i = 0; i < VPL; ++i) {
            const int o = obase + r, v = c * VPC + i * 32 + lane;
            if (o < out && v < nvec) {
                raw[r][i] = __ldg(reinterpret_cast<const uint4*>(w + (size_t)o * rb) + v);
                aux[r][i] = F::aux(wscale, o, v, in);
            } else {
                raw[r][i] = make_uint4(0u, 0u, 0u, 0u);
                aux[r][i] = 0u;
            }
        }
    }
}

// R: output rows per warp (MV_ROWS_PER_WARP = 2 for the q|k|v and gate|up matvecs; 1 for
// o_proj / down_proj / plain, whose `out` is only hidden_size: 8 rows a block, so hidden 1024
// is 128 blocks at T = 1, one per SM on a 132-SM H100/H200, instead of 64).
template <class F, int PRO, int R>
__device__ __forceinline__ void matvec_tile(
    const float* __restrict__ x, const float* __restrict__ x2, int x_stride,
    const __nv_bfloat16* __restrict__ norm_w, float eps, const u8* __restrict__ w,
    const void* __restrict__ wscale, const float* __restrict__ gscale, const float* __restrict__ bias,
    float* __restrict__ y, int T, int in, int out, int accumulate) {
    constexpr int TM = MV_TILE_T;
    constexpr int VPC = F::K_CHUNK / F::ELEMS, VPL = VPC / 32, SUBS = F::ELEMS / 8;
    constexpr int XS_ROW = F::K_CHUNK + VPC * 4;  // padded floats per staged row
    constexpr int Q4 = F::K_CHUNK / 4;            // float4 per staged row
    __shared__ __align__(16) float xs[TM * XS_ROW];
    __shared__ float rms_s[TM];

    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int t0 = blockIdx.y * TM;
    const int nt = min(TM, T - t0);
    const int obase = blockIdx.x * (MV_WARPS * R) + warp * R;
    const int nvec = in / F::ELEMS;
    const int nchunks = (in + F::K_CHUNK - 1) / F::K_CHUNK;
    const size_t rb = F::row_bytes(in);

    uint4 wn[R][VPL];
    u32 an[R][VPL];
    mv_load_chunk<F, R, VPL>(w, wscale, rb, in, out, obase, nvec, 0, lane, wn, an);
    pdl_trigger();  // after the loads: before them, ptxas spills 4 bytes in nvfp4_matvec_swiglu
    pdl_wait();     // the weights' first chunk is in flight; x, x2 and y come from earlier kernels
    if (PRO == PRO_RMSNORM && warp < nt) {  // one warp per activation row (TM == MV_WARPS)
        const float r = row_rms(x + (size_t)(t0 + warp) * x_stride, in, eps, lane);
        if (lane == 0) rms_s[warp] = r;
    }

    float acc[R][TM];
#pragma unroll
    for (int r = 0; r < R; ++r)
#pragma unroll
        for (int t = 0; t < TM; ++t) acc[r][t] = 0.f;

    for (int c = 0; c < nchunks; ++c) {
        __syncthreads();  // xs free (previous chunk done); rms_s written
        const int k0 = c * F::K_CHUNK;
        for (int idx = threadIdx.x; idx < nt * Q4; idx += MV_THREADS) {
            const int t = idx / Q4, k = (idx - t * Q4) * 4, gk = k0 + k;
            float4 v = make_float4(0.f, 0.f, 0.f, 0.f);
            if (gk < in)
                v = prologue_x4<PRO>(x, x2, (size_t)(t0 + t) * x_stride + gk, norm_w,
                                     PRO == PRO_RMSNORM ? rms_s[t] : 1.f, gk);
            *reinterpret_cast<float4*>(&xs[t * XS_ROW + k + (k / F::ELEMS) * 4]) = v;
        }
        __syncthreads();

        uint4 wc[R][VPL];
        u32 ac[R][VPL];
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
            for (int i = 0; i < VPL; ++i) { wc[r][i] = wn[r][i]; ac[r][i] = an[r][i]; }
        if (c + 1 < nchunks)
            mv_load_chunk<F, R, VPL>(w, wscale, rb, in, out, obase, nvec, c + 1, lane, wn, an);

#pragma unroll
        for (int i = 0; i < VPL; ++i) {
            const int vl = i * 32 + lane;  // vector index within the chunk
            if (c * VPC + vl >= nvec) continue;
            const float* xv = xs + vl * (F::ELEMS + 4);
#pragma unroll
            for (int sub = 0; sub < SUBS; ++sub) {
                float wf[R][8];
#pragma unroll
                for (int r = 0; r < R; ++r) F::decode(wc[r][i], ac[r][i], sub, wf[r]);
#pragma unroll
                for (int t = 0; t < TM; ++t) {
                    if (t >= nt) break;
                    const float4 xa = *reinterpret_cast<const float4*>(xv + t * XS_ROW + sub * 8);
                    const float4 xb = *reinterpret_cast<const float4*>(xv + t * XS_ROW + sub * 8 + 4);
                    const float xf[8] = {xa.x, xa.y, xa.z, xa.w, xb.x, xb.y, xb.z, xb.w};
#pragma unroll
                    for (int r = 0; r < R; ++r)
#pragma unroll
                        for (int e = 0; e < 8; ++e) acc[r][t] = fmaf(wf[r][e], xf[e], acc[r][t]);
                }
            }
        }
    }

#pragma unroll
    for (int r = 0; r < R; ++r) {
#pragma unroll
        for (int t = 0; t < TM; ++t) {
            if (t >= nt) break;
            const float s = warp_sum(acc[r][t]);
            const int o = obase + r;
            if (lane == 0 && o < out) {
                float res = __fmul_rn(s, F::row_scale(wscale, gscale, o));
                if (bias != nullptr) res = __fadd_rn(res, bias[o]);
                float* yp = y + (size_t)(t0 + t) * out + o;
                *yp = accumulate ? __fadd_rn(*yp, res) : res;
            }
        }
    }
}
