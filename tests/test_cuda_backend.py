"""The CUDA backend's host side: buffer plans, launch lists, the decode loop and the GPU load path.

On CPU the backend runs on tests/emulated_gpu.py (numpy references behind the real launch
arguments), so pointers, strides, fused layouts, prefill padding, grammar buffers and the
graph loop's logic are checked against the CPU backend's tokens without a driver. The GPU
tests (marked gpu) load a real bundle; without a device they skip with the reason.
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import shutil
from pathlib import Path

import contract_edits
import numpy as np
import pytest
from click.testing import CliRunner
from emulated_gpu import EmulatedGpu
from tokenizers import Tokenizer

from toolcall.builder.catalog import load_catalog
from toolcall.builder.checkpoint import open_checkpoint
from toolcall.builder.memory_plan import kv_pool_bytes, weights_bytes, workspace_breakdown
from toolcall.builder.quantize import quantize_checkpoint
from toolcall.builder.synth import SynthOptions, model_config_for
from toolcall.builder.trie import build_grammar
from toolcall.common.errors import EXIT_CODES, CudaError, Refusal
from toolcall.common.formats import FP8_E4M3, NVFP4
from toolcall.kernels.declarations import declaration, declarations
from toolcall.kernels.geometry import FMA, KERNEL_FAMILIES, MATVEC_FORMATS, MMA, RMSNORM, SWIGLU, matvec_kernel
from toolcall.kernels.launch import probe_gpu
from toolcall.kernels.weight_args import weight_args
from toolcall.runtime.batching.batcher import Request, StepBatcher
from toolcall.runtime.bundle.contract import CONTRACT_FILE, Limits
from toolcall.runtime.bundle.machine import MachineFacts
from toolcall.runtime.bundle.tensor_file import SafetensorsFile
from toolcall.runtime.cli import main as runtime_cli
from toolcall.runtime.cpu.backend import cpu_batcher, load_cpu_weights
from toolcall.runtime.cuda.backend import CudaModel
from toolcall.runtime.cuda.buffers import BREAKDOWN_NAMES, attention_splits, workspace_plan
from toolcall.runtime.cuda.graph import DecodeGraph
from toolcall.runtime.cuda.graph_build import dependencies
from toolcall.runtime.engine import Engine

PRECISIONS = MATVEC_FORMATS  # every weight format with GPU kernels
IDS = [f.name for f in PRECISIONS]
SHAPE = dict(hidden_size=128, intermediate_size=256, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=64)
REQUESTS = ["Book a flight to Paris", "What's the weather in Oslo tomorrow?", "Send an email to Bob " * 12]
CUBINS = {d.file: b"" for d in declarations().values()}  # the emulator runs references, not cubins

_SPEC = importlib.util.spec_from_file_location("gpu_check_stages",
                                               Path(__file__).parents[1] / "bench" / "gpu_check_stages.py")
stages = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(stages)


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    """A kernel-compatible synthetic checkpoint: config, grammar, limits, prompts, weights files."""
    root = tmp_path_factory.mktemp("small-cuda")
    original = model_config_for

    def config_for(opts, vocab):
        return dataclasses.replace(original(opts, vocab), **SHAPE)
    import toolcall.builder.synth as synth
    synth.model_config_for = config_for
    try:
        synth.synth_checkpoint(root / "ckpt", SynthOptions())
    finally:
        synth.model_config_for = original
    ckpt = open_checkpoint(root / "ckpt")
    tok = Tokenizer.from_file(str(root / "ckpt" / "tokenizer.json"))
    grammar = build_grammar(load_catalog("builder/data/tools-64.json"), tok, ckpt.config.eos_token_ids[0])
    limits = Limits(page_size=16, num_pages=4 * 12, max_sequences=4, max_tokens_per_step=64, prefill_chunk=32,
                    max_input_tokens=160, max_output_tokens=grammar.max_answer_tokens)
    files = {}
    for fmt in PRECISIONS:
        files[fmt] = root / f"{fmt.name}.safetensors"
        quantize_checkpoint(ckpt, ckpt.config, fmt.name, files[fmt])
    prompts = [tuple(tok.encode(grammar.render_prompt(r)).ids) for r in REQUESTS]
    assert len(prompts[-1]) > 2 * limits.prefill_chunk  # the long prompt spans several chunks
    return dict(cfg=ckpt.config, grammar=grammar, limits=limits, files=files, prompts=prompts, ckpt=root / "ckpt")


@pytest.fixture(scope="module")
def cpu_tokens(small):
    out = {}
    for fmt, path in small["files"].items():
        gen = cpu_batcher(small["cfg"], load_cpu_weights(path, small["cfg"]), small["grammar"], small["limits"])
        out[fmt] = [r.token_ids for r in gen.generate([Request(p) for p in small["prompts"]])]
    return out


def emulated_model(small, fmt, family=FMA) -> tuple[CudaModel, EmulatedGpu]:
    gpu = EmulatedGpu()
    with SafetensorsFile(small["files"][fmt]) as st:  # CudaModel takes the contract's name of the format
        model = CudaModel(small["cfg"], small["limits"], small["grammar"], fmt.name, st, CUBINS, gpu, family=family)
    return model, gpu


def generator(model: CudaModel, small, head: str = "sparse") -> StepBatcher:
    lim = small["limits"]
    return StepBatcher(model, model.kv, small["grammar"], max_input_tokens=lim.max_input_tokens,
                     max_output_tokens=lim.max_output_tokens, max_tokens_per_step=lim.max_tokens_per_step,
                     prefill_chunk=lim.prefill_chunk, head=head)


# ---- buffer plans ----
def test_workspace_plan_matches_the_memory_plan():
    cfg = model_config_for(SynthOptions(shape="qwen3-0.6b"), 151936)
    limits = Limits(page_size=32, num_pages=528, max_sequences=8, max_tokens_per_step=256, prefill_chunk=128,
                    max_input_tokens=2048, max_output_tokens=35)
    plan, breakdown = workspace_plan(cfg, limits, 32, 1), workspace_breakdown(cfg, limits, 32)
    assert set(BREAKDOWN_NAMES) == set(breakdown)
    for name in BREAKDOWN_NAMES:
        assert plan[name] == breakdown[name], name
    assert attention_splits(limits) == 9  # ceil(2083 / 256): the kernels' split size


@pytest.mark.parametrize("precision", PRECISIONS, ids=IDS)
def test_device_bytes_match_the_contract_plan(small, precision):
    model, gpu = emulated_model(small, precision)
    cfg, lim = small["cfg"], small["limits"]
    model_keys = [k for k in model.weights.arena.sizes if not k.startswith(("grammar.", "inv_freq"))]
    # a stored scalar (nvfp4's weight_scale_2, 4 bytes in the file) is repeated per output row on the
    # device (float32 [out], so fused q|k|v and gate|up keep each of their 7 tensors' own)
    fmt = model.weights.fmt
    rows = cfg.q_dim + 2 * cfg.kv_dim + cfg.hidden_size + 2 * cfg.intermediate_size + cfg.hidden_size
    expanded = sum(4 * (rows - 7) * cfg.num_layers for a in weight_args(fmt) if a.per_row)
    assert sum(model.weights.arena.sizes[k] for k in model_keys) - expanded == weights_bytes(cfg, fmt)
    assert model.kv.nbytes == kv_pool_bytes(cfg, lim.num_pages, lim.page_size)
    model.close()
    assert not gpu.buffers, "close() left device allocations behind"


# ---- launch lists ----
@pytest.mark.parametrize("family", KERNEL_FAMILIES.values(), ids=KERNEL_FAMILIES)
@pytest.mark.parametrize("precision,per_layer", [(f, 5) for f in PRECISIONS], ids=IDS)
def test_decode_step_launches(small, precision, per_layer, family):
    model, _ = emulated_model(small, precision, family)
    loop = DecodeGraph(model)
    body = loop.body(0x1234)
    tail = ["rmsnorm", "grammar_candidates", "head_sparse", "grammar_advance"]
    assert [ln.fn for ln in body[-4:]] == tail and body[0].fn == "embed_gather"
    assert len(body) == 1 + per_layer * small["cfg"].num_layers + 4
    assert body[-1].args["cond_handle"] == 0x1234 and loop.first_sample()[-1].args["cond_handle"] == 0
    deps, last = dependencies(body)
    assert last == [len(body) - 1] and deps[0] == []
    f = model.weights.fmt
    assert f is precision and f.kernel_prefix == f.name  # the contract's name is the kernels' prefix
    mv = lambda prologue="": matvec_kernel(f, prologue, family)  # noqa: E731
    assert [ln.fn for ln in body[1:1 + per_layer]] == [mv(RMSNORM), "attention_decode", mv(), mv(RMSNORM), mv(SWIGLU)]
    L = small["cfg"].num_layers
    # prefill chunks: a layer's qkv, rope + KV write, the family's attention (fma: partials, merge; mma: one
    # pass), o_proj, gate_up, down
    plan, attention = loop.plan(3), list(family.prefill_attention)
    assert len(plan) == 3 * (1 + (5 + len(attention)) * L) + 4 and plan[-1].args["cond_handle"] == 0
    assert [ln.fn for ln in plan[1:3 + len(attention)]] == [mv(RMSNORM), "qk_norm_rope_kv", *attention]
    # every launch of every list names exactly its kernel's declared parameters
    for ln in body + plan + model._forward_launches(5, 2):
        assert sorted(ln.args) == sorted(declaration(ln.fn).names), ln.fn
    model.close()


# ---- the whole backend on the emulated device ----
@pytest.mark.parametrize("family", KERNEL_FAMILIES.values(), ids=KERNEL_FAMILIES)
@pytest.mark.parametrize("precision", PRECISIONS, ids=IDS)
def test_emulated_backend_gives_the_cpu_tokens(small, cpu_tokens, precision, family):
    """Every path, each kernel family (the emulator runs each family's reference: the mma family's activations
    as bf16 hi + lo), the CPU's tokens."""
    model, gpu = emulated_model(small, precision, family)
    want = cpu_tokens[precision]
    prompts = small["prompts"]
    assert [r.token_ids for r in generator(model, small).generate([Request(p) for p in prompts])] == want
    assert [r.token_ids for r in generator(model, small, "check").generate([Request(p) for p in prompts])] == want
    loop = DecodeGraph(model)
    assert [loop.generate(p).token_ids for p in prompts] == want
    assert [loop.generate(p, mode="host").token_ids for p in prompts] == want
    assert model.kv.free_slots == small["limits"].max_sequences and model.kv.free_pages == small["limits"].num_pages
    model.close()
    assert not gpu.buffers


