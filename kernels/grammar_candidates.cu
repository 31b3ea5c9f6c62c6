// grammar_candidates.cu: the next-token candidates of each sequence's grammar state.
//
//   node, count, used = state[s]                (s = sample_seq[b])
//   slot e < degree(node): cand[b, e] = edge_token[first + e], valid[b, e] = allowed(edge)
//   slot e >= degree, s < 0 or status[s] != 0: cand = -1, valid = 0
//
// allowed (as runtime/grammar/stepper.py): kind 3 (END of an empty answer): count == 0 and
// allow_empty[s]; kinds 0/1/2: edge_bits & ~used != 0, and kind 1 (SEP) also
// count + 1 < max_tools[s] and popcount(used) + 1 < n_tools (another tool must fit and be unused:
// a tools subset is its initial state's used bits, GrammarStepper.initial_state, so the popcount, not
// count, says whether one is left). The rules are each sequence's own (a request's "at most one
// tool", "at least one tool").
// Grammar arrays (runtime/grammar/trie.py): node_edge_start uint32 [N+1], edge_token int32 [E],
// edge_kind uint8 [E], edge_bits uint64 [E, W]. State: uint64 [max_seqs, 1 + W], word 0 =
// node (low 32 bits) | count (high 32 bits), words 1..W = used bits (the numpy record
// toolcall.runtime.grammar.stepper.state_dtype(W), byte for byte). status: int32 [max_seqs], 0 = running.
// max_tools: int32 [max_seqs]; allow_empty: uint8 [max_seqs].
// cand: int32 [B, max_edges]; valid: uint8 [B, max_edges].
// Launch: grid (ceil(max_edges / GRAM_THREADS), B), block GRAM_THREADS.
#include "common.cuh"

#define GRAM_THREADS 128

extern "C" __global__ void __launch_bounds__(GRAM_THREADS)
grammar_candidates(const int* sample_seq, const u64* state, const int* status,
                   const u32* node_edge_start, const int* edge_token, const u8* edge_kind,
                   const u64* edge_bits, int n_words, int n_nodes, int n_tools, const int* max_tools,
                   const u8* allow_empty, int max_edges, int B, int* cand, u8* valid) {
    pdl_enter();
    const int b = blockIdx.y, e = blockIdx.x * GRAM_THREADS + threadIdx.x;
    if (b >= B || e >= max_edges) return;
    const size_t i = (size_t)b * max_edges + e;
    int tok = -1;
    u8 ok = 0;
    const int s = sample_seq[b];
    if (s >= 0 && status[s] == 0) {
        const u64* st = state + (size_t)s * (1 + n_words);
        const int node = (int)(u32)st[0], count = (int)(u32)(st[0] >> 32);
        if (node >= 0 && node < n_nodes) {
            const u32 ed = node_edge_start[node] + (u32)e;
            if (ed < node_edge_start[node + 1]) {
                tok = edge_token[ed];
                const int kind = edge_kind[ed];
                if (kind == 3) {
                    ok = count == 0 && allow_empty[s] != 0;
                } else {
                    bool unused = false;
                    int used = 0;
                    for (int w = 0; w < n_words; ++w) {
                        unused |= (edge_bits[(size_t)ed * n_words + w] & ~st[1 + w]) != 0ull;
                        used += __popcll(st[1 + w]);
                    }
                    ok = unused && (kind != 1 || (count + 1 < max_tools[s] && used + 1 < n_tools));
                }
            }
        }
    }
    cand[i] = tok;
    valid[i] = ok;
}
