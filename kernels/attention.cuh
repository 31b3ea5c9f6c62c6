// attention.cuh: the prefill attention tile of attention.cu (the fma kernel family): paged causal
// GQA attention of one tile of query rows of one sequence against one kv head, over one split of
// ATTN_SPLIT key positions.
//
// One block = (tile of query rows of one sequence, kv head, split of ATTN_SPLIT positions).
// Query vectors of the tile = its rows x the G = n_heads / n_kv_heads q heads sharing the kv
// head, processed ATTN_QCHUNK at a time so every K/V vector loaded feeds all of them (the loops
// over a chunk's query vectors are unrolled).
//   score[q, j] = (q . k_j) * sm_scale, masked to -inf for j > pos(q's row)
//   m = max_j score, p_j = exp(score_j - m), l = sum_j p_j, o[d] = sum_j p_j v_j[d]
//   part_ml[row, h, split] = (m, l);  part_o[row, h, split, :] = o  (unnormalized)
// Keys j -> thread group j mod KG (KG = 128 / (head_dim / 8) groups of head_dim / 8 lanes,
// each lane 8 dims = one 16-byte bf16 load). Every sum is a fixed tree: a row's partials are
// bit-identical whatever tile holds it, since keys past the row's position add exact zeros.
//
// q: float32 [T, q_stride], head h at columns h * head_dim, already normed and rotated; seq, pos:
// int32 [T]; tile_start, tile_len: int32 [n_tiles] (rows tile_start .. +tile_len, same sequence,
// positions rising); block_table: int32 [max_seqs, max_pages_per_seq]; k_cache, v_cache: bf16
// [pages, page_size, n_kv_heads, head_dim], K/V of every position up to the tile's last already
// written (read-only here: __ldg); part_o: float32 [T, n_heads, max_splits, head_dim]; part_ml:
// float32 [T, n_heads, max_splits, 2]. head_dim in {32, 64, 128}.
#pragma once
#include "common.cuh"

#define ATTN_THREADS 128
#define ATTN_WARPS 4
#define ATTN_QCHUNK 8
#define ATTN_MAX_HEAD_DIM 128
#define ATTN_UNROLL 4

// Lane c's 16 bytes (dims c*8 .. c*8+7) of key position p of kv head kvh, through the read-only path (the
// cache is not written during the launch). page_shift >= 0: page_size == 1 << page_shift (a shift and a
// mask per key instead of / and %).
__device__ __forceinline__ uint4 kv_load(const __nv_bfloat16* cache, const int* bt_row, int page_size,
                                         int page_shift, int n_kv_heads, int head_dim, int kvh, int p, int c) {
    const int in_page = page_shift >= 0 ? p & (page_size - 1) : p % page_size;
    const int page = bt_row[page_shift >= 0 ? p >> page_shift : p / page_size];
    const size_t off = (((size_t)page * page_size + in_page) * n_kv_heads + kvh) * head_dim;
    return __ldg(reinterpret_cast<const uint4*>(cache + off) + c);
}

