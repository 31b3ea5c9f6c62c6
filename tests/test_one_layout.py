"""runtime/jit/one_layout.py: a kernel called through ``AnyLayout`` compiles one specialization for
C-contiguous and strided views alike, gives the kernel's own results, and leaves the kernel's dispatcher alone."""
from __future__ import annotations

import numpy as np
import pytest
from numba import njit

from toolcall.runtime.jit.one_layout import AnyLayout


@njit(nogil=True, cache=True)
def row_sums(x, out):
    for r in range(x.shape[0]):
        s = x.dtype.type(0)
        for i in range(x.shape[1]):
            s += x[r, i]
        out[r] = s


def test_one_compile_serves_contiguous_and_strided_views():
    calls = AnyLayout(row_sums, positions=(0,))
    joined = np.arange(24, dtype=np.float32).reshape(4, 6)
    for x in (joined[:, :3], joined[:1, :3], np.ascontiguousarray(joined[:, 3:])):  # strided, C (one row), C
        out = np.empty(x.shape[0], np.float32)
        calls(x, out)
        assert np.array_equal(out, x.sum(axis=1))
    assert len(calls.calls.signatures) == 1 and str(calls.calls.signatures[0][0]).endswith("2d, A)")
    assert row_sums.signatures == []  # the kernel's own dispatcher compiled nothing


def test_other_element_types_compile_their_own():
    calls = AnyLayout(row_sums, positions=(0,))
    calls(np.ones((2, 3), np.float64), np.empty(2, np.float64))
    calls(np.ones((2, 3), np.float32), np.empty(2, np.float32))
    assert len(calls.calls.signatures) == 2


def test_an_argument_not_made_any_layout_keeps_its_own():
    """``out`` strided is another kind of call (numba's type of it differs): compiled for it, not misread."""
    calls = AnyLayout(row_sums, positions=(0,))
    x = np.ones((3, 2), np.float32)
    wide = np.zeros((3, 2), np.float32)
    calls(x, wide[:, 0])
    assert np.array_equal(wide[:, 0], [2, 2, 2]) and not wide[:, 1].any()
    with pytest.raises(TypeError):
        calls.calls(x, np.zeros(3, np.int64))  # a kind never compiled: numba refuses it, compiles nothing
