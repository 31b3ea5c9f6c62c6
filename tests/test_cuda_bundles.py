"""GPU bundles end to end: refused without a GPU, a shape the kernels cannot run refused by the builder and the
runtime, a bundle built from other kernel sources refused by `runtime check`, the shipped model's launch lists on the
emulated device, and on a GPU the engine's loops against the CPU reference."""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import shutil
from pathlib import Path

import contract_edits
import pytest
from click.testing import CliRunner
from emulated_gpu import EmulatedGpu
from tokenizers import Tokenizer

from toolcall.builder.catalog import load_catalog
from toolcall.builder.checkpoint import open_checkpoint
from toolcall.builder.quantize import quantize_checkpoint
from toolcall.builder.synth import SynthOptions, model_config_for
from toolcall.builder.trie import build_grammar
from toolcall.common.errors import EXIT_CODES, CudaError, Refusal
from toolcall.common.formats import FP8_E4M3, NVFP4
from toolcall.kernels.declarations import declarations
from toolcall.kernels.launch import probe_gpu
from toolcall.runtime.batching.batcher import Request
from toolcall.runtime.bundle.contract import Limits
from toolcall.runtime.bundle.machine import MachineFacts
from toolcall.runtime.bundle.tensor_file import SafetensorsFile
from toolcall.runtime.cli import main as runtime_cli
from toolcall.runtime.cpu.backend import cpu_batcher, load_cpu_weights
from toolcall.runtime.cuda.backend import CudaModel
from toolcall.runtime.cuda.graph import DecodeGraph
from toolcall.runtime.engine import Engine

SHAPE = dict(hidden_size=128, intermediate_size=256, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=64)
CUBINS = {d.file: b"" for d in declarations().values()}  # the emulator runs references, not cubins

_SPEC = importlib.util.spec_from_file_location("gpu_check_stages",
                                               Path(__file__).parents[1] / "bench" / "gpu_check_stages.py")
stages = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(stages)


# ---- GPU bundles on a machine without a GPU ----
@pytest.fixture
def gpu_bundle(tmp_path, tiny_bundle):
    folder = tmp_path / "bundle"
    shutil.copytree(tiny_bundle, folder)
    contract_edits.retarget_bundle_h200(folder)
    return folder


@pytest.mark.skipif(probe_gpu()[0], reason="checks the refusal on a machine without a usable GPU")
def test_gpu_bundle_without_a_gpu_is_refused_no_gpu(gpu_bundle):
    with pytest.raises(Refusal) as info:
        Engine.load(gpu_bundle)
    assert info.value.code == "no_gpu"
    result = CliRunner().invoke(runtime_cli, ["load", str(gpu_bundle), "--json"])
    assert result.exit_code == EXIT_CODES["no_gpu"] and json.loads(result.output)["error"] == "no_gpu"
    with pytest.raises(CudaError):  # past the checks (facts claim a GPU), the driver is still missing
        CudaModel(dataclasses.replace(model_config_for(SynthOptions(), 1024), **SHAPE), Limits(16, 8, 1, 8, 8, 32, 8),
                  None, "fp8_e4m3", {}, {})


def test_a_shape_the_kernels_cannot_run_is_refused_by_builder_and_runtime(tmp_path, make_checkpoint):
    from toolcall.builder.compile import compile_bundle
    from toolcall.common.errors import BuildError
    from toolcall.runtime.bundle.contract import BuildOptions
    qwen2 = make_checkpoint(family="qwen2")  # head_dim = hidden / heads = 16: no attention kernel for it
    options = BuildOptions(precision="fp8_e4m3", target="h200", max_sequences=2, max_input_tokens=64,
                           max_output_tokens=None, page_size=16, max_tokens_per_step=64, prefill_chunk=32,
                           memory_budget_bytes=None, context_reserve_bytes=None, seed=0)
    with pytest.raises(BuildError) as built:
        compile_bundle(qwen2, "builder/data/tools-64.json", options, tmp_path / "gpu")
    assert built.value.code == "build_failed" and "head_dim = 16" in built.value.message
    assert not (tmp_path / "gpu").exists()
    # `builder plan` runs the same check, so it never suggests a compile command that fails
    from toolcall.builder.cli import main as builder_cli
    planned = CliRunner().invoke(builder_cli, ["plan", str(qwen2), "--gpu-memory", "8GiB", "--target", "h200", "--json"])
    assert planned.exit_code == EXIT_CODES["build_failed"] and "head_dim = 16" in planned.output
    assert CliRunner().invoke(builder_cli, ["plan", str(qwen2), "--gpu-memory", "8GiB", "--target", "cpu"]).exit_code == 0
    # A CPU bundle retargeted by hand gets past the builder; the runtime refuses it before the driver.
    compile_bundle(qwen2, "builder/data/tools-64.json", dataclasses.replace(options, target="cpu"), tmp_path / "cpu")
    contract_edits.retarget_bundle_h200(tmp_path / "cpu")
    with pytest.raises(Refusal) as info:
        Engine.load(tmp_path / "cpu", facts=MachineFacts(1 << 40, "NVIDIA H200", "9.0", 13000))
    assert info.value.code == "bundle_invalid" and "head_dim = 16" in info.value.message


