"""The fast CPU backend (numba, stored weights) against the numpy reference: same greedy tokens on
every parity case, resident memory of a load against the contract, kernels cached across starts."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import ml_dtypes
import numpy as np
import pytest
from test_hf_parity import CASES, DECODE_STEPS, MARGIN_TOL, PROMPT_TOKENS, REL_TOL
from tokenizers import Tokenizer

from toolcall.builder.checkpoint import open_checkpoint
from toolcall.common.formats import BF16, FP8_E4M3, KV_FP32, NVFP4
from toolcall.common.minifloat import E4M3_VALUES
from toolcall.common.nvfp4 import E2M1_VALUES
from toolcall.runtime.batching.batcher import Request, Result
from toolcall.runtime.bundle.files import GRAMMAR_FILE, TOKENIZER_FILE, WEIGHTS_FILE, read_contract
from toolcall.runtime.cpu import CPU_BACKENDS
from toolcall.runtime.cpu.backend import cpu_batcher, load_cpu_weights
from toolcall.runtime.cpu.fast_model import FastCpuModel, StoredWeights
from toolcall.runtime.cpu.kv_pool import PagedKVPool
from toolcall.runtime.cpu.model import CpuModel
from toolcall.runtime.grammar.trie import Grammar

REQUESTS = ["Book a flight to Paris", "What's the weather in Oslo tomorrow?", "Send an email to Bob",
            "Convert 20 euros to yen", "Remind me to call Alice on Friday", "Find a hotel in Rome",
            "Play some music", "Translate this note to French"]
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUNDLE_FORMATS = (FP8_E4M3, NVFP4, BF16)  # the ``bundles`` fixture's CPU bundles


def test_cli_and_engine_name_the_same_backends():
    from toolcall.runtime import cli
    assert cli.CPU_BACKENDS == CPU_BACKENDS == ("fast", "reference")


@pytest.mark.parametrize("family,ratio,tied,page_size", CASES)
def test_fast_matches_reference_on_the_parity_cases(make_checkpoint, family, ratio, tied, page_size):
    """test_hf_parity's cases, on the checkpoint's own bf16 arrays: a 64-token prefill and 32 greedy
    steps give the reference's tokens, logits within its tolerance; near-ties are reported apart."""
    folder = make_checkpoint(family=family, num_kv_heads=4 // ratio, tie_word_embeddings=tied)
    ckpt = open_checkpoint(folder)
    cfg = ckpt.config
    ref = CpuModel(cfg, ckpt.weights_f32())
    fast = FastCpuModel(cfg, StoredWeights.from_arrays(cfg, {n: ckpt.read(n) for n in ckpt.tensor_names()}))
    prompt = np.random.default_rng(7).integers(3, 3000, PROMPT_TOKENS)
    pools = [PagedKVPool(cfg, num_pages=8, page_size=page_size, max_seqs=1,
                         max_tokens_per_seq=PROMPT_TOKENS + DECODE_STEPS, kv_format=KV_FP32) for _ in range(2)]
    slot = [p.admit(PROMPT_TOKENS + DECODE_STEPS) for p in pools][0]
    rows = (prompt, np.full(PROMPT_TOKENS, slot), np.arange(PROMPT_TOKENS))
    logits = [m.dense_logits(m.forward(*rows, pool))[-1] for m, pool in zip((ref, fast), pools)]
    near_ties = []
    for step in range(DECODE_STEPS):
        want, got = logits
        assert np.abs(got - want).max() <= REL_TOL * np.abs(want).max(), f"step {step}"
        top2 = np.sort(want)[-2:]
        if top2[1] - top2[0] < MARGIN_TOL:
            near_ties.append(step)
            break  # past a near-tie the two paths may follow different tokens
        token = int(np.argmax(want))
        assert int(np.argmax(got)) == token, f"greedy token differs at step {step}"
        rows = (np.array([token]), np.array([slot]), np.array([PROMPT_TOKENS + step]))
        logits = [m.dense_logits(m.forward(*rows, pool))[0] for m, pool in zip((ref, fast), pools)]
    if near_ties:
        print(f"near-tie steps (margin < {MARGIN_TOL}), compared up to there: {near_ties}")


@pytest.fixture(scope="module")
def bundles(tmp_path_factory, tiny_checkpoint):
    from toolcall.builder.compile import compile_bundle
    from toolcall.runtime.bundle.contract import BuildOptions

    out = {}
    for fmt in BUNDLE_FORMATS:
        folder = tmp_path_factory.mktemp("bundles") / fmt.name
        compile_bundle(tiny_checkpoint, "builder/data/tools-64.json",
                       BuildOptions(precision=fmt.name, target="cpu", max_sequences=8, max_input_tokens=128,
                                    max_output_tokens=None, page_size=32, max_tokens_per_step=128,
                                    prefill_chunk=64, memory_budget_bytes=None, context_reserve_bytes=None,
                                    seed=0), folder)
        out[fmt] = folder
    return out


@pytest.mark.parametrize("fmt", BUNDLE_FORMATS, ids=lambda f: f.name)
@pytest.mark.parametrize("head", ["sparse", "check"])
def test_fast_generator_gives_the_reference_tokens(bundles, fmt, head):
    folder = bundles[fmt]
    contract = read_contract(folder)
    grammar = Grammar.read(folder / GRAMMAR_FILE)
    tok = Tokenizer.from_file(str(folder / TOKENIZER_FILE))
    requests = [Request(tuple(tok.encode(grammar.render_prompt(r)).ids), keep_logits=True) for r in REQUESTS]
    results = {}
    for backend in CPU_BACKENDS:
        weights = load_cpu_weights(folder / WEIGHTS_FILE, contract.model, backend)
        results[backend] = cpu_batcher(contract.model, weights, grammar, contract.limits, head).generate(requests)
    for fast, ref in zip(results["fast"], results["reference"]):
        assert isinstance(fast, Result) and isinstance(ref, Result)
        assert fast.token_ids == ref.token_ids
        for got, want, cand in zip(fast.step_logits, ref.step_logits, ref.step_candidates):
            ok = cand >= 0
            assert np.abs(got[ok] - want[ok]).max() <= REL_TOL * max(1.0, np.abs(want[ok]).max())


def test_stored_weights_are_views_of_the_file(bundles):
    folder = bundles[NVFP4]
    contract = read_contract(folder)
    weights = load_cpu_weights(folder / WEIGHTS_FILE, contract.model, "fast")
    widened = sum(v.size * 2 for v in weights.vectors.values())  # norms held as float32 copies of bf16
    assert weights.nbytes == contract.memory.weights_bytes + widened
    lin = weights.linear["model.layers.0.mlp.down_proj"]
    assert lin.fmt is NVFP4 and lin.weight.base is not None and not lin.weight.flags.owndata


# -- memory: RSS growth of a load against the contract ---------------------------------------------

RSS_PROBE = textwrap.dedent("""
    import json, sys
    from toolcall.runtime.engine import Engine
    from toolcall.runtime.bundle.machine import MachineFacts

    def rss():
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    facts = MachineFacts(free_bytes=1 << 40)
    Engine.load(sys.argv[1], facts=facts).close()  # imports, kernels from the cache, allocator pools warm
    before = rss()
    engine = Engine.load(sys.argv[2], facts=facts)
    print(json.dumps({"growth": rss() - before, "workspace": engine.model.workspace_bytes}))
""")


@pytest.fixture(scope="module")
def mid_bundle(tmp_path_factory, monkeypatch_module, tiny_checkpoint):
    """A CPU FP8 bundle of ~60 MB (weights ~28 MB, KV pool ~38 MB): big enough that the
    interpreter's constant costs do not hide a float32 copy (which would add ~100 MB)."""
    import toolcall.builder.synth as synth
    from toolcall.builder.compile import compile_bundle
    from toolcall.runtime.bundle.contract import BuildOptions

    tiny = synth.model_config_for

    def mid(opts, vocab):
        cfg = tiny(opts, vocab)
        return type(cfg)(**{**cfg.__dict__, "hidden_size": 512, "intermediate_size": 1536, "num_layers": 8,
                            "num_heads": 8, "num_kv_heads": 4, "head_dim": 64})
    monkeypatch_module.setattr(synth, "model_config_for", mid)
    ckpt = tmp_path_factory.mktemp("mid") / "ckpt"
    synth.synth_checkpoint(ckpt, synth.SynthOptions(seed=3))
    out = ckpt.parent / "bundle"
    compile_bundle(ckpt, "builder/data/tools-64.json",
                   BuildOptions(precision="fp8_e4m3", target="cpu", max_sequences=8, max_input_tokens=512,
                                max_output_tokens=None, page_size=32, max_tokens_per_step=256, prefill_chunk=128,
                                memory_budget_bytes=None, context_reserve_bytes=None, seed=0), out)
    return out


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def test_load_holds_what_the_contract_states(mid_bundle, tiny_bundle):
    memory = read_contract(mid_bundle).memory
    assert memory.weights_bytes > 20_000_000 and memory.total_bytes > 50_000_000
    out = subprocess.run([sys.executable, "-c", RSS_PROBE, str(tiny_bundle), str(mid_bundle)], cwd=ROOT,
                         capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": ROOT})
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    growth = got["growth"]
    print(f"RSS growth {growth} bytes, contract {memory.total_bytes} bytes ({growth / memory.total_bytes:.3f}x)")
    assert abs(growth - memory.total_bytes) <= 0.10 * memory.total_bytes
    assert got["workspace"] <= memory.workspace_bytes


# -- numba cache ---------------------------------------------------------------------------------

CACHE_PROBE = textwrap.dedent("""
    import json, sys
    from toolcall.runtime.engine import Engine
    from toolcall.runtime.bundle.machine import MachineFacts
    from toolcall.runtime.cpu import attention_kernels as ak, fast_kernels as fk, linear_high as lh, linear_kernels as lk
    from toolcall.runtime.cpu import fast_model as fm, panel_kernels as pk, stored_weights as sw
    from toolcall.runtime.jit.one_layout import AnyLayout
    Engine.load(sys.argv[1], facts=MachineFacts(free_bytes=1 << 40))
    kernels = [v for m in (fk, lk, lh, ak, pk) for v in vars(m).values() if hasattr(v, "stats") and hasattr(v, "py_func")]
    kernels += [v.calls for m in (fm, sw) for v in vars(m).values() if isinstance(v, AnyLayout)]
    print(json.dumps({k.__name__: sum(k.stats.cache_misses.values()) for k in kernels if k.signatures}))
""")


def test_a_second_start_loads_the_kernels_from_the_cache(tiny_bundle):
    runs = [subprocess.run([sys.executable, "-c", CACHE_PROBE, str(tiny_bundle)], cwd=ROOT, capture_output=True,
                           text=True, timeout=600, env={**os.environ, "PYTHONPATH": ROOT}) for _ in range(2)]
    assert all(r.returncode == 0 for r in runs), runs[-1].stderr
    misses = json.loads(runs[1].stdout.strip().splitlines()[-1])
    assert "linear_panels" in misses and "attention" in misses and "candidate_logits" in misses
    assert not any(misses.values()), f"compiled again on the second start: {misses}"


# -- the linear kernels: values, bits in any tile, the same bits without the x86 extensions --------

KERNEL_INPUTS = textwrap.dedent("""
    import hashlib, json, numpy as np, ml_dtypes
    from toolcall.runtime.cpu import linear_high as lh, linear_kernels as lk, panel_kernels as pk

    def inputs(out, n, t_rows, seed):
        rng = np.random.default_rng(seed)
        x = rng.standard_normal((t_rows, n)).astype(np.float32)
        w = (rng.standard_normal((out, n)) * 0.05).astype(np.float32)
        codes = rng.integers(0, 16, (out, n - n % 16)).astype(np.uint8)  # NVFP4 rows: whole 16-blocks
        return dict(x=x, w=w, e4m3=np.clip(w * 40, -448, 448).astype(ml_dtypes.float8_e4m3fn).view(np.int8),
                    scale=rng.random(out).astype(np.float32), bf16_bits=w.astype(ml_dtypes.bfloat16).view(np.uint16),
                    codes=codes, packed=(codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8),
                    blocks=rng.integers(0x01, 0x7F, (out, n // 16)).astype(np.uint8))

    NO_SCALE = np.empty(0, np.float32)
    # kernel (by the weight dtype it is compiled for) -> kernel(a, x, y) on the inputs ``a``
    KERNELS = {
        "linear_nvfp4": lambda a, x, y: lk.linear_nvfp4(x, a["packed"], a["blocks"], np.float32(0.01), y),
        "linear_rows u16": lambda a, x, y: lh.linear_rows(x, a["bf16_bits"], y),
        "linear_rows f32": lambda a, x, y: lh.linear_rows(x, a["w"], y),
        "linear_panels i8": lambda a, x, y: pk.linear_panels(x, pk.repack(a["e4m3"]), pk.padded_scale(a["scale"]), y),
        "linear_panels u16": lambda a, x, y: pk.linear_panels(x, pk.repack(a["bf16_bits"]), NO_SCALE, y),
        "linear_panels f32": lambda a, x, y: pk.linear_panels(x, pk.repack(a["w"]), NO_SCALE, y),
    }

    def run(kernel, a, x):
        y = np.empty((x.shape[0], a["w"].shape[0]), np.float32)
        KERNELS[kernel](a, x, y)
        return y

    def bit_hashes(cases):
        return {f"{k}:{o}x{n}": hashlib.sha256(run(k, a, a["x"]).tobytes()).hexdigest()
                for k, o, n in cases for a in [inputs(o, n, 7, seed=n)]}
""")
# (kernel, out, in): 70 outputs = a 64-row work item + a ragged 6; in 96 / 80 take NVFP4's two-block and
# one-block paths; 83 leaves a scalar tail of 3 elements. Panels (32 outputs): 70 = 2 panels + a zero-padded
# 6, 64 exactly 2; in 200 = 3 blocks of 64 features + a short one, 83 one block + a short one.
KERNEL_CASES = [("linear_nvfp4", 70, 96), ("linear_nvfp4", 70, 80), ("linear_rows u16", 70, 83),
                ("linear_rows f32", 70, 83), ("linear_panels i8", 70, 200), ("linear_panels i8", 64, 83),
                ("linear_panels i8", 70, 96), ("linear_panels u16", 70, 83), ("linear_panels u16", 64, 200),
                ("linear_panels f32", 70, 200), ("linear_panels f32", 64, 16)]
exec(KERNEL_INPUTS)  # the same inputs in this process and in the probe below
# kernel -> its weights [out, in] as float64, from the inputs
WEIGHTS = {
    "linear_nvfp4": lambda a: (E2M1_VALUES[a["codes"]].astype(np.float64) * 0.01
                               * np.repeat(E4M3_VALUES[a["blocks"]], 16, axis=1)),
    "linear_rows u16": lambda a: a["bf16_bits"].view(ml_dtypes.bfloat16).astype(np.float64),
    "linear_rows f32": lambda a: a["w"].astype(np.float64),
    "linear_panels i8": lambda a: a["e4m3"].view(ml_dtypes.float8_e4m3fn).astype(np.float64) * a["scale"][:, None],
    "linear_panels u16": lambda a: a["bf16_bits"].view(ml_dtypes.bfloat16).astype(np.float64),
    "linear_panels f32": lambda a: a["w"].astype(np.float64),
}


@pytest.mark.parametrize("kernel,out,n", KERNEL_CASES)
def test_linear_kernels_give_the_dot_product_and_the_same_bits_in_any_tile(kernel, out, n):
    a = inputs(out, n, 13, seed=n)
    full = run(kernel, a, a["x"])
    want = a["x"].astype(np.float64) @ WEIGHTS[kernel](a).T
    assert np.abs(full - want).max() <= 1e-5 * np.abs(want).max()
    for t_rows in (1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12):  # every tile shape and mix of shapes, rows at both ends
        for rows in (slice(0, t_rows), slice(13 - t_rows, 13)):
            got = run(kernel, a, np.ascontiguousarray(a["x"][rows]))
            assert got.tobytes() == full[rows].tobytes(), f"{kernel}: rows {rows} alone differ from the 13-row step"


def test_sparse_head_is_bit_equal_to_the_dense_head():
    a = inputs(70, 83, 5, seed=1)
    cand = np.random.default_rng(2).integers(0, 70, (5, 9))
    for w in (a["bf16_bits"], a["w"]):
        y = np.empty((5, 70), np.float32)
        lh.linear_rows(a["x"], w, y)
        got = np.empty(cand.shape, np.float32)
        lh.candidate_logits(a["x"], w, cand, got)
        assert got.tobytes() == np.take_along_axis(y, cand, axis=1).tobytes()


BITS_PROBE = KERNEL_INPUTS + textwrap.dedent("""
    import sys
    print(json.dumps(bit_hashes(json.loads(sys.argv[1]))))
""")


@pytest.mark.skipif(__import__("platform").machine() != "x86_64", reason="compares x86 extension paths")
def test_the_same_bits_without_avx512_f16c_or_ssse3(tmp_path):
    """The dot order is written down, and every decoder is exact: a baseline x86-64 build (no F16C,
    SSSE3 or AVX-512: the arithmetic fallbacks) gives the host build's bits, and so do the panel
    tile shapes of the other register file (zmm or ymm, whichever this CPU does not choose)."""
    from toolcall.runtime.cpu import panel_kernels as pk
    cases = [c for c in KERNEL_CASES if c[0] in ("linear_nvfp4", "linear_panels i8", "linear_panels u16")]
    env = {**os.environ, "PYTHONPATH": ROOT}
    env.pop("TOOLCALL_PANEL_TILES", None)
    other = next(k for k in pk.TILE_SHAPES if k != pk.TILE_REGISTERS)
    # the two other builds compile cold (a minute or more each, one core each): side by side; the host's here
    procs = [subprocess.Popen([sys.executable, "-c", BITS_PROBE, json.dumps(cases)], cwd=ROOT, env={**env, **extra},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for extra in ({"NUMBA_CACHE_DIR": str(tmp_path / "baseline"), "NUMBA_CPU_NAME": "x86-64",
                            "NUMBA_CPU_FEATURES": "+64bit,+cx8,+fxsr,+mmx,+sse,+sse2"},
                           {"NUMBA_CACHE_DIR": str(tmp_path / other), "TOOLCALL_PANEL_TILES": other})]
    try:
        host = bit_hashes(cases)
        runs = []
        for proc in procs:
            out, err = proc.communicate(timeout=600)
            assert proc.returncode == 0, err[-2000:]
            runs.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            proc.kill()
    assert len(host) == len(cases) and runs[0] == host and runs[1] == host


@pytest.mark.parametrize("fmt", [FP8_E4M3, BF16], ids=lambda f: f.name)
def test_joined_linears_give_each_parts_bits(fmt):
    """join_panels: q|k|v side by side in one linear give each part's outputs, byte for byte; outputs that are
    not whole panels are not joined."""
    from toolcall.runtime.cpu import panel_kernels as pk
    from toolcall.runtime.cpu.stored_weights import StoredLinear, join_panels
    rng = np.random.default_rng(4)
    n, outs = 96, [192, 64, 64]
    def fp8(w):
        scale = rng.uniform(0.5, 2.0, w.shape[0]).astype(np.float32)
        return StoredLinear(FP8_E4M3, pk.repack(w.astype(ml_dtypes.float8_e4m3fn).view(np.int8)),
                            scale=pk.padded_scale(scale), panel=pk.PANEL)
    # weight format -> the StoredLinear of w [out, in] float32 in it
    stored = {FP8_E4M3: fp8,
              BF16: lambda w: StoredLinear(BF16, pk.repack(w.astype(ml_dtypes.bfloat16).view(np.uint16)),
                                           panel=pk.PANEL)}
    parts = [stored[fmt]((rng.standard_normal((out, n)) * 0.1).astype(np.float32)) for out in outs]
    joined = join_panels(parts, outs)
    model = FastCpuModel.__new__(FastCpuModel)  # only .linear is used: it reads nothing of the model
    for rows in (1, 3, 11):
        x = rng.standard_normal((rows, n)).astype(np.float32)
        together = model.linear(joined, x, np.zeros((rows, sum(outs)), np.float32))
        start = 0
        for part, out in zip(parts, outs):
            alone = model.linear(part, x, np.zeros((rows, out), np.float32))
            assert np.array_equal(alone.view(np.uint32), together[:, start:start + out].view(np.uint32))
            start += out
    assert join_panels(parts, [192, 64, 48]) is None
