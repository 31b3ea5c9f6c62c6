"""Every kernel declared once: its entry point as the source writes it, plus how it is launched.

A ``KernelDecl`` joins what kernels/cuda_source.py reads from the ``.cu`` (function, file,
parameters, the ``__launch_bounds__`` block size) with the one thing the source cannot say in a
form Python reads: the grid, a function of some of the kernel's own ``int`` parameters (the
``Launch:`` line of each kernel's header comment). The builder (nvrtc_build.compile_all checks
each cubin holds its file's declared entry points), the launchers and packers (launch.py,
runner.py), the runtime's launch lists and the graph builder all go through these declarations.

A ``Launch`` names its arguments by the kernel's parameter names; a missing or an unknown name
fails on the host, naming the kernel and the parameter. Its grid comes from its own arguments,
so launch sizes and kernel arguments can never disagree.
"""
from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from types import SimpleNamespace

from toolcall.kernels.cuda_source import Param, defines, entry_points
from toolcall.kernels.geometry import (
    DECODE_KERNELS,
    FMA,
    MATVEC_FORMATS,
    MMA,
    PROLOGUES,
    RMSNORM,
    cdiv,
    matvec_kernel,
)

C = SimpleNamespace(**defines())
# Widest row sample_draw.cu draws from (its candidates live in shared memory): builds, loads and launches
# refuse more candidate columns on a GPU (builder/kernel_build.py, runtime/cuda/backend.py, device_step.py).
DRAW_MAX_CANDIDATES: int = C.DRAW_MAX_CANDIDATES


def _matvec_grid(rows_per_block: int):
    return lambda n_out, T: (cdiv(n_out, rows_per_block), cdiv(T, C.MV_TILE_T))


def _linear_mma_grid(n_out, T):
    """linear_mma.cuh: 16 output rows a row group, LM_WIDE_GROUPS groups a block from LM_WIDE_T rows on."""
    groups = C.LM_WIDE_GROUPS if T >= C.LM_WIDE_T else 1
    return cdiv(n_out, 16 * groups), cdiv(T, C.LM_TOKENS)


# Grid (x, y, z) of each entry point from its int parameters (the lambda's parameter names), as the
# kernel's header comment states it; the block is the kernel's __launch_bounds__.
GRIDS: dict[str, Callable[..., tuple[int, ...]]] = {
    # matvec.cuh: 8 warps x 2 output rows a block (*_rmsnorm, head_dense) or x 1 (plain and *_swiglu:
    # o_proj / down_proj get twice the blocks), MV_TILE_T activation rows a block
    **{matvec_kernel(f, p, FMA): _matvec_grid(C.MV_ROWS_PER_BLOCK if p == RMSNORM else C.MV_ROWS_PER_BLOCK_NARROW)
       for f in MATVEC_FORMATS for p in PROLOGUES},
    **{matvec_kernel(f, p, MMA): _linear_mma_grid for f in MATVEC_FORMATS for p in PROLOGUES},
    "head_dense": lambda vocab, T: (cdiv(vocab, C.MV_ROWS_PER_BLOCK), cdiv(T, C.MV_TILE_T)),
    "embed_gather": lambda T: (T,),  # a block a row
    "rmsnorm": lambda B: (cdiv(B, C.NORM_ROWS_PER_BLOCK),),  # a warp a row
    "swiglu": lambda n, T: (cdiv(n, 4 * C.SWIGLU_THREADS), T),  # 4 columns a thread
    "qk_norm_rope_kv": lambda n_heads, n_kv_heads, T: (cdiv(n_heads + n_kv_heads, C.ROPE_HEADS_PER_BLOCK), T),
    **{fn: (lambda T, n_kv_heads, max_splits: (T, n_kv_heads, max_splits)) for fn in DECODE_KERNELS},
    "attention_prefill_partial": lambda n_tiles, n_kv_heads, max_splits: (n_tiles, n_kv_heads, max_splits),
    "attention_merge": lambda n_heads, T: (n_heads, T),
    "attention_prefill_mma": lambda n_tiles, n_kv_heads: (n_tiles, n_kv_heads),
    "head_sparse": lambda n_cand, B: (cdiv(n_cand, C.HEAD_CANDS_PER_BLOCK), B),  # a warp a candidate
    "head_gather": lambda n_cand, B: (cdiv(n_cand, C.HEAD_THREADS), B),
    "argmax_rows": lambda T: (T,),
    "sample_draw": lambda B: (B,),  # a warp a row
    "grammar_candidates": lambda max_edges, B: (cdiv(max_edges, C.GRAM_THREADS), B),  # a thread an edge
    "grammar_advance": lambda B: (cdiv(B, C.GRAM_ADV_ROWS_PER_BLOCK),),  # a warp a row
}

