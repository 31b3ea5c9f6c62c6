// attention_prefill_mma.cu: prefill attention on tensor cores (FlashAttention-2 style): one tile of
// query rows of one sequence against one kv head, over every key up to the tile's last position, in
// one pass with an online softmax; the output rows are written directly (no splits, no merge).
//
//   score[v, j] = (q_v . k_j) * sm_scale, -inf for j > pos(v's row);  out[v] = sum_j softmax_j v_j
//
// Query vectors of a tile: row r (0 .. tile_len - 1) x the G = n_heads / n_kv_heads heads of kv
// head kvh, vector r * G + (h - kvh * G), PM_QVECS at a time; warp w holds vectors 16 w .. 16 w + 15
// of a round as the A operand of mma.sync m16n8k16 (bf16 x bf16 + f32), q split into bf16 hi + lo
// (two mma, as linear_mma.cuh: 16 significant bits). Keys go in blocks of PM_KEYS = 16 through
// shared memory (bf16 K and V rows, one page lookup a key). Per block: S = Q K^T (two 8-key column
// tiles; K's B fragment is one 32-bit word of a K row), scaled and masked; per row the block max
// over the 4 lanes of its group, m_new = max(m, block max), corr = exp(m - m_new),
// p = exp(s - m_new), l = l corr + sum p, O = O corr; then O += P V with S's C fragments as P's A
// fragment (two 8-key tiles = one 16-key tile), P split hi + lo, V's B fragment two keys of one
// column from shared memory. Finally out = O / l.
// Every row's sums run over the same key blocks (0, 16, 32, ...) whatever tile it is in: a key block
// past a row's position leaves its m, l and O as they were (corr 1, p 0), so a row's bits do not
// depend on the other rows of its tile or of the launch.
//
// q: float32 [T, q_stride] normed and rotated (qk_norm_rope.cu, which also wrote this chunk's K/V
// to the cache); seq, pos: int32 [T]; tile_start, tile_len: int32 [n_tiles] (rows of one sequence,
// positions rising, at most max(1, PM_QVECS / G) rows; rows of another sequence or pos < 0 inside a
// tile are padding: zeros written, as attention_merge.cu writes them); block_table: int32
// [max_seqs, max_pages_per_seq]; k_cache, v_cache: bf16 [pages, page_size, n_kv_heads, head_dim];
// out: float32 [T, out_stride], head h at columns h * head_dim (the o_proj input). head_dim in
// {32, 64, 128}.
// Launch: grid (n_tiles, n_kv_heads), block PM_THREADS (4 warps x 16 query vectors).
#include "linear_mma.cuh"

#define PM_THREADS 128
#define PM_QVECS 64
#define PM_KEYS 16
#define PM_PAD 8  // bf16 after each shared K/V row: row g's K word 2c + 8s lands in bank 4g + c + 8s

template <int HD>
__device__ __forceinline__ void prefill_mma_tile(
    const float* __restrict__ q, int q_stride, const int* __restrict__ seq, const int* __restrict__ pos, int first,
    int n_rows, int v0,
    const int* __restrict__ bt_row, int page_size, const __nv_bfloat16* __restrict__ k_cache,
    const __nv_bfloat16* __restrict__ v_cache, int n_kv_heads, int G, float sm_scale, float* __restrict__ out,
    int out_stride) {
    constexpr int STEPS = HD / 16, NT = HD / 8, ROW = HD + PM_PAD, VECS = HD / 8;
    __shared__ __align__(16) __nv_bfloat16 ks[PM_KEYS][ROW];
    __shared__ __align__(16) __nv_bfloat16 vs[PM_KEYS][ROW];
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, g = lane >> 2, c = lane & 3;
    const int kvh = blockIdx.y;
    int maxpos = -1;
    for (int r = 0; r < n_rows; ++r)
        if (seq[first + r] == seq[first]) maxpos = max(maxpos, pos[first + r]);
    const int page_shift = (page_size & (page_size - 1)) == 0 ? __ffs(page_size) - 1 : -1;

    // this lane's two query vectors (C rows g and g + 8 of the warp's 16, vectors v0 + ...): row, head,
    // position; a padding row in the tile (another sequence, pos < 0) masks every key and is written as zeros
    int qrow[2], qhead[2], qpos[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        const int v = v0 + 16 * warp + g + 8 * h, r = v / G;
        qrow[h] = r < n_rows ? first + r : -1;  // -1: past the tile, nothing read or written
        qhead[h] = kvh * G + v % G;
        qpos[h] = r < n_rows && seq[first + r] == seq[first] ? pos[first + r] : -1;
    }
    // Q as A fragments, hi and lo: step s, reg 0/1 = rows g / g + 8 at d = 16 s + 2c, reg 2/3 at + 8
    u32 qh[STEPS][4], ql[STEPS][4];
#pragma unroll
    for (int s = 0; s < STEPS; ++s)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            const int h = i & 1, d = 16 * s + 2 * c + 8 * (i >> 1);
            float2 x = make_float2(0.f, 0.f);
            if (qpos[h] >= 0)
                x = *reinterpret_cast<const float2*>(q + (size_t)qrow[h] * q_stride + (size_t)qhead[h] * HD + d);
            split_bf16x2(x.x, x.y, qh[s][i], ql[s][i]);
        }

    float o[NT][4];
