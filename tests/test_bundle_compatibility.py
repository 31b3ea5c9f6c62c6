"""Bundles written before a change of the code still load: tests/fixtures/format2-cpu-bundle is a tiny CPU
FP8 bundle (format version 2) written by the builder of commit b5eaf4b, before the modules moved under the
``toolcall`` namespace and the formats into their registry. Today's runtime loads it and answers, and
today's builder writes the same files from the same checkpoint and options: the same contract but for the
format version (3 since a KV cache may be fp8_e4m3; a bf16 bundle's other sections are unchanged)."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

from toolcall.builder.compile import compile_bundle
from toolcall.runtime.bundle.contract import FORMAT_VERSION, BuildOptions
from toolcall.runtime.engine import Engine

FIXTURE = Path(__file__).parent / "fixtures" / "format2-cpu-bundle"
# every file but the canary's recorded logits (floats of the machine that wrote them): weights, grammar,
# tokenizer, and the contract's other sections
COMPARED = ("weights.safetensors", "grammar.msgpack", "tokenizer.json")


def test_a_format2_bundle_loads_and_answers():
    engine = Engine.load(FIXTURE)
    try:
        (answer,) = engine.run(["Book a flight to Oslo"])
        assert answer.finish in ("done", "length") and answer.token_ids
    finally:
        engine.close()


def test_todays_builder_writes_the_same_files(tiny_checkpoint, tmp_path):
    recorded = json.loads((FIXTURE / "contract.json").read_text())
    options = BuildOptions(**recorded["engine"]["build_options"])
    compile_bundle(tiny_checkpoint, "builder/data/tools-64.json", options, tmp_path / "b")
    for name in COMPARED:
        assert hashlib.sha256((tmp_path / "b" / name).read_bytes()).digest() == \
            hashlib.sha256((FIXTURE / name).read_bytes()).digest(), name
    written = json.loads((tmp_path / "b" / "contract.json").read_text())
    assert written["format"] == {**recorded["format"], "version": FORMAT_VERSION} and FORMAT_VERSION == 3
    for section in ("model", "target", "precision", "limits", "memory", "grammar", "prompt"):
        assert written[section] == recorded[section], section
