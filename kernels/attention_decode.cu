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
//   3. per round of QG query heads: q staged, normed and rotated in shared memory, then held in
//      registers; per chunk (later chunks: their loads issued first) scores summed over the key's
//      lanes (xor butterfly), online softmax in registers (running max m, sum l, o rescaled by
//      exp(m_old - m_new)); each warp's (m, l, o) summed over its key groups, then the 4 warps
//      merged in order 0..3:
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
#include "attention.cuh"
#include "rope.cuh"

// DECODE_KEYS: keys of one chunk (two pages of 32); DECODE_MAX_SPLITS: a row's splits at most (2,048
// keys in one-chunk splits; <= 32: the merge holds a split a lane); L2_LINE: bytes one prefetch asks for.
#define DECODE_KEYS 64
#define DECODE_MAX_SPLITS 32
#define DECODE_NARROW_GROUP 2
#define DECODE_THREADS 128
#define DECODE_WARPS 4
#define L2_LINE 128

constexpr int DECODE_WARP_KEYS = DECODE_KEYS / DECODE_WARPS;  // a warp's keys of a chunk
constexpr int DECODE_PASSES = DECODE_WARP_KEYS / 2;           // its passes over them at head_dim 128
static_assert(DECODE_WARPS * 32 == DECODE_THREADS && DECODE_WARP_KEYS * DECODE_WARPS == DECODE_KEYS,
              "a chunk's keys split evenly over the block's warps");
static_assert(DECODE_MAX_SPLITS <= 32 && ATTN_MAX_HEAD_DIM == 128, "the merge and DECODE_PASSES assume these");

