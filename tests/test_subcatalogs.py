"""Sub-catalogs of the shipped tools (models/recipe/subcatalogs.py) label each request with the tools the
sub-catalog holds, under the catalog's own (possibly generated) names; ``--init`` loads a Hugging Face
folder into the training model unchanged."""
from __future__ import annotations

import random
from collections import Counter
from pathlib import Path

import pytest

from toolcall.models.recipe.subcatalogs import SubcatalogSampler

TOOLS = [(f"tool_{c}", f"Does the {c} thing.") for c in "abcdefghijkl"]


def pool() -> list:
    """Requests naming 0-3 of TOOLS, one clause span per tool."""
    rng, out = random.Random(0), []
    for i in range(600):
        names = [n for n, _ in rng.sample(TOOLS, i % 4)]
        text = " and ".join(f"please {n.split('_')[1]} it" for n in names) or "hello there"
        spans, at = [], 0
        for n in names:
            clause = f"please {n.split('_')[1]} it"
            spans.append((at, at + len(clause), n))
            at += len(clause) + len(" and ")
        out.append((text, names, spans))
    return out


@pytest.mark.parametrize("rename_p", [0.0, 1.0])
def test_a_request_answers_the_tools_its_sub_catalog_holds(rename_p):
    requests = pool()
    sampler = SubcatalogSampler(TOOLS, requests, seed=3, rename_p=rename_p, none_p=0.3, partial_p=0.2)
    by_text = {text: (names, spans) for text, names, spans in requests}
    descriptions = dict(TOOLS)
    kinds = Counter()
    for k in (2, 5, 9):
        tools, rows = sampler.row(k, 40)
        assert len(tools) == k and len({n for n, _ in tools}) == k
        shipped = {n for n, _ in TOOLS}
        if rename_p:  # a renamed catalog keeps the descriptions, never a shipped name
            assert not {n for n, _ in tools} & shipped
            back = {}
            for (name, desc) in tools:
                (orig,) = [n for n, d in descriptions.items() if d == desc]
                back[name] = orig
        else:
            back = {n: n for n, _ in tools}
        for text, answer, spans in rows:
            names, orig_spans = by_text[text]
            held = [n for n in names if n in back.values()]
            assert [back[a] for a in answer] == held  # the held tools, in the request's order
            assert [(a, b, back[n]) for a, b, n in spans] == [s for s in orig_spans if s[2] in held]
            kinds["none" if not held else "partial" if len(held) < len(names) else "held"] += 1
    assert kinds["none"] and kinds["partial"] and kinds["held"], kinds


def test_the_sampler_repeats_itself_from_its_seed():
    draw = lambda seed: [SubcatalogSampler(TOOLS, pool(), seed, rename_p=0.5).row(4, 10) for _ in range(3)]  # noqa: E731
    assert draw(5) == draw(5)
    assert draw(5) != draw(6)


def test_init_loads_a_hugging_face_folder_unchanged():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    from toolcall.models.recipe.train_catalog import load_init

    shipped = Path(__file__).parents[1] / "models" / "toolcall-qwen3-tiny"
    ours = load_init(shipped).eval()
    theirs = transformers.Qwen3ForCausalLM.from_pretrained(shipped, torch_dtype=torch.float32).eval()
    ids = torch.randint(0, ours.c["vocab"], (1, 23), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(23, 23, dtype=torch.bool).tril()[None, None]
    with torch.no_grad():
        a = ours.logits_at(ours.hidden(ids, torch.arange(23)[None], mask))
        b = theirs(input_ids=ids).logits
    assert torch.allclose(a, b, atol=1e-3), (a - b).abs().max()


def test_init_from_a_folder_without_a_checkpoint_says_what_it_expected(tmp_path):
    pytest.importorskip("torch")
    from toolcall.models.recipe.train_catalog import load_init

    with pytest.raises(SystemExit, match="expected a Hugging Face folder with config.json"):
        load_init(tmp_path)
