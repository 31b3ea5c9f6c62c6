// grammar_advance.cu: greedy pick among the candidates, grammar transition, next-step rows,
// and the decode loop's condition (cudaGraphSetConditional) in one kernel.
//
// Per sample b with s = sample_seq[b] running (s >= 0, status[s] == 0):
//   e* = pick[b] where pick is given and pick[b] >= 0 (a sampled row's draw: sample_draw.cu; it must be a
//   valid slot), else argmax over valid slots of cand_logits[b, e] (ties: lowest token id; NaN = -inf)
//   edge = node_edge_start[node] + e*; kinds 1/2 set used bit edge_tool and count += 1;
//   node = edge_child; out_tokens[s, out_len[s]++] = token;
//   status[s] = 1 at the terminal node (N - 1), 2 when out_len reaches max_out, 3 when no
//   candidate is valid (a dead end: nothing is written);
//   token_out[b] = token, pos_out[b] = pos_in[b] + 1 (the next decode step's row).
// Other samples: token_out = token_in, pos_out = pos_in (a finished row re-runs its last
// token at its last position, rewriting the same K/V; it never moves past its reservation).
// Loop condition = any sample still running: written to *cond_out and, when cond_handle is
// non-zero (inside a captured graph), to the WHILE node via cudaGraphSetConditional. The
// last block to finish decides, counting through sync_ws int32[2] (zero before the first
// launch; the kernel leaves it zeroed). Integer counts: the same answer in any block order.
//
// cand_logits: float32 [B, max_edges]; cand: int32 [B, max_edges]; valid: uint8 [B, max_edges];
// pick: int32 [B] or null;
// sample_seq, token_in, pos_in, token_out, pos_out: int32 [B] (in/out may alias);
// grammar arrays and state as in grammar_candidates.cu; edge_child, edge_tool int32 [E];
// status, out_len: int32 [max_seqs]; out_tokens: int32 [max_seqs, max_out].
// Launch: grid (ceil(B / 8)), block GRAM_ADV_THREADS (one warp per sample).
#include "common.cuh"

#define GRAM_ADV_THREADS 256
#define GRAM_ADV_ROWS_PER_BLOCK 8

extern "C" __device__ __cudart_builtin__ void CUDARTAPI
cudaGraphSetConditional(cudaGraphConditionalHandle handle, unsigned int value);

// (v, tok, slot) beats (bv, bt, be)? be < 0 means "none yet".
__device__ __forceinline__ bool beats(float v, int tok, int e, float bv, int bt, int be) {
    if (e < 0) return false;
    if (be < 0) return true;
    return v > bv || (v == bv && (tok < bt || (tok == bt && e < be)));
}

extern "C" __global__ void __launch_bounds__(GRAM_ADV_THREADS)
grammar_advance(const float* cand_logits, const int* cand, const u8* valid, const int* pick, const int* sample_seq,
                const int* token_in, const int* pos_in, const u32* node_edge_start,
                const int* edge_child, const u8* edge_kind, const int* edge_tool, int n_words,
                int n_nodes, int max_edges, int max_out, int B, u64* state, int* status,
                int* out_tokens, int* out_len, int* token_out, int* pos_out, int* sync_ws,
                int* cond_out, cudaGraphConditionalHandle cond_handle) {
    pdl_enter();
    const int lane = threadIdx.x & 31;
    const int b = blockIdx.x * GRAM_ADV_ROWS_PER_BLOCK + (threadIdx.x >> 5);
    bool running = false;
    if (b < B) {
        const int s = sample_seq[b];
        const bool active = s >= 0 && status[s] == 0;
        int tok_next = token_in[b], pos_next = pos_in[b];
        float bv = NEG_INF;
        int bt = 0x7fffffff, be = -1;
        const int drawn = active && pick != nullptr ? pick[b] : -1;
        if (drawn >= 0) {
            if (drawn < max_edges && valid[(size_t)b * max_edges + drawn]) {
                be = drawn; bt = cand[(size_t)b * max_edges + drawn];
            }  // else be stays -1: a dead end, as with nothing valid
        } else if (active) {
            for (int e = lane; e < max_edges; e += 32) {
                const size_t i = (size_t)b * max_edges + e;
                if (!valid[i]) continue;
                float v = cand_logits[i];
                if (v != v) v = NEG_INF;
                if (beats(v, cand[i], e, bv, bt, be)) { bv = v; bt = cand[i]; be = e; }
            }
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) {
                const float v = __shfl_xor_sync(FULL_MASK, bv, off);
                const int t = __shfl_xor_sync(FULL_MASK, bt, off);
                const int e = __shfl_xor_sync(FULL_MASK, be, off);
                if (beats(v, t, e, bv, bt, be)) { bv = v; bt = t; be = e; }
            }
        }
        if (active && lane == 0) {
            u64* st = state + (size_t)s * (1 + n_words);
            const int len = out_len[s];
            if (be < 0) {
                status[s] = 3;
            } else if (len >= max_out) {
                status[s] = 2;
            } else {
                int node = (int)(u32)st[0], count = (int)(u32)(st[0] >> 32);
                const u32 ed = node_edge_start[node] + (u32)be;
                const int kind = edge_kind[ed];
                if (kind == 1 || kind == 2) {
                    const int tool = edge_tool[ed];
                    st[1 + tool / 64] |= 1ull << (tool % 64);
                    count += 1;
                }
                node = edge_child[ed];
                st[0] = (u64)(u32)node | ((u64)(u32)count << 32);
                out_tokens[(size_t)s * max_out + len] = bt;
                out_len[s] = len + 1;
                tok_next = bt;
                pos_next = pos_in[b] + 1;
                const int st_new = node == n_nodes - 1 ? 1 : (len + 1 >= max_out ? 2 : 0);
                status[s] = st_new;
                running = st_new == 0;
            }
        }
        if (lane == 0) { token_out[b] = tok_next; pos_out[b] = pos_next; }
    }
    const int block_running = __syncthreads_count(running);
    if (threadIdx.x == 0) {
        atomicAdd(&sync_ws[1], block_running);
        __threadfence();
        const int ticket = atomicAdd(&sync_ws[0], 1);
        if (ticket == (int)gridDim.x - 1) {  // last block: every count is in
            __threadfence();
            const int total = atomicAdd(&sync_ws[1], 0);
            const unsigned int go = total > 0 ? 1u : 0u;
            *cond_out = (int)go;
            if (cond_handle != 0ull) cudaGraphSetConditional(cond_handle, go);
            sync_ws[0] = 0;
            sync_ws[1] = 0;
        }
    }
}
