// attention_decode.cu: one decode step's attention for rows of distinct sequences, split-KV
// (flash-decoding), fused: q/k norm + rope, this row's K/V into the paged cache, the attention of
// each split, and the split merge, in one launch. Two entry points, the same parameters and
// results: attention_decode for G = n_heads / n_kv_heads <= DECODE_NARROW_GROUP query heads a kv
// head (QG = 2 at a time), attention_decode_wide for more (QG = 4 at a time, G / 4 rounds); each
// keeps only its own registers (kernels/geometry.py decode_kernel picks).
//
// Splits, from the row's position p and the launch's max_splits only (never from the batch, so
// a row's bits do not depend on what else runs): keys 0..p in chunks of DECODE_KEYS,
//   chunks = p / DECODE_KEYS + 1,  cap = min(max_splits, DECODE_MAX_SPLITS),
//   per_split = ceil(chunks / cap) chunks a split,  n = ceil(chunks / per_split) splits;
// split s covers keys [s * per_split * DECODE_KEYS, min((s + 1) * per_split * DECODE_KEYS, p + 1)).
// (kernels/geometry.py decode_split_keys is the same rule.)
//
// Block (t, kvh, split), DECODE_THREADS threads; lane c of a key group owns dims c*8 .. c*8+7
// (LPK = head_dim / 8 lanes a key, one 16-byte bf16 load each; KPP = 32 / LPK keys a warp pass);
// in a chunk warp w takes keys w*16 .. w*16+15:
//   0. every block (those that exit at once too) asks for its share of prefetch[0 ..
//      prefetch_bytes) into L2, one prefetch a 128-byte line: the launcher passes the weights the
//      step reads next, which stream in while attention, latency-bound, leaves the memory system
//      idle. Immutable bytes: issued before pdl_wait; null / 0: none.
//   1. the split's first chunk: its pages, then every K and V load issued (all but key p), in flight
//      during 2-3 (a round of 3 issues the next round's before its merge);
//   2. the block of the row's last split (n - 1, which holds key p) norms and rotates k[t, kvh]
//      (rope.cuh) into shared memory as bf16, with bf16(v[t, kvh]) beside it, and stores both at
//      (block_table[seq, p / page_size], p % page_size); its attention takes key p from shared
//      memory (the same bits the cache holds), so no block reads a position this launch writes;
//   3. per round of QG query heads (decode_split.cuh): q staged, normed and rotated in shared
//      memory, then held in registers; per chunk (later chunks: their loads issued first) scores
//      summed over the key's lanes (xor butterfly), online softmax in registers (running max m, sum
//      l, o rescaled by exp(m_old - m_new)); each warp's (m, l, o) summed over its key groups, then
//      the 4 warps merged in order 0..3:
//        M = max_w m_w, c_w = exp(m_w - M), L = sum_w c_w l_w, o[d] = sum_w c_w o_w[d]
//      n == 1: out = o / L directly; else part_o[t, h, split] = o, part_ml[t, h, split] = (M, L);
//   4. n > 1: __threadfence, then an atomic count per (t, kvh) in counters; the block that counts
//      last (every other split's partials are then visible) resets the count to 0 for the next
//      launch and merges, a warp a (query head, 32 dims), split s's (m, l) in lane s, reading with
//      __ldcg, splits in order 0..n-1:
//        M = max_s m_s, w_s = exp(m_s - M), L = sum_s w_s l_s, out[d] = (sum_s w_s o_s[d]) / L
// Padding rows (seq < 0 or pos < 0): split 0 writes zeros to out and nothing else happens.
// The launcher's invariants: keys 0..p of a live row lie on assigned pages (block_table >= 0), and the
// page holding a live row's own position p is no other live row's (prefix pages shared between
// sequences are full pages, written before).
//
// q, k, v: float32 raw projections [T, q_stride] / [T, k_stride] / [T, v_stride] (k is rewritten
// in place by the writer block, normed + rotated; q is only read); seq, pos: int32 [T], at most
// one row per sequence; block_table: int32 [max_seqs, max_pages_per_seq]; k_cache, v_cache: bf16
// [pages, page_size, n_kv_heads, head_dim]; q_norm_w, k_norm_w: bf16 [head_dim] or null; rope:
// float32 [T, head_dim / 2, 2], the step's (cos, sin) table (embedding.cu); part_o: float32 [T,
// n_heads, max_splits, head_dim]; part_ml: float32 [T, n_heads, max_splits, 2]; counters: int32
// [T, n_kv_heads], zero before the launch and left zero after it; out: float32 [T, out_stride],
// head h at columns h * head_dim (the o_proj input). head_dim in {32, 64, 128}. prefetch: any
// bytes (null with prefetch_bytes 0).
// Launch: grid (T, n_kv_heads, max_splits), block DECODE_THREADS; max_splits >= 1.
#include "decode_split.cuh"

