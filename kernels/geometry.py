"""Launch shapes of the kernels, and the layout limits they assume.

The constants mirror the ``#define``s of kernels/*.cu and *.cuh (a test checks they agree);
``launch_shape`` turns problem sizes into (grid, block) for any entry point, so the runtime
and the GPU tests compute launches one way.

One step over rows (token, seq, pos), per layer (<fmt> = fp8 | nvfp4 | bf16):
  <fmt>_matvec_rmsnorm  q|k|v, one fused weight (input_layernorm fused)
  decode (one row per sequence; 5 launches a layer):
    attention_decode    q/k norm + rope, K/V -> the paged bf16 cache, attention, split merge
  prefill (7 launches a layer):
    qk_norm_rope_kv     q/k norm + rope in place, K/V -> the cache (before attention reads it)
    attention_prefill_partial + attention_merge -> attn [T, heads * head_dim]
  <fmt>_matvec          o_proj, accumulate=1 into the residual stream x
  <fmt>_matvec_rmsnorm  gate|up, one fused weight (post_attention_layernorm fused)
  <fmt>_matvec_swiglu   down_proj, accumulate=1 into x
then embed_gather at the start; at the end rmsnorm (rows gathered) + grammar_candidates ->
head_sparse -> grammar_advance (the WHILE condition), or head_dense + argmax_rows / head_gather.
"""
from __future__ import annotations

import numpy as np

# matvec.cuh: 8 warps x 2 output rows per block (*_rmsnorm, head_dense) or x 1 (plain and
# *_swiglu: o_proj / down_proj get twice the blocks), 8 activation rows per block.
MV_THREADS, MV_ROWS_PER_BLOCK, MV_ROWS_PER_BLOCK_NARROW, MV_TILE_T = 256, 16, 8, 8
EMB_THREADS = 128
NORM_THREADS, NORM_ROWS_PER_BLOCK = 256, 8
SWIGLU_THREADS = 256
ROPE_THREADS, ROPE_HEADS_PER_BLOCK, ROPE_MAX_HEAD_DIM = 128, 4, 256
ATTN_THREADS, ATTN_SPLIT, ATTN_QCHUNK, ATTN_MAX_HEAD_DIM = 128, 256, 8, 128
HEAD_DIMS = (32, 64, 128)  # what the attention kernels take (attention.cuh)
MERGE_THREADS = 128
HEAD_THREADS, HEAD_CANDS_PER_BLOCK = 256, 8
ARGMAX_THREADS = 256
GRAM_THREADS = 128
GRAM_ADV_THREADS, GRAM_ADV_ROWS_PER_BLOCK = 256, 8

MATVECS = tuple(f"{fmt}_matvec{suffix}" for fmt in ("fp8", "nvfp4", "bf16")
                for suffix in ("", "_rmsnorm", "_swiglu"))
# in-dimension multiple each weight format needs (one 16-byte vector per lane step)
IN_MULTIPLE = {"fp8": 16, "nvfp4": 32, "bf16": 8}


