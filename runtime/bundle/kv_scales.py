"""The KV cache's per-head scales (bundles whose KV format is ``scaled``: common/formats.py), one file.

kv-scales.safetensors holds ``k_scale`` and ``v_scale``, float32 [num_layers, num_kv_heads]: a cached element
is stored as code(value * inv_scale) and read as decode(code) * scale, with inv_scale = float32(1 / scale).
The builder calibrates them (builder/kv_calibration.py) and writes them with ``write``; the runtime reads
them with ``KvScales.read``, which refuses a file that does not match the contract's model.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from toolcall.common.errors import Refusal
from toolcall.runtime.bundle.model_config import ModelConfig
from toolcall.runtime.bundle.tensor_file import SafetensorsFile, SafetensorsWriter

KV_SCALES_FILE = "kv-scales.safetensors"
NAMES = ("k_scale", "v_scale")


@dataclass(frozen=True, eq=False)
class KvScales:
    """K and V scales, float32 (num_layers, num_kv_heads) each; ``inv_k``/``inv_v`` their float32 reciprocals."""

    k: np.ndarray
    v: np.ndarray

    @property
    def inv_k(self) -> np.ndarray:
        return (np.float32(1.0) / self.k).astype(np.float32)

    @property
    def inv_v(self) -> np.ndarray:
        return (np.float32(1.0) / self.v).astype(np.float32)

    @classmethod
    def ones(cls, cfg: ModelConfig) -> "KvScales":
        """The scales of an unscaled format: reading multiplies by 1 exactly."""
        shape = (cfg.num_layers, cfg.num_kv_heads)
        return cls(np.ones(shape, np.float32), np.ones(shape, np.float32))

    def write(self, path: str | Path) -> None:
        specs = [(name, "F32", a.shape) for name, a in zip(NAMES, (self.k, self.v))]
        writer = SafetensorsWriter(path, specs)
        for name, a in zip(NAMES, (self.k, self.v)):
            writer.write(name, np.ascontiguousarray(a, np.float32))
        writer.close()

    @classmethod
    def read(cls, path: str | Path, cfg: ModelConfig) -> "KvScales":
        """The scales in ``path``; Refusal("bundle_invalid") unless it holds exactly k_scale and v_scale, float32
        [num_layers, num_kv_heads], every one finite and positive."""
        shape = (cfg.num_layers, cfg.num_kv_heads)
        with SafetensorsFile(path, error_code="bundle_invalid") as st:
            if sorted(st.names()) != sorted(NAMES):
                raise _invalid(f"tensors {sorted(st.names())}, expected {list(NAMES)}", found=sorted(st.names()))
            arrays = []
            for name in NAMES:
                a = np.array(st.get(name))
                if a.dtype != np.float32 or a.shape != shape:
                    raise _invalid(f"{name} is {a.dtype}{list(a.shape)}, expected float32{list(shape)} (layers, kv "
                                   "heads)", expected=list(shape), found=list(a.shape))
                if not (np.isfinite(a).all() and (a > 0).all()):
                    raise _invalid(f"{name} holds a scale that is not a finite positive number",
                                   found=float(a[~(np.isfinite(a) & (a > 0))][0]))
                arrays.append(a)
        return cls(*arrays)


def _invalid(what: str, **details) -> Refusal:
    return Refusal("bundle_invalid", f"{KV_SCALES_FILE}: {what}; rebuild the bundle with `builder compile`",
                   file=KV_SCALES_FILE, **details)