__device__ __forceinline__ void attn_tile(
    int first, int n_rows, const float* __restrict__ q, int q_stride, const int* __restrict__ seq,
    const int* __restrict__ pos, const int* __restrict__ block_table, int max_pages_per_seq,
    int page_size, const __nv_bfloat16* __restrict__ k_cache,
    const __nv_bfloat16* __restrict__ v_cache, int n_heads, int n_kv_heads, int head_dim,
    float sm_scale, int max_splits, float* __restrict__ part_o, float* __restrict__ part_ml) {
    constexpr int QC = ATTN_QCHUNK;
    __shared__ __align__(16) float qs[QC][ATTN_MAX_HEAD_DIM];
    __shared__ float S[QC][ATTN_SPLIT];
    __shared__ __align__(16) float red[ATTN_WARPS][QC][ATTN_MAX_HEAD_DIM];
    __shared__ int qpos[QC];

    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int kvh = blockIdx.y, split = blockIdx.z;
    if (n_rows <= 0 || seq[first] < 0) return;
    int maxpos = -1;
    for (int r = 0; r < n_rows; ++r) maxpos = max(maxpos, pos[first + r]);
    const int k0 = split * ATTN_SPLIT;
    if (k0 > maxpos || split >= max_splits) return;
    const int k1 = min(k0 + ATTN_SPLIT, maxpos + 1);  // keys k0 .. k1-1 are read
    // the loops over the split's slots stop after its last key (block-uniform): slots past k1 - k0 only
    // ever held -inf scores and zero probabilities, so the bits are those of the full walk
    const int nkeys = k1 - k0;
    const int page_shift = (page_size & (page_size - 1)) == 0 ? __ffs(page_size) - 1 : -1;
    const int G = n_heads / n_kv_heads, LPK = head_dim / 8, KG = ATTN_THREADS / LPK;
    const int g = tid / LPK, c = tid - g * LPK;
    const int* bt_row = block_table + (size_t)seq[first] * max_pages_per_seq;
    const int nq = n_rows * G;

    for (int qc0 = 0; qc0 < nq; qc0 += QC) {
        const int nqc = min(QC, nq - qc0);
        __syncthreads();  // the previous chunk is done with qs, S, red
        for (int idx = tid; idx < nqc * head_dim; idx += ATTN_THREADS) {
            const int qi = idx / head_dim, d = idx - qi * head_dim, gq = qc0 + qi;
            const int row = first + gq / G, h = kvh * G + gq % G;
            qs[qi][d] = q[(size_t)row * q_stride + (size_t)h * head_dim + d];
            if (d == 0) qpos[qi] = pos[row];
        }
        __syncthreads();

        // Phase 1: scores of the split's keys (-inf where masked or past k1).
        for (int j0 = 0; j0 < nkeys; j0 += KG * ATTN_UNROLL) {
            uint4 kr[ATTN_UNROLL];
#pragma unroll
            for (int u = 0; u < ATTN_UNROLL; ++u) {
                const int p = k0 + j0 + u * KG + g;
                kr[u] = p < k1 ? kv_load(k_cache, bt_row, page_size, page_shift, n_kv_heads, head_dim, kvh, p, c)
                               : make_uint4(0u, 0u, 0u, 0u);
            }
#pragma unroll
            for (int u = 0; u < ATTN_UNROLL; ++u) {
                const int j = j0 + u * KG + g, p = k0 + j;
                float kf[8];
                bf16x8_to_float(kr[u], kf);
#pragma unroll
                for (int qi = 0; qi < QC; ++qi) {
                    if (qi >= nqc) break;
                    const float4 qa = *reinterpret_cast<const float4*>(&qs[qi][c * 8]);
                    const float4 qb = *reinterpret_cast<const float4*>(&qs[qi][c * 8 + 4]);
                    float d = 0.f;
                    d = fmaf(qa.x, kf[0], d); d = fmaf(qa.y, kf[1], d);
                    d = fmaf(qa.z, kf[2], d); d = fmaf(qa.w, kf[3], d);
                    d = fmaf(qb.x, kf[4], d); d = fmaf(qb.y, kf[5], d);
                    d = fmaf(qb.z, kf[6], d); d = fmaf(qb.w, kf[7], d);
                    for (int off = LPK / 2; off > 0; off >>= 1) d += __shfl_xor_sync(FULL_MASK, d, off);
                    if (c == 0) S[qi][j] = (p < k1 && p <= qpos[qi]) ? __fmul_rn(d, sm_scale) : NEG_INF;
                }
            }
        }
        __syncthreads();

        // Phase 2: per query vector (one warp each) max, probabilities (back into S), sum.
        for (int qi = warp; qi < nqc; qi += ATTN_WARPS) {
            float sv[ATTN_SPLIT / 32];
            float m = NEG_INF;
#pragma unroll
            for (int i = 0; i < ATTN_SPLIT / 32; ++i) {
                sv[i] = lane + 32 * i < nkeys ? S[qi][lane + 32 * i] : NEG_INF;  // phase 1 wrote the first nkeys
                m = fmaxf(m, sv[i]);
            }
            m = warp_max(m);
            float l = 0.f;
#pragma unroll
            for (int i = 0; i < ATTN_SPLIT / 32; ++i) {
                const float pr = m == NEG_INF ? 0.f : expf(sv[i] - m);
                S[qi][lane + 32 * i] = pr;
                l += pr;
            }
            l = warp_sum(l);
            if (lane == 0) {
                const int gq = qc0 + qi, row = first + gq / G, h = kvh * G + gq % G;
                float* ml = part_ml + (((size_t)row * n_heads + h) * max_splits + split) * 2;
                ml[0] = m; ml[1] = l;
            }
        }
        __syncthreads();

        // Phase 3: o = sum_j p_j v_j; per thread 8 dims x its key group, then a fixed tree.
        float acc[QC][8];
#pragma unroll
        for (int qi = 0; qi < QC; ++qi)
#pragma unroll
            for (int d = 0; d < 8; ++d) acc[qi][d] = 0.f;
        for (int j0 = 0; j0 < nkeys; j0 += KG * ATTN_UNROLL) {
            uint4 vr[ATTN_UNROLL];
#pragma unroll
            for (int u = 0; u < ATTN_UNROLL; ++u) {
                const int p = k0 + j0 + u * KG + g;
                vr[u] = p < k1 ? kv_load(v_cache, bt_row, page_size, page_shift, n_kv_heads, head_dim, kvh, p, c)
                               : make_uint4(0u, 0u, 0u, 0u);
            }
#pragma unroll
            for (int u = 0; u < ATTN_UNROLL; ++u) {
                const int j = j0 + u * KG + g;
                if (k0 + j >= k1) continue;  // p = 0 there: skipping adds nothing
                float vf[8];
                bf16x8_to_float(vr[u], vf);
#pragma unroll
                for (int qi = 0; qi < QC; ++qi) {
                    if (qi >= nqc) break;
                    const float pr = S[qi][j];
#pragma unroll
                    for (int d = 0; d < 8; ++d) acc[qi][d] = fmaf(pr, vf[d], acc[qi][d]);
                }
            }
        }
#pragma unroll
        for (int qi = 0; qi < QC; ++qi) {
            if (qi >= nqc) break;
#pragma unroll
            for (int d = 0; d < 8; ++d)
                for (int off = LPK; off < 32; off <<= 1)
                    acc[qi][d] += __shfl_xor_sync(FULL_MASK, acc[qi][d], off);
            if (lane < LPK) {  // key group 0 of this warp holds the warp's sum
                *reinterpret_cast<float4*>(&red[warp][qi][c * 8]) =
                    make_float4(acc[qi][0], acc[qi][1], acc[qi][2], acc[qi][3]);
                *reinterpret_cast<float4*>(&red[warp][qi][c * 8 + 4]) =
                    make_float4(acc[qi][4], acc[qi][5], acc[qi][6], acc[qi][7]);
            }
        }
        __syncthreads();
        for (int idx = tid; idx < nqc * head_dim; idx += ATTN_THREADS) {
            const int qi = idx / head_dim, d = idx - qi * head_dim, gq = qc0 + qi;
            const int row = first + gq / G, h = kvh * G + gq % G;
            float o = red[0][qi][d];
#pragma unroll
            for (int w = 1; w < ATTN_WARPS; ++w) o += red[w][qi][d];
            part_o[(((size_t)row * n_heads + h) * max_splits + split) * head_dim + d] = o;
        }
    }
}

