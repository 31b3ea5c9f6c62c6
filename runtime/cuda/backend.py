"""The CUDA backend: CpuModel's interface (forward over rows, dense and sparse heads) on the GPU.

Everything is allocated at load: weights in the bundle's formats (runtime/cuda/weights.py),
the KV pool as the contract sizes it (runtime/cuda/kv.py) and the step workspace
(runtime/cuda/buffers.py). A step only copies its row arrays in and the normed hidden rows
out. Kernels come from the bundle's kernels/<file>.cubin, compiled for the contract's arch.
A failed load frees what it took; ``close`` frees everything and releases the context.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from kernels.geometry import launch_shape, prefill_tiles, shape_problems
from kernels.launch import DeviceArray, Gpu, check, first_error
from kernels.runner import DryRunGpu
from kernels.signatures import kernel_signatures

from ..bundle import KERNELS_DIR, WEIGHTS_FILE
from ..contract import Contract, Limits
from .buffers import DeviceArena, attention_splits, workspace_plan
from .kv import CudaKVPool
from .launches import StepLaunches, StepRows, rows_per_tile
from .weights import FORMATS, DeviceWeights
from common.errors import CudaError, Refusal
from ..grammar import Grammar
from ..model_config import ModelConfig
from ..tensor_file import SafetensorsFile


def arena_sizes(plan: dict[str, int]) -> dict[str, int]:
    """The workspace plan with q/k/v and gate/up merged into one buffer each (fused layouts)."""
    sizes = {k: v for k, v in plan.items() if k not in ("q", "k", "v", "gate", "up")}
    return {"qkv": plan["q"] + plan["k"] + plan["v"], "gate_up": plan["gate"] + plan["up"], **sizes}

PROGRAM_CACHE = 64  # packed launch lists kept (each ~ layers x 5-7 launches of packed arguments)


class Program:
    """A launch list bound to loaded kernels, argument-packed once, launched in order."""

    def __init__(self, model: "CudaModel", launches):
        self.model, self.launches, self.items = model, launches, []
        for ln in launches:
            kernel = model.kernel(ln.fn)
            grid, block = launch_shape(ln.fn, **ln.sizes)
            params, holders = kernel.pack(ln.args)
            self.items.append((kernel, grid, block, params, holders))

    def run(self) -> None:
        m = self.model
        if m.dry:
            for (kernel, grid, block, _, _), ln in zip(self.items, self.launches):
                m.gpu.launch(kernel, grid, block, *ln.args)
            return
        from cuda.bindings import driver
        for kernel, (gx, gy, gz), (bx, by, bz), params, _ in self.items:
            check(driver.cuLaunchKernel(kernel.function, gx, gy, gz, bx, by, bz, 0, m.stream, params.ctypes.data, 0),
                  f"cuLaunchKernel({kernel.signature.name})")


class CudaModel:
    """Forward pass over rows and both heads on one GPU. ``gpu``: None (the model retains device
    0's primary context itself), a launch.Gpu (the model takes it over and closes it), or a
    DryRunGpu stand-in (launches checked or emulated on the host). ``strict=False`` records
    cubins that fail to load instead of failing (diagnostics: their kernels then raise)."""

    def __init__(self, cfg: ModelConfig, limits: Limits, grammar: Grammar, precision: str, tensors,
                 cubins: dict[str, bytes], gpu=None, strict: bool = True):
        problems = shape_problems(cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads,
                                  cfg.head_dim, FORMATS[precision])
        if problems:
            raise Refusal("bundle_invalid", f"the CUDA kernels cannot run this model: {'; '.join(problems)}",
                          problems=problems)
        self.cfg, self.limits, self.grammar, self.precision = cfg, limits, grammar, precision
        self.gpu = gpu if gpu is not None else Gpu()
        self.dry = isinstance(self.gpu, DryRunGpu)
        self.stream, self.kv, self.closers, self._programs = 0, None, [], {}
        self.module_errors: dict[str, str] = {}  # strict=False: modules that failed to load (diagnostics)
        try:
            self._load(tensors, cubins, strict)
        except BaseException:
            self.close()
            raise

    def _load(self, tensors, cubins: dict[str, bytes], strict: bool) -> None:
        cfg, lim, g = self.cfg, self.limits, self.grammar
        self.modules = {}
        needed = {kernel_signatures()[fn].file for fn in REQUIRED_KERNELS}
        for file in sorted(needed):
            if file not in cubins:
                raise Refusal("bundle_invalid", f"{KERNELS_DIR}/{file}.cubin is missing; rebuild the bundle for a "
                              "GPU target", file=f"{KERNELS_DIR}/{file}.cubin")
            try:
                self.modules[file] = self.gpu.load(cubins[file])
            except CudaError as e:
                if strict:
                    raise CudaError("cuda_error", f"{KERNELS_DIR}/{file}.cubin does not load on this device: "
                                    f"{e.message}", file=f"{KERNELS_DIR}/{file}.cubin", **e.details) from None
                self.module_errors[file] = e.message
        self._kernels = {}
        self.splits = attention_splits(lim)
        self.plan = workspace_plan(cfg, lim, g.max_edges_per_node, g.bitset_words)
        self.ws = DeviceArena(arena_sizes(self.plan)).allocate(self.gpu)
        self.weights = DeviceWeights(cfg, self.precision, tensors, g)
        self.weights.upload(self.gpu)
        self.kv = CudaKVPool(self.gpu, cfg, lim.num_pages, lim.page_size, lim.max_sequences,
                             lim.max_input_tokens + lim.max_output_tokens)
        self.memset(self.ws.base, 0)  # sync_ws must start at zero; the rest is tidiness
        self.memset(self.kv.storage, 0)  # never read before written; zeros keep stale NaN patterns out
        if not self.dry:
            from cuda.bindings import driver
            self.stream = check(driver.cuStreamCreate(0), "cuStreamCreate")  # blocking: orders with sync copies
        self.steps = StepLaunches(self)
        self.rows_cap = min(lim.max_tokens_per_step, lim.max_sequences)  # head rows per launch

    # ---- device helpers ----
    def kernel(self, fn: str):
        file = kernel_signatures()[fn].file
        if file in self.module_errors:
            raise CudaError("cuda_error", f"kernel {fn}: {file}.cubin failed to load: {self.module_errors[file]}",
                            kernel=fn)
        if fn not in self._kernels:
            self._kernels[fn] = self.modules[kernel_signatures()[fn].file].kernel(fn)
        return self._kernels[fn]

    def memset(self, arr, value: int) -> None:
        if not self.dry:
            from cuda.bindings import driver
            check(driver.cuMemsetD8(arr.ptr, value, arr.nbytes), "cuMemsetD8")

    def sync(self) -> None:
        if not self.dry:
            from cuda.bindings import driver
            check(driver.cuStreamSynchronize(self.stream), "cuStreamSynchronize")

    def program(self, key, make) -> Program:
        """The packed Program of ``key``, built by ``make()`` (a launch list) on first use."""
        if key not in self._programs:
            if len(self._programs) >= PROGRAM_CACHE:  # step shapes vary while serving: keep the newest
                self._programs.pop(next(iter(self._programs)))
            self._programs[key] = Program(self, make())
        return self._programs[key]

    # ---- CpuModel interface ----
    def forward(self, tokens: np.ndarray, slots: np.ndarray, positions: np.ndarray, kv: CudaKVPool,
                trace: list | None = None, outputs: np.ndarray | None = None) -> np.ndarray:
        """Runs rows (T,) through every layer, writing their K/V into the pool; returns (T, hidden)
        float32 after the final norm, or only the rows ``outputs`` (R,). (``trace`` is a CPU-backend
        feature: ignored.)"""
        t_max, T = self.limits.max_tokens_per_step, len(tokens)
        assert kv is self.kv and 0 < T <= t_max, f"{T} rows; this backend takes 1..{t_max} on its own pool"
        slots, positions = np.asarray(slots), np.asarray(positions)
        kv.check_rows(slots, positions)
        kv.sync()
        seq, pos = slots.astype(np.int32), positions.astype(np.int32)
        start, length = prefill_tiles(seq, pos, rows_per_tile(self.cfg.num_heads, self.cfg.num_kv_heads))
        rows = np.zeros((5, t_max), np.int32)  # ws["rows"]: tokens, seq, pos, tile_start, tile_len
        rows[0, :T], rows[1, :T], rows[2, :T] = tokens, seq, pos
        rows[3, :len(start)], rows[4, :len(start)] = start, length
        self.gpu.copy_in(self.ws["rows"], rows)
        self.program(("forward", T, len(start)), lambda: self._forward_launches(T, len(start))).run()
        self.sync()
        hidden = self.gpu.download(self.ws["normed"], (T, self.cfg.hidden_size), np.float32)
        return hidden if outputs is None else hidden[outputs]

    def _forward_launches(self, T: int, n_tiles: int):
        r, step = self.ws["rows"], 4 * self.limits.max_tokens_per_step
        view = [DeviceArray(r.ptr + i * step, step) for i in range(5)]  # int32 [T_max] each
        rows = StepRows(T, view[0], view[1], view[2], (view[3], view[4], n_tiles))
        return self.steps.forward(rows) + [self.steps.final_norm(T)]

    def dense_logits(self, hidden: np.ndarray) -> np.ndarray:
        """(B, vocab) float32: every row of the head (bf16_matvec over normed rows)."""
        from .launches import Launch
        cfg, w = self.cfg, self.weights
        out = []
        for b0 in range(0, len(hidden), self.rows_cap):
            x = np.ascontiguousarray(hidden[b0:b0 + self.rows_cap], np.float32)
            nb = len(x)
            self.gpu.copy_in(self.ws["normed"], x)
            self.program(("dense", nb), lambda: [Launch("bf16_matvec", dict(T=nb, out=cfg.vocab_size), (
                self.ws["normed"], cfg.hidden_size, w.arena[w.head], None, self.ws["logits_dense"], nb,
                cfg.hidden_size, cfg.vocab_size, 0))]).run()
            self.sync()
            out.append(self.gpu.download(self.ws["logits_dense"], (nb, cfg.vocab_size), np.float32))
        return np.concatenate(out)

    def sparse_logits(self, hidden: np.ndarray, candidates: np.ndarray) -> np.ndarray:
        """(B, K) float32 logits of candidate token ids (B, K) (head_sparse, every slot valid)."""
        from .launches import Launch
        cfg, w = self.cfg, self.weights
        K = candidates.shape[1]
        M = self.grammar.max_edges_per_node
        assert K <= M, f"{K} candidates; the buffers hold {M}"
        out = []
        for b0 in range(0, len(hidden), self.rows_cap):
            x = np.ascontiguousarray(hidden[b0:b0 + self.rows_cap], np.float32)
            nb = len(x)
            self.gpu.copy_in(self.ws["normed"], x)
            self.gpu.copy_in(self.ws["cand"], np.ascontiguousarray(candidates[b0:b0 + nb], np.int32))
            self.gpu.copy_in(self.ws["valid"], np.ones((nb, K), np.uint8))
            self.program(("sparse", nb, K), lambda: [Launch("head_sparse", dict(n_cand=K, B=nb), (
                self.ws["normed"], cfg.hidden_size, self.ws["cand"], self.ws["valid"], w.arena[w.head],
                cfg.hidden_size, cfg.vocab_size, K, nb, self.ws["logits_sparse"]))]).run()
            self.sync()
            out.append(self.gpu.download(self.ws["logits_sparse"], (nb, K), np.float32))
        return np.concatenate(out)

    # ---- sizes and teardown ----
    def device_bytes(self) -> dict[str, int]:
        return {"weights": self.weights.arena.nbytes, "kv_pool": self.kv.nbytes, "workspace": self.ws.nbytes}

    def close(self) -> None:
        """Graph loops first, then every allocation, the modules and the context (idempotent).
        Best effort: each step runs even after one fails (after a sticky device error they all
        do), and the first error is raised at the end."""
        closers, self.closers = list(reversed(self.closers)), []
        gpu, self.gpu = self.gpu, None
        steps = list(closers)
        if gpu is not None:
            for owner in (getattr(self, "weights", None), getattr(self, "ws", None)):
                if owner is not None:
                    steps.append(lambda o=owner: o.free(gpu))
            if self.kv is not None:
                steps.append(self.kv.free)
            if not self.dry:
                steps.append(self._destroy_stream)
                steps.append(gpu.close)  # unloads the modules, releases the context
        first_error(steps)

    def _destroy_stream(self) -> None:
        from cuda.bindings import driver
        stream, self.stream = self.stream, 0
        if stream:
            check(driver.cuStreamDestroy(stream), "cuStreamDestroy")


REQUIRED_KERNELS = ("embed_gather", "qk_norm_rope_kv", "attention_decode", "attention_prefill_partial",
                    "attention_merge", "rmsnorm", "grammar_candidates", "head_sparse", "grammar_advance",
                    "bf16_matvec", "fp8_matvec", "nvfp4_matvec")


def read_cubins(folder: Path) -> dict[str, bytes]:
    """kernels/<file>.cubin of a bundle folder, by file stem."""
    return {p.stem: p.read_bytes() for p in sorted((Path(folder) / KERNELS_DIR).glob("*.cubin"))}


def load_cuda_model(folder: str | Path, contract: Contract, grammar: Grammar, gpu=None,
                    strict: bool = True) -> CudaModel:
    """The bundle's CudaModel: cubins, weights (mmapped, uploaded once), KV pool and workspace."""
    folder = Path(folder)
    with SafetensorsFile(folder / WEIGHTS_FILE) as st:
        return CudaModel(contract.model, contract.limits, grammar, contract.precision.weights, st,
                         read_cubins(folder), gpu, strict)