#define L2_LINE 128  // bytes one prefetch asks for

// The whole kernel for QG query heads at a time (the entry points below).
template <int QG>
__device__ __forceinline__ void decode_row(
    const float* q, int q_stride, float* k, int k_stride, const float* v, int v_stride, const int* seq,
    const int* pos, const int* block_table, int max_pages_per_seq, int page_size, __nv_bfloat16* k_cache,
    __nv_bfloat16* v_cache, const __nv_bfloat16* q_norm_w, const __nv_bfloat16* k_norm_w, const float* rope,
    float eps, int n_heads, int n_kv_heads, int head_dim, float sm_scale, int max_splits, float* part_o,
    float* part_ml, int* counters, float* out, int out_stride, const u8* prefetch, int prefetch_bytes, int T) {
    {  // 0. L2 prefetch, a grid-stride loop over 128-byte lines
        const int blocks = gridDim.x * gridDim.y * gridDim.z;
        const int block = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x;
        for (long long off = ((long long)block * DECODE_THREADS + threadIdx.x) * L2_LINE; off < prefetch_bytes;
             off += (long long)blocks * DECODE_THREADS * L2_LINE)
            asm volatile("prefetch.global.L2 [%0];" ::"l"(prefetch + off));
    }
    pdl_enter();
    __shared__ __align__(16) __nv_bfloat16 own_k[ATTN_MAX_HEAD_DIM], own_v[ATTN_MAX_HEAD_DIM];
    __shared__ int is_last;

    const int t = blockIdx.x, kvh = blockIdx.y, split = blockIdx.z, tid = threadIdx.x;
    const int lane = tid & 31, warp = tid >> 5;
    if (t >= T) return;
    const int G = n_heads / n_kv_heads, s = seq[t], p = pos[t];
    if (s < 0 || p < 0) {
        if (split == 0)
            for (int i = tid; i < G * head_dim; i += DECODE_THREADS)
                out[(size_t)t * out_stride + (size_t)kvh * G * head_dim + i] = 0.f;
        return;
    }
    const int chunks = p / DECODE_KEYS + 1, cap = min(max_splits, DECODE_MAX_SPLITS);
    const int per_split = (chunks + cap - 1) / cap, n = (chunks + per_split - 1) / per_split;
    if (split >= n) return;
    const int k0 = split * per_split * DECODE_KEYS, k1 = min(k0 + per_split * DECODE_KEYS, p + 1);
    const int LPK = head_dim / 8, KPP = 32 / LPK, passes = DECODE_WARP_KEYS / KPP;  // passes: 8, 4, 2
    const int g = lane / LPK, c = lane - g * LPK;
    const int page_shift = (page_size & (page_size - 1)) == 0 ? __ffs(page_size) - 1 : -1;
    const DecodeBlock b{t, kvh, split, n, p, k0, k1, G, LPK, KPP, passes, g, c, warp, lane, n_heads, n_kv_heads,
                        head_dim, page_size, page_shift, block_table + (size_t)s * max_pages_per_seq,
                        rope + (size_t)t * head_dim};

    // 1. the first chunk's loads, in flight while the row's own K/V and q are prepared
    uint4 kr[DECODE_PASSES], vr[DECODE_PASSES];
    load_chunk(kr, vr, k0 + warp * DECODE_WARP_KEYS + g, b, k_cache, v_cache);
    if (split == n - 1) {  // 2. this row's K (normed, rotated) and V: shared memory, then the cache
        const long long row = kv_row_offset(block_table, max_pages_per_seq, page_size, s, p, n_kv_heads, head_dim,
                                            kvh);
        const int vecs = head_dim / 8;  // 16-byte vectors of a row
        if (warp == 0) {
            warp_norm_rope(k + (size_t)t * k_stride + (size_t)kvh * head_dim, k_norm_w, b.rope_row, eps,
                           head_dim, lane, own_k);
            __syncwarp();
            if (row >= 0 && lane < vecs)
                reinterpret_cast<uint4*>(k_cache + row)[lane] = reinterpret_cast<const uint4*>(own_k)[lane];
        }
        if (warp == 1) {
            const float* vh = v + (size_t)t * v_stride + (size_t)kvh * head_dim;
            for (int i = lane; i < head_dim; i += 32) own_v[i] = __float2bfloat16_rn(vh[i]);
            __syncwarp();
            if (row >= 0 && lane < vecs)
                reinterpret_cast<uint4*>(v_cache + row)[lane] = reinterpret_cast<const uint4*>(own_v)[lane];
        }
    }  // own_k / own_v are read after the barriers below

    // 3. attention over keys [k0, k1), QG query heads a round (decode_split.cuh)
    split_attention<QG>(b, kr, vr, own_k, own_v, q, q_stride, q_norm_w, eps, k_cache, v_cache, sm_scale, max_splits,
                        part_o, part_ml, out, out_stride);
    if (n == 1) return;

    // 4. merge, by the last block of (t, kvh) to finish
    __threadfence();  // every thread's partials visible device-wide before the block counts
    __syncthreads();  // ... and to this block's threads
    if (tid == 0) {
        int* cnt = counters + (size_t)t * n_kv_heads + kvh;
        const int done = atomicAdd(cnt, 1);
        is_last = done == n - 1;
        if (is_last) *cnt = 0;  // every split has counted: reset for the next launch
    }
    __syncthreads();
    if (!is_last) return;
    __threadfence();  // the other splits' partials are read after their counts were seen
    const int cols = head_dim / 32;  // 32-dim column blocks of a head
    for (int j = warp; j < G * cols; j += DECODE_WARPS) {  // a warp a (query head, 32 dims); split sp in lane sp
        const int hq = j / cols, d = (j - hq * cols) * 32 + lane, h = kvh * G + hq;
        const size_t base = ((size_t)t * n_heads + h) * max_splits;
        const float ms = lane < n ? __ldcg(part_ml + (base + lane) * 2) : NEG_INF;
        const float ls = lane < n ? __ldcg(part_ml + (base + lane) * 2 + 1) : 0.f;
        const float M = warp_max(ms);
        const float w = lane < n ? expf(ms - M) : 0.f;  // every split's m is finite
        float L = 0.f, o = 0.f;
        for (int sp = 0; sp < n; ++sp) {
            const float ws = __shfl_sync(FULL_MASK, w, sp);
            L = fmaf(ws, __shfl_sync(FULL_MASK, ls, sp), L);
            o = fmaf(ws, __ldcg(part_o + (base + sp) * head_dim + d), o);
        }
        out[(size_t)t * out_stride + (size_t)h * head_dim + d] = __fdiv_rn(o, L);
    }
}

