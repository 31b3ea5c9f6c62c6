"""Checking cuda-python results: every call's name goes into the error."""
from __future__ import annotations

from common.errors import CudaError


def check(result, call: str):
    """Unpacks a cuda.bindings ``(err, *values)`` tuple; raises CudaError naming ``call`` on failure."""
    err, *values = result if isinstance(result, tuple) else (result,)
    if int(err) != 0:
        name = getattr(err, "name", str(err))
        raise CudaError("cuda_error", f"{call} failed: {name}", call=call, error=name)
    if not values:
        return None
    return values[0] if len(values) == 1 else tuple(values)
