// attention.cu: prefill attention partials, tiles of query rows of one sequence each (see
// attention.cuh for the tile, its layouts and its sums); attention_merge.cu combines the splits.
//
// q: float32 [T, q_stride], already normed and rotated (qk_norm_rope.cu), whose K/V that launch
// wrote to the cache; tile_start, tile_len: int32 [n_tiles] (rows tile_start .. +tile_len of
// one sequence, positions rising); part_o / part_ml as attention.cuh. head_dim in {32, 64, 128}.
// Launch: grid (n_tiles, n_kv_heads, max_splits), block ATTN_THREADS; blocks whose split
// starts past the tile's last position exit at once.
#include "attention.cuh"

// Prefill: tile i = rows tile_start[i] .. tile_start[i] + tile_len[i] - 1 (grid.x = n_tiles).
extern "C" __global__ void __launch_bounds__(ATTN_THREADS)
attention_prefill_partial(const float* q, int q_stride, const int* seq, const int* pos,
                          const int* tile_start, const int* tile_len, const int* block_table,
                          int max_pages_per_seq, int page_size, const __nv_bfloat16* k_cache,
                          const __nv_bfloat16* v_cache, int n_heads, int n_kv_heads, int head_dim,
                          float sm_scale, int max_splits, float* part_o, float* part_ml,
                          int n_tiles) {
    pdl_enter();
    if ((int)blockIdx.x >= n_tiles) return;
    attn_tile(tile_start[blockIdx.x], tile_len[blockIdx.x], q, q_stride, seq, pos, block_table, max_pages_per_seq,
              page_size, k_cache, v_cache, n_heads, n_kv_heads, head_dim, sm_scale, max_splits, part_o, part_ml);
}