#pragma unroll
    for (int n = 0; n < NT; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) o[n][e] = 0.f;
    float m[2] = {NEG_INF, NEG_INF}, l[2] = {0.f, 0.f};  // running max, this lane's share of the sum

    for (int k0 = 0; k0 <= maxpos; k0 += PM_KEYS) {
        __syncthreads();  // the previous block's K/V are read
        for (int i = tid; i < PM_KEYS * VECS; i += PM_THREADS) {
            const int key = i / VECS, chunk = i - key * VECS, p = k0 + key;
            uint4 kv = make_uint4(0u, 0u, 0u, 0u), vv = kv;
            if (p <= maxpos) {
                const int page = bt_row[page_shift >= 0 ? p >> page_shift : p / page_size];
                const int in_page = page_shift >= 0 ? p & (page_size - 1) : p % page_size;
                const size_t off = (((size_t)page * page_size + in_page) * n_kv_heads + kvh) * HD;
                kv = __ldg(reinterpret_cast<const uint4*>(k_cache + off) + chunk);
                vv = __ldg(reinterpret_cast<const uint4*>(v_cache + off) + chunk);
            }
            *reinterpret_cast<uint4*>(&ks[key][chunk * 8]) = kv;
            *reinterpret_cast<uint4*>(&vs[key][chunk * 8]) = vv;
        }
        __syncthreads();

        // S = Q K^T: column tile j = keys k0 + 8 j .. + 7; C reg e: row g + 8 (e / 2), key 8 j + 2c + e % 2
        float sc[2][4];
#pragma unroll
        for (int j = 0; j < 2; ++j) {
#pragma unroll
            for (int e = 0; e < 4; ++e) sc[j][e] = 0.f;
#pragma unroll
            for (int s = 0; s < STEPS; ++s) {
                const u32 b0 = *reinterpret_cast<const u32*>(&ks[8 * j + g][16 * s + 2 * c]);
                const u32 b1 = *reinterpret_cast<const u32*>(&ks[8 * j + g][16 * s + 2 * c + 8]);
                mma_bf16_16816(sc[j], qh[s], b0, b1);
                mma_bf16_16816(sc[j], ql[s], b0, b1);
            }
        }
        // scale, mask, the running max and sum, P
        float corr[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
            float bm = NEG_INF;
#pragma unroll
            for (int j = 0; j < 2; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    const int key = k0 + 8 * j + 2 * c + e;
                    float& s = sc[j][2 * h + e];
                    s = key <= qpos[h] ? __fmul_rn(s, sm_scale) : NEG_INF;
                    bm = fmaxf(bm, s);
                }
            bm = fmaxf(bm, __shfl_xor_sync(FULL_MASK, bm, 1));
            bm = fmaxf(bm, __shfl_xor_sync(FULL_MASK, bm, 2));
            const float m_new = fmaxf(m[h], bm);
            corr[h] = m_new == NEG_INF ? 1.f : expf(m[h] - m_new);
            float sum = 0.f;
#pragma unroll
            for (int j = 0; j < 2; ++j)
#pragma unroll
                for (int e = 0; e < 2; ++e) {
                    float& s = sc[j][2 * h + e];
                    s = m_new == NEG_INF ? 0.f : expf(s - m_new);
                    sum += s;
                }
            l[h] = fmaf(l[h], corr[h], sum);
            m[h] = m_new;
        }
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            o[n][0] *= corr[0]; o[n][1] *= corr[0];
            o[n][2] *= corr[1]; o[n][3] *= corr[1];
        }
        // O += P V: P's A fragment from S's C fragments (reg 0/1: rows g / g + 8 at keys 2c, 2c + 1 of
        // tile 0; reg 2/3: the same of tile 1), hi and lo
        u32 ph[4], pl[4];
        split_bf16x2(sc[0][0], sc[0][1], ph[0], pl[0]);
        split_bf16x2(sc[0][2], sc[0][3], ph[1], pl[1]);
        split_bf16x2(sc[1][0], sc[1][1], ph[2], pl[2]);
        split_bf16x2(sc[1][2], sc[1][3], ph[3], pl[3]);