def test_emulated_backend_shares_a_prefix_through_the_same_page_table(small, cpu_tokens):
    """Pinned prefix pages (2 whole, 1 partial copied device to device) on the CUDA pool, then the same prompts
    again (their full pages shared, their last pages' rows copied): the CPU's tokens."""
    from toolcall.runtime.batching.prefix_cache import prefill_prefix
    model, gpu = emulated_model(small, FP8_E4M3)
    prompts, kv = small["prompts"], model.kv
    prefix = prompts[-1][:2 * small["limits"].page_size + 5]
    kv.enable_prefix_cache("emulated")
    prefill_prefix(model, kv, prefix, small["limits"].prefill_chunk)
    results = generator(model, small).generate([Request(p) for p in prompts])
    assert [r.token_ids for r in results] == cpu_tokens[FP8_E4M3]
    assert results[-1].cached_prompt_tokens == len(prefix)  # forward's check_rows: no row wrote a shared page
    again = generator(model, small).generate([Request(p) for p in prompts])  # each last page's rows copied on device
    assert [r.token_ids for r in again] == cpu_tokens[FP8_E4M3]
    assert [r.cached_prompt_tokens for r in again] == [len(p) - 1 for p in prompts]
    expected = np.zeros(kv.num_pages, np.int32)
    expected[kv.prefix_pages] = 1
    assert np.array_equal(kv.refs, expected) and kv.free_pages + kv.pinned_pages == kv.num_pages
    model.close()
    assert not gpu.buffers


