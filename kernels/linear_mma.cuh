// linear_mma.cuh: the linear layer on tensor cores for every row count T, shared by
// linear_mma_{fp8_e4m3,nvfp4,bf16}.cu.
//
//   y[t, o] (+)= scale(o) * sum_k prologue(x)[t, k] * W[o, k]  (+ bias[o])
//
// x: float32 [T, x_stride] (first `in` columns used); y: float32 [T, out], must not alias x;
// weights, prologues and scales as linear.cuh (the same arguments as matvec.cuh's kernels).
//
// Arithmetic: mma.sync m16n8k16 bf16 x bf16 + f32 with the weights as A (16 output rows) and the
// tokens as B (8 columns; the swap-AB layout: T = 1 fills one column of 8). Weights decode
// exactly to bf16 (linear.cuh bf16_word). Each activation splits into hi = bf16(x) and
// lo = bf16(x - hi) (x - hi is exact in float32) and both go through the mma, hi then lo: the
// activation keeps 16 significant bits (relative error <= 2^-17) instead of bf16's 8.
//
// One reduction order for every T (batch invariance: a row's bits never depend on the other
// rows of the launch). n_in alone cuts K into LM_K_SLICES slices of whole k-blocks; warp w of
// every block sums slice w into one float32 accumulator (k-blocks in order, in each its mma steps
// in order, hi then lo); the block adds the slices' partials in order 0 .. LM_K_SLICES - 1
// (__fadd_rn), then scales, adds the bias and accumulates as matvec.cuh does. Neither the row
// groups a warp holds (RG) nor T enter a row's sum: an mma column depends on that column alone.
//
// k mapping: a k-block is 4 x E consecutive k (E = the format's elements per 16-byte vector).
// Lane (g = lane / 4, c = lane % 4) loads vector kb * 4 + c of rows g and g + 8 of each row
// group; mma step q (0 .. E/4 - 1) takes that vector's elements 4q, 4q + 1 as logical k = 2c,
// 2c + 1 (A regs 0, 1; B reg 0) and 4q + 2, 4q + 3 as 2c + 8, 2c + 9 (A regs 2, 3; B reg 1); the
// lane's B fragment is token g's activations at the same k, read from x as one float4 per step.
//
// Launch: grid (ceil(out / (16 RG)), ceil(T / LM_TOKENS)), block LM_THREADS = 32 x LM_K_SLICES;
// RG = LM_WIDE_GROUPS row groups of 16 a warp when T >= LM_WIDE_T (each B fragment then feeds 4
// weight tiles: x is read out / 64 times, not out / 16; its loads go as it computes), else 1 (T = 1:
// out / 16 blocks, each lane with 4 vectors x 2 rows = 8 16-byte weight loads in flight, the next 8
// issued before the current ones are used). Requires in % E == 0, x_stride % 4 == 0, 16-byte aligned bases.
#pragma once
#include "linear.cuh"

#define LM_THREADS 256
#define LM_K_SLICES 8
#define LM_TOKENS 16
#define LM_WIDE_T 64
#define LM_WIDE_GROUPS 4
#define LM_LOAD_KBLOCKS 4

// c += A (16 x 16 bf16, 4 words) x B (16 x 8 bf16, 2 words), float32 accumulate.
__device__ __forceinline__ void mma_bf16_16816(float (&c)[4], const u32 (&a)[4], u32 b0, u32 b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 "
                 "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

// (a, b) -> hi = bf16x2(a, b) and lo = bf16x2(a - hi.a, b - hi.b); hi + lo = (a, b) to 16 bits.
__device__ __forceinline__ void split_bf16x2(float a, float b, u32& hi, u32& lo) {
    hi = float2_to_bf16x2(a, b);
    const float2 h = bf16x2_to_float2(hi);
    lo = float2_to_bf16x2(__fsub_rn(a, h.x), __fsub_rn(b, h.y));
}

// The 16-byte vectors (and aux words) of k-blocks kb .. kb + KB - 1 of this lane's rows: [k-block]
// [row group][0: row g, 1: row g + 8]; zeros past `out`, past `nvec` and from k-block kb_end on.
template <class F, int KB, int RG>
__device__ __forceinline__ void lm_load(const u8* __restrict__ w, const void* wscale, size_t rb, int in,
                                        int out, int nvec, int o0, int kb, int kb_end, int g, int c,
                                        uint4 (&raw)[KB][RG][2], u32 (&aux)[KB][RG][2]) {
#pragma unroll
    for (int i = 0; i < KB; ++i)
#pragma unroll
        for (int r = 0; r < RG; ++r)
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const int o = o0 + 16 * r + 8 * h + g, v = (kb + i) * 4 + c;
                if (kb + i < kb_end && o < out && v < nvec) {
                    raw[i][r][h] = __ldg(reinterpret_cast<const uint4*>(w + (size_t)o * rb) + v);
                    aux[i][r][h] = F::aux(wscale, o, v, in);
                } else {
                    raw[i][r][h] = make_uint4(0u, 0u, 0u, 0u);
                    aux[i][r][h] = 0u;
                }
            }
}