# ---- on a GPU ----
@pytest.fixture(scope="module")
def device_bundle(tmp_path_factory, cuda_device):
    work = tmp_path_factory.mktemp("gpu-bundles")
    stages.stage_build(work, ["small-fp8", "small-nvfp4"])
    return work


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["small-fp8", "small-nvfp4"])
def test_gpu_engine_loads_and_both_loops_match_the_cpu(device_bundle, name):
    engine = Engine.load(device_bundle / name)  # canary gate: host-driven and graph
    try:
        prompts = stages.e2e_prompts(engine.grammar, engine.tokenizer, engine.contract.limits.max_input_tokens)
        cpu = stages.stage_cpuref(device_bundle, [name])[name]["tokens"]
        assert [r.token_ids for r in engine.generator.generate([Request(p) for p in prompts])] == cpu
        assert [engine.decode_graph.generate(p).token_ids for p in prompts] == cpu
        assert [engine.decode_graph.generate(p, mode="host").token_ids for p in prompts] == cpu
    finally:
        engine.close()


@pytest.mark.parametrize("precision", [FP8_E4M3.name, NVFP4.name])
def test_the_shipped_model_runs_on_the_emulated_device(tmp_path, precision):
    """models/toolcall-qwen3-tiny (the model the repo ships, head_dim 64): `builder plan` for h200
    suggests a build, and the CUDA backend's launch lists give the CPU tokens, a prompt past one
    attention split (> 256 positions) included."""
    from toolcall.builder.cli import main as builder_cli
    model_dir = Path(__file__).parents[1] / "models" / "toolcall-qwen3-tiny"
    planned = CliRunner().invoke(builder_cli, ["plan", str(model_dir), "--gpu-memory", "2GiB", "--target", "h200",
                                               "--precision", precision])
    assert planned.exit_code == 0, planned.output
    ckpt = open_checkpoint(model_dir)
    cfg = ckpt.config
    assert cfg.head_dim == 64
    tok = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    grammar = build_grammar(load_catalog("builder/data/tools-64.json"), tok, cfg.eos_token_ids[0])
    limits = Limits(page_size=32, num_pages=4 * 12, max_sequences=4, max_tokens_per_step=64, prefill_chunk=64,
                    max_input_tokens=320, max_output_tokens=grammar.max_answer_tokens)
    quantize_checkpoint(ckpt, cfg, precision, tmp_path / "w.safetensors")
    requests = ["Book a flight to Paris and a hotel", "Send an email to Bob about the weather " * 40]
    prompts = [tuple(tok.encode(grammar.render_prompt(r)).ids)[-limits.max_input_tokens:] for r in requests]
    assert len(prompts[-1]) > 256
    gen = cpu_batcher(cfg, load_cpu_weights(tmp_path / "w.safetensors", cfg), grammar, limits)
    want = [r.token_ids for r in gen.generate([Request(p) for p in prompts])]
    gpu = EmulatedGpu()
    with SafetensorsFile(tmp_path / "w.safetensors") as st:
        model = CudaModel(cfg, limits, grammar, precision, st, CUBINS, gpu)
    loop = DecodeGraph(model)
    assert [loop.generate(p).token_ids for p in prompts] == want
    assert [loop.generate(p, mode="host").token_ids for p in prompts] == want
    model.close()
    assert not gpu.buffers


