"""Every kernel on the PTX executor (toolcall.kernels.sim), sanitizers on, against its numpy reference: the case table
of toolcall.kernels.cases marked for CI, on the four targets (sm_80, sm_90, sm_100a, sm_120a). Also: every entry
point of kernels/*.cu is run by some CI case (a kernel added later fails here until a case runs it), the hardware
e2m1 path of sm_100a / sm_120a gives the plain path's bits, and the CLI prints its SIM line."""
from __future__ import annotations

import numpy as np
import pytest

from toolcall.common.formats import NVFP4
from toolcall.kernels.cases import all_cases, run_case
from toolcall.kernels.declarations import declarations
from toolcall.kernels.geometry import FMA, MMA, PLAIN, SWIGLU, matvec_kernel
from toolcall.kernels.runner import KernelRunner, Out
from toolcall.kernels.sim.cli import DEFAULT_TARGETS, launched_kernels, main
from toolcall.kernels.sim.device import SimGpu

CI_CASES = [c for c in all_cases() if c.ci]


@pytest.mark.parametrize("target", DEFAULT_TARGETS)
@pytest.mark.parametrize("case", CI_CASES, ids=[c.id for c in CI_CASES])
def test_kernel_case_on_the_executor(case, target):
    run_case(KernelRunner(SimGpu(target, seed=1)), case)


def test_every_entry_point_runs_in_a_ci_case():
    ran = set().union(*(launched_kernels(c) for c in CI_CASES))
    assert sorted(set(declarations()) - ran) == []


@pytest.mark.parametrize("family,prologue", [(FMA, PLAIN), (MMA, PLAIN), (FMA, SWIGLU), (MMA, SWIGLU)])
def test_hardware_e2m1_gives_the_plain_paths_bits(family, prologue):
    """sm_100a / sm_120a convert NVFP4 codes with cvt.rn.f16x2.e2m1x2; sm_100 / sm_120 place the bits in software."""
    rng = np.random.default_rng(7)
    T, n_in, n_out = 3, 256, 32
    x, up = (rng.standard_normal((T, n_in)).astype(np.float32) for _ in range(2))
    codes = rng.integers(0, 256, (n_out, n_in // 2), dtype=np.uint8)
    scales = rng.integers(0x28, 0x48, (n_out, n_in // 16), dtype=np.uint8)
    head = dict(x=x) if prologue == PLAIN else dict(gate=x, up=up)
    fn = matvec_kernel(NVFP4, prologue, family)

    def run(arch):
        return KernelRunner(SimGpu(arch)).run(
            fn, **head, x_stride=n_in, w=codes, w_scale=scales, global_scale=np.full(n_out, 0.01, np.float32), bias=None,
            y=Out(np.zeros((T, n_out), np.float32)), T=T, n_in=n_in, n_out=n_out, accumulate=0)["y"]

    plain = run("sm_100")
    assert np.isfinite(plain).all() and np.abs(plain).max() > 0
    for arch in ("sm_100a", "sm_120a"):
        assert np.array_equal(run(arch).view(np.uint32), plain.view(np.uint32)), arch


def test_the_cli_runs_a_kernels_cases_and_prints_its_sim_line(capsys):
    assert main(["test", "--kernel", "argmax_rows", "--target", "sm_90"]) == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert last.startswith("SIM kernels=") and " failed=0 " in last and " seconds=" in last


def test_the_cli_refuses_an_unknown_kernel_target_or_kernels_folder(capsys, tmp_path):
    assert main(["test", "--kernel", "no_such_kernel"]) == 2
    assert main(["test", "--target", "sm_11"]) == 2
    assert main(["test", "--kernels-dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "no kernel named no_such_kernel" in err and "unknown target sm_11" in err and "lacks argmax.cu" in err


def test_a_kernel_copy_that_does_not_compile_is_a_failure_line(capsys, tmp_path):
    import shutil

    from toolcall.kernels.cuda_source import KERNEL_DIR
    for p in list(KERNEL_DIR.glob("*.cu")) + list(KERNEL_DIR.glob("*.cuh")):
        shutil.copy(p, tmp_path / p.name)
    (tmp_path / "argmax.cu").write_text((tmp_path / "argmax.cu").read_text() + "\nthis is not C++;\n")
    assert main(["test", "--kernel", "argmax_rows", "--target", "sm_90", "--kernels-dir", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert ": compile: argmax.cu does not compile for sm_90" in out
