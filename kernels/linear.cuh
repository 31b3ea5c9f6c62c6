// linear.cuh: what both linear-layer families share (matvec.cuh: FP32 FMAs on CUDA cores;
// linear_mma.cuh: bf16 mma.sync on tensor cores): the prologue kinds and the weight formats.
//
// A format reads one 16-byte vector = ELEMS consecutive elements of one weight row (rows
// row-major, `in` elements each) and decodes it, exactly, either to floats (`decode`, 8 at a
// time) or to bf16 pairs (`bf16_word`: word i = elements 2i, 2i + 1, element 2i in the low half,
// the mma.sync operand layout; `aux` through `word_aux` first, once a vector). `row_scale` is the
// float32 factor of output row o; `aux` the bytes a vector needs besides itself (NVFP4: its two
// block scales).
#pragma once
#include "common.cuh"

// Prologue applied to the activations as they are read:
//   PRO_PLAIN   x
//   PRO_RMSNORM (x / sqrt(mean(x^2) + eps)) * norm_w[k]   (norm_w bf16 [in]; = rmsnorm.cu)
//   PRO_SWIGLU  silu(x[t, k]) * x2[t, k]                   (gate x, up x2; = swiglu.cu)

#define PRO_PLAIN 0
#define PRO_RMSNORM 1
#define PRO_SWIGLU 2

// Activations k .. k + 3 of the row at x + off (x2 + off: SwiGLU's up) after the prologue; rms: the
// row's row_rms (PRO_RMSNORM). off and k multiples of 4.
template <int PRO>
__device__ __forceinline__ float4 prologue_x4(const float* __restrict__ x, const float* __restrict__ x2, size_t off,
                                              const __nv_bfloat16* __restrict__ norm_w, float rms, int k) {
    float4 v = *reinterpret_cast<const float4*>(x + off);
    if (PRO == PRO_RMSNORM) {
        v.x = rms_apply(v.x, rms, __bfloat162float(norm_w[k]));
        v.y = rms_apply(v.y, rms, __bfloat162float(norm_w[k + 1]));
        v.z = rms_apply(v.z, rms, __bfloat162float(norm_w[k + 2]));
        v.w = rms_apply(v.w, rms, __bfloat162float(norm_w[k + 3]));
    } else if (PRO == PRO_SWIGLU) {
        const float4 u = *reinterpret_cast<const float4*>(x2 + off);
        v.x = silu_mul(v.x, u.x); v.y = silu_mul(v.y, u.y);
        v.z = silu_mul(v.z, u.z); v.w = silu_mul(v.w, u.w);
    }
    return v;
}

// Word i (0..3) of a 16-byte vector (i known at compile time after unrolling).
__device__ __forceinline__ u32 vec_word(const uint4 r, int i) {
    return i == 0 ? r.x : i == 1 ? r.y : i == 2 ? r.z : r.w;
}

// ---- weight formats: ELEMS per 16-byte vector; K_CHUNK: matvec.cuh's staged columns (a multiple
// of 32 * ELEMS; smem = MV_TILE_T * K_CHUNK * (1 + 4 / ELEMS) * 4 bytes <= 40 KiB) ----

// FP8 e4m3 [out, in] + float32 per-row scale [out].
struct FmtFP8 {
    static constexpr int ELEMS = 16, K_CHUNK = 1024;
    static __device__ __forceinline__ size_t row_bytes(int in) { return (size_t)in; }
    static __device__ __forceinline__ u32 aux(const void*, int, int, int) { return 0u; }
    // Sub-vector `sub` (0..1) = bytes 8*sub .. 8*sub+7 of the vector.
    static __device__ __forceinline__ void decode(const uint4 r, u32, int sub, float w[8]) {
        const u32 a = sub == 0 ? r.x : r.z, b = sub == 0 ? r.y : r.w;
        float2 f0 = e4m3x2_to_float2((unsigned short)(a & 0xffffu));
        float2 f1 = e4m3x2_to_float2((unsigned short)(a >> 16));
        float2 f2 = e4m3x2_to_float2((unsigned short)(b & 0xffffu));
        float2 f3 = e4m3x2_to_float2((unsigned short)(b >> 16));
        w[0] = f0.x; w[1] = f0.y; w[2] = f1.x; w[3] = f1.y;
        w[4] = f2.x; w[5] = f2.y; w[6] = f3.x; w[7] = f3.y;
    }
    static __device__ __forceinline__ u32 word_aux(u32 aux) { return aux; }
    // Word i (0..7): bytes 2i, 2i + 1 -> bf16x2 (e4m3 -> fp16 -> float -> bf16: exact).
    static __device__ __forceinline__ u32 bf16_word(const uint4 r, u32, int i) {
        const u32 v = vec_word(r, i >> 1);
        const float2 f = e4m3x2_to_float2((unsigned short)((i & 1) ? v >> 16 : v & 0xffffu));
        return float2_to_bf16x2(f.x, f.y);
    }
    static __device__ __forceinline__ float row_scale(const void* s, const float*, int o) {
        return static_cast<const float*>(s)[o];
    }
};

