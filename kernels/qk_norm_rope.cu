// qk_norm_rope.cu: per-head RMSNorm of q and k (skipped for a null weight) and rotary
// embedding in place (rope.cuh), with K and V appended to the paged bf16 cache in the same
// launch (prefill rows; a decode row does all of this inside attention_decode.cu).
//
//   q[t, h]   <- rope(norm(q[t, h]))                 h < n_heads
//   k[t, h]   <- rope(norm(k[t, h]))                 h < n_kv_heads
//   k_cache[page, slot, h, :] = bf16(k[t, h]),  v_cache[page, slot, h, :] = bf16(v[t, h])
//   page = block_table[seq[t], pos[t] / page_size], slot = pos[t] % page_size (round to
//   nearest even; rows with seq < 0 or an unassigned page (< 0) write no cache row)
//
// q: float32 [T, q_stride], head h at columns h * head_dim; k, v: float32 [T, k_stride] /
// [T, v_stride]; seq, pos: int32 [T]; block_table: int32 [max_seqs, max_pages_per_seq];
// q_norm_w, k_norm_w: bf16 [head_dim] or null; rope: float32 [T, head_dim / 2, 2], the step's
// (cos, sin) table (embedding.cu; llama3 scaling is the host's, in inv_freq); k_cache, v_cache: bf16 [pages, page_size, n_kv_heads, head_dim]
// or null (then q and k are only normed and rotated). head_dim in {32, 64, 128, 256}.
// One warp per (row, head): warps of the q heads, then of the kv heads (which also store V).
// Launch: grid (ceil((n_heads + n_kv_heads) / 4), T), block ROPE_THREADS.
#include "rope.cuh"

#define ROPE_THREADS 128
#define ROPE_HEADS_PER_BLOCK 4

extern "C" __global__ void __launch_bounds__(ROPE_THREADS)
qk_norm_rope_kv(float* q, int q_stride, float* k, int k_stride, const float* v, int v_stride,
                const int* seq, const int* pos, const int* block_table, int max_pages_per_seq,
                int page_size, const __nv_bfloat16* q_norm_w, const __nv_bfloat16* k_norm_w,
                const float* rope, float eps, int T, int n_heads, int n_kv_heads,
                int head_dim, __nv_bfloat16* k_cache, __nv_bfloat16* v_cache) {
    pdl_enter();
    const int lane = threadIdx.x & 31;
    const int t = blockIdx.y, hh = blockIdx.x * ROPE_HEADS_PER_BLOCK + (threadIdx.x >> 5);
    if (t >= T || hh >= n_heads + n_kv_heads) return;
    const bool is_q = hh < n_heads;
    const int h = is_q ? hh : hh - n_heads;
    const long long row = is_q || k_cache == nullptr ? -1 : kv_row_offset(block_table, max_pages_per_seq,
                                                                           page_size, seq[t], pos[t],
                                                                           n_kv_heads, head_dim, h);
    float* x = is_q ? q + (size_t)t * q_stride + (size_t)h * head_dim
                    : k + (size_t)t * k_stride + (size_t)h * head_dim;
    warp_norm_rope(x, is_q ? q_norm_w : k_norm_w, rope + (size_t)t * head_dim, eps, head_dim, lane,
                   row < 0 ? nullptr : k_cache + row);
    if (row >= 0) {  // the kv heads' warps also store V
        const float* vh = v + (size_t)t * v_stride + (size_t)h * head_dim;
        for (int i = lane; i < head_dim; i += 32) v_cache[row + i] = __float2bfloat16_rn(vh[i]);
    }
}
