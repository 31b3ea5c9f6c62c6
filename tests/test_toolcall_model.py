"""The committed tool-discovery checkpoint (models/toolcall-qwen3-tiny: `python3 -m
toolcall.models.recipe.train` with its defaults): it loads in the builder and in transformers, and its CPU bf16
bundle answers a fixed handful of requests (held-out test-split ones, the README's, and requests that
need no tool, answered empty)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from conftest import compile_test_bundle

from toolcall.builder.checkpoint import open_checkpoint
from toolcall.models.recipe.data import make_split

MODEL = Path(__file__).parents[1] / "models" / "toolcall-qwen3-tiny"
CATALOG = "builder/data/tools-64.json"
README = "Convert 100 dollars to euros and then book a taxi to the airport"
# Seed-0 test-split requests (held-out templates) with 1 to 4 tools, by index, and their labels.
KNOWN = {
    0: ("set_alarm",),
    1: ("send_text_message", "get_forecast"),
    8: ("delete_calendar_event", "get_directions", "get_weather"),
    13: ("search_train_tickets", "calculate", "define_word"),
    21: ("search_wikipedia", "search_web", "add_contact", "search_email"),
}
# Requests outside every split with their answers: the README's, and requests that need no tool.
FIXED = {README: ["convert_currency", "book_taxi"], "thanks a lot, bye": [], "zzkq vlorp": []}
# every step of these answers: top-1 minus top-2 allowed logit at least this (the committed model's
# smallest is 6.4; the README's request 7.5)
MIN_MARGIN = 2.0


@pytest.fixture(scope="module")
def bundle(tmp_path_factory):
    return compile_test_bundle(MODEL, tmp_path_factory.mktemp("toolcall") / "toolcall-bf16-cpu", "bf16",
                               catalog=CATALOG)


def test_checkpoint_is_a_small_qwen3_the_builder_reads():
    ckpt = open_checkpoint(MODEL)
    cfg = ckpt.config
    assert cfg.family == "qwen3" and cfg.tie_word_embeddings and cfg.eos_token_ids == (2, 0)
    assert cfg.vocab_size % 64 == 0 and cfg.rope_theta == 10000.0
    assert cfg.head_dim == 64  # the smallest head the GPU attention kernels take
    # NVFP4 quantizes blocks along every linear's input dim; the GPU matvec wants multiples of 32
    assert cfg.hidden_size % 32 == 0 and cfg.intermediate_size % 32 == 0
    assert (cfg.num_heads * cfg.head_dim) % 32 == 0 and cfg.num_heads % cfg.num_kv_heads == 0
    assert sum(f.stat().st_size for f in MODEL.iterdir()) <= 32 * 2**20
    for name in ckpt.tensor_names():
        assert ckpt.files[name] == "model.safetensors"
        assert np.isfinite(ckpt.read_f32(name)).all(), name


def test_the_kernels_take_its_shape_for_every_gpu_precision():
    from toolcall.kernels.geometry import MATVEC_FORMATS, shape_problems

    cfg = open_checkpoint(MODEL).config
    assert len(MATVEC_FORMATS) == 3
    for fmt in MATVEC_FORMATS:
        assert shape_problems(cfg.hidden_size, cfg.intermediate_size, cfg.num_heads, cfg.num_kv_heads,
                              cfg.head_dim, fmt) == []


def test_bf16_bundle_answers_a_fixed_handful(bundle):
    from toolcall.runtime.engine import Engine

    split = make_split("test", seed=0, size=max(KNOWN, default=0) + 1)
    examples = [split[i] for i in KNOWN]
    assert [e.tools for e in examples] == list(KNOWN.values())  # the generator still makes these requests
    texts = [e.request for e in examples] + list(FIXED)
    want = [list(e.tools) for e in examples] + list(FIXED.values())
    # "check": the sparse head picks, the dense head must pick the same (the empty answer included)
    results = Engine.load(bundle, head="check").run(texts)
    for text, r, tools in zip(texts, results, want):
        assert r.finish == "done", text
        assert r.tools == tools, text
        assert r.min_margin >= MIN_MARGIN, (text, r.min_margin)


def test_transformers_loads_it_and_agrees_on_the_fixed_requests():
    pytest.importorskip("transformers")
    from toolcall.builder.catalog import load_catalog
    from toolcall.models.recipe.eval import transformers_lists

    assert transformers_lists(str(MODEL), list(FIXED), load_catalog(CATALOG)) == list(FIXED.values())