// Token t's activations k .. k + 3 after the prologue (zeros when the lane has no token or k is
// past the row).
template <int PRO>
__device__ __forceinline__ float4 lm_x4(const float* __restrict__ x, const float* __restrict__ x2, int x_stride,
                                        const __nv_bfloat16* __restrict__ norm_w, float rms, int t, int k, bool ok) {
    return ok ? prologue_x4<PRO>(x, x2, (size_t)t * x_stride + k, norm_w, rms, k)
              : make_float4(0.f, 0.f, 0.f, 0.f);
}

// One block: rows o0 .. o0 + 16 RG - 1, tokens t0 .. t0 + LM_TOKENS - 1; `part` holds
// LM_K_SLICES x 16 RG x (LM_TOKENS + 1) floats of shared memory, `rms_s` LM_TOKENS.
template <class F, int PRO, int RG>
__device__ __forceinline__ void linear_mma_tile(
    const float* __restrict__ x, const float* __restrict__ x2, int x_stride,
    const __nv_bfloat16* __restrict__ norm_w, float eps, const u8* __restrict__ w,
    const void* __restrict__ wscale, const float* __restrict__ gscale, const float* __restrict__ bias,
    float* __restrict__ y, int T, int in, int out, int accumulate, float* part, float* rms_s) {
    constexpr int E = F::ELEMS, STEPS = E / 4, NJ = LM_TOKENS / 8, ROWS = 16 * RG, PS = LM_TOKENS + 1;
    // k-blocks a load group: LM_LOAD_KBLOCKS of up to 16 elements a lane (NVFP4's 32: half as many, the same
    // 4 vectors a row in flight); the wide tiling 1
    constexpr int KB = RG == 1 ? LM_LOAD_KBLOCKS * 16 / (E > 16 ? E : 16) : 1;
    // the next group's loads issued before this one's mma (RG = 1: T = 1's memory-bound case); the wide
    // tiling (8 x 4 x 2 mma a vector) loads as it goes and keeps its registers for the activations
    constexpr bool PREFETCH = RG == 1;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, g = lane >> 2, c = lane & 3;
    const int o0 = blockIdx.x * ROWS, t0 = blockIdx.y * LM_TOKENS;
    const int nt = min(LM_TOKENS, T - t0);
    if (nt <= 0) return;  // T = 0 (the grid is at least one block): nothing to read or write
    const int nvec = in / E, nkb = (nvec + 3) / 4;
    const int kb_begin = nkb * warp / LM_K_SLICES, kb_end = nkb * (warp + 1) / LM_K_SLICES;  // by n_in only
    const size_t rb = F::row_bytes(in);

    uint4 cur[KB][RG][2], nxt[KB][RG][2];
    u32 acur[KB][RG][2], anxt[KB][RG][2];
    lm_load<F, KB, RG>(w, wscale, rb, in, out, nvec, o0, kb_begin, kb_end, g, c, cur, acur);
    pdl_trigger();
    pdl_wait();  // the first weights are in flight; x, x2 and y come from earlier kernels
    if (PRO == PRO_RMSNORM) {
        for (int t = warp; t < nt; t += LM_K_SLICES) {
            const float r = row_rms(x + (size_t)(t0 + t) * x_stride, in, eps, lane);
            if (lane == 0) rms_s[t] = r;
        }
        __syncthreads();
    }

    float acc[RG][NJ][4];
#pragma unroll
    for (int r = 0; r < RG; ++r)
#pragma unroll
        for (int j = 0; j < NJ; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e) acc[r][j][e] = 0.f;

    for (int kb = kb_begin; kb < kb_end; kb += KB) {
        if (PREFETCH && kb + KB < kb_end)
            lm_load<F, KB, RG>(w, wscale, rb, in, out, nvec, o0, kb + KB, kb_end, g, c, nxt, anxt);
        else if (!PREFETCH && kb != kb_begin)
            lm_load<F, KB, RG>(w, wscale, rb, in, out, nvec, o0, kb, kb_end, g, c, cur, acur);
#pragma unroll
        for (int i = 0; i < KB; ++i) {
            if (kb + i >= kb_end) break;
            const int v = (kb + i) * 4 + c;  // this lane's vector of the k-block
            u32 wa[RG][2];  // the vectors' aux words as bf16_word takes them (NVFP4: fp16 block scales)
#pragma unroll
            for (int r = 0; r < RG; ++r)
#pragma unroll
                for (int h = 0; h < 2; ++h) wa[r][h] = F::word_aux(acur[i][r][h]);
            // the wide tiling unrolls 2 steps at a time: fully unrolled, ptxas decodes all of NVFP4's 8 steps'
            // weights ahead (4 x 4 x 8 words) and spills on sm_100
#pragma unroll(RG > 1 ? 2 : STEPS)
            for (int q = 0; q < STEPS; ++q) {
                u32 b[NJ][4];  // per column tile: hi (B regs 0, 1), lo (B regs 0, 1)
#pragma unroll
                for (int j = 0; j < NJ; ++j) {
                    const int tl = 8 * j + g;
                    const float rms = PRO == PRO_RMSNORM ? rms_s[min(tl, nt - 1)] : 1.f;
                    const float4 xv = lm_x4<PRO>(x, x2, x_stride, norm_w, rms, t0 + tl, v * E + 4 * q,
                                                 tl < nt && v < nvec);
                    split_bf16x2(xv.x, xv.y, b[j][0], b[j][2]);
                    split_bf16x2(xv.z, xv.w, b[j][1], b[j][3]);
                }
#pragma unroll
                for (int r = 0; r < RG; ++r) {
                    const u32 a[4] = {F::bf16_word(cur[i][r][0], wa[r][0], 2 * q),
                                      F::bf16_word(cur[i][r][1], wa[r][1], 2 * q),
                                      F::bf16_word(cur[i][r][0], wa[r][0], 2 * q + 1),
                                      F::bf16_word(cur[i][r][1], wa[r][1], 2 * q + 1)};
#pragma unroll
                    for (int j = 0; j < NJ; ++j) {
                        if (8 * j >= nt) break;  // the whole warp: no token in this column tile
                        mma_bf16_16816(acc[r][j], a, b[j][0], b[j][1]);
                        mma_bf16_16816(acc[r][j], a, b[j][2], b[j][3]);
                    }
                }
            }
        }
        if (PREFETCH) {
#pragma unroll
            for (int i = 0; i < KB; ++i)
#pragma unroll
                for (int r = 0; r < RG; ++r)
#pragma unroll
                    for (int h = 0; h < 2; ++h) { cur[i][r][h] = nxt[i][r][h]; acur[i][r][h] = anxt[i][r][h]; }
        }
    }

    // C fragment e of (r, j): row 16 r + g + 8 (e / 2), token 8 j + 2 c + e % 2
#pragma unroll
    for (int r = 0; r < RG; ++r)
#pragma unroll
        for (int j = 0; j < NJ; ++j)
#pragma unroll
            for (int e = 0; e < 4; ++e)
                part[(warp * ROWS + 16 * r + g + 8 * (e >> 1)) * PS + 8 * j + 2 * c + (e & 1)] = acc[r][j][e];
    __syncthreads();
    for (int idx = threadIdx.x; idx < ROWS * LM_TOKENS; idx += LM_THREADS) {
        const int row = idx / LM_TOKENS, tl = idx - row * LM_TOKENS, o = o0 + row;
        if (o >= out || tl >= nt) continue;
        float s = part[row * PS + tl];
#pragma unroll
        for (int k = 1; k < LM_K_SLICES; ++k) s = __fadd_rn(s, part[(k * ROWS + row) * PS + tl]);
        float res = __fmul_rn(s, F::row_scale(wscale, gscale, o));
        if (bias != nullptr) res = __fadd_rn(res, bias[o]);
        float* yp = y + (size_t)(t0 + tl) * out + o;
        *yp = accumulate ? __fadd_rn(*yp, res) : res;
    }
}

// The entry points' body: the row grouping by T (the grid's x, declarations.py), one shared buffer.
template <class F, int PRO>
__device__ __forceinline__ void linear_mma(
    const float* __restrict__ x, const float* __restrict__ x2, int x_stride,
    const __nv_bfloat16* __restrict__ norm_w, float eps, const u8* __restrict__ w,
    const void* __restrict__ wscale, const float* __restrict__ gscale, const float* __restrict__ bias,
    float* __restrict__ y, int T, int in, int out, int accumulate) {
    __shared__ float part[LM_K_SLICES * 16 * LM_WIDE_GROUPS * (LM_TOKENS + 1)];
    __shared__ float rms_s[LM_TOKENS];
    if (T >= LM_WIDE_T)
        linear_mma_tile<F, PRO, LM_WIDE_GROUPS>(x, x2, x_stride, norm_w, eps, w, wscale, gscale, bias, y, T, in,
                                                out, accumulate, part, rms_s);
    else
        linear_mma_tile<F, PRO, 1>(x, x2, x_stride, norm_w, eps, w, wscale, gscale, bias, y, T, in, out,
                                   accumulate, part, rms_s);
}
