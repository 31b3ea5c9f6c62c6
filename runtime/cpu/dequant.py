"""Bundle weights back to float32 (the reference backend's weights): each linear through its weight
format's ``dequantize`` (common/formats.py; the layouts: docs/bundle-format.md, "Weight formats"), the
unquantized tensors widened. The tensors are checked against the format's stored layout first.
"""
from __future__ import annotations

import numpy as np

from toolcall.common.errors import Refusal
from toolcall.common.formats import WEIGHT_FORMATS, WeightFormat, format_of_linear
from toolcall.runtime.bundle.tensor_file import SafetensorsFile

_HIGH_PRECISION = ("BF16", "F16", "F32")


def _refuse(st: SafetensorsFile, name: str, problem: str, **details) -> None:
    raise Refusal("bundle_invalid", f"{st.path}: {name}: {problem}; the weights file is not a bundle this "
                  "runtime reads: rebuild the bundle", file=str(st.path), tensor=name, **details)


def _expect(st: SafetensorsFile, name: str, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    info = st.tensors.get(name)
    if info is None:
        _refuse(st, name, f"missing; expected {dtype}{list(shape)}")
    if info.dtype != dtype or info.shape != shape:
        _refuse(st, name, f"expected {dtype}{list(shape)}, found {info.dtype}{list(info.shape)}",
                expected=[dtype, list(shape)], found=[info.dtype, list(info.shape)])
    return st.get(name)


def load_dequantized(st: SafetensorsFile, names: list[str] | None = None) -> dict[str, np.ndarray]:
    """Bundle tensor file -> {name: float32}, for each base name (default: all but the scales).

    A weight with a quantized format's companion tensors beside it (common/formats.py ``format_of_linear``)
    is read as that format; anything else must be BF16/F16/F32. Inconsistent dtypes or shapes are a
    Refusal (``bundle_invalid``) naming the tensor.
    """
    if names is None:
        suffixes = tuple({s for f in WEIGHT_FORMATS for s in f.companions})
        names = [n for n in st.names() if not n.endswith(suffixes)]
    out: dict[str, np.ndarray] = {}
    for name in names:
        info = st.tensors.get(name)
        if info is None:
            _refuse(st, name, "missing")
        fmt = format_of_linear(lambda n: n in st.tensors, name)
        if fmt is None:
            if info.dtype not in _HIGH_PRECISION:
                _refuse(st, name, f"{info.dtype} without scale tensors; expected one of {', '.join(_HIGH_PRECISION)}",
                        found=info.dtype)
            out[name] = st.get(name).astype(np.float32)
            continue
        if len(info.shape) != 2:
            weight_dtype = fmt.stored(name, (1, fmt.stored_multiple))[0][1]
            _refuse(st, name, f"a {fmt.name} weight is a 2-D {weight_dtype} tensor, "
                    f"found {info.dtype}{list(info.shape)}")
        rows, cols = info.shape[0], info.shape[1] * _elements_per_column(fmt)
        if cols % fmt.stored_multiple:
            _refuse(st, name, f"{fmt.name} input dimension {cols} is not a multiple of {fmt.stored_multiple}")
        for tensor, dtype, shape in fmt.stored(name, (rows, cols)):
            _expect(st, tensor, dtype, shape)
        out[name] = fmt.dequantize(st.get, name)
    return out


def _elements_per_column(fmt: WeightFormat) -> int:
    """Weights held by one column of ``fmt``'s stored weight tensor (NVFP4: 2 codes a byte)."""
    m = fmt.stored_multiple
    return m // fmt.stored("w", (1, m))[0][2][1]
