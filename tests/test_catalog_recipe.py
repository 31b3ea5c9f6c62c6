"""The catalog-reading model's training recipe (models/recipe/catalog_gen, catalog_rows, masked_qwen3):
the generated labels follow their rule, a packed row holds exactly the runtime's prompts and answers,
and the training model is the Hugging Face Qwen3 it is exported as."""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

from toolcall.models.recipe.catalog_gen import (  # noqa: E402
    CatalogGenerator,
    match_score,
    tool_words,
    words,
)
from toolcall.models.recipe.catalog_rows import END, TEMPLATE, TOOL_FORMAT, RowEncoder, collate  # noqa: E402
from toolcall.runtime.grammar.tool_text import Tool, render_template  # noqa: E402


def drawn(seed: int, n: int, k: int):
    gen = CatalogGenerator(seed, single_p=0.3)
    tools = gen.catalog(n)
    return tools, gen.requests(tools, k)


def test_the_generator_repeats_itself_from_its_seed():
    assert drawn(7, 8, 20) == drawn(7, 8, 20)
    assert drawn(7, 8, 20) != drawn(8, 8, 20)


@pytest.mark.parametrize("seed,n", [(1, 2), (2, 5), (3, 16), (4, 40)])
def test_every_generated_answer_follows_the_labelling_rule(seed, n):
    tools, requests = drawn(seed, n, 60)
    assert len({name for name, _ in tools}) == n
    by_name = {name: tool_words((name, d)) for name, d in tools}
    kinds = set()
    for text, answer in requests:
        rw = words(text)
        kinds.add(min(len(answer), 2))
        scores = {name: match_score(rw, tw) for name, tw in by_name.items()}
        if not answer:  # a no-tool request shares no content word with any tool
            assert all(content == 0 for content, _ in scores.values()), text
            continue
        assert len(set(answer)) == len(answer)
        lowest = min(scores[name][1] for name in answer)
        assert all(scores[name][0] >= 1 for name in answer), text
        assert all(score < lowest for name, (_, score) in scores.items() if name not in answer), text
    assert kinds == {0, 1, 2} or n < 3


def test_a_row_holds_the_runtimes_prompt_and_answer_for_each_request():
    from toolcall.runtime.batching.prompt import PromptEncoder

    tools, requests = drawn(5, 6, 12)
    enc = RowEncoder()
    row = enc.row(tools, [(text, answer, None) for text, answer in requests])
    rendered = render_template(TEMPLATE, tuple(Tool(n, d) for n, d in tools), TOOL_FORMAT)
    runtime = PromptEncoder.create(enc.tokenizer, TEMPLATE.replace("{tools}", "x")).with_template(rendered)
    prefix = len(runtime.prefix_ids)
    assert tuple(row.ids[:prefix]) == runtime.prefix_ids
    for j, (text, answer) in enumerate(requests):
        at = [i for i, s in enumerate(row.segment) if s == j]
        prompt = runtime.encode(text)
        seq = row.ids[:prefix] + [row.ids[i] for i in at]
        targets = [t for c, t, _, jj, _, _ in row.targets if jj == j]
        paths = [enc.tokenizer.encode(n, add_special_tokens=False).ids for n in answer]
        expected = [t for p in paths for t in p + [enc.sep]][:-1] + [END] if answer else [END]
        assert targets == expected
        assert seq == list(prompt) + expected[:-1]  # the answer is fed back but for its last token
        assert [row.positions[i] for i in at] == list(range(prefix, prefix + len(at)))


def test_a_packed_batch_gives_each_request_the_logits_of_its_own_prompt():
    """Each answer position's logits equal the Hugging Face model's on that request's sequence alone:
    the masks, positions and padding of a packed batch of rows lose nothing."""
    pytest.importorskip("transformers")
    from toolcall.models.recipe.masked_qwen3 import Qwen3, to_hf

    torch.manual_seed(0)
    model = Qwen3(dict(vocab=2048, hidden=64, mlp=96, layers=2, heads=2, kv=1)).eval()
    hf = to_hf(model).float()
    enc = RowEncoder()
    rows = [enc.row(tools, [(t, a, None) for t, a in reqs]) for tools, reqs in (drawn(11, 3, 4), drawn(12, 6, 3))]
    b = collate(rows)
    with torch.no_grad():
        ours = iter(model.logits_at(model.hidden(b["ids"], b["pos"], b["mask"])[b["rows"], b["cols"]]))
        for r in rows:  # targets in row, then row order
            for c, _, _, j, _, _ in r.targets:
                alone = [q for q in range(len(r.ids)) if r.segment[q] in (-1, j)]  # the prefix and request j
                theirs = hf(input_ids=torch.tensor([[r.ids[q] for q in alone]])).logits[0, alone.index(c)]
                assert torch.allclose(next(ours), theirs, atol=1e-4)


def test_attention_targets_point_at_the_tokens_they_name():
    tools, requests = drawn(9, 8, 16)
    row = RowEncoder().row(tools, [(t, a, None) for t, a in requests])
    emitted = {c: t for c, t, *_ in row.targets}
    assert row.supervised["copy"] and row.supervised["same_word"]
    for at, (key,) in row.supervised["copy"]:  # the catalog token the answer copies next
        assert row.ids[key] == emitted[at] and row.segment[key] == -1
    for q, keys in row.supervised["same_word"]:  # the same token, inside a catalog line
        assert all(row.ids[k] == row.ids[q] and row.line_labels[k] == row.request_labels[q] for k in keys)
    b = collate([row])  # the batch's flat indices name the same tokens
    for key in ("copy", "same_word", "evidence"):
        _, queries, keys, _, groups = b["supervised"][key]
        assert groups == len(row.supervised[key])
        assert b["ids"][0, keys].tolist() == [row.ids[k] for _, keys_ in row.supervised[key] for k in keys_]
        assert all(row.segment[k] == -1 for k in keys.tolist()) == (key != "evidence")


def test_the_training_model_is_the_qwen3_it_is_exported_as():
    pytest.importorskip("transformers")
    from toolcall.models.recipe.masked_qwen3 import Qwen3, to_hf

    torch.manual_seed(0)
    model = Qwen3(dict(vocab=128, hidden=64, mlp=96, layers=2, heads=2, kv=1)).eval()
    ids = torch.randint(0, 128, (1, 17))
    pos = torch.arange(17)[None]
    mask = torch.ones(17, 17, dtype=torch.bool).tril()[None, None]
    ours = model.logits_at(model.hidden(ids, pos, mask))
    theirs = to_hf(model).float()(input_ids=ids).logits
    assert torch.allclose(ours, theirs, atol=1e-4), (ours - theirs).abs().max()