// NVFP4: e2m1 codes uint8 [out, in/2] (element 2k in the low nibble), e4m3 block scales
// [out, in/16], float32 global scale per output row [out] (one value repeated per source
// tensor, so fused q|k|v and gate|up keep each tensor's own). A vector holds 32 elements = 2
// scale blocks. Codes times their block scale become fp16 e2m1 x 2^-14 x scale (common.cuh
// e2m1x2_scaled: bit placement, or the hardware conversion on sm_100a / sm_120a); that is exact
// (a.b x 2^-24 with a <= 12, b an e4m3 significand: <= 6 significant bits, 2^-24 .. 2688 x 2^-14,
// all fp16 values), and the 2^14 is folded into the row's global scale (exact: a power of two), so
// every product and partial sum is the true one times 2^-14 exactly and the result has the same bits.
struct FmtNVFP4 {
    static constexpr int ELEMS = 32, K_CHUNK = 1024;
    static __device__ __forceinline__ size_t row_bytes(int in) { return (size_t)(in / 2); }
    // The vector's two block-scale bytes (in % 32 == 0 keeps the u16 load aligned).
    static __device__ __forceinline__ u32 aux(const void* s, int o, int v, int in) {
        const u8* row = static_cast<const u8*>(s) + (size_t)o * (in / 16);
        return *reinterpret_cast<const unsigned short*>(row + 2 * v);
    }
    // Sub-vector `sub` (0..3) = word `sub` = 8 elements of block sub / 2.
    static __device__ __forceinline__ void decode(const uint4 r, u32 scales, int sub, float w[8]) {
        const u32 word = sub == 0 ? r.x : sub == 1 ? r.y : sub == 2 ? r.z : r.w;
        const __half2 bs2 = e2m1_block_scales((unsigned short)scales);
        const __half2 bs = sub < 2 ? __low2half2(bs2) : __high2half2(bs2);
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            float2 f = __half22float2(e2m1x2_scaled(word >> (8 * i), bs));
            w[2 * i] = f.x; w[2 * i + 1] = f.y;
        }
    }
    // The two block scales as e2m1x2_scaled takes them (half2 bits), converted once a vector.
    static __device__ __forceinline__ u32 word_aux(u32 aux) {
        const __half2 bs2 = e2m1_block_scales((unsigned short)aux);
        return *reinterpret_cast<const u32*>(&bs2);
    }
    // Word i (0..15): byte i = elements 2i, 2i + 1 of block i / 8 -> bf16x2 of e2m1 x block scale x
    // 2^-14 (the fp16 product above, at most 6 significant bits: exact in bf16); `scales` from word_aux.
    static __device__ __forceinline__ u32 bf16_word(const uint4 r, u32 scales, int i) {
        const __half2 bs2 = *reinterpret_cast<const __half2*>(&scales);
        const __half2 bs = i < 8 ? __low2half2(bs2) : __high2half2(bs2);
        const float2 f = __half22float2(e2m1x2_scaled(vec_word(r, i >> 2) >> (8 * (i & 3)), bs));
        return float2_to_bf16x2(f.x, f.y);
    }
    static __device__ __forceinline__ float row_scale(const void*, const float* g, int o) {
        return __fmul_rn(g[o], 16384.0f);  // 2^14: exact
    }
};

// BF16 [out, in], no scale (unquantized reference build and the lm head).
struct FmtBF16 {
    static constexpr int ELEMS = 8, K_CHUNK = 512;
    static __device__ __forceinline__ size_t row_bytes(int in) { return (size_t)in * 2; }
    static __device__ __forceinline__ u32 aux(const void*, int, int, int) { return 0u; }
    static __device__ __forceinline__ void decode(const uint4 r, u32, int, float w[8]) {
        bf16x8_to_float(r, w);
    }
    static __device__ __forceinline__ u32 word_aux(u32 aux) { return aux; }
    // Word i (0..3): elements 2i, 2i + 1, as stored.
    static __device__ __forceinline__ u32 bf16_word(const uint4 r, u32, int i) { return vec_word(r, i); }
    static __device__ __forceinline__ float row_scale(const void*, const float*, int) { return 1.0f; }
};