def test_emulated_forward_matches_cpu_hidden(small):
    cfg, lim = small["cfg"], small["limits"]
    gen = cpu_batcher(cfg, load_cpu_weights(small["files"][FP8_E4M3], cfg), small["grammar"], lim)
    model, _ = emulated_model(small, FP8_E4M3)
    p = np.asarray(small["prompts"][0])
    rows = (p, np.zeros(len(p), np.int64), np.arange(len(p)))
    assert gen.kv.admit(len(p)) == 0 and model.kv.admit(len(p)) == 0
    want = gen.model.forward(*rows, gen.kv)
    got = model.forward(*rows, model.kv)
    assert np.linalg.norm(got - want) / np.linalg.norm(want) < 1e-5
    model.close()


def test_failed_load_frees_what_it_took(small):
    gpu = EmulatedGpu()
    with SafetensorsFile(small["files"][FP8_E4M3]) as st:
        tensors = {n: st.get(n) for n in st.names() if n != "model.norm.weight"}
    with pytest.raises(Refusal) as info:
        CudaModel(small["cfg"], small["limits"], small["grammar"], "fp8_e4m3", tensors, CUBINS, gpu)
    assert info.value.code == "bundle_invalid" and "model.norm.weight" in info.value.message
    assert not gpu.buffers
    with pytest.raises(Refusal, match="cubin is missing"):
        CudaModel(small["cfg"], small["limits"], small["grammar"], "fp8_e4m3", tensors, {}, gpu)
    before_mma = {name: blob for name, blob in CUBINS.items() if not name.startswith("linear_mma")}
    with pytest.raises(Refusal, match=r"linear_mma_\w+\.cubin is missing"):  # a bundle built before the family
        CudaModel(small["cfg"], small["limits"], small["grammar"], "fp8_e4m3", tensors, before_mma, gpu, family=MMA)
    assert not gpu.buffers


