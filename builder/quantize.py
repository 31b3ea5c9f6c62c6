"""Which checkpoint tensors are quantized, and the streaming checkpoint -> bundle weights conversion.

The one rule: the linear weights of the decoder layers (``model.layers.N.….{q,k,v,o,gate,up,
down}_proj.weight``) take the build precision; everything else (embedding, lm_head, norms,
biases) stays high precision, stored BF16. Precision "bf16" stores every tensor BF16.

Bundle tensor names (ModelOpt-compatible), per quantized ``<m>.weight``:
    fp8_e4m3: <m>.weight F8_E4M3 [out, in], <m>.weight_scale F32 [out]
    nvfp4:    <m>.weight U8 [out, in/2], <m>.weight_scale F8_E4M3 [out, in/16], <m>.weight_scale_2 F32 []
in the checkpoint's tensor order (ModelConfig.tensor_shapes), companions right after their weight.
"""
from __future__ import annotations

import collections
import math
import os
import re
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable

import ml_dtypes
import numpy as np

from common.errors import CheckpointError, QuantizeError
from runtime.model_config import ModelConfig
from runtime.tensor_file import SafetensorsWriter

from .fp8 import SOURCE_FLOATS, quantize_fp8
from .nvfp4 import BLOCK, quantize_nvfp4

PRECISIONS = ("fp8_e4m3", "nvfp4", "bf16")
_QUANTIZED_LINEAR = re.compile(r"^model\.layers\.\d+\.(?:[\w.]+\.)?(?:q|k|v|o|gate|up|down)_proj\.weight$")
_HIGH_PRECISION_CHUNK = 1 << 20  # elements per conversion step of a high-precision tensor


def check_precision(precision: str) -> None:
    if precision not in PRECISIONS:
        raise QuantizeError("quantize_invalid", f"precision {precision!r} is not supported; expected one of "
                            f"{', '.join(PRECISIONS)}", found=precision, expected=list(PRECISIONS))


def is_quantized(name: str, precision: str) -> bool:
    """True for a decoder-layer linear weight under a quantized precision."""
    return precision != "bf16" and _QUANTIZED_LINEAR.match(name) is not None


def output_specs(config: ModelConfig, precision: str) -> list[tuple[str, str, tuple[int, ...]]]:
    """Bundle weights file layout [(name, safetensors dtype, shape)], computed from shapes alone."""
    check_precision(precision)
    specs: list[tuple[str, str, tuple[int, ...]]] = []
    for name, shape in config.tensor_shapes().items():
        if not is_quantized(name, precision):
            specs.append((name, "BF16", shape))
            continue
        rows, cols = shape
        if precision == "fp8_e4m3":
            specs += [(name, "F8_E4M3", (rows, cols)), (name + "_scale", "F32", (rows,))]
            continue
        if cols % BLOCK:
            raise QuantizeError("quantize_invalid", f"{name}: NVFP4 needs the input dimension to be a multiple of "
                                f"{BLOCK}; found shape {[rows, cols]}; build this model as fp8_e4m3 or bf16",
                                tensor=name, shape=[rows, cols], block=BLOCK)
        specs += [(name, "U8", (rows, cols // 2)), (name + "_scale", "F8_E4M3", (rows, cols // BLOCK)),
                  (name + "_scale_2", "F32", ())]
    return specs


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
    check_precision(precision)
    if not is_quantized(name, precision):
        return {name: to_bf16(w, name)}
    if precision == "fp8_e4m3":
        q, scale = quantize_fp8(w, name, error=error)
        return {name: q, name + "_scale": scale}
    packed, block_scale, global_scale = quantize_nvfp4(w, name, error=error)
    return {name: packed, name + "_scale": block_scale, name + "_scale_2": global_scale}


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
    stored_as: str                  # "fp8_e4m3" | "nvfp4" | "bf16"
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
    # A source with read(name) (a view in the stored dtype, as builder.checkpoint.Checkpoint has)
    # is used as stored: quantizers widen row chunks, bf16 passes through; no float32 copy of a
    # whole tensor is made (622 MB for Qwen3-0.6B's embedding, and fresh pages are slow to fault).
    read = getattr(source, "read", None)
    w = read(name) if read is not None else None
    if not isinstance(w, np.ndarray) or w.dtype not in SOURCE_FLOATS:
        w = np.asarray(source.read_f32(name), dtype=np.float32)
    if tuple(w.shape) != tuple(shape):
        raise CheckpointError("tensor_invalid", f"{name}: the source holds shape {list(w.shape)}, the model "
                              f"config needs {list(shape)}", tensor=name, expected=list(shape), found=list(w.shape))
    quantized = is_quantized(name, precision)
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
