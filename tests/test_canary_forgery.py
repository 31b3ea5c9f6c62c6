"""A consistent forgery cannot pass the canary: bundles whose weights, tokenizer or prompt template
were changed and then re-hashed (file entries and bundle_id recomputed, so every hash and
cross-check passes) are refused at load, on random (synthetic) and on trained weights.
Also: the canary's choice rules, and a one-tool catalog (infinite margins) that still builds."""
from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from toolcall.builder.canary import CANARY_PROMPTS, LOGIT_TOLERANCE, TOP_K, is_first_candidate_answer, record_canary
from toolcall.builder.compile import compile_bundle
from toolcall.common.errors import BuildError, EngineError, Refusal
from toolcall.runtime.batching.batcher import Result
from toolcall.runtime.bundle.contract import CONTRACT_FILE, BuildOptions, compute_bundle_id
from toolcall.runtime.bundle.files import GRAMMAR_FILE, TOKENIZER_FILE, WEIGHTS_FILE, file_entry
from toolcall.runtime.bundle.machine import MachineFacts
from toolcall.runtime.bundle.tensor_file import DTYPES, SafetensorsFile
from toolcall.runtime.engine import Engine, check_bundle
from toolcall.runtime.grammar.stepper import GrammarStepper
from toolcall.runtime.grammar.trie import Grammar

ROOMY_CPU = MachineFacts(free_bytes=1 << 40)
TRAINED = Path(__file__).parents[1] / "models" / "toolcall-qwen3-tiny"
CATALOG = "builder/data/tools-64.json"
OPTIONS = BuildOptions(precision="fp8_e4m3", target="cpu", max_sequences=4, max_input_tokens=128,
                       max_output_tokens=None, page_size=32, max_tokens_per_step=128, prefill_chunk=64,
                       memory_budget_bytes=None, context_reserve_bytes=None, seed=0)


def rehash(folder: Path) -> None:
    """Re-lists every file with its new size and sha256 and recomputes bundle_id: a consistent forgery."""
    path = folder / CONTRACT_FILE
    d = json.loads(path.read_text())
    d["files"] = {name: dataclasses.asdict(file_entry(folder / name)) for name in d["files"]}
    d["engine"]["bundle_id"] = compute_bundle_id(d)
    path.write_text(json.dumps(d, sort_keys=True, indent=2))


def edit_tensors(folder: Path, edit) -> None:
    """``edit(name, array)`` may change each tensor in place (a writable view of its bytes); re-hashes."""
    path = folder / WEIGHTS_FILE
    data = bytearray(path.read_bytes())
    with SafetensorsFile(path) as st:
        infos, start = list(st.tensors.values()), 8 + int.from_bytes(data[:8], "little")
    for info in infos:
        raw = np.frombuffer(data, np.uint8, count=info.nbytes, offset=start + info.begin)
        edit(info.name, raw.view(DTYPES[info.dtype]).reshape(info.shape))
    path.write_bytes(bytes(data))
    rehash(folder)


def layer_zeroed(folder):
    edit_tensors(folder, lambda n, a: a.view(np.uint8).fill(0) if n.startswith("model.layers.0.") else None)


def fp8_tensor_nan(folder):
    done = []

    def edit(name, a):
        if a.dtype == DTYPES["F8_E4M3"] and not done:
            a.view(np.uint8).fill(0x7F)  # E4M3 "fn": 0x7f is NaN
            done.append(name)
    edit_tensors(folder, edit)
    assert done


def scales_x100(folder):
    def edit(name, a):
        if name.endswith("_scale") and a.dtype == np.float32:
            a *= np.float32(100)
    edit_tensors(folder, edit)


def embedding_negated(folder):
    edit_tensors(folder, lambda n, a: np.bitwise_xor(a.view(np.uint16), np.uint16(0x8000), out=a.view(np.uint16))
                 if n == "model.embed_tokens.weight" else None)


FORGERIES = [layer_zeroed, fp8_tensor_nan, scales_x100, embedding_negated]


@pytest.fixture(scope="module")
def trained_bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("trained") / "toolcall-fp8-cpu"
    compile_bundle(TRAINED, CATALOG, OPTIONS, out)
    return out


@pytest.fixture(params=["synthetic", "trained"])
def bundle(request, tmp_path, tiny_bundle):
    source = tiny_bundle if request.param == "synthetic" else request.getfixturevalue("trained_bundle")
    folder = tmp_path / "bundle"
    shutil.copytree(source, folder)
    return folder


