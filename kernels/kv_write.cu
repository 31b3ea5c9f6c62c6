// kv_write.cu: append each row's K and V to the paged cache as bf16 (round to nearest even).
//
//   page = block_table[seq[t], pos[t] / page_size], slot = pos[t] % page_size
//   k_cache[page, slot, h, d] = bf16(k[t, h * head_dim + d])   (same for v)
//
// k, v: float32 [T, k_stride] / [T, v_stride] (kv_heads * head_dim columns used);
// seq, pos: int32 [T] (seq < 0: padding row, skipped; a negative page id is skipped too);
// block_table: int32 [max_seqs, max_pages_per_seq];
// k_cache, v_cache: bf16 [pages, page_size, kv_heads, head_dim].
// (kv_heads * head_dim) % 8 == 0: each thread converts 8 values and stores 16 bytes.
// Launch: grid (T), block KV_THREADS.
#include "common.cuh"

#define KV_THREADS 128

extern "C" __global__ void __launch_bounds__(KV_THREADS)
kv_write(const float* k, int k_stride, const float* v, int v_stride, const int* seq,
         const int* pos, const int* block_table, int max_pages_per_seq, int page_size,
         int n_kv_heads, int head_dim, __nv_bfloat16* k_cache, __nv_bfloat16* v_cache, int T) {
    const int t = blockIdx.x;
    if (t >= T) return;
    const int s = seq[t], p = pos[t];
    if (s < 0 || p < 0) return;
    const int page = block_table[(size_t)s * max_pages_per_seq + p / page_size];
    if (page < 0) return;
    const int width = n_kv_heads * head_dim;
    const size_t base = ((size_t)page * page_size + p % page_size) * width;
    for (int i = threadIdx.x; i < width / 8; i += KV_THREADS) {
        const float4* k4 = reinterpret_cast<const float4*>(k + (size_t)t * k_stride) + 2 * i;
        const float4* v4 = reinterpret_cast<const float4*>(v + (size_t)t * v_stride) + 2 * i;
        const float4 ka = k4[0], kb = k4[1], va = v4[0], vb = v4[1];
        reinterpret_cast<uint4*>(k_cache + base)[i] =
            make_uint4(float2_to_bf16x2(ka.x, ka.y), float2_to_bf16x2(ka.z, ka.w),
                       float2_to_bf16x2(kb.x, kb.y), float2_to_bf16x2(kb.z, kb.w));
        reinterpret_cast<uint4*>(v_cache + base)[i] =
            make_uint4(float2_to_bf16x2(va.x, va.y), float2_to_bf16x2(va.z, va.w),
                       float2_to_bf16x2(vb.x, vb.y), float2_to_bf16x2(vb.z, vb.w));
    }
}