// 3 blocks an SM (<= 170 registers: ptxas keeps them without spilling; left to itself it spilled 8-16 bytes)
extern "C" __global__ void __launch_bounds__(DECODE_THREADS, 3)
attention_decode(const float* q, int q_stride, float* k, int k_stride, const float* v,
                 int v_stride, const int* seq, const int* pos, const int* block_table,
                 int max_pages_per_seq, int page_size, __nv_bfloat16* k_cache,
                 __nv_bfloat16* v_cache, const __nv_bfloat16* q_norm_w,
                 const __nv_bfloat16* k_norm_w, const float* rope, float eps, int n_heads,
                 int n_kv_heads, int head_dim, float sm_scale, int max_splits, float* part_o,
                 float* part_ml, int* counters, float* out, int out_stride, const u8* prefetch,
                 int prefetch_bytes, int T) {
    decode_row<DECODE_NARROW_GROUP>(q, q_stride, k, k_stride, v, v_stride, seq, pos, block_table, max_pages_per_seq,
                                    page_size, k_cache, v_cache, q_norm_w, k_norm_w, rope, eps, n_heads,
                                    n_kv_heads, head_dim, sm_scale, max_splits, part_o, part_ml, counters, out,
                                    out_stride, prefetch, prefetch_bytes, T);
}

extern "C" __global__ void __launch_bounds__(DECODE_THREADS, 2)
attention_decode_wide(const float* q, int q_stride, float* k, int k_stride, const float* v,
                      int v_stride, const int* seq, const int* pos, const int* block_table,
                      int max_pages_per_seq, int page_size, __nv_bfloat16* k_cache,
                      __nv_bfloat16* v_cache, const __nv_bfloat16* q_norm_w,
                      const __nv_bfloat16* k_norm_w, const float* rope, float eps, int n_heads,
                      int n_kv_heads, int head_dim, float sm_scale, int max_splits, float* part_o,
                      float* part_ml, int* counters, float* out, int out_stride, const u8* prefetch,
                      int prefetch_bytes, int T) {
    decode_row<4>(q, q_stride, k, k_stride, v, v_stride, seq, pos, block_table, max_pages_per_seq, page_size,
                  k_cache, v_cache, q_norm_w, k_norm_w, rope, eps, n_heads, n_kv_heads, head_dim, sm_scale,
                  max_splits, part_o, part_ml, counters, out, out_stride, prefetch, prefetch_bytes, T);
}