def test_runtime_check_refuses_a_gpu_bundle_built_from_other_kernel_sources(tmp_path, tiny_bundle):
    """`runtime check` (no GPU, nothing loaded) reads a GPU bundle's cubins: one whose kernel takes other parameters
    than this runtime's sources declare is bundle_invalid before the target check, naming the kernel."""
    from toolcall.kernels.nvrtc_build import compile_source
    folder = tmp_path / "bundle"
    shutil.copytree(tiny_bundle, folder)
    (folder / "kernels").mkdir()
    (folder / "kernels" / "sample_draw.cubin").write_bytes(compile_source(
        b'extern "C" __global__ void sample_draw(const float* logits, int B) {}', "sample_draw", "sm_90").cubin)
    contract_edits.retarget_bundle_h200(folder)  # listed, hashed, bundle_id recomputed: only the kernel check refuses
    result = CliRunner().invoke(runtime_cli, ["check", str(folder), "--json"])
    assert result.exit_code == EXIT_CODES["bundle_invalid"], result.output
    error = json.loads(result.output)
    assert error["error"] == "bundle_invalid" and "kernel sample_draw takes 2 parameters" in error["message"]


def test_rows_wider_than_the_gpu_draw_are_refused_by_builder_and_runtime(tmp_path, tiny_checkpoint):
    """kernels/sample_draw.cu draws among at most DRAW_MAX_CANDIDATES candidates a row: a GPU build whose catalog
    trie has a wider node, or whose --max-request-tools would give a request's grammar a wider root, is refused
    before any work; a CPU build of the same catalog is fine; a GPU model over wider grammars is refused at load."""
    from toolcall.builder.compile import compile_bundle
    from toolcall.common.errors import BuildError
    from toolcall.kernels.declarations import DRAW_MAX_CANDIDATES
    from toolcall.runtime.bundle.contract import BuildOptions
    tok = Tokenizer.from_file(str(Path(tiny_checkpoint) / "tokenizer.json"))
    words = sorted({w.lstrip("Ġ") for w in tok.get_vocab() if w.lstrip("Ġ").isalpha() and len(w.lstrip("Ġ")) > 1})
    catalog = tmp_path / "wide.json"
    catalog.write_text(json.dumps({"tools": [{"name": f"{w}_x"} for w in words[:700]]}))
    cfg = open_checkpoint(tiny_checkpoint).config
    grammar = build_grammar(load_catalog(catalog), tok, cfg.eos_token_ids[0])
    assert grammar.max_edges_per_node > DRAW_MAX_CANDIDATES  # tool names starting with that many tokens
    options = BuildOptions(precision="fp8_e4m3", target="h200", max_sequences=2, max_input_tokens=64,
                           max_output_tokens=None, page_size=16, max_tokens_per_step=64, prefill_chunk=32,
                           memory_budget_bytes=None, context_reserve_bytes=None, seed=0)
    with pytest.raises(BuildError) as built:
        compile_bundle(tiny_checkpoint, catalog, options, tmp_path / "gpu")
    assert built.value.code == "build_failed" and built.value.details["limit"] == DRAW_MAX_CANDIDATES
    assert built.value.details["max_edges_per_node"] == grammar.max_edges_per_node and not (tmp_path / "gpu").exists()
    # a request's own tools: T tools give its root T + 1 candidates
    tools_catalog = tmp_path / "takes-tools.json"
    tools_catalog.write_text(json.dumps({"tools": [{"name": "get_weather"}, {"name": "send_email"}],
                                         "prompt_template": "Tools:\n{tools}\nRequest: {request}\nAnswer:"}))
    for max_request_tools, refused in ((DRAW_MAX_CANDIDATES - 1, False), (DRAW_MAX_CANDIDATES, True)):
        from toolcall.builder.kernel_build import check_candidate_columns, contract_target
        if refused:
            with pytest.raises(BuildError) as wide:
                compile_bundle(tiny_checkpoint, tools_catalog, dataclasses.replace(
                    options, max_request_tools=max_request_tools), tmp_path / "gpu-tools")
            assert wide.value.code == "usage" and wide.value.details["option"] == "max_request_tools"
            assert f"--max-request-tools {DRAW_MAX_CANDIDATES - 1}" in wide.value.message
        else:
            check_candidate_columns(contract_target("h200"), 2, max_request_tools)  # passes
    limits = Limits(page_size=16, num_pages=8, max_sequences=2, max_tokens_per_step=64, prefill_chunk=32,
                    max_input_tokens=64, max_output_tokens=grammar.max_answer_tokens)
    with pytest.raises(Refusal) as loaded:  # before any tensor is read or any memory is taken
        CudaModel(cfg, limits, grammar, "fp8_e4m3", None, CUBINS, EmulatedGpu())
    assert loaded.value.code == "bundle_invalid" and loaded.value.details["limit"] == DRAW_MAX_CANDIDATES
