"""Mutation proof of the PTX executor's sanitizers: each row breaks one kernel on purpose in a copy of kernels/, and
``python -m toolcall.kernels.sim test --kernels-dir COPY`` must fail with the finding the break causes (a removed
barrier: a race; an off-by-one page: out of bounds; a wrong shuffle mask: sync; swapped mma fragments: a mismatch
against the reference). The unmutated copy passes the same command."""
from __future__ import annotations

import shutil

import pytest

from toolcall.kernels.cuda_source import KERNEL_DIR
from toolcall.kernels.sim.cli import main

# (name, file, text, replacement, kernel whose cases run, the failure the executor must report)
MUTATIONS = [
    ("barrier removed after staging xs", "matvec.cuh",
     "            *reinterpret_cast<float4*>(&xs[t * XS_ROW + k + (k / F::ELEMS) * 4]) = v;\n        }\n        __syncthreads();",
     "            *reinterpret_cast<float4*>(&xs[t * XS_ROW + k + (k / F::ELEMS) * 4]) = v;\n        }",
     "bf16_matvec", "race"),
    ("page index off by one", "rope.cuh", "return (((long long)page * page_size", "return (((long long)(page + 1) * page_size",
     "qk_norm_rope_kv", "out_of_bounds"),
    ("half-warp shuffle mask", "common.cuh", "v += __shfl_xor_sync(FULL_MASK, v, off)",
     "v += __shfl_xor_sync(0x0000ffffu, v, off)", "rmsnorm", "sync"),
    ("two mma A fragments swapped", "linear_mma.cuh", '"r"(a[1]), "r"(a[2])', '"r"(a[2]), "r"(a[1])',
     "fp8_e4m3_linear_mma", "mismatch"),
]


def mutated_copy(tmp_path, file=None, text=None, replacement=None):
    folder = tmp_path / "kernels"
    folder.mkdir()
    for p in list(KERNEL_DIR.glob("*.cu")) + list(KERNEL_DIR.glob("*.cuh")):
        shutil.copy(p, folder / p.name)
    if file:
        source = (folder / file).read_text()
        assert source.count(text) == 1, f"the mutation's text is not in {file} exactly once"
        (folder / file).write_text(source.replace(text, replacement))
    return folder


@pytest.mark.parametrize("name,file,text,replacement,kernel,kind", MUTATIONS, ids=[m[0] for m in MUTATIONS])
def test_the_executor_catches_a_broken_kernel(tmp_path, capsys, name, file, text, replacement, kernel, kind):
    folder = mutated_copy(tmp_path, file, text, replacement)
    assert main(["test", "--kernel", kernel, "--target", "sm_90", "--kernels-dir", str(folder)]) == 1
    out = capsys.readouterr().out
    assert f": {kind}:" in out, out
    assert "SIM kernels=" in out.splitlines()[-1]


def test_the_unmutated_copy_passes(tmp_path, capsys):
    folder = mutated_copy(tmp_path)
    assert main(["test", "--kernel", "rmsnorm", "--target", "sm_90", "--kernels-dir", str(folder)]) == 0, \
        capsys.readouterr().out
