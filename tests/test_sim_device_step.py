"""The CUDA backend's serving step on the simulated device (toolcall.kernels.sim.device.SimGpu): the bundle's real
kernels, their PTX run by the executor with the sanitizers on, answer as the CPU backend does (the same requests
and model as tests/test_device_step.py, where the emulated device runs numpy references in the kernels' place)."""
from __future__ import annotations

import time

from test_device_step import answers, batcher, cpu_answers, parts, requests  # noqa: F401 (fixtures)

from toolcall.kernels.declarations import declarations
from toolcall.kernels.nvrtc_build import compile_kernel
from toolcall.kernels.sim.device import SimGpu
from toolcall.runtime.bundle.tensor_file import SafetensorsFile
from toolcall.runtime.cuda.backend import CudaModel


def sim_model(parts, arch: str = "sm_90", columns: int | None = None):
    cubins = {d.file: compile_kernel(d.file, arch).cubin for d in declarations().values()}
    gpu = SimGpu(arch, seed=1)
    with SafetensorsFile(parts["weights"]) as st:
        model = CudaModel(parts["cfg"], parts["limits"], parts["grammar"], "fp8_e4m3", st, cubins, gpu,
                          candidate_columns=columns)
    return model, gpu


def test_the_device_step_on_the_simulated_device_answers_as_the_cpu_does(parts, cpu_answers):
    """Step buffers wider than the catalog's grammar (as request tools make them): each group's candidate rows are
    packed at its own grammar's width by the real kernels."""
    model, gpu = sim_model(parts, columns=parts["grammar"].max_edges_per_node + 5)
    reqs = requests(parts)
    pick = [0, 1, 2, 6]  # greedy, sampled, a tool subset, a request's own tool list
    start = time.monotonic()
    got = batcher(model, parts).generate([reqs[i] for i in pick])
    print(f"{len(gpu.launches)} launches in {time.monotonic() - start:.1f} s")
    assert answers(got) == answers([cpu_answers[i] for i in pick])
    assert {"sample_draw", "grammar_candidates", "head_sparse", "grammar_advance"} <= set(gpu.launches)
    model.close()
    assert gpu.allocated_bytes == 0


def test_a_cubin_the_checkout_does_not_compile_to_is_refused():
    """The simulated device runs this checkout's PTX for a bundle's cubin only where that PTX's source compiles to
    the very same cubin (another arch's or another version's kernels would be checked in the bundle's place)."""
    import pytest

    from toolcall.kernels.sim.errors import SimUnsupported
    gpu = SimGpu("sm_90")
    assert gpu.load(compile_kernel("argmax", "sm_90").cubin).file == "argmax"
    with pytest.raises(SimUnsupported, match="argmax.cubin is not what"):
        gpu.load(compile_kernel("argmax", "sm_80").cubin)