def test_a_cubin_from_other_kernel_sources_is_refused_before_it_loads(small):
    """A bundle whose sample_draw was compiled with another parameter list (kernels/cubin.py reads it) is refused,
    typed, naming the kernel and both layouts: launching it would put arguments in the wrong places."""
    from toolcall.kernels.nvrtc_build import compile_source
    other = compile_source(b'extern "C" __global__ void sample_draw(const float* logits, int B) {}', "sample_draw",
                           "sm_90").cubin
    gpu = EmulatedGpu()
    with SafetensorsFile(small["files"][FP8_E4M3]) as st, pytest.raises(Refusal) as info:
        CudaModel(small["cfg"], small["limits"], small["grammar"], "fp8_e4m3", st, {**CUBINS, "sample_draw": other},
                  gpu)
    assert info.value.code == "bundle_invalid" and "kernel sample_draw takes 2 parameters" in info.value.message
    assert info.value.details["found"] == [[0, 8], [8, 4]] and not gpu.buffers


def test_a_bundle_with_kernels_under_a_formats_old_name_is_refused_naming_it(small):
    """GPU bundles built before the fp8 kernels took the format's one name (fp8_e4m3) hold
    kernels/matvec_fp8.cubin: refused, typed, with the old spelling named."""
    old = {name.replace("fp8_e4m3", "fp8"): blob for name, blob in CUBINS.items()}
    gpu = EmulatedGpu()
    with SafetensorsFile(small["files"][FP8_E4M3]) as st, pytest.raises(Refusal) as info:
        CudaModel(small["cfg"], small["limits"], small["grammar"], "fp8_e4m3", st, old, gpu)
    assert info.value.code == "bundle_invalid" and "old name" in info.value.message
    assert info.value.details["old_spelling"] == "kernels/matvec_fp8.cubin" and not gpu.buffers


# ---- GPU bundles on a machine without a GPU ----
@pytest.fixture
def gpu_bundle(tmp_path, tiny_bundle):
    folder = tmp_path / "bundle"
    shutil.copytree(tiny_bundle, folder)
    retarget_h200(folder)
    return folder


def retarget_h200(folder: Path) -> None:
    """Edits a CPU bundle's contract to an h200 target as a forger would: every file (kernels/
    included) listed and hashed, bundle_id recomputed, so only the later checks can refuse it."""
    from toolcall.runtime.bundle.contract import compute_bundle_id
    from toolcall.runtime.bundle.files import file_entry
    path = folder / CONTRACT_FILE
    d = json.loads(path.read_text())
    contract_edits.retarget_h200(d)
    for p in sorted((folder / "kernels").glob("*")) if (folder / "kernels").is_dir() else []:
        d["files"][f"kernels/{p.name}"] = dataclasses.asdict(file_entry(p))
    d["engine"]["bundle_id"] = compute_bundle_id(d)
    path.write_text(json.dumps(d))


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
    retarget_h200(tmp_path / "cpu")
    with pytest.raises(Refusal) as info:
        Engine.load(tmp_path / "cpu", facts=MachineFacts(1 << 40, "NVIDIA H200", "9.0", 13000))
    assert info.value.code == "bundle_invalid" and "head_dim = 16" in info.value.message


