"""The CUDA backend: CpuModel's interface (forward over rows, dense and sparse heads) on the GPU.

Everything is allocated at load: weights in the bundle's formats (runtime/cuda/weights.py),
the KV pool as the contract sizes it (runtime/cuda/kv.py) and the step workspace
(runtime/cuda/buffers.py). A serving step with the sparse head keeps the grammar and the sampling on
the device (runtime/cuda/device_step.py: one plan copied in, one record out); the dense and check head
modes copy the normed hidden rows out and pick on the host (HostStep). Kernels come from the bundle's
kernels/<file>.cubin, compiled for the contract's arch.
A failed load frees what it took; ``close`` frees everything and releases the context.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from toolcall.common.errors import CudaError, Refusal
from toolcall.common.formats import WEIGHT_FORMATS
from toolcall.kernels.declarations import DRAW_MAX_CANDIDATES, declaration
from toolcall.kernels.geometry import FMA, KernelFamily, prefill_tiles, shape_problems
from toolcall.kernels.launch import DeviceArray, Gpu, check, first_error
from toolcall.runtime.batching.picks import HostStep
from toolcall.runtime.bundle.contract import Contract, Limits
from toolcall.runtime.bundle.files import WEIGHTS_FILE
from toolcall.runtime.bundle.model_config import ModelConfig
from toolcall.runtime.bundle.tensor_file import SafetensorsFile
from toolcall.runtime.cuda.buffers import DeviceArena, arena_sizes, workspace_plan
from toolcall.runtime.cuda.device_step import DeviceStep
from toolcall.runtime.cuda.kv import KV_FORMAT, CudaKVPool
from toolcall.runtime.cuda.launches import StepLaunches, StepRows
from toolcall.runtime.cuda.modules import DENSE_HEAD, load_modules, read_cubins
from toolcall.runtime.cuda.program import PROGRAM_CACHE, Program
from toolcall.runtime.cuda.weights import DeviceWeights
from toolcall.runtime.grammar.trie import Grammar


class CudaModel(HostStep):
    """Forward pass over rows and both heads on one GPU. ``gpu``: None (the model retains device
    0's primary context itself), a launch.Gpu (the model takes it over and closes it), or a
    DryRunGpu stand-in (launches checked or emulated on the host). ``strict=False`` records
    cubins that fail to load instead of failing (diagnostics: their kernels then raise)."""

    def __init__(self, cfg: ModelConfig, limits: Limits, grammar: Grammar, precision: str, tensors,
                 cubins: dict[str, bytes], gpu=None, strict: bool = True, candidate_columns: int | None = None,
                 state_words: int | None = None, family: KernelFamily = FMA):
        problems = shape_problems(cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads,
                                  cfg.head_dim, WEIGHT_FORMATS.get(precision))
        if problems:
            raise Refusal("bundle_invalid", f"the CUDA kernels cannot run this model: {'; '.join(problems)}",
                          problems=problems)
        self.cfg, self.limits, self.grammar, self.precision = cfg, limits, grammar, precision
        self.family = family  # the GPU kernel family (kernels/geometry.py KERNEL_FAMILIES)
        self.columns = candidate_columns  # the sparse head's width (None: the grammar's; set in _load)
        # bitset words of the widest grammar a row may bring (None: the bundle grammar's; set in _load)
        self.state_words = state_words
        self.gpu = gpu if gpu is not None else Gpu()
        # launches through gpu.launch, no driver calls: a host stand-in or the simulated device (kernels/sim)
        self.dry = getattr(self.gpu, "host_launches", False)
        self.stream, self.kv, self.closers, self._programs, self.packs = 0, None, [], {}, 0
        self.module_errors: dict[str, str] = {}  # strict=False: modules that failed to load (diagnostics)
        try:
            self._load(tensors, cubins, strict)
        except BaseException:
            self.close()
            raise

    def _load(self, tensors, cubins: dict[str, bytes], strict: bool) -> None:
        cfg, lim, g = self.cfg, self.limits, self.grammar
        self.modules = load_modules(self.gpu, cubins, self.family, strict, self.module_errors)
        self._kernels = {}
        # the sparse head's buffer width (Contract.candidate_columns): any grammar a request may bring
        self.columns = g.max_edges_per_node if self.columns is None else self.columns
        if self.columns > DRAW_MAX_CANDIDATES:  # builds refuse it (builder/kernel_build.py); a hand-made bundle may not
            raise Refusal("bundle_invalid", f"the bundle's grammars have up to {self.columns} candidates a step; the "
                          f"CUDA draw (kernels/sample_draw.cu) takes at most {DRAW_MAX_CANDIDATES}: rebuild it for "
                          "this target (the builder refuses such a catalog or --max-request-tools) or run it on the CPU",
                          candidate_columns=self.columns, limit=DRAW_MAX_CANDIDATES)
        self.state_words = max(g.bitset_words, self.state_words or 0)
        self.plan = workspace_plan(cfg, lim, self.columns, self.state_words)
        self.ws = DeviceArena(arena_sizes(self.plan)).allocate(self.gpu)
        self.weights = DeviceWeights(cfg, self.precision, tensors, g)
        self.weights.upload(self.gpu)
        self.kv = CudaKVPool(self.gpu, cfg, lim.num_pages, lim.page_size, lim.max_sequences,
                             lim.max_input_tokens + lim.max_output_tokens)
        self.memset(self.ws.base, 0)  # sync_ws must start at zero; the rest is tidiness
        self.memset(self.kv.storage, 0)  # never read before written; zeros keep stale NaN patterns out
        if not self.dry:
            from cuda.bindings import driver
            self.stream = check(driver.cuStreamCreate(0), "cuStreamCreate")
            self.gpu.stream = self.stream  # the copies queue on the model's stream, in order with its kernels
        self.steps = StepLaunches(self)
        self.rows_cap = min(lim.max_tokens_per_step, lim.max_sequences)  # head rows per launch
        self.device_step = DeviceStep(self)
        self.closers.append(self.device_step.free)

    # ---- device helpers ----
    def kernel(self, fn: str):
        file = declaration(fn).file
        if file in self.module_errors:
            raise CudaError("cuda_error", f"kernel {fn}: {file}.cubin failed to load: {self.module_errors[file]}",
                            kernel=fn)
        if fn not in self._kernels:
            self._kernels[fn] = self.modules[file].kernel(fn)
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
        """The packed Program of ``key``, built by ``make()`` (a launch list) on first use; the PROGRAM_CACHE most
        recently used are kept (``packs`` counts the builds)."""
        if key in self._programs:
            self._programs[key] = self._programs.pop(key)  # most recent last
            return self._programs[key]
        if len(self._programs) >= PROGRAM_CACHE:  # step shapes vary while serving: the least recently used out
            self._programs.pop(next(iter(self._programs)))
        self._programs[key] = Program(self, make())
        self.packs += 1
        return self._programs[key]

    # ---- the serving step ----
    def step(self, plan, kv, picker):
        """The step's record: picks on the device for the sparse head, on the host (HostStep) for the others."""
        assert kv is self.kv, "this backend steps on its own pool"
        try:
            if picker.head != "sparse":
                return HostStep.step(self, plan, kv, picker)
            return self.device_step.step(plan, picker)
        except BaseException:
            self.reset_split_counters()
            raise

    def reset_split_counters(self) -> None:
        """Zeroes attention_decode's split counters (ws["attn_count"]: each launch's last block leaves them zero, so a
        launch that stopped part-way leaves counts every later merge of those rows would trust). Best effort: where
        the context itself is lost the copy fails too, and the step's own error is the one raised."""
        try:
            counters = self.ws["attn_count"]
            self.gpu.copy_in(counters, np.zeros(counters.nbytes // 4, np.int32))
        except Exception:  # noqa: BLE001 (a lost context: the step's own error follows)
            pass

    # ---- CpuModel interface ----
    def forward(self, tokens: np.ndarray, slots: np.ndarray, positions: np.ndarray, kv: CudaKVPool,
                trace: list | None = None, outputs: np.ndarray | None = None) -> np.ndarray:
        """Runs rows (T,) through every layer, writing their K/V into the pool; returns (T, hidden)
        float32 after the final norm, or only the rows ``outputs`` (R,). (``trace`` is a CPU-backend
        feature: ignored.)"""
        assert kv is self.kv, "this backend steps on its own pool"
        T = len(tokens)
        n_tiles = self.write_rows(tokens, slots, positions)
        self.program(("forward", T, n_tiles), lambda: self._forward_launches(T, n_tiles)).run()
        self.sync()
        hidden = self.gpu.download(self.ws["normed"], (T, self.cfg.hidden_size), np.float32)
        return hidden if outputs is None else hidden[outputs]

    def write_rows(self, tokens, slots, positions, tiles_from: int | None = 0, launched: int | None = None) -> int:
        """A step's rows (T,) into ws["rows"], checked against the pool (its block table uploaded): tokens, seq,
        pos, then the prefill tiles over rows ``tiles_from`` .. T - 1 (counted from that row; None: none, every row
        the decode kernel's); rows T .. ``launched`` - 1 padding (-1: the kernels skip them). The tiles' count."""
        t_max, T = self.limits.max_tokens_per_step, len(tokens)
        assert 0 < T <= (launched or T) <= t_max, f"{T} rows ({launched} launched); this backend takes 1..{t_max}"
        slots, positions = np.asarray(slots), np.asarray(positions)
        self.kv.check_rows(slots, positions)
        self.kv.sync()
        seq, pos = slots.astype(np.int32), positions.astype(np.int32)
        rows = np.zeros((5, t_max), np.int32)  # ws["rows"]: tokens, seq, pos, tile_start, tile_len
        rows[:3, T:launched or T] = -1
        rows[0, :T], rows[1, :T], rows[2, :T] = tokens, seq, pos
        n_tiles = 0
        if tiles_from is not None:
            start, length = prefill_tiles(seq[tiles_from:], pos[tiles_from:],
                                          self.family.rows_per_tile(self.cfg.num_heads, self.cfg.num_kv_heads))
            rows[3, :len(start)], rows[4, :len(start)], n_tiles = start, length, len(start)
        self.gpu.copy_in(self.ws["rows"], rows)
        return n_tiles

    def row_views(self) -> list[DeviceArray]:
        """ws["rows"]'s five int32 [T_max] rows: tokens, seq, pos, tile_start, tile_len."""
        r, step = self.ws["rows"], 4 * self.limits.max_tokens_per_step
        return [DeviceArray(r.ptr + i * step, step) for i in range(5)]

    def _forward_launches(self, T: int, n_tiles: int):
        tokens, seq, pos, start, length = self.row_views()
        rows = StepRows(T, tokens, seq, pos, (start, length, n_tiles))
        return self.steps.forward(rows) + [self.steps.final_norm(T)]

    def dense_logits(self, hidden: np.ndarray) -> np.ndarray:
        """(B, vocab) float32: every row of the head (DENSE_HEAD over normed rows)."""
        from toolcall.runtime.cuda.launches import Launch
        cfg, w = self.cfg, self.weights
        out = []
        for b0 in range(0, len(hidden), self.rows_cap):
            x = np.ascontiguousarray(hidden[b0:b0 + self.rows_cap], np.float32)
            nb = len(x)
            self.gpu.copy_in(self.ws["normed"], x)
            self.program(("dense", nb), lambda: [Launch(DENSE_HEAD, dict(
                x=self.ws["normed"], x_stride=cfg.hidden_size, w=w.arena[w.head], bias=None, y=self.ws["logits_dense"],
                T=nb, n_in=cfg.hidden_size, n_out=cfg.vocab_size, accumulate=0))]).run()
            self.sync()
            out.append(self.gpu.download(self.ws["logits_dense"], (nb, cfg.vocab_size), np.float32))
        return np.concatenate(out)

    def sparse_logits(self, hidden: np.ndarray, candidates: np.ndarray) -> np.ndarray:
        """(B, K) float32 logits of candidate token ids (B, K) (head_sparse, every slot valid)."""
        from toolcall.runtime.cuda.launches import Launch
        cfg, w = self.cfg, self.weights
        K = candidates.shape[1]
        M = self.columns
        assert K <= M, f"{K} candidates; the buffers hold {M}"
        out = []
        for b0 in range(0, len(hidden), self.rows_cap):
            x = np.ascontiguousarray(hidden[b0:b0 + self.rows_cap], np.float32)
            nb = len(x)
            self.gpu.copy_in(self.ws["normed"], x)
            self.gpu.copy_in(self.ws["cand"], np.ascontiguousarray(candidates[b0:b0 + nb], np.int32))
            self.gpu.copy_in(self.ws["valid"], np.ones((nb, K), np.uint8))
            self.program(("sparse", nb, K), lambda: [Launch("head_sparse", dict(
                xn=self.ws["normed"], x_stride=cfg.hidden_size, cand=self.ws["cand"], valid=self.ws["valid"],
                table=w.arena[w.head], hidden=cfg.hidden_size, vocab=cfg.vocab_size, n_cand=K, B=nb,
                out=self.ws["logits_sparse"]))]).run()
            self.sync()
            out.append(self.gpu.download(self.ws["logits_sparse"], (nb, K), np.float32))
        return np.concatenate(out)

    # ---- sizes and teardown ----
    # ---- the rest of the Backend interface (runtime/backends.py) ----
    threads = max_threads = None  # the host runs no kernel threads
    lanes_supported = False

    def new_kv_pool(self, limits: Limits, kv_format, scales=None) -> CudaKVPool:
        """The device pool made at load, as the contract's limits size it (one pool a backend)."""
        if kv_format is not KV_FORMAT:
            raise Refusal("bundle_invalid", f"the CUDA kernels keep K/V in {KV_FORMAT.name}, the contract asks for "
                          f"{kv_format.name}; rebuild the bundle", expected=KV_FORMAT.name, found=kv_format.name)
        assert limits == self.limits, (limits, self.limits)
        return self.kv

    def split(self, lanes: int, rows: int) -> list:
        raise NotImplementedError("the CUDA backend steps as one lane")

    def memory(self) -> dict[str, int]:
        return self.device_bytes()

    def bind_thread(self) -> None:
        """Makes the device's primary context current on the calling thread (the engine thread; the load ran
        on another)."""
        if not self.dry:  # the emulated device has no context
            from cuda.bindings import driver
            check(driver.cuCtxSetCurrent(self.gpu.context), "cuCtxSetCurrent")

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
                steps.append(lambda: self._destroy_stream(gpu))
                steps.append(gpu.close)  # unloads the modules, releases the context
        first_error(steps)

    def _destroy_stream(self, gpu) -> None:
        from cuda.bindings import driver
        stream, self.stream = self.stream, 0
        gpu.stream = 0
        if stream:
            check(driver.cuStreamDestroy(stream), "cuStreamDestroy")


def request_state_words(contract: Contract) -> int | None:
    """Bitset words of the widest tool list a request may bring (None: requests bring none)."""
    section = contract.request_tools
    return None if section is None else -(-section.max_tools // 64)


def load_cuda_model(folder: str | Path, contract: Contract, grammar: Grammar, gpu=None,
                    strict: bool = True, family: KernelFamily = FMA) -> CudaModel:
    """The bundle's CudaModel: cubins, weights (mmapped, uploaded once), KV pool and workspace; its linear
    layers and prefill attention from the kernel ``family``."""
    folder = Path(folder)
    with SafetensorsFile(folder / WEIGHTS_FILE) as st:
        return CudaModel(contract.model, contract.limits, grammar, contract.precision.weights, st,
                         read_cubins(folder), gpu, strict, contract.candidate_columns, request_state_words(contract),
                         family)