#pragma unroll
        for (int n = 0; n < NT; ++n) {
            const int col = 8 * n + g;  // B fragment: keys 2c, 2c + 1 (reg 0) and 2c + 8, 2c + 9 (reg 1)
            const u32 b0 = (u32)__bfloat16_as_ushort(vs[2 * c][col]) |
                           ((u32)__bfloat16_as_ushort(vs[2 * c + 1][col]) << 16);
            const u32 b1 = (u32)__bfloat16_as_ushort(vs[2 * c + 8][col]) |
                           ((u32)__bfloat16_as_ushort(vs[2 * c + 9][col]) << 16);
            mma_bf16_16816(o[n], ph, b0, b1);
            mma_bf16_16816(o[n], pl, b0, b1);
        }
    }

    // out = O / l, l summed over the 4 lanes of the row's group (l >= 1 for a row with keys: its max's own exp)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
        float total = l[h];
        total += __shfl_xor_sync(FULL_MASK, total, 1);
        total += __shfl_xor_sync(FULL_MASK, total, 2);
        if (qrow[h] < 0) continue;
        float* dst = out + (size_t)qrow[h] * out_stride + (size_t)qhead[h] * HD;
#pragma unroll
        for (int n = 0; n < NT; ++n)
            *reinterpret_cast<float2*>(dst + 8 * n + 2 * c) =
                total > 0.f ? make_float2(__fdiv_rn(o[n][2 * h], total), __fdiv_rn(o[n][2 * h + 1], total))
                            : make_float2(0.f, 0.f);
    }
}

extern "C" __global__ void __launch_bounds__(PM_THREADS)
attention_prefill_mma(const float* q, int q_stride, const int* seq, const int* pos, const int* tile_start,
                      const int* tile_len, const int* block_table, int max_pages_per_seq, int page_size,
                      const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache, int n_heads, int n_kv_heads,
                      int head_dim, float sm_scale, float* out, int out_stride, int n_tiles) {
    pdl_enter();
    if ((int)blockIdx.x >= n_tiles) return;
    const int first = tile_start[blockIdx.x], n_rows = tile_len[blockIdx.x];
    const int G = n_heads / n_kv_heads;
    if (n_rows <= 0) return;
    if (seq[first] < 0) {  // a tile of padding rows (the graph's fixed tiles past a prompt's end): zeros
        for (int i = threadIdx.x; i < n_rows * G * head_dim; i += PM_THREADS)
            out[(size_t)(first + i / (G * head_dim)) * out_stride + (size_t)blockIdx.y * G * head_dim +
                i % (G * head_dim)] = 0.f;
        return;
    }
    const int* bt_row = block_table + (size_t)seq[first] * max_pages_per_seq;
    // PM_QVECS query vectors at a time (more than one round only where G > PM_QVECS: one row a tile)
    for (int v0 = 0; v0 < n_rows * G; v0 += PM_QVECS) {
        if (head_dim == 128)
            prefill_mma_tile<128>(q, q_stride, seq, pos, first, n_rows, v0, bt_row, page_size, k_cache, v_cache,
                                  n_kv_heads, G, sm_scale, out, out_stride);
        else if (head_dim == 64)
            prefill_mma_tile<64>(q, q_stride, seq, pos, first, n_rows, v0, bt_row, page_size, k_cache, v_cache,
                                 n_kv_heads, G, sm_scale, out, out_stride);
        else
            prefill_mma_tile<32>(q, q_stride, seq, pos, first, n_rows, v0, bt_row, page_size, k_cache, v_cache,
                                 n_kv_heads, G, sm_scale, out, out_stride);
    }
}
