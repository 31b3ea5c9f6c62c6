"""The fast backend's vectorizable float32 exp (silu, softmax) against float64 numpy exp."""
from __future__ import annotations

import numpy as np
import pytest

numba = pytest.importorskip("numba")

CASES = [  # (low, high, points, most ulps off)
    (-1.0, 1.0, 200_001, 5),
    (-20.0, 20.0, 400_001, 5),
    (-87.3, 0.0, 400_001, 5),  # softmax: exp(s - max) <= 1
    (0.0, 88.3, 400_001, 5),
]


@pytest.fixture(scope="module")
def exp_loop():
    from toolcall.runtime.jit.exp32 import exp32

    @numba.njit
    def loop(x, out):
        for i in range(x.size):
            out[i] = exp32(x[i])
    return loop


@pytest.mark.parametrize("low,high,points,ulps", CASES)
def test_exp_is_within_a_few_ulps(exp_loop, low, high, points, ulps):
    x = np.linspace(low, high, points).astype(np.float32)
    out = np.empty_like(x)
    exp_loop(x, out)
    ref = np.exp(x.astype(np.float64))
    ulp = np.spacing(ref.astype(np.float32)).astype(np.float64)
    assert (np.abs(out - ref) <= ulps * ulp).all()


def test_exp_clamps_instead_of_overflowing(exp_loop):
    x = np.array([-1e30, -200.0, -87.3, 88.3, 200.0, np.float32(3e38)], np.float32)
    out = np.empty_like(x)
    exp_loop(x, out)
    assert np.isfinite(out).all()
    assert out[0] == out[1] == out[2] and out[3] == out[4] == out[5]
