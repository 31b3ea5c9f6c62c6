"""Shared fixtures: synthetic checkpoints made once per test session."""
from __future__ import annotations

import pytest

from toolcall.builder.synth import SynthOptions, synth_checkpoint


@pytest.fixture(scope="session")
def make_checkpoint(tmp_path_factory):
    """make_checkpoint(**SynthOptions fields) -> folder, cached per option set."""
    cache = {}

    def make(**kw):
        opts = SynthOptions(**kw)
        if opts not in cache:
            folder = tmp_path_factory.mktemp("ckpt")
            synth_checkpoint(folder, opts)
            cache[opts] = folder
        return cache[opts]

    return make


@pytest.fixture(scope="session")
def tiny_checkpoint(make_checkpoint):
    return make_checkpoint()


def compile_test_bundle(checkpoint, out, precision: str = "fp8_e4m3", target: str = "cpu",
                        catalog: str = "builder/data/tools-64.json"):
    """``out``: a bundle of ``checkpoint`` with the tests' limits (8 sequences of 128 input tokens, 32-token pages,
    128-row steps, 64-row prefill chunks)."""
    from toolcall.builder.compile import compile_bundle
    from toolcall.runtime.bundle.contract import BuildOptions

    options = BuildOptions(precision=precision, target=target, max_sequences=8, max_input_tokens=128,
                           max_output_tokens=None, page_size=32, max_tokens_per_step=128, prefill_chunk=64,
                           memory_budget_bytes=None, context_reserve_bytes=None, seed=0)
    compile_bundle(checkpoint, catalog, options, out)
    return out


@pytest.fixture(scope="session")
def tiny_bundle(tmp_path_factory, tiny_checkpoint):
    """A CPU FP8 bundle of the tiny checkpoint and the 64-tool example catalog."""
    return compile_test_bundle(tiny_checkpoint, tmp_path_factory.mktemp("bundles") / "tiny-fp8-cpu")


@pytest.fixture(scope="session")
def cuda_device():
    """Skips, with the probe's reason, where there is no usable CUDA device (GPU tests ask for it)."""
    from toolcall.kernels.launch import probe_gpu

    ok, why = probe_gpu()
    if not ok:
        pytest.skip(f"needs a CUDA GPU and driver: {why}")


@pytest.fixture(scope="module")
def dev(cuda_device):
    """A KernelRunner on GPU 0 (skipped where there is no usable CUDA device)."""
    from toolcall.kernels.launch import Gpu
    from toolcall.kernels.runner import KernelRunner

    gpu = Gpu()
    yield KernelRunner(gpu)
    gpu.close()


@pytest.fixture(scope="module")
def sim():
    """A KernelRunner on the PTX executor (toolcall.kernels.sim), sm_90, sanitizers on: GPU tests' kernels on the CPU."""
    from toolcall.kernels.runner import KernelRunner
    from toolcall.kernels.sim.device import SimGpu

    return KernelRunner(SimGpu("sm_90", seed=1))


@pytest.fixture(scope="session")
def shipped_bundle(tmp_path_factory):
    """A CPU FP8 bundle of the project's own trained tool model (models/toolcall-qwen3-tiny) and its catalog:
    it names several tools for multi-intent requests and none for chit-chat, as a real model does."""
    return compile_test_bundle("models/toolcall-qwen3-tiny", tmp_path_factory.mktemp("bundles") / "toolcall-fp8-cpu")
