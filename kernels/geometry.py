"""The layout limits the kernels assume, and the matvec kernels of each weight format.

The constants are the ``#define``s of kernels/*.cu and *.cuh, read from the sources
(kernels/cuda_source.py); the launch shape of every entry point is declared in
kernels/declarations.py.

One step over rows (token, seq, pos), per layer (<fmt> = a bundle weight format's kernel prefix,
common/formats.py: fp8_e4m3 | nvfp4 | bf16):
  <fmt>_matvec_rmsnorm  q|k|v, one fused weight (input_layernorm fused); every <fmt>_matvec* below is
                        one of a kernel family's (KERNEL_FAMILIES: <fmt>_linear_mma* on tensor cores)
  decode (one row per sequence; 5 launches a layer):
    attention_decode    q/k norm + rope, K/V -> the paged bf16 cache, split-KV attention, split merge
                        (attention_decode_wide where a kv head serves more than 2 query heads)
  prefill (7 launches a layer):
    qk_norm_rope_kv     q/k norm + rope in place, K/V -> the cache (before attention reads it)
    attention_prefill_partial + attention_merge -> attn [T, heads * head_dim] (the mma family:
                        attention_prefill_mma, one pass)
  <fmt>_matvec          o_proj, accumulate=1 into the residual stream x
  <fmt>_matvec_rmsnorm  gate|up, one fused weight (post_attention_layernorm fused)
  <fmt>_matvec_swiglu   down_proj, accumulate=1 into x
then embed_gather at the start; at the end rmsnorm (rows gathered) + grammar_candidates ->
head_sparse -> grammar_advance (the WHILE condition), or head_dense + argmax_rows / head_gather.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from toolcall.common.formats import WEIGHT_FORMATS, WeightFormat
from toolcall.kernels.cuda_source import defines

ATTN_SPLIT = defines()["ATTN_SPLIT"]  # positions of one attention split (common.cuh)
ATTN_QCHUNK = defines()["ATTN_QCHUNK"]  # query rows one prefill block stages (attention.cuh)
DECODE_KEYS = defines()["DECODE_KEYS"]  # keys of one decode attention chunk (decode_split.cuh)
DECODE_MAX_SPLITS = defines()["DECODE_MAX_SPLITS"]  # a decode row's splits at most (decode_split.cuh)
DECODE_NARROW_GROUP = defines()["DECODE_NARROW_GROUP"]  # the most query heads a kv head attention_decode takes
DECODE_KERNELS = ("attention_decode", "attention_decode_wide")  # one parameter list, registers of their own
HEAD_DIMS = (32, 64, 128)  # what the attention kernels take (attention.cuh: head_dim / 8 lanes a key)

# Formats with linear-layer kernels: the bundle formats (fp32 runs on the CPU only). Each has three entry
# points a kernel family, one per prologue (linear.cuh PRO_*): plain, input RMSNorm fused, SwiGLU fused.
MATVEC_FORMATS: tuple[WeightFormat, ...] = tuple(f for f in WEIGHT_FORMATS if f.in_bundles)
PLAIN, RMSNORM, SWIGLU = "", "_rmsnorm", "_swiglu"
PROLOGUES = (PLAIN, RMSNORM, SWIGLU)


@dataclass(frozen=True)
class KernelFamily:
    """One family of GPU kernels for the step's linear layers and prefill attention: the same result to
    float32 rounding, each with one reduction order for every row count T (a row's bits never depend on
    the other rows of its launch). Linear entry points: ``<fmt.kernel_prefix>_<stem><prologue>``;
    ``prefill_attention``: the kernels of a prefill chunk's attention, in launch order, over tiles of at most
    ``prefill_vectors`` query vectors (rows x the query heads of one kv head)."""

    name: str
    stem: str
    prefill_attention: tuple[str, ...]
    prefill_vectors: int
    summary: str

    def rows_per_tile(self, num_heads: int, num_kv_heads: int) -> int:
        """Query rows of one prefill attention tile."""
        return max(1, self.prefill_vectors // (num_heads // num_kv_heads))


# fma: matvec.cuh, attention.cuh (+ attention_merge.cu); mma: linear_mma.cuh, attention_prefill_mma.cu
FMA = KernelFamily("fma", "matvec", ("attention_prefill_partial", "attention_merge"), ATTN_QCHUNK,
                   "CUDA cores, float32 FMAs")
MMA = KernelFamily("mma", "linear_mma", ("attention_prefill_mma",), defines()["PM_QVECS"],
                   "tensor cores, bf16 mma.sync with activations, queries and probabilities split into bf16 hi + lo")
KERNEL_FAMILIES: dict[str, KernelFamily] = {f.name: f for f in (FMA, MMA)}


def matvec_kernel(fmt: WeightFormat, prologue: str = PLAIN, family: KernelFamily = FMA) -> str:
    """The entry point of ``fmt``'s linear layer with ``prologue`` in ``family``."""
    return f"{fmt.kernel_prefix}_{family.stem}{prologue}"


