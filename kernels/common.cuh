// common.cuh: device helpers shared by every kernel of the engine.
//
// Numerics contract (all kernels): float32 accumulation; every reduction is a fixed tree
// (sequential per lane, then an xor butterfly over lanes in a fixed order), so a row's
// result depends only on that row's data, never on how many other rows share the launch.
// Expressions whose rounding must match the numpy reference (kernels/reference.py) are
// written with explicit __fmul_rn/__fadd_rn so the compiler cannot contract them to FMA.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>

#define FULL_MASK 0xffffffffu
#define NEG_INF (__int_as_float(0xff800000))

typedef unsigned long long u64;
typedef unsigned int u32;
typedef unsigned char u8;

// Sum over the 32 lanes; every lane ends with the same bits (xor pairs add commutatively).
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(FULL_MASK, v, off);
    return v;
}

__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(FULL_MASK, v, off));
    return v;
}

// ---- conversions (all exact except float -> bf16, which rounds to nearest even) ----

// Two bf16 packed in a 32-bit word (element 0 in the low half) -> two floats. Exact.
__device__ __forceinline__ float2 bf16x2_to_float2(u32 w) {
    return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}

// 8 bf16 (one 16-byte vector) -> 8 floats, element order preserved.
__device__ __forceinline__ void bf16x8_to_float(const uint4 r, float f[8]) {
    float2 a = bf16x2_to_float2(r.x), b = bf16x2_to_float2(r.y);
    float2 c = bf16x2_to_float2(r.z), d = bf16x2_to_float2(r.w);
    f[0] = a.x; f[1] = a.y; f[2] = b.x; f[3] = b.y;
    f[4] = c.x; f[5] = c.y; f[6] = d.x; f[7] = d.y;
}

__device__ __forceinline__ float bf16_to_float(const __nv_bfloat16* p) {
    return __bfloat162float(*p);
}

// Two floats -> two bf16 in one word, round-to-nearest-even (what ml_dtypes.astype does).
__device__ __forceinline__ u32 float2_to_bf16x2(float a, float b) {
    __nv_bfloat16 lo = __float2bfloat16_rn(a), hi = __float2bfloat16_rn(b);
    return (u32)__bfloat16_as_ushort(lo) | ((u32)__bfloat16_as_ushort(hi) << 16);
}

// Two e4m3 codes (low byte = first element) -> two floats. Exact: e4m3 fits in fp16.
// On sm_89+ this is one cvt.rn.f16x2.e4m3x2 instruction.
__device__ __forceinline__ float2 e4m3x2_to_float2(unsigned short v) {
    __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)v, __NV_E4M3);
    return __half22float2(*reinterpret_cast<__half2*>(&h));
}

// Two e4m3 codes -> half2, for multiplying into e2m1 values without rounding.
__device__ __forceinline__ __half2 e4m3x2_to_half2(unsigned short v) {
    __half2_raw h = __nv_cvt_fp8x2_to_halfraw2((__nv_fp8x2_storage_t)v, __NV_E4M3);
    return *reinterpret_cast<__half2*>(&h);
}

// One byte of two e2m1 codes (low nibble first) -> half2 of e2m1(c) x 2^-14, exactly, by bit
// placement alone: code c = s|m2 m1 m0 has fp16 bits ((c & 7) << 9) | ((c & 8) << 12)
// (magnitude bits into exponent/mantissa, sign to bit 15): codes 1..7 are 0.5..6 x 2^-14
// (code 1 the subnormal 2^-15). The high nibble lands the same way in bits 16..31.
// kernels/reference.py e2m1_half_bits and tests/test_kernels_reference.py prove it for all 16
// codes. The caller folds the 2^14 back into the float32 global scale.
__device__ __forceinline__ __half2 e2m1x2_to_half2_2m14(u32 x) {
    const u32 bits = ((x & 0x7u) << 9) | ((x & 0x8u) << 12) | ((x & 0x70u) << 21) | ((x & 0x80u) << 24);
    return *reinterpret_cast<const __half2*>(&bits);
}

