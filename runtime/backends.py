"""The backend interface, and the registry that loads one by the contract's target kind.

A backend is a model on one kind of target: the engine, the step batcher and the server use only what
``Backend`` lists, and never ask which implementation they hold. Implementations: the CPU reference
(runtime/cpu/model.py, numpy float32: the source of truth), the fast CPU backend (runtime/cpu/
fast_model.py, numba on the stored weights) and CUDA (runtime/cuda/backend.py). Those three return the
sampled rows' hidden states and pick on the host (runtime/batching/picks.py ``HostStep``); a backend may
instead keep the grammar and sampling on its device, as long as it fills the same ``StepRecord``.
tests/test_backends.py checks every implementation provides the interface.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol, runtime_checkable

import numpy as np

from toolcall.common.errors import CudaError, EngineError
from toolcall.runtime.batching.picks import HostPicker
from toolcall.runtime.batching.step import StepPlan, StepRecord
from toolcall.runtime.bundle.contract import CPU_TARGET, Contract
from toolcall.runtime.bundle.model_config import ModelConfig
from toolcall.runtime.cpu import CPU_BACKENDS  # noqa: F401  (the CPU backends' names, for the CLI and Engine.load)
# where a GPU bundle runs (native | sim), for the CLI, Engine.load and the server
from toolcall.runtime.cuda.devices import DEVICES, NATIVE, device_for, say_notice  # noqa: F401
from toolcall.runtime.grammar.trie import Grammar


@runtime_checkable
class Backend(Protocol):
    """A model on one target. ``kv`` is the KV pool the step batcher admits into (pages, block tables)."""

    cfg: ModelConfig
    #: host kernel threads a step uses, adjustable between steps up to ``max_threads`` (both None: not a
    #: host-threaded backend)
    threads: int | None
    max_threads: int | None
    #: whether ``split`` gives lanes whose steps may overlap (runtime/batching/lanes.py)
    lanes_supported: bool

    def new_kv_pool(self, limits, kv_format, scales=None) -> object:
        """The KV pool the contract's ``limits`` size, of ``kv_format`` elements (common/formats.py; a scaled
        format with its ``scales``, runtime/bundle/kv_scales.py), in this backend's memory."""

    def forward(self, tokens: np.ndarray, slots: np.ndarray, positions: np.ndarray, kv,
                trace: list | None = None, outputs: np.ndarray | None = None) -> np.ndarray:
        """Rows (T,) through every layer, K/V written into ``kv``; (T or R, hidden) float32 after the final norm
        (the prompt prefix's prefill and the parity tests read it)."""

    def step(self, plan: StepPlan, kv, picker: HostPicker) -> StepRecord:
        """One engine step: the plan's rows through the model, then each sampled row's pick and grammar
        state (``picker``: the host's, for backends that pick there)."""

    def step_call(self, plan: StepPlan, kv) -> Callable[[], object]:
        """``step``'s first half, for overlapped lanes: lays the step out now (the calling thread) and returns
        the call that computes it (any thread)."""

    def step_record(self, plan: StepPlan, computed: object, picker: HostPicker) -> StepRecord:
        """``step``'s second half, on the engine thread: the record of what ``step_call``'s call computed."""

    def split(self, lanes: int, rows: int) -> list["Backend"]:
        """``lanes`` backends sharing this one's weights (this one first), each with step buffers for ``rows``
        rows; only where ``lanes_supported``."""

    def memory(self) -> dict[str, int]:
        """Bytes this backend holds, by part (weights, workspace, KV pool where it owns one)."""

    def bind_thread(self) -> None:
        """Makes the backend usable from the calling thread (a GPU context made current; no-op on the CPU)."""

    def close(self) -> None:
        """Frees what the backend holds (device memory); idempotent."""


@dataclass(frozen=True)
class LoadOptions:
    """How to load: ``cpu_backend`` "fast" (numba, stored weights) or "reference" (numpy float32) on a CPU
    target; ``threads``: host kernel threads (None: the CPUs this process may use); ``gpu_kernels``: on a
    GPU target, the kernel family of the linear layers and prefill attention (toolcall.kernels.geometry
    KERNEL_FAMILIES: "fma", "mma"); ``device``: on a GPU target, where it runs (runtime/cuda/devices.py DEVICES:
    "native", or "sim", the simulated device)."""

    cpu_backend: str = "fast"
    threads: int | None = None
    gpu_kernels: str = "fma"
    device: str = "native"


@dataclass(frozen=True)
class BackendKind:
    """One kind of target: ``load(folder, contract, grammar, options)`` gives its Backend (freeing what it
    took if it fails); ``decode_graph(backend)`` the single-request decode graph, where the kind has one;
    ``first_use_note()`` what a first step on this machine will do beside stepping, to say on screen (None:
    nothing)."""

    name: str
    load: Callable[[Path, Contract, Grammar, LoadOptions], Backend]
    decode_graph: Callable[[Backend], object] | None = None
    first_use_note: Callable[[], str | None] = lambda: None


def _load_cpu(folder: Path, contract: Contract, grammar: Grammar, options: LoadOptions) -> Backend:
    from toolcall.runtime.cpu.backend import load_cpu_backend
    if options.gpu_kernels != LoadOptions.gpu_kernels:
        raise EngineError("usage", f"--gpu-kernels {options.gpu_kernels}: a kernel family of the GPU targets; "
                          f"this bundle's target is {contract.target.name}: leave the option out",
                          option="gpu_kernels", value=options.gpu_kernels)
    return load_cpu_backend(folder, contract, options)


def _cpu_first_use_note() -> str | None:
    from toolcall.runtime.cpu.backend import COLD_CACHE_NOTE, kernels_cached
    return None if kernels_cached() else COLD_CACHE_NOTE


def _load_cuda(folder: Path, contract: Contract, grammar: Grammar, options: LoadOptions) -> Backend:
    from toolcall.kernels.geometry import KERNEL_FAMILIES
    from toolcall.runtime.cuda.backend import load_cuda_model
    family = KERNEL_FAMILIES.get(options.gpu_kernels)
    if family is None:
        raise EngineError("usage", f"--gpu-kernels {options.gpu_kernels!r}: the families are "
                          f"{', '.join(KERNEL_FAMILIES)}", option="gpu_kernels", value=options.gpu_kernels)
    gpu = device_for(options.device, contract).gpu(contract)
    try:
        return load_cuda_model(folder, contract, grammar, gpu=gpu, family=family)  # frees what it took if it fails
    except EngineError:
        raise
    except Exception as e:  # a binding or driver surprise: typed, never a traceback
        raise CudaError("cuda_error", f"loading the CUDA backend failed: {type(e).__name__}: {e}",
                        reason=type(e).__name__) from None


def _cuda_decode_graph(backend: Backend) -> object:
    from toolcall.runtime.cuda.graph import DecodeGraph
    return DecodeGraph(backend)


BACKENDS = {kind.name: kind for kind in (BackendKind("cpu", _load_cpu, first_use_note=_cpu_first_use_note),
                                         BackendKind("cuda", _load_cuda, _cuda_decode_graph))}


def target_kind(contract: Contract) -> BackendKind:
    """The backend kind for the contract's target: cpu, or cuda for every GPU target."""
    return BACKENDS["cpu" if contract.target.name == CPU_TARGET else "cuda"]