@pytest.mark.parametrize("family", KERNEL_FAMILIES)
def test_engine_serves_a_gpu_bundle_on_the_emulated_device(small, tmp_path, monkeypatch, family):
    """Engine.load's GPU branch end to end, with each kernel family: target check, CUDA backend, canary on both
    decode paths."""
    import toolcall.runtime.cuda.backend
    from toolcall.builder.compile import compile_bundle
    from toolcall.runtime.bundle.contract import BuildOptions
    options = BuildOptions(precision="fp8_e4m3", target="cpu", max_sequences=4, max_input_tokens=96,
                           max_output_tokens=None, page_size=16, max_tokens_per_step=64, prefill_chunk=32,
                           memory_budget_bytes=None, context_reserve_bytes=None, seed=0)
    folder = tmp_path / "bundle"
    compile_bundle(small["ckpt"], "builder/data/tools-64.json", options, folder)
    (folder / "kernels").mkdir()
    for name in CUBINS:  # empty files, listed and hashed: the emulator ignores their bytes
        (folder / "kernels" / f"{name}.cubin").write_bytes(b"")
    retarget_h200(folder)
    monkeypatch.setattr(toolcall.runtime.cuda.backend, "Gpu", EmulatedGpu)
    engine = Engine.load(folder, facts=MachineFacts(1 << 40, "NVIDIA H200", "9.0", 13000), gpu_kernels=family)
    try:
        assert engine.model.family is KERNEL_FAMILIES[family]
        (result,) = engine.run(["Book a flight to Paris"])
        assert result.finish == "done" and result.tools
        assert engine.decode_graph.generate(engine.encode("Book a flight to Paris")).token_ids == result.token_ids
    finally:
        engine.close()


# ---- on a GPU ----
@pytest.fixture(scope="module")
def device_bundle(tmp_path_factory):
    ok, why = probe_gpu()
    if not ok:
        pytest.skip(f"needs a CUDA GPU and driver: {why}")
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


def test_attention_decode_prefetches_what_the_step_reads_next(small):
    """Each decode layer's attention_decode asks L2 for one arena span: that layer's o_proj, gate|up, down (and its
    norms), then the next layer's q|k|v; the last layer's span ends with its own weights."""
    model, _ = emulated_model(small, FP8_E4M3)
    w, arena = model.weights, model.weights.arena
    body = [ln for ln in DecodeGraph(model).body(0) if ln.fn == "attention_decode"]
    assert len(body) == len(w.layers)
    for i, (ln, layer) in enumerate(zip(body, w.layers)):
        start, end = ln.args["prefetch"].ptr - arena.base.ptr, ln.args["prefetch"].ptr - arena.base.ptr + \
            ln.args["prefetch_bytes"]
        inside = {k for k in arena.sizes if start <= arena.offsets[k] and arena.offsets[k] + arena.sizes[k] <= end}
        wanted = {*layer.o.keys.values(), *layer.gate_up.keys.values(), *layer.down.keys.values()}
        nxt = set(w.layers[i + 1].qkv.keys.values()) if i + 1 < len(w.layers) else set()
        assert wanted | nxt <= inside and not any(k in inside for k in layer.qkv.keys.values())
        assert all(k.startswith((f"L{i}.", f"L{i + 1}.")) for k in inside)
    model.close()


def test_runtime_check_refuses_a_gpu_bundle_built_from_other_kernel_sources(tmp_path, tiny_bundle):
    """`runtime check` (no GPU, nothing loaded) reads a GPU bundle's cubins: one whose kernel takes other parameters
    than this runtime's sources declare is bundle_invalid before the target check, naming the kernel."""
    from toolcall.kernels.nvrtc_build import compile_source
    folder = tmp_path / "bundle"
    shutil.copytree(tiny_bundle, folder)
    (folder / "kernels").mkdir()
    (folder / "kernels" / "sample_draw.cubin").write_bytes(compile_source(
        b'extern "C" __global__ void sample_draw(const float* logits, int B) {}', "sample_draw", "sm_90").cubin)
    retarget_h200(folder)  # listed and hashed, bundle_id recomputed: only the kernel check can refuse it
    result = CliRunner().invoke(runtime_cli, ["check", str(folder), "--json"])
    assert result.exit_code == EXIT_CODES["bundle_invalid"], result.output
    error = json.loads(result.output)
    assert error["error"] == "bundle_invalid" and "kernel sample_draw takes 2 parameters" in error["message"]