def cdiv(a: int, b: int) -> int:
    return -(-int(a) // int(b))


def attention_max_splits(max_positions: int) -> int:
    """Splits a sequence of up to ``max_positions`` positions needs (part_o/part_ml's dim 2)."""
    return max(1, cdiv(max_positions, ATTN_SPLIT))


def launch_shape(kernel: str, **n: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(grid, block) of ``kernel`` for sizes named as its parameters (T, out, B, ...)."""
    if kernel in MATVECS:
        rows = MV_ROWS_PER_BLOCK if kernel.endswith("_rmsnorm") else MV_ROWS_PER_BLOCK_NARROW
        return (cdiv(n["out"], rows), cdiv(n["T"], MV_TILE_T), 1), (MV_THREADS, 1, 1)
    shapes = {
        "head_dense": lambda: ((cdiv(n["vocab"], MV_ROWS_PER_BLOCK), cdiv(n["T"], MV_TILE_T), 1), MV_THREADS),
        "embed_gather": lambda: ((n["T"], 1, 1), EMB_THREADS),
        "rmsnorm": lambda: ((cdiv(n["B"], NORM_ROWS_PER_BLOCK), 1, 1), NORM_THREADS),
        "swiglu": lambda: ((cdiv(n["n"], 4 * SWIGLU_THREADS), n["T"], 1), SWIGLU_THREADS),
        "qk_norm_rope_kv": lambda: ((cdiv(n["n_heads"] + n["n_kv_heads"], ROPE_HEADS_PER_BLOCK), n["T"], 1),
                                    ROPE_THREADS),
        "attention_decode": lambda: ((n["T"], n["n_kv_heads"], n["max_splits"]), ATTN_THREADS),
        "attention_prefill_partial": lambda: ((n["n_tiles"], n["n_kv_heads"], n["max_splits"]),
                                              ATTN_THREADS),
        "attention_merge": lambda: ((n["n_heads"], n["T"], 1), MERGE_THREADS),
        "head_sparse": lambda: ((cdiv(n["n_cand"], HEAD_CANDS_PER_BLOCK), n["B"], 1), HEAD_THREADS),
        "head_gather": lambda: ((cdiv(n["n_cand"], HEAD_THREADS), n["B"], 1), HEAD_THREADS),
        "argmax_rows": lambda: ((n["T"], 1, 1), ARGMAX_THREADS),
        "grammar_candidates": lambda: ((cdiv(n["max_edges"], GRAM_THREADS), n["B"], 1), GRAM_THREADS),
        "grammar_advance": lambda: ((cdiv(n["B"], GRAM_ADV_ROWS_PER_BLOCK), 1, 1), GRAM_ADV_THREADS),
    }
    if kernel not in shapes:
        raise KeyError(f"no launch shape for kernel {kernel!r}")
    try:
        grid, threads = shapes[kernel]()
    except KeyError as e:
        raise KeyError(f"launch_shape({kernel!r}) needs size {e.args[0]!r}") from None
    return tuple(int(max(g, 1)) for g in grid), (threads, 1, 1)


def prefill_tiles(seq: np.ndarray, pos: np.ndarray, rows_per_tile: int) -> tuple[np.ndarray, np.ndarray]:
    """(tile_start, tile_len) int32 for attention_prefill_partial: runs of consecutive rows of
    one sequence with rising positions, cut every ``rows_per_tile`` rows (ATTN_QCHUNK // group
    keeps one tile in one query chunk). Padding rows (seq < 0) get no tile."""
    starts, lens = [], []
    t, T = 0, len(seq)
    while t < T:
        if seq[t] < 0:
            t += 1
            continue
        end = t + 1
        while (end < T and end - t < rows_per_tile and seq[end] == seq[t]
               and pos[end] > pos[end - 1]):
            end += 1
        starts.append(t)
        lens.append(end - t)
        t = end
    return np.asarray(starts, np.int32), np.asarray(lens, np.int32)


def shape_problems(hidden: int, intermediate: int, n_heads: int, n_kv_heads: int, head_dim: int,
                   weight_format: str) -> list[str]:
    """Why these model sizes cannot run on the kernels (empty list: they can)."""
    out = []
    m = IN_MULTIPLE[weight_format]
    for name, dim in (("hidden_size", hidden), ("intermediate_size", intermediate),
                      ("num_heads * head_dim", n_heads * head_dim)):
        if dim % m:
            out.append(f"{name} = {dim} is not a multiple of {m} ({weight_format} matvec)")
    if head_dim not in HEAD_DIMS:
        out.append(f"head_dim = {head_dim}: attention supports {', '.join(map(str, HEAD_DIMS))}")
    if n_kv_heads <= 0 or n_heads % n_kv_heads:
        out.append(f"num_heads {n_heads} is not a multiple of num_kv_heads {n_kv_heads}")
    return out
