// attention_decode.cu: one decode step's attention for rows of distinct sequences, fused:
// q/k norm + rope, this row's K/V into the paged cache, split attention, and the split merge,
// in one launch (before: qk_norm_rope, kv_write, attention partial, attention_merge).
//
// Block (t, kvh, split), as attention.cuh's tile of one row:
//   1. the block whose split is the row's last (n - 1, n = min(pos / ATTN_SPLIT + 1,
//      max_splits)) norms and rotates k[t, kvh] (rope.cuh), stores bf16(k) and bf16(v[t, kvh])
//      at (block_table[seq, pos / page_size], pos % page_size); only that block reads position
//      pos, after a __syncthreads (__ldcg loads, not __ldg: the cache changes in this launch);
//   2. stages q[t, heads of kvh], norms and rotates them in shared memory, attends over its
//      split, writes part_o / part_ml (attention.cuh);
//   3. n == 1: the block writes out directly (w = 1 in the formula below: the same bits, without
//      the round trip through part_o). n > 1: __threadfence, then an atomic count per (t, kvh)
//      in counters; the block that counts last (every other split's partials are then
//      visible) resets the count to 0 for the next launch and merges, reading with __ldcg:
//        M = max_s m_s, w_s = exp(m_s - M), L = sum_s w_s l_s, out[d] = (sum_s w_s o_s[d]) / L
//      splits in order 0..n-1, the formula of attention_merge.cu (same bits as the prefill path).
// Padding rows (seq < 0 or pos < 0): split 0 writes zeros to out and nothing else happens.
// 0. Before anything else, every block (those that exit at once too) asks for its share of
// prefetch[0 .. prefetch_bytes) into L2, one prefetch a 128-byte line: the launcher passes the
// weights the step reads next (this layer's o_proj, gate|up, down, the next layer's q|k|v), which
// stream in while attention, latency-bound at short contexts, leaves the memory system idle.
// Immutable bytes: issued before pdl_wait; null / 0: none.
//
// q, k, v: float32 raw projections [T, q_stride] / [T, k_stride] / [T, v_stride] (q and k are
// rewritten in place: k normed + rotated by the writer block; q is only read); seq, pos: int32
// [T], at most one row per sequence; block_table: int32 [max_seqs, max_pages_per_seq];
// k_cache, v_cache: bf16 [pages, page_size, n_kv_heads, head_dim]; q_norm_w, k_norm_w: bf16
// [head_dim] or null; inv_freq: float32 [head_dim / 2]; part_o: float32 [T, n_heads,
// max_splits, head_dim]; part_ml: float32 [T, n_heads, max_splits, 2]; counters: int32 [T,
// n_kv_heads], zero before the launch and left zero after it; out: float32 [T, out_stride],
// head h at columns h * head_dim (the o_proj input). head_dim in {32, 64, 128}. prefetch: any
// bytes (null with prefetch_bytes 0).
// Launch: grid (T, n_kv_heads, max_splits), block ATTN_THREADS.
#include "attention.cuh"

#define L2_LINE 128  // bytes a prefetch asks for