@pytest.mark.parametrize("forge", FORGERIES, ids=[f.__name__ for f in FORGERIES])
def test_each_consistent_weight_forgery_is_refused(bundle, forge):
    Engine.load(bundle, facts=ROOMY_CPU)  # the genuine bundle loads
    forge(bundle)
    check_bundle(bundle, ROOMY_CPU)  # hashes, bundle_id and every cross-check pass: only the canary can tell
    if forge is fp8_tensor_nan:
        with pytest.raises(Refusal) as info:  # the fast backend reads NaN codes as +-480: refused by name at load
            Engine.load(bundle, facts=ROOMY_CPU)
        assert info.value.code == "bundle_invalid" and "NaN codes" in info.value.message, info.value
        with pytest.raises(Refusal) as info:  # the reference computes NaN: typed at the step, never argmax'd
            Engine.load(bundle, facts=ROOMY_CPU, backend="reference")
        assert info.value.code == "canary_failed" and info.value.details["reason"] == "numerics_invalid"
        return
    with pytest.raises(Refusal) as info:
        Engine.load(bundle, facts=ROOMY_CPU)
    assert info.value.code == "canary_failed", info.value
    assert info.value.details["what"] in ("tokens", "logits")


def test_another_tokenizer_is_refused(bundle, make_checkpoint):
    other = make_checkpoint(seed=7)  # a tokenizer trained on another seed: same format, other merges
    shutil.copyfile(other / "tokenizer.json", bundle / TOKENIZER_FILE)
    rehash(bundle)
    check_bundle(bundle, ROOMY_CPU)
    with pytest.raises(Refusal) as info:
        Engine.load(bundle, facts=ROOMY_CPU)
    # The prompt section's prefix/suffix ids catch it first (prompt_mismatch); the canary's
    # re-encoding of its request texts would (canary_failed) where those happen to agree.
    assert info.value.code == "prompt_mismatch" or (
        info.value.code == "canary_failed" and "tokenizer or template" in info.value.message), info.value


def test_another_prompt_template_is_refused(bundle):
    g = Grammar.read(bundle / GRAMMAR_FILE)
    dataclasses.replace(g, prompt_template="Answer quickly. " + g.prompt_template).write(bundle / GRAMMAR_FILE)
    rehash(bundle)
    check_bundle(bundle, ROOMY_CPU)  # the grammar's numbers are unchanged
    with pytest.raises(Refusal) as info:
        Engine.load(bundle, facts=ROOMY_CPU)
    assert info.value.code == "prompt_mismatch" or (
        info.value.code == "canary_failed" and info.value.details["prompt"] == 0), info.value


def test_the_record_has_several_prompts_texts_and_top_logits(tiny_bundle):
    c = Engine.load(tiny_bundle, facts=ROOMY_CPU).contract.canary
    assert len(c.prompts) == CANARY_PROMPTS and c.top_k == TOP_K and c.logit_tolerance == LOGIT_TOLERANCE
    assert len({p.request for p in c.prompts}) == CANARY_PROMPTS
    grammar = Grammar.read(tiny_bundle / GRAMMAR_FILE)
    for p in c.prompts:
        assert len(p.steps) == len(p.expected_token_ids)
        assert [s.token_ids[0] for s in p.steps] == list(p.expected_token_ids)
        assert all(list(s.logits) == sorted(s.logits, reverse=True) for s in p.steps)
        assert p.min_margin is None or p.min_margin >= 1e-3
        assert not is_first_candidate_answer(grammar, list(p.expected_token_ids))[0]


def test_a_logit_outside_the_tolerance_is_refused_and_inside_passes(tmp_path, tiny_bundle):
    for delta, refused in ((0.5 * LOGIT_TOLERANCE, False), (2 * LOGIT_TOLERANCE, True)):
        folder = tmp_path / f"d{delta}"
        shutil.copytree(tiny_bundle, folder)
        d = json.loads((folder / CONTRACT_FILE).read_text())
        step = d["canary"]["prompts"][-1]["steps"][-1]
        step["logits"][-1] -= delta  # the last candidate: the order stays valid
        d["engine"]["bundle_id"] = compute_bundle_id(d)
        (folder / CONTRACT_FILE).write_text(json.dumps(d))
        if refused:
            with pytest.raises(Refusal) as info:
                Engine.load(folder, facts=ROOMY_CPU)
            assert info.value.details["what"] == "logits" and info.value.details["tolerance"] == LOGIT_TOLERANCE
        else:
            Engine.load(folder, facts=ROOMY_CPU)


def first_candidate_answer(grammar: Grammar) -> list[int]:
    stepper = GrammarStepper(grammar)
    state, out = stepper.initial_state(), []
    while not stepper.done(state):
        cand, _, allowed = stepper.allowed_mask_batch(state[None])
        out.append(int(cand[0][allowed[0]][0]))
        state = stepper.advance(state, out[-1])
    return out


def test_answers_that_always_take_the_first_candidate_are_rejected(tiny_bundle, monkeypatch):
    import toolcall.builder.canary
    grammar = Grammar.read(tiny_bundle / GRAMMAR_FILE)
    trivial = first_candidate_answer(grammar)
    assert is_first_candidate_answer(grammar, trivial) == (True, False)

    class FlatModel:  # what a model without information answers: the first candidate, clearly
        def generate(self, requests):
            return [Result(trivial, [], "done", 1.0, 0.0, 0.0, [], []) for _ in requests]

    monkeypatch.setattr(toolcall.builder.canary, "cpu_batcher", lambda *a, **k: FlatModel())
    monkeypatch.setattr(toolcall.builder.canary, "load_cpu_weights", lambda *a, **k: None)
    contract = Engine.load(tiny_bundle, facts=ROOMY_CPU).contract
    with pytest.raises(BuildError) as info:
        record_canary(tiny_bundle / WEIGHTS_FILE, contract.model, grammar, contract.limits,
                      lambda text: (1, 2, 3))
    assert info.value.details["rejected"]["first candidate at every step"] == 8


