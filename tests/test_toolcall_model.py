"""The committed tool-discovery checkpoint (models/toolcall-qwen3-tiny): it loads, and its CPU bf16
bundle answers held-out test requests (templates never seen in training) with the right tools."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from builder.checkpoint import open_checkpoint
from models.toolcall.data import make_split

MODEL = Path(__file__).parents[1] / "models" / "toolcall-qwen3-tiny"
CATALOG = "builder/data/tools-64.json"
# Seed-0 test-split requests (held-out templates) with 1 to 4 tools, by index, and their labels;
# the committed model answers each with a top-1/top-2 logit margin of at least 4.1 at every step.
KNOWN = {
    0: ("set_alarm",),
    1: ("send_text_message", "get_forecast"),
    3: ("translate_text", "calculate"),
    4: ("search_flights",),
    13: ("search_train_tickets", "calculate", "define_word"),
    17: ("book_taxi", "lookup_contact", "get_stock_price"),
    22: ("search_web", "check_flight_status", "complete_task", "turn_on_lights"),
    33: ("calculate", "check_flight_status", "get_news", "upload_file"),
}


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    from builder.compile import compile_bundle
    from runtime.contract import BuildOptions

    out = tmp_path_factory.mktemp("toolcall") / "toolcall-bf16-cpu"
    options = BuildOptions(precision="bf16", target="cpu", max_sequences=8, max_input_tokens=128,
                           max_output_tokens=None, page_size=32, max_tokens_per_step=128, prefill_chunk=64,
                           memory_budget_bytes=None, context_reserve_bytes=None, seed=0)
    compile_bundle(MODEL, CATALOG, options, out)
    return out


def test_checkpoint_is_a_small_qwen3_the_builder_reads():
    ckpt = open_checkpoint(MODEL)
    cfg = ckpt.config
    assert cfg.family == "qwen3" and cfg.tie_word_embeddings and cfg.eos_token_ids == (2, 0)
    assert cfg.vocab_size % 64 == 0 and cfg.rope_theta == 10000.0
    # NVFP4 quantizes 16-element blocks along every linear's input dim
    assert cfg.hidden_size % 16 == 0 and cfg.intermediate_size % 16 == 0
    assert (cfg.num_heads * cfg.head_dim) % 16 == 0
    assert sum(f.stat().st_size for f in MODEL.iterdir()) <= 4_000_000
    for name in ckpt.tensor_names():
        assert ckpt.files[name] == "model.safetensors"
        assert np.isfinite(ckpt.read_f32(name)).all(), name


def test_bf16_bundle_answers_known_test_requests(bundle):
    from runtime.engine import Engine

    split = make_split("test", seed=0, size=max(KNOWN) + 1)
    examples = [split[i] for i in KNOWN]
    assert [e.tools for e in examples] == list(KNOWN.values())  # the generator still makes these requests
    results = Engine.load(bundle).run([e.request for e in examples])
    for e, r in zip(examples, results):
        assert r.finish == "done", e.request
        assert r.tools == list(e.tools), e.request
