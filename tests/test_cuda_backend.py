"""The CUDA backend's host side: buffer plans, launch lists, the decode loop and the GPU load path.

On CPU the backend runs on tests/emulated_gpu.py (numpy references behind the real launch
arguments), so pointers, strides, fused layouts, prefill padding, grammar buffers and the
graph loop's logic are checked against the CPU backend's tokens without a driver. GPU bundles end to
end (refusals, the shipped model, a real device): tests/test_cuda_bundles.py.
"""
from __future__ import annotations

import dataclasses

import contract_edits
import numpy as np
import pytest
from emulated_gpu import EmulatedGpu
from tokenizers import Tokenizer

from toolcall.builder.catalog import load_catalog
from toolcall.builder.checkpoint import open_checkpoint
from toolcall.builder.memory_plan import attention_splits, kv_pool_bytes, weights_bytes, workspace_breakdown
from toolcall.builder.quantize import quantize_checkpoint
from toolcall.builder.synth import SynthOptions, model_config_for
from toolcall.builder.trie import build_grammar
from toolcall.common.errors import Refusal
from toolcall.common.formats import FP8_E4M3
from toolcall.kernels.declarations import declaration, declarations
from toolcall.kernels.geometry import (
    DECODE_KERNELS,
    FMA,
    KERNEL_FAMILIES,
    MATVEC_FORMATS,
    MMA,
    RMSNORM,
    SWIGLU,
    decode_kernel,
    decode_max_splits,
    matvec_kernel,
)
from toolcall.kernels.weight_args import weight_args
from toolcall.runtime.batching.batcher import Request, StepBatcher
from toolcall.runtime.bundle.contract import Limits
from toolcall.runtime.bundle.machine import MachineFacts
from toolcall.runtime.bundle.tensor_file import SafetensorsFile
from toolcall.runtime.cpu.backend import cpu_batcher, load_cpu_weights
from toolcall.runtime.cuda.backend import CudaModel
from toolcall.runtime.cuda.buffers import BREAKDOWN_NAMES, workspace_plan
from toolcall.runtime.cuda.graph import DecodeGraph, PromptShape
from toolcall.runtime.cuda.graph_build import dependencies
from toolcall.runtime.engine import Engine

PRECISIONS = MATVEC_FORMATS  # every weight format with GPU kernels
IDS = [f.name for f in PRECISIONS]
SHAPE = dict(hidden_size=128, intermediate_size=256, num_layers=2, num_heads=4, num_kv_heads=2, head_dim=64)
REQUESTS = ["Book a flight to Paris", "What's the weather in Oslo tomorrow?", "Send an email to Bob " * 12]
CUBINS = {d.file: b"" for d in declarations().values()}  # the emulator runs references, not cubins



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
    # prefill: 256 rows x ceil(2083 / 256) = 9 splits; decode: 8 rows x min(ceil(2083 / 64), 32) = 32
    assert attention_splits(limits) == 9 and decode_max_splits(2083) == 32
    assert plan["attn_partials"] == 256 * 9 * cfg.num_heads * (cfg.head_dim + 2) * 4
    many = dataclasses.replace(limits, max_sequences=128)  # 128 decode rows x 32 splits outgrow 256 x 9
    assert workspace_plan(cfg, many, 32, 1)["attn_partials"] == workspace_breakdown(cfg, many, 32)["attn_partials"] \
        == 128 * 32 * cfg.num_heads * (cfg.head_dim + 2) * 4


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
    body, cfg = loop.body(0x1234), small["cfg"]
    tail = ["rmsnorm", "grammar_candidates", "head_sparse", "grammar_advance"]
    assert [ln.fn for ln in body[-4:]] == tail and body[0].fn == "embed_gather"
    assert len(body) == 1 + per_layer * small["cfg"].num_layers + 4
    assert body[-1].args["cond_handle"] == 0x1234 and loop.first_sample()[-1].args["cond_handle"] == 0
    deps, last = dependencies(body)
    assert last == [len(body) - 1] and deps[0] == []
    f = model.weights.fmt
    assert f is precision and f.kernel_prefix == f.name  # the contract's name is the kernels' prefix
    mv = lambda prologue="": matvec_kernel(f, prologue, family)  # noqa: E731
    assert [ln.fn for ln in body[1:1 + per_layer]] == [mv(RMSNORM), decode_kernel(cfg.num_heads, cfg.num_kv_heads),
                                                 mv(), mv(RMSNORM), mv(SWIGLU)]
    L = small["cfg"].num_layers
    # prefill chunks: a layer's qkv, rope + KV write, the family's attention (fma: partials, merge; mma: one
    # pass), o_proj, gate_up, down
    plan, attention = loop.plan(PromptShape(3, loop.C)), list(family.prefill_attention)
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
    contract_edits.retarget_bundle_h200(folder)
    monkeypatch.setattr(toolcall.runtime.cuda.backend, "Gpu", EmulatedGpu)
    engine = Engine.load(folder, facts=MachineFacts(1 << 40, "NVIDIA H200", "9.0", 13000), gpu_kernels=family)
    try:
        assert engine.model.family is KERNEL_FAMILIES[family]
        (result,) = engine.run(["Book a flight to Paris"])
        assert result.finish == "done" and result.tools
        assert engine.decode_graph.generate(engine.encode("Book a flight to Paris")).token_ids == result.token_ids
    finally:
        engine.close()


def test_attention_decode_prefetches_what_the_step_reads_next(small):
    """Each decode layer's attention_decode asks L2 for one arena span: that layer's o_proj, gate|up, down (and its
    norms), then the next layer's q|k|v; the last layer's span ends with its own weights."""
    model, _ = emulated_model(small, FP8_E4M3)
    w, arena = model.weights, model.weights.arena
    body = [ln for ln in DecodeGraph(model).body(0) if ln.fn in DECODE_KERNELS]
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
