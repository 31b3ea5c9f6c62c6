"""A weight format's matvec arguments: how the kernels take the tensors a linear is stored as.

The matvec kernels of a format take its stored tensors (common/formats.py ``WeightFormat.stored``:
the weight, then its companions) as their parameters after ``x_stride`` / the prologue's and
before ``bias``, in the same order (fp8_e4m3: w, w_scale; nvfp4: w, w_scale, global_scale;
bf16: w). Two changes on the way, the same for every format:
  - a stored scalar (NVFP4's per-tensor weight_scale_2) is repeated per output row, float32 [out],
    so fused q|k|v and gate|up weights keep each source tensor's own;
  - e4m3 tensors are read as their uint8 codes.
The runtime's upload (runtime/cuda/weights.py), the emulated device and the references use this.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache

import ml_dtypes
import numpy as np

from toolcall.common.formats import WeightFormat
from toolcall.kernels.declarations import declaration
from toolcall.kernels.geometry import matvec_kernel

# safetensors dtype of a stored tensor -> the element type the kernels read
KERNEL_DTYPES = {"F8_E4M3": np.dtype(np.uint8), "U8": np.dtype(np.uint8), "BF16": np.dtype(ml_dtypes.bfloat16),
                 "F32": np.dtype(np.float32)}


@dataclass(frozen=True)
class WeightArg:
    """One weight argument of ``fmt``'s matvecs: kernel parameter ``param``; ``suffix`` of the stored
    tensor after the linear's weight name ("" for the weight itself); its safetensors ``stored_dtype``;
    ``per_row``: stored as one scalar, taken per output row."""

    fmt: WeightFormat
    param: str
    suffix: str
    stored_dtype: str
    per_row: bool

    @property
    def dtype(self) -> np.dtype:
        return KERNEL_DTYPES[self.stored_dtype]

    def shape(self, n_out: int, n_in: int) -> tuple[int, ...]:
        """The argument's shape for an [n_out, n_in] linear: the stored shape, (n_out,) for a per-row scalar."""
        if self.per_row:
            return (n_out,)
        return next(s for name, _, s in self.fmt.stored("w", (n_out, n_in)) if name == "w" + self.suffix)

    def nbytes(self, n_out: int, n_in: int) -> int:
        return int(np.prod(self.shape(n_out, n_in))) * self.dtype.itemsize


@lru_cache(maxsize=None)
def weight_args(fmt: WeightFormat) -> tuple[WeightArg, ...]:
    """``fmt``'s matvec weight arguments in parameter order (the stored tensors' order)."""
    params = declaration(matvec_kernel(fmt)).names
    first = params.index("x_stride") + 1
    names = params[first:params.index("bias")]
    stored = fmt.stored("w", (fmt.kernel_multiple, fmt.kernel_multiple))
    assert len(names) == len(stored), f"{matvec_kernel(fmt)} takes {names}; {fmt.name} stores {stored}"
    return tuple(WeightArg(fmt, p, name[1:], dtype, shape == ()) for p, (name, dtype, shape) in zip(names, stored))