// NVFP4 decoding: e2m1 codes times their e4m3 block scale, as half2 of e2m1(c) x 2^-14 x bs (exact: see
// linear.cuh FmtNVFP4). Blackwell's arch- and family-specific targets (sm_100a, sm_120a) convert the codes in
// hardware (cvt.rn.f16x2.e2m1x2, PTX ISA 8.6: one F2FP a byte) and fold the 2^-14 into the block scales once
// a vector; the other targets place the bits (e2m1x2_to_half2_2m14). Both give the same bits: bs x 2^-14 is
// exact in fp16 for every e4m3 bs and each product is one exact value either way (kernels/reference.py
// e2m1_scaled_half; tests/test_kernels_reference.py checks all 16 x 254 finite pairs).
#if defined(__CUDA_ARCH_FAMILY_SPECIFIC__) && __CUDA_ARCH_FAMILY_SPECIFIC__ >= 1000
#define E2M1_HARDWARE 1
#endif

// Two e4m3 block scales (low byte first) -> the half2 factor e2m1x2_scaled takes.
__device__ __forceinline__ __half2 e2m1_block_scales(unsigned short v) {
#ifdef E2M1_HARDWARE
    return __hmul2(e4m3x2_to_half2(v), __float2half2_rn(1.0f / 16384.0f));  // x 2^-14: exact
#else
    return e4m3x2_to_half2(v);
#endif
}

// The low byte of x (two e2m1 codes, low nibble first) times `scales` from e2m1_block_scales.
__device__ __forceinline__ __half2 e2m1x2_scaled(u32 x, __half2 scales) {
#ifdef E2M1_HARDWARE
    u32 codes;
    asm("{\n .reg .b8 byte;\n cvt.u8.u32 byte, %1;\n cvt.rn.f16x2.e2m1x2 %0, byte;\n}" : "=r"(codes) : "r"(x));
    return __hmul2(*reinterpret_cast<const __half2*>(&codes), scales);
#else
    return __hmul2(e2m1x2_to_half2_2m14(x), scales);
#endif
}

// ---- row statistics shared by rmsnorm.cu and the matvec prologues ----

// sqrt(mean(x^2) + eps) of one float32 row x[0:n] (n % 4 == 0, x 16-byte aligned), computed by
// one warp: lane sums float4 chunks lane, lane+32, ... sequentially (fmaf), then warp_sum.
// Every caller of this function gets the same bits for the same row.
__device__ __forceinline__ float row_rms(const float* __restrict__ x, int n, float eps, int lane) {
    const float4* x4 = reinterpret_cast<const float4*>(x);
    float s = 0.f;
    for (int i = lane; i < n / 4; i += 32) {
        float4 v = x4[i];
        s = fmaf(v.x, v.x, s); s = fmaf(v.y, v.y, s);
        s = fmaf(v.z, v.z, s); s = fmaf(v.w, v.w, s);
    }
    s = warp_sum(s);
    return sqrtf(__fadd_rn(__fdiv_rn(s, (float)n), eps));
}

// The normalized value as runtime/cpu_backend.rms_norm writes it: (x / rms) * weight.
__device__ __forceinline__ float rms_apply(float x, float rms, float w) {
    return __fmul_rn(__fdiv_rn(x, rms), w);
}

// silu(g) * u with silu(g) = g / (1 + exp(-g)), as the CPU backend computes it.
__device__ __forceinline__ float silu_mul(float g, float u) {
    return __fmul_rn(__fdiv_rn(g, __fadd_rn(1.0f, expf(-g))), u);
}

// ---- programmatic dependent launch (graph edges of type PROGRAMMATIC, sm_90+) ----
// pdl_trigger: the next kernel of the graph may start launching (its blocks then run their own
// preamble beside this kernel); pdl_wait: returns once every kernel this one depends on has
// completed and its writes are visible. Both are no-ops for a launch without a programmatic edge
// (plain stream launches, the host-stepped loop). Rule for every kernel: nothing before pdl_wait
// reads what an earlier kernel writes or writes what an earlier kernel reads; matvec_tile loads
// only its (immutable) weights there.
__device__ __forceinline__ void pdl_trigger() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.launch_dependents;");
#endif
}
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
    asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
// The preamble of a kernel with nothing to do before its inputs are ready.
__device__ __forceinline__ void pdl_enter() {
    pdl_trigger();
    pdl_wait();
}

// ---- attention geometry shared by attention.cu and attention_merge.cu ----
// Key positions per split: split s of a sequence covers positions [s*ATTN_SPLIT, (s+1)*ATTN_SPLIT).
#define ATTN_SPLIT 256