# kernel name -> (weight format, prologue), for every linear-layer entry point of every family
MATVECS: dict[str, tuple[WeightFormat, str]] = {matvec_kernel(f, p, fam): (f, p) for fam in KERNEL_FAMILIES.values()
                                                for f in MATVEC_FORMATS for p in PROLOGUES}


def cdiv(a: int, b: int) -> int:
    return -(-int(a) // int(b))


def attention_max_splits(max_positions: int) -> int:
    """Splits a sequence of up to ``max_positions`` positions needs (part_o/part_ml's dim 2)."""
    return max(1, cdiv(max_positions, ATTN_SPLIT))


def decode_kernel(num_heads: int, num_kv_heads: int) -> str:
    """The decode attention entry point for a model's group size (query heads a kv head)."""
    return DECODE_KERNELS[num_heads // num_kv_heads > DECODE_NARROW_GROUP]


def decode_max_splits(max_positions: int) -> int:
    """attention_decode's split slots (its grid's z, part_o/part_ml's dim 2) for contexts of up to
    ``max_positions`` positions: one chunk of DECODE_KEYS a split, at most DECODE_MAX_SPLITS."""
    return max(1, min(cdiv(max_positions, DECODE_KEYS), DECODE_MAX_SPLITS))


def decode_split_keys(pos: int, max_splits: int) -> list[tuple[int, int]]:
    """The key ranges [k0, k1) of each split of a decode row at ``pos`` in a launch of ``max_splits`` split
    slots (attention_decode.cu's rule: from the position and the launch's constant only, never the batch)."""
    chunks = int(pos) // DECODE_KEYS + 1
    per_split = cdiv(chunks, min(max_splits, DECODE_MAX_SPLITS)) * DECODE_KEYS
    return [(k0, min(k0 + per_split, int(pos) + 1)) for k0 in range(0, int(pos) + 1, per_split)]


def prefill_tiles(seq: np.ndarray, pos: np.ndarray, rows_per_tile: int) -> tuple[np.ndarray, np.ndarray]:
    """(tile_start, tile_len) int32 for a kernel family's prefill attention: runs of consecutive rows of
    one sequence with rising positions, cut every ``rows_per_tile`` rows (KernelFamily.rows_per_tile:
    what one block holds). Padding rows (seq < 0) get no tile."""
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


def tile_rows(tile_start, tile_len) -> np.ndarray:
    """The rows (int indices, tile by tile) of prefill_tiles' tiles."""
    return np.concatenate([np.arange(s, s + n) for s, n in zip(tile_start, tile_len)] or [[]]).astype(int)


def shape_problems(hidden: int, intermediate: int, n_heads: int, n_kv_heads: int, head_dim: int,
                   weight_format: WeightFormat | None) -> list[str]:
    """Why these model sizes (and weight format) cannot run on the kernels (empty list: they can)."""
    if weight_format not in MATVEC_FORMATS:
        name = "an unknown weight format" if weight_format is None else f"{weight_format.name} weights"
        return [f"{name}: the GPU kernels take {', '.join(f.name for f in MATVEC_FORMATS)}"]
    out = []
    m = weight_format.kernel_multiple
    for name, dim in (("hidden_size", hidden), ("intermediate_size", intermediate),
                      ("num_heads * head_dim", n_heads * head_dim)):
        if dim % m:
            out.append(f"{name} = {dim} is not a multiple of {m} ({weight_format.name} matvec)")
    if head_dim not in HEAD_DIMS:
        out.append(f"head_dim = {head_dim}: attention supports {', '.join(map(str, HEAD_DIMS))}")
    if n_kv_heads <= 0 or n_heads % n_kv_heads:
        out.append(f"num_heads {n_heads} is not a multiple of num_kv_heads {n_kv_heads}")
    return out
