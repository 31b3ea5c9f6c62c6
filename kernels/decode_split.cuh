// decode_split.cuh: the attention of one split of one decode row against one kv head, the core of
// attention_decode.cu (whose header gives the kernel, the split rule and the lane layout): a chunk's
// K/V loads (load_chunk) and the split's rounds of QG query heads (split_attention): q staged,
// normed and rotated in shared memory, online softmax over the split's chunks in registers, the
// warps' (m, l, o) merged in order 0..3; the row's only split writes out = o / L, any other its
// partials (part_o, part_ml).
#pragma once
#include "attention.cuh"
#include "rope.cuh"

// DECODE_KEYS: keys of one chunk (two pages of 32); DECODE_MAX_SPLITS: a row's splits at most (2,048
// keys in one-chunk splits; <= 32: the merge holds a split a lane); DECODE_NARROW_GROUP: the query
// heads a kv head attention_decode takes (attention_decode_wide: more).
#define DECODE_KEYS 64
#define DECODE_MAX_SPLITS 32
#define DECODE_NARROW_GROUP 2
#define DECODE_THREADS 128
#define DECODE_WARPS 4

constexpr int DECODE_WARP_KEYS = DECODE_KEYS / DECODE_WARPS;  // a warp's keys of a chunk
constexpr int DECODE_PASSES = DECODE_WARP_KEYS / 2;           // its passes over them at head_dim 128
static_assert(DECODE_WARPS * 32 == DECODE_THREADS && DECODE_WARP_KEYS * DECODE_WARPS == DECODE_KEYS,
              "a chunk's keys split evenly over the block's warps");
static_assert(DECODE_MAX_SPLITS <= 32 && ATTN_MAX_HEAD_DIM == 128, "the merge and DECODE_PASSES assume these");

// One block's place: row t at position p, kv head kvh, split `split` of the row's n over keys [k0, k1);
// this lane's key group g and 8-dim slice c (LPK lanes a key, KPP keys a pass, `passes` passes a chunk).
struct DecodeBlock {
    int t, kvh, split, n, p, k0, k1;
    int G, LPK, KPP, passes, g, c, warp, lane;
    int n_heads, n_kv_heads, head_dim, page_size, page_shift;
    const int* bt_row;      // the row's block-table row
    const float* rope_row;  // the row's head_dim / 2 (cos, sin) pairs
};

// This lane's K/V of the chunk whose first key for it is ``base``: keys base + i * KPP, i < passes,
// below k1, other than p (the row's own key, in shared memory); zeros elsewhere (and for a key on an
// unassigned page). Every page first (independent loads), then every K and V load of the chunk.
__device__ __forceinline__ void load_chunk(uint4 (&kr)[DECODE_PASSES], uint4 (&vr)[DECODE_PASSES], int base,
                                           const DecodeBlock& b, const __nv_bfloat16* k_cache,
                                           const __nv_bfloat16* v_cache) {
    int page[DECODE_PASSES];
#pragma unroll
    for (int i = 0; i < DECODE_PASSES; ++i) {
        const int key = base + i * b.KPP;
        const bool in = i < b.passes && key < b.k1 && key != b.p;
        page[i] = in ? __ldg(b.bt_row + (b.page_shift >= 0 ? key >> b.page_shift : key / b.page_size)) : -1;
    }
#pragma unroll
    for (int i = 0; i < DECODE_PASSES; ++i) {
        const int key = base + i * b.KPP;
        const int slot = b.page_shift >= 0 ? key & (b.page_size - 1) : key % b.page_size;
        const size_t off = (((size_t)page[i] * b.page_size + slot) * b.n_kv_heads + b.kvh) * b.head_dim + b.c * 8;
        const uint4 zero = make_uint4(0u, 0u, 0u, 0u);
        kr[i] = page[i] >= 0 ? __ldcg(reinterpret_cast<const uint4*>(k_cache + off)) : zero;
        vr[i] = page[i] >= 0 ? __ldcg(reinterpret_cast<const uint4*>(v_cache + off)) : zero;
    }
}

// Keys [k0, k1) for the G query heads of kv head kvh, QG a round; kr / vr hold the split's first chunk
// (issued by the caller), own_k / own_v the row's own key and value (bf16, written by the last split's
// block before its first barrier here).
template <int QG>
__device__ __forceinline__ void split_attention(const DecodeBlock& b, uint4 (&kr)[DECODE_PASSES],
                                                uint4 (&vr)[DECODE_PASSES], const __nv_bfloat16* own_k,
                                                const __nv_bfloat16* own_v, const float* q, int q_stride,
                                                const __nv_bfloat16* q_norm_w, float eps,
                                                const __nv_bfloat16* k_cache, const __nv_bfloat16* v_cache,
                                                float sm_scale, int max_splits, float* part_o, float* part_ml,
                                                float* out, int out_stride) {
    __shared__ __align__(16) float qs[QG][ATTN_MAX_HEAD_DIM];
    __shared__ __align__(16) float wo[DECODE_WARPS][QG][ATTN_MAX_HEAD_DIM];
    __shared__ float wml[DECODE_WARPS][QG][2];
    const int t = b.t, kvh = b.kvh, split = b.split, n = b.n, p = b.p, k0 = b.k0, k1 = b.k1, G = b.G;
    const int LPK = b.LPK, KPP = b.KPP, passes = b.passes, g = b.g, c = b.c, warp = b.warp, lane = b.lane;
    const int n_heads = b.n_heads, head_dim = b.head_dim, tid = threadIdx.x;
    const float* rope_row = b.rope_row;
    // the wide kernel (several rounds where G > 4) issues a round's first chunk during the previous round; the
    // narrow one, launched for G <= 2 (one round), keeps those registers free
    constexpr bool AHEAD = QG > DECODE_NARROW_GROUP;

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
            const float4 lo = qi < nq ? *reinterpret_cast<const float4*>(&qs[qi][c * 8]) : z;
            const float4 hi = qi < nq ? *reinterpret_cast<const float4*>(&qs[qi][c * 8 + 4]) : z;
            qr[qi][0] = lo.x; qr[qi][1] = lo.y; qr[qi][2] = lo.z; qr[qi][3] = lo.w;
            qr[qi][4] = hi.x; qr[qi][5] = hi.y; qr[qi][6] = hi.z; qr[qi][7] = hi.w;
            m[qi] = NEG_INF;
            l[qi] = 0.f;
#pragma unroll
            for (int d = 0; d < 8; ++d) acc[qi][d] = 0.f;
        }

        for (int c0 = k0; c0 < k1; c0 += DECODE_KEYS) {  // the split's chunks (one, up to 2,048 keys)
            const int base = c0 + warp * DECODE_WARP_KEYS + g;  // this lane's key of pass i: base + i * KPP
            if (c0 != k0 || (q0 != 0 && !AHEAD))  // else issued before this round's q
                load_chunk(kr, vr, base, b, k_cache, v_cache);
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
            load_chunk(kr, vr, k0 + warp * DECODE_WARP_KEYS + g, b, k_cache, v_cache);

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
}