// This lane's K/V of the chunk whose first key for it is ``base``: keys base + i * KPP, i < passes,
// below k1, other than p (the row's own key, in shared memory); zeros elsewhere (and for a key on an
// unassigned page). Every page first (independent loads), then every K and V load of the chunk.
__device__ __forceinline__ void load_chunk(uint4 (&kr)[DECODE_PASSES], uint4 (&vr)[DECODE_PASSES], int base,
                                           int KPP, int passes, int k1, int p, const __nv_bfloat16* k_cache,
                                           const __nv_bfloat16* v_cache, const int* bt_row, int page_size,
                                           int page_shift, int n_kv_heads, int head_dim, int kvh, int c) {
    int page[DECODE_PASSES];
#pragma unroll
    for (int i = 0; i < DECODE_PASSES; ++i) {
        const int key = base + i * KPP;
        const bool in = i < passes && key < k1 && key != p;
        page[i] = in ? __ldg(bt_row + (page_shift >= 0 ? key >> page_shift : key / page_size)) : -1;
    }
#pragma unroll
    for (int i = 0; i < DECODE_PASSES; ++i) {
        const int key = base + i * KPP, slot = page_shift >= 0 ? key & (page_size - 1) : key % page_size;
        const size_t off = (((size_t)page[i] * page_size + slot) * n_kv_heads + kvh) * head_dim + c * 8;
        const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
        kr[i] = page[i] >= 0 ? __ldcg(reinterpret_cast<const uint4*>(k_cache + off)) : zero;
        vr[i] = page[i] >= 0 ? __ldcg(reinterpret_cast<const uint4*>(v_cache + off)) : zero;
    }
}

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
    __shared__ __align__(16) float qs[QG][ATTN_MAX_HEAD_DIM];
    __shared__ __align__(16) float wo[DECODE_WARPS][QG][ATTN_MAX_HEAD_DIM];
    __shared__ float wml[DECODE_WARPS][QG][2];
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
    const int* bt_row = block_table + (size_t)s * max_pages_per_seq;
    const float* rope_row = rope + (size_t)t * head_dim;  // the row's head_dim / 2 (cos, sin) pairs
    // the wide kernel (several rounds where G > 4) issues a round's first chunk during the previous round; the
    // narrow one, launched for G <= 2 (one round), keeps those registers free
    constexpr bool AHEAD = QG > DECODE_NARROW_GROUP;

    // 1. the first chunk's loads, in flight while the row's own K/V and q are prepared
    uint4 kr[DECODE_PASSES], vr[DECODE_PASSES];
    load_chunk(kr, vr, k0 + warp * DECODE_WARP_KEYS + g, KPP, passes, k1, p, k_cache, v_cache, bt_row, page_size,
               page_shift, n_kv_heads, head_dim, kvh, c);
    if (split == n - 1) {  // 2. this row's K (normed, rotated) and V: shared memory, then the cache
        const long long row = kv_row_offset(block_table, max_pages_per_seq, page_size, s, p, n_kv_heads, head_dim,
                                            kvh);
        const int vecs = head_dim / 8;  // 16-byte vectors of a row
        if (warp == 0) {
            warp_norm_rope(k + (size_t)t * k_stride + (size_t)kvh * head_dim, k_norm_w, rope_row, eps, head_dim,
                           lane, own_k);
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

    // 3. attention over keys [k0, k1), QG query heads a round
    for (int q0 = 0; q0 < G; q0 += QG) {
        const int nq = min(QG, G - q0);
        __syncthreads();  // the previous round is done with qs, wo, wml
        for (int i = tid; i < nq * head_dim; i += DECODE_THREADS) {
            const int qi = i / head_dim, d = i - qi * head_dim;
            qs[qi][d] = q[(size_t)t * q_stride + (size_t)(kvh * G + q0 + qi) * head_dim + d];
        }
        __syncthreads();
        for (int qi = warp; qi < nq; qi += DECODE_WARPS)
            warp_norm_rope(qs[qi], q_norm_w, rope_row, eps, head_dim, lane, nullptr);
        __syncthreads();
        float qr[QG][8], m[QG], l[QG], acc[QG][8];
#pragma unroll
        for (int qi = 0; qi < QG; ++qi) {  // heads past nq: zeros (their results are never written)
            const float4 z = make_float4(0.f, 0.f, 0.f, 0.f);
            const float4 a = qi < nq ? *reinterpret_cast<const float4*>(&qs[qi][c * 8]) : z;
            const float4 b = qi < nq ? *reinterpret_cast<const float4*>(&qs[qi][c * 8 + 4]) : z;
            qr[qi][0] = a.x; qr[qi][1] = a.y; qr[qi][2] = a.z; qr[qi][3] = a.w;
            qr[qi][4] = b.x; qr[qi][5] = b.y; qr[qi][6] = b.z; qr[qi][7] = b.w;
            m[qi] = NEG_INF;
            l[qi] = 0.f;
#pragma unroll
            for (int d = 0; d < 8; ++d) acc[qi][d] = 0.f;
        }

        for (int c0 = k0; c0 < k1; c0 += DECODE_KEYS) {  // the split's chunks (one, up to 2,048 keys)
            const int base = c0 + warp * DECODE_WARP_KEYS + g;  // this lane's key of pass i: base + i * KPP
            if (c0 != k0 || (q0 != 0 && !AHEAD))  // else issued before this round's q
                load_chunk(kr, vr, base, KPP, passes, k1, p, k_cache, v_cache, bt_row, page_size, page_shift,
                           n_kv_heads, head_dim, kvh, c);
#pragma unroll
            for (int i = 0; i < DECODE_PASSES; ++i)  // the row's own key (the writer block's last chunk only)
                if (i < passes && base + i * KPP == p) {
                    kr[i] = reinterpret_cast<const uint4*>(own_k)[c];
                    vr[i] = reinterpret_cast<const uint4*>(own_v)[c];
                }
            float sc[QG][DECODE_PASSES];  // scores, -inf past k1
#pragma unroll
            for (int i = 0; i < DECODE_PASSES; ++i) {
                const bool in = i < passes && base + i * KPP < k1;
                if (i >= passes) {  // head_dim < 128: fewer passes (block-uniform)
#pragma unroll
                    for (int qi = 0; qi < QG; ++qi) sc[qi][i] = NEG_INF;
                    continue;
                }
                float kf[8];
                bf16x8_to_float(kr[i], kf);
#pragma unroll
                for (int qi = 0; qi < QG; ++qi) {
                    float d = 0.f;
#pragma unroll
                    for (int e = 0; e < 8; ++e) d = fmaf(qr[qi][e], kf[e], d);
                    for (int off = LPK / 2; off > 0; off >>= 1) d += __shfl_xor_sync(FULL_MASK, d, off);
                    sc[qi][i] = in ? __fmul_rn(d, sm_scale) : NEG_INF;
                }
            }
#pragma unroll
            for (int qi = 0; qi < QG; ++qi) {  // online softmax: the warp's running max over its keys
                float mc = m[qi];
#pragma unroll
                for (int i = 0; i < DECODE_PASSES; ++i) mc = fmaxf(mc, sc[qi][i]);
                for (int off = LPK; off < 32; off <<= 1) mc = fmaxf(mc, __shfl_xor_sync(FULL_MASK, mc, off));
                const float alpha = m[qi] == NEG_INF ? 0.f : expf(m[qi] - mc);  // mc finite where m is
                m[qi] = mc;
                float ls = 0.f;
#pragma unroll
                for (int i = 0; i < DECODE_PASSES; ++i) {
                    sc[qi][i] = sc[qi][i] == NEG_INF ? 0.f : expf(sc[qi][i] - mc);  // now probabilities
                    ls += sc[qi][i];
                }
                l[qi] = fmaf(l[qi], alpha, ls);
#pragma unroll
                for (int d = 0; d < 8; ++d) acc[qi][d] *= alpha;
            }
#pragma unroll
            for (int i = 0; i < DECODE_PASSES; ++i) {
                if (i >= passes) break;
                float vf[8];
                bf16x8_to_float(vr[i], vf);  // zeros past k1, where the probability is 0 too
#pragma unroll
                for (int qi = 0; qi < QG; ++qi)
#pragma unroll
                    for (int d = 0; d < 8; ++d) acc[qi][d] = fmaf(sc[qi][i], vf[d], acc[qi][d]);
            }
        }

        if (AHEAD && q0 + QG < G)  // the next round's first chunk, in flight during this round's merge and q
            load_chunk(kr, vr, k0 + warp * DECODE_WARP_KEYS + g, KPP, passes, k1, p, k_cache, v_cache, bt_row,
                       page_size, page_shift, n_kv_heads, head_dim, kvh, c);

        // the warp's (m, l, o): l and o summed over its key groups (lanes c, c + LPK, ...)
#pragma unroll
        for (int qi = 0; qi < QG; ++qi) {
            if (qi >= nq) break;
            float lw = l[qi];
            for (int off = LPK; off < 32; off <<= 1) lw += __shfl_xor_sync(FULL_MASK, lw, off);
#pragma unroll
            for (int d = 0; d < 8; ++d)
                for (int off = LPK; off < 32; off <<= 1) acc[qi][d] += __shfl_xor_sync(FULL_MASK, acc[qi][d], off);
            if (lane < LPK) {
                *reinterpret_cast<float4*>(&wo[warp][qi][c * 8]) =
                    make_float4(acc[qi][0], acc[qi][1], acc[qi][2], acc[qi][3]);
                *reinterpret_cast<float4*>(&wo[warp][qi][c * 8 + 4]) =
                    make_float4(acc[qi][4], acc[qi][5], acc[qi][6], acc[qi][7]);
            }
            if (lane == 0) {
                wml[warp][qi][0] = m[qi];
                wml[warp][qi][1] = lw;
            }
        }
        __syncthreads();
        // the block's (M, L, o): warps 0..3 in order (warp 0 always holds key k0, so M is finite)
        for (int i = tid; i < nq * head_dim; i += DECODE_THREADS) {
            const int qi = i / head_dim, d = i - qi * head_dim, h = kvh * G + q0 + qi;
            float M = NEG_INF;
#pragma unroll
            for (int w = 0; w < DECODE_WARPS; ++w) M = fmaxf(M, wml[w][qi][0]);
            float L = 0.f, o = 0.f;
#pragma unroll
            for (int w = 0; w < DECODE_WARPS; ++w) {
                const float mw = wml[w][qi][0], cw = mw == NEG_INF ? 0.f : expf(mw - M);
                L = fmaf(cw, wml[w][qi][1], L);
                o = fmaf(cw, wo[w][qi][d], o);
            }
            if (n == 1) {
                out[(size_t)t * out_stride + (size_t)h * head_dim + d] = __fdiv_rn(o, L);
            } else {
                const size_t at = ((size_t)t * n_heads + h) * max_splits + split;
                part_o[at * head_dim + d] = o;
                if (d == 0) { part_ml[at * 2] = M; part_ml[at * 2 + 1] = L; }
            }
        }
    }
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
