"""The streaming checkpoint -> bundle weights conversion.

Which tensors take the build's weight format is one rule (runtime/bundle/layout.py ``is_quantized``:
the decoder layers' linear weights); the stored layout and the quantizer are the format's own
(common/formats.py). Everything else (embedding, lm_head, norms, biases) is stored BF16, in the
checkpoint's tensor order (ModelConfig.tensor_shapes), companions right after their weight.
"""
from __future__ import annotations

import collections
import math
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

import ml_dtypes
import numpy as np

from toolcall.common.errors import CheckpointError, QuantizeError
from toolcall.common.formats import WEIGHT_FORMATS, WeightFormat
from toolcall.common.minifloat import SOURCE_FLOATS
from toolcall.runtime.bundle.layout import is_quantized, weight_specs
from toolcall.runtime.bundle.model_config import ModelConfig
from toolcall.runtime.bundle.tensor_file import SafetensorsWriter

_HIGH_PRECISION_CHUNK = 1 << 20  # elements per conversion step of a high-precision tensor


def weight_format(precision: str) -> WeightFormat:
    """The registry's format for a build precision (older spellings read too); QuantizeError otherwise."""
    fmt = WEIGHT_FORMATS.get(precision)
    if fmt is None or not fmt.in_bundles:
        raise QuantizeError("quantize_invalid", f"precision {precision!r} is not supported; expected one of "
                            f"{', '.join(WEIGHT_FORMATS.bundle_names)}", found=precision,
                            expected=list(WEIGHT_FORMATS.bundle_names))
    return fmt


def output_specs(config: ModelConfig, precision: str) -> list[tuple[str, str, tuple[int, ...]]]:
    """Bundle weights file layout [(name, safetensors dtype, shape)], computed from shapes alone; a
    QuantizeError for a linear whose input dimension the format cannot store."""
    fmt = weight_format(precision)
    for name, shape in config.tensor_shapes().items():
        if is_quantized(name, fmt) and shape[1] % fmt.stored_multiple:
            raise QuantizeError("quantize_invalid", f"{name}: {fmt.name} needs the input dimension to be a multiple "
                                f"of {fmt.stored_multiple}; found shape {list(shape)}; build this model in another "
                                f"precision ({', '.join(WEIGHT_FORMATS.bundle_names)})", tensor=name,
                                shape=list(shape), multiple=fmt.stored_multiple)
    return weight_specs(config, fmt)


def to_bf16(w: np.ndarray, name: str) -> np.ndarray:
    """Any float array (float32, float16 or bfloat16) -> bfloat16 (nearest even); a bfloat16 input
    comes back as is (no copy). NaN/Inf is a QuantizeError naming the tensor."""
    flat = np.ascontiguousarray(w).reshape(-1)
    out = w if w.dtype == ml_dtypes.bfloat16 else np.empty(w.shape, ml_dtypes.bfloat16)
    flat_out = out.reshape(-1)
    widened = np.empty(min(flat.size, _HIGH_PRECISION_CHUNK), np.float32)
    for start in range(0, flat.size, _HIGH_PRECISION_CHUNK):
        stop = min(flat.size, start + _HIGH_PRECISION_CHUNK)
        f32 = widened[: stop - start]
        np.copyto(f32, flat[start:stop])
        if not np.isfinite(np.maximum(f32.max(), -f32.min())):
            index = start + int(np.flatnonzero(~np.isfinite(f32))[0])
            raise QuantizeError("quantize_invalid", f"{name}: element {index} is NaN or Inf; a checkpoint tensor "
                                "must be finite: re-export the checkpoint from a healthy training step",
                                tensor=name, index=index)
        if out is not w:
            np.copyto(flat_out[start:stop], f32, casting="same_kind")       # nearest even
    return out


def quantize_tensor(name: str, w: np.ndarray, precision: str, error: "DequantError | None" = None) \
        -> dict[str, np.ndarray]:
    """One checkpoint tensor (float32, or float16/bfloat16 as stored) -> its bundle tensors
    {name: array}, in file order. ``error`` accumulates the runtime dequantization's error."""
    fmt = weight_format(precision)
    if not is_quantized(name, fmt):
        return {name: to_bf16(w, name)}
    return fmt.quantize(w, name, error=error)


class DequantError:
    """||deq - w|| / ||w|| and max |deq - w|, accumulated over the quantizer's row chunks.

    Sums of squares are float32 per chunk (numpy's pairwise sum, whose order is fixed C code)
    added in float64; chunks depend only on the shape, so the figures do not depend on the
    machine or the worker count.
    """

    def __init__(self):
        self.err_sq = self.ref_sq = self.max_abs = 0.0

    def add(self, x: np.ndarray, deq: np.ndarray) -> None:
        """x: source rows float32; deq: their dequantized values float32 (overwritten)."""
        np.subtract(deq, x, out=deq)
        self.max_abs = max(self.max_abs, float(deq.max()), -float(deq.min()))
        self.err_sq += float(np.square(deq, out=deq).sum())
        self.ref_sq += float(np.square(x, out=deq).sum())

    @property
    def rel_rms(self) -> float:
        return math.sqrt(self.err_sq / self.ref_sq) if self.ref_sq > 0 else 0.0


def _significant(x: float) -> float:
    return float(f"{x:.6g}")