def test_a_catalog_the_fixed_requests_miss_takes_its_canary_from_its_own_requests(tiny_bundle, monkeypatch):
    """A model that reads its catalog answers none (the first candidate) to every fixed request; the
    bundle's own requests, tried after them, give the canary."""
    import toolcall.builder.canary
    grammar = Grammar.read(tiny_bundle / GRAMMAR_FILE)
    trivial = first_candidate_answer(grammar)
    stepper = GrammarStepper(grammar)
    state, answer, logits, candidates = stepper.initial_state(), [], [], []
    while not stepper.done(state):  # the last allowed candidate at every step, clearly
        cand, _, allowed = stepper.allowed_mask_batch(state[None])
        ids = cand[0][allowed[0]]
        answer.append(int(ids[-1]))
        candidates.append(ids)
        logits.append(np.where(ids == ids[-1], 2.0, 0.0).astype(np.float32))
        state = stepper.advance(state, answer[-1])
    assert is_first_candidate_answer(grammar, answer)[0] is False
    own = "water the ferns on the balcony"

    class ReadingModel:
        def generate(self, requests):
            (r,) = requests
            if r.prompt_ids == (4, 5, 6):
                return [Result(answer, [], "done", 2.0, 0.0, 0.0, logits, candidates)]
            return [Result(trivial, [], "done", 1.0, 0.0, 0.0, [], [])]

    monkeypatch.setattr(toolcall.builder.canary, "cpu_batcher", lambda *a, **k: ReadingModel())
    monkeypatch.setattr(toolcall.builder.canary, "load_cpu_weights", lambda *a, **k: None)
    contract = Engine.load(tiny_bundle, facts=ROOMY_CPU).contract
    canary = record_canary(tiny_bundle / WEIGHTS_FILE, contract.model, grammar, contract.limits,
                           lambda text: (4, 5, 6) if text == own else (1, 2, 3), own_requests=(own, own))
    assert [p.request for p in canary.prompts] == [own]
    assert list(canary.prompts[0].expected_token_ids) == answer


def test_a_one_tool_catalog_builds_and_loads(tmp_path, tiny_checkpoint):
    catalog = tmp_path / "one.json"
    full = json.loads(Path(CATALOG).read_text())
    catalog.write_text(json.dumps({**full, "tools": full["tools"][:1], "answer": {**full["answer"], "allow_empty": False}}))
    out = tmp_path / "one-tool"
    contract = compile_bundle(tiny_checkpoint, catalog, OPTIONS, out).contract
    text = (out / CONTRACT_FILE).read_text()
    assert "Infinity" not in text and "NaN" not in text
    assert all(p.min_margin is None for p in contract.canary.prompts)  # every step forced: margin infinite
    assert contract.canary.min_margin is None
    engine = Engine.load(out, facts=ROOMY_CPU)
    (result,) = engine.run(["Book a flight"])
    assert result.tools == [full["tools"][0]["name"]]


def test_nan_in_hidden_states_is_a_typed_error(tiny_bundle, monkeypatch):
    engine = Engine.load(tiny_bundle, facts=ROOMY_CPU)
    real = engine.model.forward

    def poisoned(*args, **kw):
        out = real(*args, **kw)
        out[-1, 0] = np.inf
        return out

    monkeypatch.setattr(engine.model, "forward", poisoned)
    with pytest.raises(EngineError) as info:
        engine.run(["Book a flight"])
    assert info.value.code == "numerics_invalid" and info.value.exit_code == 60


@pytest.mark.parametrize("family", ["qwen3", "qwen2", "llama"])
@pytest.mark.parametrize("precision", ["fp8_e4m3", "nvfp4", "bf16"])
def test_the_runtime_expects_exactly_the_layout_the_builder_writes(family, precision):
    import toolcall.builder.memory_plan
    from toolcall.builder.quantize import output_specs, weight_format
    from toolcall.builder.synth import SynthOptions, model_config_for
    from toolcall.runtime.bundle import layout
    cfg = model_config_for(SynthOptions(family=family), 1000)
    assert layout.weight_specs(cfg, weight_format(precision)) == output_specs(cfg, precision)
    # one formula for the memory plan and the load check
    assert toolcall.builder.memory_plan.weights_bytes is layout.weights_bytes
    assert toolcall.builder.memory_plan.kv_pool_bytes is layout.kv_pool_bytes
    assert toolcall.builder.memory_plan.workspace_breakdown is layout.workspace_breakdown
