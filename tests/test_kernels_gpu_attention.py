"""The attention kernels on a GPU against kernels/reference_attention.py (the cases: toolcall.kernels.cases.attention),
and the bits the runtime relies on: a decode row's output does not depend on the other rows of its launch (its
splits come from its position alone), and for the tensor-core prefill attention a chunk that starts mid-sequence
and rows beside padding rows with the same bits as in the whole prompt.

Without a GPU ``test_cases_pack_their_arguments`` still runs every case on a dry-run device (names and kinds checked
on the CPU; arithmetic is judged on a GPU only)."""
from __future__ import annotations

import pytest
from test_kernels_gpu import pack_case, params

from toolcall.kernels.cases import attention, run_case


@pytest.mark.gpu
@pytest.mark.parametrize("case", params(attention.CASES))
def test_attention_kernels(dev, case):
    run_case(dev, case)


@pytest.mark.parametrize("case", params(attention.CASES))
def test_cases_pack_their_arguments(case):
    pack_case(case)