@dataclass
class TensorReport:
    name: str
    stored_as: str                  # a weight format's name (common/formats.py)
    shape: tuple[int, ...]
    bytes_in: int                   # as stored in the source (float32 if the source only has read_f32)
    bytes_out: int                  # all bundle tensors made from it
    rel_rms: float | None = None    # quantized tensors only: ||deq - w|| / ||w||
    max_abs_error: float | None = None

    def to_dict(self) -> dict:
        d = {"name": self.name, "stored_as": self.stored_as, "shape": list(self.shape),
             "bytes_in": self.bytes_in, "bytes_out": self.bytes_out}
        if self.rel_rms is not None:
            d["rel_rms"] = _significant(self.rel_rms)
            d["max_abs_error"] = _significant(self.max_abs_error)
        return d


@dataclass
class QuantReport:
    """Per-tensor error and sizes of one quantized checkpoint; ``seconds`` is the only timing."""

    precision: str
    tensors: list[TensorReport] = field(default_factory=list)
    seconds: float = 0.0
    workers: int = 1

    @property
    def bytes_in(self) -> int:
        return sum(t.bytes_in for t in self.tensors)

    @property
    def bytes_out(self) -> int:
        return sum(t.bytes_out for t in self.tensors)

    def to_dict(self) -> dict:
        """Build-report section: deterministic for given inputs except the ``timings`` field."""
        quantized = [t for t in self.tensors if t.rel_rms is not None]
        totals = {"tensors": len(self.tensors), "quantized": len(quantized),
                  "params": sum(math.prod(t.shape) for t in self.tensors),
                  "bytes_in": self.bytes_in, "bytes_out": self.bytes_out}
        if quantized:
            totals["rel_rms_max"] = _significant(max(t.rel_rms for t in quantized))
            totals["max_abs_error_max"] = _significant(max(t.max_abs_error for t in quantized))
        return {"precision": self.precision, "totals": totals, "tensors": [t.to_dict() for t in self.tensors],
                "timings": {"seconds": round(self.seconds, 3), "workers": self.workers,
                            "source_gb_per_s": round(self.bytes_in / self.seconds / 1e9, 3) if self.seconds else None}}


def _convert(source, name: str, shape: tuple[int, ...], precision: str) -> tuple[dict[str, np.ndarray], TensorReport]:
    # A source with read(name) (a view in the stored dtype, as toolcall.builder.checkpoint.Checkpoint has)
    # is used as stored: quantizers widen row chunks, bf16 passes through; no float32 copy of a
    # whole tensor is made (622 MB for Qwen3-0.6B's embedding, and fresh pages are slow to fault).
    read = getattr(source, "read", None)
    w = read(name) if read is not None else None
    if not isinstance(w, np.ndarray) or w.dtype not in SOURCE_FLOATS:
        w = np.asarray(source.read_f32(name), dtype=np.float32)
    if tuple(w.shape) != tuple(shape):
        raise CheckpointError("tensor_invalid", f"{name}: the source holds shape {list(w.shape)}, the model "
                              f"config needs {list(shape)}", tensor=name, expected=list(shape), found=list(w.shape))
    quantized = is_quantized(name, weight_format(precision))
    error = DequantError() if quantized else None
    tensors = quantize_tensor(name, w, precision, error)
    report = TensorReport(name, precision if quantized else "bf16", tuple(shape),
                          bytes_in=w.nbytes, bytes_out=sum(a.nbytes for a in tensors.values()))
    if quantized:
        report.rel_rms, report.max_abs_error = error.rel_rms, error.max_abs
    return tensors, report


def quantize_checkpoint(source, config: ModelConfig, precision: str, out_path: str | os.PathLike,
                        workers: int = 2, progress: Callable[[str, int, int], None] | None = None,
                        metadata: dict[str, str] | None = None) -> QuantReport:
    """Streams every tensor of ``config`` from ``source`` into a safetensors file at ``out_path``.

    ``source`` needs ``read_f32(name)``; if it also has ``read(name)`` returning the tensor as
    stored (float32/float16/bfloat16 view), that is used instead, so no whole-tensor float32
    copy is made. NaN/Inf checks are done here either way.

    At most ``workers`` tensors are in flight (read, quantized and checked on a thread pool;
    numpy releases the GIL); they are written in ``output_specs`` order as they complete, so
    the model is never held in memory and the bytes do not depend on ``workers``. NaN/Inf is a
    QuantizeError naming the tensor; on any error the partial file is removed.
    ``progress(name, done, total)`` is called after each source tensor is written.
    """
    specs = output_specs(config, precision)
    shapes = config.tensor_shapes()
    names = list(shapes)
    report = QuantReport(precision, workers=workers)
    started = time.perf_counter()
    writer = SafetensorsWriter(out_path, specs, metadata)
    pool = ThreadPoolExecutor(max_workers=max(1, workers), thread_name_prefix="quantize")
    try:
        pending: collections.deque = collections.deque()
        upcoming = iter(names)
        for name in upcoming:
            pending.append(pool.submit(_convert, source, name, shapes[name], precision))
            if len(pending) >= max(1, workers):
                break
        while pending:
            tensors, tensor_report = pending.popleft().result()
            for out_name, array in tensors.items():
                writer.write(out_name, array)
            del tensors
            report.tensors.append(tensor_report)
            if progress is not None:
                progress(tensor_report.name, len(report.tensors), len(names))
            next_name = next(upcoming, None)
            if next_name is not None:
                pending.append(pool.submit(_convert, source, next_name, shapes[next_name], precision))
        writer.close()
    except BaseException:
        pool.shutdown(wait=True, cancel_futures=True)
        writer.abort()
        raise
    pool.shutdown(wait=True)
    report.seconds = time.perf_counter() - started
    return report
