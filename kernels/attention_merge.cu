// attention_merge.cu: combine the per-split partials of attention.cu (prefill) into the output
// (attention_decode.cu merges its own, with the same formula).
//
//   n = min(ceil((pos[t] + 1) / ATTN_SPLIT), max_splits) splits of row t
//   M = max_s m_s;  w_s = exp(m_s - M);  L = sum_s w_s l_s;  out[d] = (sum_s w_s o_s[d]) / L
//
// Splits are summed in order 0..n-1 (fixed), identically for decode and prefill rows.
// part_o: float32 [T, n_heads, max_splits, head_dim]; part_ml: float32 [T, n_heads,
// max_splits, 2]; seq, pos: int32 [T] (seq < 0: padding row, output zeros);
// out: float32 [T, out_stride], head h at columns h * head_dim (the o_proj input).
// head_dim <= 128. Launch: grid (n_heads, T), block MERGE_THREADS (>= head_dim, <= 128).
#include "common.cuh"

#define MERGE_THREADS 128

extern "C" __global__ void __launch_bounds__(MERGE_THREADS)
attention_merge(const float* part_o, const float* part_ml, const int* seq, const int* pos,
                int n_heads, int head_dim, int max_splits, float* out, int out_stride, int T) {
    pdl_enter();
    const int h = blockIdx.x, t = blockIdx.y, d = threadIdx.x;
    if (t >= T || d >= head_dim) return;
    float* dst = out + (size_t)t * out_stride + (size_t)h * head_dim + d;
    if (seq[t] < 0 || pos[t] < 0) { *dst = 0.f; return; }
    const int n = min(pos[t] / ATTN_SPLIT + 1, max_splits);
    const size_t base = ((size_t)t * n_heads + h) * max_splits;
    float M = NEG_INF;
    for (int s = 0; s < n; ++s) M = fmaxf(M, part_ml[(base + s) * 2]);
    float L = 0.f, o = 0.f;
    for (int s = 0; s < n; ++s) {
        const float m = part_ml[(base + s) * 2], l = part_ml[(base + s) * 2 + 1];
        const float w = m == NEG_INF ? 0.f : expf(m - M);
        L = fmaf(w, l, L);
        o = fmaf(w, part_o[(base + s) * head_dim + d], o);
    }
    *dst = __fdiv_rn(o, L);
}
