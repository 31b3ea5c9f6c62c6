"""The linear-layer kernels of both families (kernels/geometry.py KERNEL_FAMILIES: FMAs, mma.sync) over the batch
sizes a serving step takes, against kernels/reference.py, and the rule the serving step's bit gates rest on: a row's
output bits are the same alone and beside 1, 7, 63 or 255 other rows (the cases: toolcall.kernels.cases.linear).

On a GPU the cases compare; without one ``test_cases_pack_their_arguments`` still runs every case on a dry-run
device (names and kinds checked on the CPU; arithmetic is judged on a GPU only)."""
from __future__ import annotations

import pytest
from test_kernels_gpu import pack_case, params

from toolcall.kernels.cases import linear, run_case


@pytest.mark.gpu
@pytest.mark.parametrize("case", params(linear.CASES))
def test_gpu_kernels(dev, case):
    run_case(dev, case)


@pytest.mark.parametrize("case", params(linear.CASES))
def test_cases_pack_their_arguments(case):
    pack_case(case)
