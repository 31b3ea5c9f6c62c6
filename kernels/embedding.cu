// embedding.cu: token embedding gather, bf16 -> float32 (exact), and the step's rotary table.
//
//   x[t, :] = float(table[tokens[t], :])      (zeros where tokens[t] is outside [0, vocab))
//   rope[t, i] = (cos(a), sin(a)),  a = float(pos[t]) * inv_freq[i] (float32 product, as HF /
//                runtime/bundle/rope.py),  i < rope_pairs = head_dim / 2
// The table is made here once a step, for every layer's rope (rope.cuh) of the step's rows.
//
// tokens, pos: int32 [T]; table: bf16 [vocab, hidden] row-major; x: float32 [T, hidden];
// inv_freq: float32 [rope_pairs]; rope: float32 [T, rope_pairs, 2] or null (no table; pos and
// inv_freq unread). hidden % 8 == 0. Each thread moves 16-byte vectors (8 bf16 in, two float4 out).
// Launch: grid (T), block EMB_THREADS.
#include "common.cuh"

#define EMB_THREADS 128

extern "C" __global__ void __launch_bounds__(EMB_THREADS)
embed_gather(const int* tokens, const __nv_bfloat16* table, int vocab, int hidden, float* x,
             const int* pos, const float* inv_freq, int rope_pairs, float* rope, int T) {
    pdl_enter();
    const int t = blockIdx.x;
    if (t >= T) return;
    const int tok = tokens[t];
    const bool ok = tok >= 0 && tok < vocab;
    const uint4* src = reinterpret_cast<const uint4*>(table + (size_t)(ok ? tok : 0) * hidden);
    float4* dst = reinterpret_cast<float4*>(x + (size_t)t * hidden);
    for (int v = threadIdx.x; v < hidden / 8; v += EMB_THREADS) {
        float f[8] = {0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f, 0.f};
        if (ok) bf16x8_to_float(__ldg(src + v), f);
        dst[2 * v] = make_float4(f[0], f[1], f[2], f[3]);
        dst[2 * v + 1] = make_float4(f[4], f[5], f[6], f[7]);
    }
    if (rope == nullptr) return;
    const float p = (float)pos[t];
    for (int i = threadIdx.x; i < rope_pairs; i += EMB_THREADS) {
        float sn, cs;
        sincosf(__fmul_rn(p, inv_freq[i]), &sn, &cs);
        reinterpret_cast<float2*>(rope)[(size_t)t * rope_pairs + i] = make_float2(cs, sn);
    }
}
