"""The CPU backends' share of the Backend interface (runtime/backends.py), and their loader.

Both CPU backends hold the model in this process's memory, step on the calling thread and pick on the
host (``HostStep``): the reference (runtime/cpu/model.py, numpy float32 under Hugging Face names,
dequantized at load) and the fast one (runtime/cpu/fast_model.py, numba kernels on the stored weights).
Their KV pool is a paged pool in host memory (runtime/cpu/kv_pool.py) that lanes share.
"""
from __future__ import annotations

from pathlib import Path

from toolcall.common.errors import EngineError, Refusal
from toolcall.runtime.batching.picks import HostStep
from toolcall.runtime.bundle.contract import Contract, Limits
from toolcall.runtime.bundle.files import WEIGHTS_FILE
from toolcall.runtime.bundle.machine import available_cpus
from toolcall.runtime.bundle.tensor_file import SafetensorsFile
from toolcall.runtime.cpu import CPU_BACKENDS
from toolcall.runtime.cpu.kv_pool import PagedKVPool


class CpuBackend(HostStep):
    """What both CPU backends share: no device to bind or free, a host KV pool, one lane unless overridden."""

    threads: int | None = None
    max_threads: int | None = None
    lanes_supported = False

    def new_kv_pool(self, limits: Limits, kv_format, scales=None) -> PagedKVPool:
        return PagedKVPool(self.cfg, limits.num_pages, limits.page_size, limits.max_sequences,
                           limits.max_input_tokens + limits.max_output_tokens, kv_format, scales)

    def split(self, lanes: int, rows: int) -> list:
        raise NotImplementedError(f"{type(self).__name__} steps as one lane")

    def bind_thread(self) -> None:
        pass

    def close(self) -> None:
        pass


COLD_CACHE_NOTE = "compiling CPU kernels, once: ~15 s (later loads and builds reuse them)"


def kernels_cached() -> bool:
    """Whether numba's on-disk cache already holds this machine's compiled CPU linear kernels (the first use of a
    fresh install compiles them, which takes most of its first minute)."""
    import numba

    from toolcall.runtime.cpu import panel_kernels
    here = Path(panel_kernels.__file__).resolve()
    folder = Path(numba.config.CACHE_DIR) if numba.config.CACHE_DIR else here.parent / "__pycache__"
    return any(folder.rglob(f"{here.stem}.linear_panels*.nbi"))


def _stored(weights_path, cfg):
    from toolcall.runtime.cpu.stored_weights import load_stored
    return load_stored(weights_path, cfg)


def _dequantized(weights_path, cfg):
    from toolcall.runtime.cpu.dequant import load_dequantized
    with SafetensorsFile(weights_path, error_code="bundle_invalid") as st:
        return load_dequantized(st, list(cfg.tensor_shapes()))


# each CPU backend's weights: fast, the stored arrays memory-mapped (StoredWeights); reference, float32
# under Hugging Face names (dequantized)
WEIGHT_LOADERS = {"fast": _stored, "reference": _dequantized}
assert tuple(WEIGHT_LOADERS) == CPU_BACKENDS


def load_cpu_weights(weights_path: str | Path, cfg, backend: str = "reference"):
    """A bundle's weights for the CPU backend named ``backend`` (CPU_BACKENDS)."""
    return WEIGHT_LOADERS[backend](weights_path, cfg)


def cpu_model(cfg, weights, limits: Limits, threads: int | None = None):
    """The CPU backend over ``weights`` (``load_cpu_weights``' result): fast for StoredWeights, with step
    buffers as ``limits`` size them; reference for a float32 dict."""
    from toolcall.runtime.cpu.fast_model import FastCpuModel
    from toolcall.runtime.cpu.model import CpuModel
    from toolcall.runtime.cpu.stored_weights import StoredWeights
    if isinstance(weights, StoredWeights):
        context = limits.max_input_tokens + limits.max_output_tokens
        return FastCpuModel(cfg, weights, limits.max_tokens_per_step, context,
                            threads if threads is not None else available_cpus())
    return CpuModel(cfg, weights)


def cpu_batcher(cfg, weights, grammar, limits: Limits, head: str = "sparse", threads: int | None = None,
                kv_format=None, kv_scales=None):
    """A StepBatcher on the CPU backend over ``weights``, its pool and buffers sized exactly as ``limits`` say;
    K/V in ``kv_format`` (default bf16; a scaled format with its ``kv_scales``)."""
    from toolcall.common.formats import KV_BF16
    from toolcall.runtime.batching.batcher import StepBatcher
    model = cpu_model(cfg, weights, limits, threads)
    pool = model.new_kv_pool(limits, kv_format or KV_BF16, kv_scales)
    return StepBatcher.for_limits(model, pool, grammar, limits, head)


def load_cpu_backend(folder: Path, contract: Contract, options) -> CpuBackend:
    """The bundle's CPU backend (``options``: runtime/backends.py LoadOptions); Refusal("bundle_invalid") for
    a weights file that hashes right but does not parse, ("insufficient_memory") where buffers do not fit."""
    try:
        weights = load_cpu_weights(folder / WEIGHTS_FILE, contract.model, options.cpu_backend)
    except EngineError:
        raise
    except Exception as e:  # a file that hashes right but does not parse: the builder wrote it wrong
        raise Refusal("bundle_invalid", f"bundle file failed to load: {type(e).__name__}: {e}",
                      reason=type(e).__name__) from None
    try:
        return cpu_model(contract.model, weights, contract.limits, options.threads)
    except MemoryError:
        raise Refusal("insufficient_memory", f"the step buffers of {contract.limits} do not fit this machine's "
                      "memory", needed=contract.memory.total_bytes, available=None) from None