extern "C" __global__ void __launch_bounds__(ATTN_THREADS)
attention_decode(const float* q, int q_stride, float* k, int k_stride, const float* v,
                 int v_stride, const int* seq, const int* pos, const int* block_table,
                 int max_pages_per_seq, int page_size, __nv_bfloat16* k_cache,
                 __nv_bfloat16* v_cache, const __nv_bfloat16* q_norm_w,
                 const __nv_bfloat16* k_norm_w, const float* inv_freq, float eps, int n_heads,
                 int n_kv_heads, int head_dim, float sm_scale, int max_splits, float* part_o,
                 float* part_ml, int* counters, float* out, int out_stride, const u8* prefetch,
                 int prefetch_bytes, int T) {
    {  // 0. L2 prefetch, a grid-stride loop over 128-byte lines
        const int blocks = gridDim.x * gridDim.y * gridDim.z;
        const int block = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
        for (long long off = ((long long)block * ATTN_THREADS + threadIdx.x) * L2_LINE; off < prefetch_bytes;
             off += (long long)blocks * ATTN_THREADS * L2_LINE)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(prefetch + off));
    }
    pdl_enter();
    __shared__ int is_last;
    const int t = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z, tid = threadIdx.x;
    if (t >= T) return;
    const int G = n_heads / n_kv_heads, s = seq[t], p = pos[t];
    if (s < 0 || p < 0) {
        if (split == 0)
            for (int i = tid; i < G * head_dim; i += ATTN_THREADS)
                out[(size_t)t * out_stride + (size_t)kvh * G * head_dim + i] = 0.f;
        return;
    }
    const int n = min(p / ATTN_SPLIT + 1, max_splits);
    if (split >= n) return;
    if (split == n - 1) {  // 1. this row's K (normed, rotated) and V into the cache
        const long long row = kv_row_offset(block_table, max_pages_per_seq, page_size, s, p,
                                            n_kv_heads, head_dim, kvh);
        const int warp = tid >> 5, lane = tid & 31;
        if (row >= 0 && warp == 0)
            warp_norm_rope(k + (size_t)t * k_stride + (size_t)kvh * head_dim, k_norm_w, inv_freq, p,
                           eps, head_dim, lane, k_cache + row);
        if (row >= 0 && warp == 1) {
            const float* vh = v + (size_t)t * v_stride + (size_t)kvh * head_dim;
            for (int i = lane; i < head_dim; i += 32) v_cache[row + i] = __float2bfloat16_rn(vh[i]);
        }
        __syncthreads();  // the cache row is visible to the block's loads in step 2
    }
    // 2. q norm + rope in shared memory, attention over this split; a row of one split writes
    // its output there (the merge's formula with weight 1, same bits) and is done. G <= 2 (most
    // GQA models) runs a 2-vector chunk: a quarter of the unrolled code of the 8-vector one.
    float* direct = n == 1 ? out : nullptr;
    if (G <= 2)
        attn_tile<true, false, 2>(t, 1, q, q_stride, seq, pos, block_table, max_pages_per_seq, page_size,
                                  k_cache, v_cache, n_heads, n_kv_heads, head_dim, sm_scale, max_splits,
                                  part_o, part_ml, q_norm_w, inv_freq, eps, direct, out_stride);
    else
        attn_tile<true, false, ATTN_QCHUNK>(t, 1, q, q_stride, seq, pos, block_table, max_pages_per_seq,
                                            page_size, k_cache, v_cache, n_heads, n_kv_heads, head_dim, sm_scale,
                                            max_splits, part_o, part_ml, q_norm_w, inv_freq, eps, direct,
                                            out_stride);
    if (n == 1) return;
    // 3. merge, by the last block of (t, kvh) to finish
    __threadfence();  // every thread's partials visible device-wide before the block counts
    __syncthreads();  // ... and to this block's threads
    if (tid == 0) {
        int* c = counters + (size_t)t * n_kv_heads + kvh;
        const int done = atomicAdd(c, 1);
        is_last = done == n - 1;
        if (is_last) *c = 0;  // every split has counted: reset for the next launch
    }
    __syncthreads();
    if (!is_last) return;
    __threadfence();  // the other splits' partials are read after their counts were seen
    for (int i = tid; i < G * head_dim; i += ATTN_THREADS) {
        const int h = kvh * G + i / head_dim, d = i - (i / head_dim) * head_dim;
        const size_t base = ((size_t)t * n_heads + h) * max_splits;
        float M = NEG_INF;
        for (int sp = 0; sp < n; ++sp) M = fmaxf(M, __ldcg(part_ml + (base + sp) * 2));
        float L = 0.f, o = 0.f;
        for (int sp = 0; sp < n; ++sp) {
            const float m = __ldcg(part_ml + (base + sp) * 2), l = __ldcg(part_ml + (base + sp) * 2 + 1);
            const float w = m == NEG_INF ? 0.f : expf(m - M);
            L = fmaf(w, l, L);
            o = fmaf(w, __ldcg(part_o + (base + sp) * head_dim + d), o);
        }
        out[(size_t)t * out_stride + (size_t)h * head_dim + d] = __fdiv_rn(o, L);
    }
}