Shape = tuple[tuple[int, int, int], tuple[int, int, int]]


@dataclass(frozen=True)
class KernelDecl:
    """One kernel: ``name`` and ``file`` (the .cu stem, its cubin), ``params`` in order, ``threads`` a
    block, ``grid`` over the ``sizes`` (int parameters) it reads."""

    name: str
    file: str
    params: tuple[Param, ...]
    threads: int
    grid: Callable[..., tuple[int, ...]]
    sizes: tuple[str, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.params)

    def check(self, args: Mapping[str, object]) -> None:
        """TypeError naming the kernel and the parameters unless ``args`` names each parameter once."""
        missing = [n for n in self.names if n not in args]
        unknown = [n for n in args if n not in self.names]
        if missing or unknown:
            why = ([f"missing argument(s) {', '.join(map(repr, missing))}"] if missing else []) + \
                  ([f"no parameter(s) named {', '.join(map(repr, unknown))}"] if unknown else [])
            raise TypeError(f"{self.name}: {'; '.join(why)} (parameters: {', '.join(self.names)})")

    def shape(self, sizes: Mapping[str, object]) -> Shape:
        """(grid, block) from ``sizes``: any of the kernel's parameters by name, the grid's sizes among them."""
        unknown = [n for n in sizes if n not in self.names]
        if unknown:
            raise TypeError(f"launch_shape({self.name!r}): no parameter(s) named {', '.join(map(repr, unknown))}")
        missing = [n for n in self.sizes if n not in sizes]
        if missing:
            raise KeyError(f"launch_shape({self.name!r}) needs size {missing[0]!r}")
        grid = tuple(int(max(g, 1)) for g in self.grid(**{n: int(sizes[n]) for n in self.sizes}))
        return (grid + (1, 1))[:3], (self.threads, 1, 1)


def _declare(entry, grid) -> KernelDecl:
    bounds = entry.launch_bounds
    if bounds is None:
        raise ValueError(f"kernel {entry.name} ({entry.file}.cu) has no __launch_bounds__: its block size")
    threads = int(bounds) if bounds.isdigit() else defines().get(bounds)
    if threads is None:
        raise ValueError(f"kernel {entry.name}: __launch_bounds__({bounds}) is no integer #define")
    sizes = tuple(inspect.signature(grid).parameters)
    ints = {p.name for p in entry.params if p.kind == "int32"}
    if not set(sizes) <= ints:
        raise ValueError(f"kernel {entry.name}: its grid reads {sorted(set(sizes) - ints)}, not int parameters")
    return KernelDecl(entry.name, entry.file, entry.params, threads, grid, sizes)


@lru_cache(maxsize=1)
def declarations() -> dict[str, KernelDecl]:
    """Every kernel by name; ValueError if an entry point has no grid or a grid no entry point."""
    entries = entry_points()
    undeclared, unknown = sorted(set(entries) - set(GRIDS)), sorted(set(GRIDS) - set(entries))
    if undeclared or unknown:
        raise ValueError(f"kernels/declarations.py GRIDS: no grid for {undeclared}; no entry point for {unknown}")
    return {name: _declare(entry, GRIDS[name]) for name, entry in entries.items()}


def declaration(kernel: str) -> KernelDecl:
    """The declaration of ``kernel``; KeyError naming it if there is none."""
    decl = declarations().get(kernel)
    if decl is None:
        raise KeyError(f"no kernel {kernel!r} in kernels/*.cu")
    return decl


def launch_shape(kernel: str, **sizes) -> Shape:
    """(grid, block) of ``kernel`` for sizes named as its parameters (T, n_out, B, ...)."""
    return declaration(kernel).shape(sizes)


@dataclass(frozen=True)
class Launch:
    """One launch: kernel name and arguments by parameter name (device arrays, None for a null pointer,
    numbers). ``parallel``: a graph gives it the dependencies of the launch before it (the host runs
    launches in order on one stream, the same computation)."""

    fn: str
    args: Mapping[str, object]
    parallel: bool = False

    def __post_init__(self):
        declaration(self.fn).check(self.args)

    @property
    def shape(self) -> Shape:
        return declaration(self.fn).shape(self.args)
