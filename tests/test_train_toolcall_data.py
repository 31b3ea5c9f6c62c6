"""models/recipe/train.py's data side: the domain tokenizer, answer ids and per-token clause labels."""
from __future__ import annotations

import importlib.util

import pytest

import toolcall.models.recipe.train as tt
from toolcall.builder.catalog import load_catalog, tokenize_catalog
from toolcall.models.recipe.data import make_split


@pytest.fixture(scope="module")
def encoded():
    catalog = load_catalog(tt.CATALOG)
    train = make_split("train", seed=0, size=2000, noise=0.05, lexicon=0.5, counts=tt.TRAIN_COUNTS, paraphrases=True)
    tokenizer = tt.toolcall_tokenizer(train, catalog, 2048)
    return catalog, tokenizer, train[:300], tt.encode_examples(train[:300], tokenizer, catalog)


def test_domain_tokenizer_is_compact_and_keeps_the_special_tokens(encoded):
    catalog, tokenizer, examples, _ = encoded
    assert tokenizer.get_vocab_size() == 2048
    assert [tokenizer.token_to_id(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")] == [0, 1, 2]
    words = sum(len(e.request.split()) for e in examples)
    tokens = sum(len(tokenizer.encode(e.request).ids) for e in examples)
    assert tokens < 1.5 * words  # the generic synthetic tokenizer needs about 2 per word


def test_answer_is_tool_paths_joined_by_sep_and_closed_by_end(encoded):
    catalog, tokenizer, examples, pairs = encoded
    tokenized = tokenize_catalog(catalog, tokenizer, tt.END_ID)
    path = dict(zip(catalog.names, tokenized.paths))
    for e, (prompt, answer, _) in zip(examples, pairs):
        expected = []
        for tool in e.tools:
            expected += [*path[tool], tokenized.sep_token_id]
        assert answer == expected[:-1] + [tt.END_ID]
        assert tokenizer.decode(prompt, skip_special_tokens=False).endswith("<|im_start|>assistant\n")


def test_clause_labels_name_each_token_s_tool_and_clause(encoded):
    catalog, tokenizer, examples, pairs = encoded
    for e, (prompt, _, labels) in zip(examples, pairs):
        assert len(labels) == len(prompt)
        assert labels[:3] == [-1, -1, -1]  # "<|im_start|>user\n" is template, not request
        def spelled(token_ids):
            return tokenizer.decode(token_ids).replace(" ", "").lower()

        for k, tool in enumerate(e.tools):
            mine = [i for i, label in enumerate(labels) if label == tt.CLAUSES * catalog.names.index(tool) + k]
            ids = [prompt[i] for i in mine]
            assert ids, (e.request, tool)
            # the labelled tokens spell the clause (the first one capitalized); connectors carry -1 ...
            got, want = spelled(ids), e.clauses[k].replace(" ", "").lower()
            if got != want:  # ... and so does a last token that runs past the clause ("'hello'" + "." -> "'.")
                assert want.startswith(got) and spelled(ids + [prompt[mine[-1] + 1]]).startswith(want), e.request
        assert {label % tt.CLAUSES for label in labels if label >= 0} == set(range(len(e.tools)))


@pytest.mark.skipif(importlib.util.find_spec("torch") is None, reason="torch (the test extra) trains the model")
def test_keep_last_writes_the_last_steps_averaged_weights(tmp_path):
    """--keep last writes the last step's EMA weights: byte-identical to that step's snapshot. A 102-step run
    of a one-layer model validates at steps 100 and 101, both answering nothing right: "best" would keep 100."""
    import subprocess
    import sys
    from pathlib import Path

    out = tmp_path / "model"
    cmd = [sys.executable, "-m", "toolcall.models.recipe.train", "--out", str(out), "--steps", "102", "--train-size", "600",
           "--seed", "0", "--threads", "1", "--layers", "1", "--warmup", "1", "--ema", "0.5", "--save-every", "101",
           "--keep", "last"]
    r = subprocess.run(cmd, cwd=Path(__file__).parents[1], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    assert "kept step 101" in r.stdout
    snapshot = tmp_path / "model-step101"
    assert (out / "model.safetensors").read_bytes() == (snapshot / "model.safetensors").read_bytes()
    assert (out / "tokenizer.json").read_bytes() == (snapshot / "tokenizer.json").read_bytes()
