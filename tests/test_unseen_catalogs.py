"""The frozen unseen-catalog set (models/recipe/unseen_catalogs.json) meets its stated proportions and
stays apart from the training catalog; the word-overlap baseline and the scorer on a hand-made table."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from toolcall.builder.catalog import Tool, load_catalog, tokenize_catalog
from toolcall.builder.checkpoint import load_tokenizer
from toolcall.common.errors import EXIT_CODES, CatalogError
from toolcall.models.recipe.eval_unseen import main, table
from toolcall.models.recipe.handwritten import DEVSET, DEVSET_MULTI, HANDWRITTEN, load_handwritten, normalized
from toolcall.models.recipe.overlap import overlap_answer, words
from toolcall.models.recipe.unseen import Case, UnseenCatalog, load_unseen, score_unseen

TRAINING_CATALOG = "builder/data/tools-64.json"
SHIPPED = "models/toolcall-qwen3-tiny"


@pytest.fixture(scope="module")
def unseen():
    return load_unseen()


def test_frozen_set_meets_its_proportions(unseen):
    assert unseen.frozen and "never used for training" in unseen.note
    assert len(unseen.catalogs) >= 20
    sizes = [len(c.tools) for c in unseen.catalogs]
    assert all(2 <= n <= 40 for n in sizes), sizes
    assert sum(n <= 3 for n in sizes) >= 2 and sum(n >= 30 for n in sizes) >= 2, sizes  # both ends covered
    assert all(len(c.cases) >= 5 for c in unseen.catalogs)
    kinds = [c.kind for c in unseen.cases]
    assert 120 <= len(kinds) <= 250
    assert kinds.count("none") >= len(kinds) / 5 and kinds.count("multi") >= len(kinds) / 5, (
        kinds.count("none"), kinds.count("multi"), len(kinds))
    for catalog in unseen.catalogs:
        assert all(set(case.tools) <= set(catalog.names) for case in catalog.cases), catalog.id
        for tool in catalog.tools:
            assert re.fullmatch(r"[a-z][a-z0-9]*(_[a-z0-9]+)+", tool.name), tool.name  # snake_case, 2+ words
            sentences = re.findall(r"[.!?](?:\s|$)", tool.description or "")
            assert 1 <= len(sentences) <= 2, (tool.name, tool.description)


def test_every_catalog_loads_and_tokenizes_for_the_shipped_model(unseen):
    template = json.loads(Path(TRAINING_CATALOG).read_text(encoding="utf-8"))
    tokenizer = load_tokenizer(Path(SHIPPED) / "tokenizer.json")
    eos = json.loads((Path(SHIPPED) / "generation_config.json").read_text(encoding="utf-8"))["eos_token_id"]
    for catalog in unseen.catalogs:
        loaded = catalog.catalog(template)
        assert loaded.names == catalog.names and loaded.answer.allow_empty
        assert loaded.answer.max_tools >= catalog.largest_answer
        assert loaded.prompt_template == load_catalog(TRAINING_CATALOG).prompt_template
        tokenize_catalog(loaded, tokenizer, eos[0] if isinstance(eos, list) else eos)  # distinct token paths


def test_set_stays_apart_from_the_training_catalog_and_its_requests(unseen):
    training = set(load_catalog(TRAINING_CATALOG).names)
    assert not training & {t.name for c in unseen.catalogs for t in c.tools}
    held = {normalized(r) for path in (HANDWRITTEN, DEVSET, DEVSET_MULTI) for r, _ in load_handwritten(path)}
    assert not held & {normalized(c.request) for c in unseen.cases}
    # nor a phrase of the training data generator (its sources hold every fixed phrase it emits)
    generator = " " + " ".join(normalized(p.read_text(encoding="utf-8"))
                               for p in sorted(Path("models/recipe").glob("*.py"))) + " "
    assert not [c.request for c in unseen.cases if f" {normalized(c.request)} " in generator]
    for catalog in unseen.catalogs:  # a request is a user's words, never a tool's description copied
        described = {normalized(t.description or "") for t in catalog.tools}
        assert not described & {normalized(c.request) for c in catalog.cases}, catalog.id


def test_loading_refuses_an_unknown_expected_tool_and_a_repeated_id(tmp_path, unseen):
    entry = {"id": "x", "domain": "d", "tools": [{"name": "a_b", "description": "A."},
                                                  {"name": "c_d", "description": "C."}],
             "cases": [{"request": "do a", "tools": ["a_b"]}]}
    path = tmp_path / "set.json"
    for catalogs, found in (([entry, entry], "repeats the id"),
                            ([{**entry, "cases": [{"request": "do e", "tools": ["e_f"]}]}], "unknown ['e_f']"),
                            ([{**entry, "tools": [{"name": "a_b"}, {"name": "a_b"}]}], "duplicates the name")):
        path.write_text(json.dumps({"frozen": "2026-12-06", "note": "test", "catalogs": catalogs}))
        with pytest.raises(CatalogError, match=re.escape(found)):
            load_unseen(path)


def test_document_takes_the_templates_prompt_and_room_for_the_largest_answer():
    catalog = UnseenCatalog("x", "d", (Tool("a_b", "Does a."), Tool("c_d", "Does c."), Tool("e_f", "Does e.")),
                            (Case("all three", ("a_b", "c_d", "e_f")), Case("none", ())))
    template = {"tools": [{"name": "z"}], "answer": {"max_tools": 2, "separator": "\n"},
                "prompt_template": "Tools:\n{tools}\nQ: {request}\nA:", "tool_format": "* {name} ({description})"}
    loaded = catalog.catalog(template)
    assert loaded.prompt_template == "Tools:\n* a_b (Does a.)\n* c_d (Does c.)\n* e_f (Does e.)\nQ: {request}\nA:"
    assert (loaded.answer.max_tools, loaded.answer.allow_empty) == (3, True)
    assert catalog.catalog(None).prompt_template == load_catalog({"tools": [{"name": "z"}]}).prompt_template


# The hand-made table: a three-tool catalog, and per request its expected tools, the word-overlap
# baseline's answer (worked out by hand from the rule in models/recipe/overlap.py) and a made-up
# answerer's answer for the scorer. The tools' words: crm lookup contact find name email |
# crm log call record notes phone contact | send invoice email customer.
TOOLS = (Tool("crm_lookup_contact", "Find a contact by name or email."),
         Tool("crm_log_call", "Record the notes of a phone call with a contact."),
         Tool("send_invoice", "Email an invoice to a customer."))
LOOKUP, CALL, INVOICE = (t.name for t in TOOLS)
TABLE = [  # request, expected, word overlap's answer, the answerer's answer
    ("find the contact for Dana", [LOOKUP], [LOOKUP], [LOOKUP]),  # find+contact 2 beats contact 1
    ("log the phone call with Raj", [CALL], [CALL], [CALL, INVOICE]),  # log+phone+call 3
    ("email the invoice to Acme", [INVOICE], [INVOICE], []),  # email+invoice 2 beats email 1
    ("crm contact", [LOOKUP], [LOOKUP], [LOOKUP]),  # tie (crm+contact 2 for both crm tools): the earlier one
    ("what is it and how do I do that?", [], [], []),  # stopwords only: overlap 0, no tool
    ("tell me a joke", [], [], [CALL]),  # content words no tool has
    ("What's Dana's e-mail?", [LOOKUP], [], [LOOKUP]),  # "e-mail" gives "e", "mail": no stemming or spelling fix
    ("log my call with Raj and send him the invoice", [CALL, INVOICE], [CALL], [INVOICE, CALL]),  # tie 2-2
    ("find Dana's contact and invoice her", [LOOKUP, INVOICE], [LOOKUP], [INVOICE]),  # 2 beats 1
    ("SEND INVOICE", [INVOICE], [INVOICE], [LOOKUP]),  # case folded
]


@pytest.mark.parametrize("request_text, expected, overlap, _answer", TABLE)
def test_word_overlap_on_the_table(request_text, expected, overlap, _answer):
    assert overlap_answer(request_text, TOOLS) == overlap


def test_words_drop_stopwords_and_split_on_non_alphanumerics():
    assert words("What's the e-mail of Dana, please?") == {"e", "mail", "dana"}
    assert overlap_answer("anything", ()) == []


def test_scores_on_the_table():
    labels = [row[1] for row in TABLE]
    ours = score_unseen([row[2] for row in TABLE], labels)
    assert [ours[k]["n"] for k in ("all", "none", "one", "multi")] == [10, 2, 6, 2]
    # word overlap: exact on rows 1-6 and 10; top-1 also on the multi rows 8 and 9 (first tool expected)
    assert (ours["all"]["exact_set"], ours["all"]["top1"], ours["all"]["answered_empty"]) == (7, 9, 3)
    assert (ours["one"]["exact_set"], ours["one"]["top1"], ours["one"]["answered_empty"]) == (5, 5, 1)
    assert (ours["multi"]["exact_set"], ours["multi"]["top1"]) == (0, 2)
    assert (ours["none"]["exact_set"], ours["none"]["top1"], ours["none_rate"]) == (2, 2, 1.0)
    theirs = score_unseen([row[3] for row in TABLE], labels)
    # the answerer: exact on rows 1, 4, 5, 7, 8; top-1 also on rows 2 and 9; row 6 names a tool for none
    assert (theirs["all"]["exact_set"], theirs["all"]["top1"], theirs["all"]["answered_empty"]) == (5, 7, 2)
    assert (theirs["one"]["exact_set"], theirs["one"]["top1"]) == (3, 4)
    assert (theirs["multi"]["exact_set"], theirs["multi"]["top1"]) == (1, 2)
    assert (theirs["none"]["top1"], theirs["none_rate"]) == (1, 0.5)
    assert theirs["tool_cases_empty_rate"] == pytest.approx(1 / 8)  # row 3, of the 8 tool-bearing rows
    assert theirs["all"]["exact_set_rate"] == pytest.approx(0.5) and theirs["one"]["top1_rate"] == pytest.approx(4 / 6)
    assert score_unseen([], [])["none"]["top1_rate"] == 0.0  # no cases of a kind: 0.0, not a division error
    printed = table(theirs, ours)
    assert "no-tool        2" in printed and "model 50.0%, word overlap 100.0%" in printed


def test_evaluator_builds_each_catalog_with_the_templates_tool_list(tiny_checkpoint, tmp_path, capsys):
    tools = [{"name": "find_parking_spot", "description": "Find open parking near an address."},
             {"name": "pay_parking_session", "description": "Pay for parking by plate and zone."}]
    cases = [{"request": "pay for my parking in zone 4", "tools": ["pay_parking_session"]},
             {"request": "find parking and pay for it", "tools": ["find_parking_spot", "pay_parking_session"]},
             {"request": "good grief", "tools": []}]
    (tmp_path / "set.json").write_text(json.dumps({"frozen": "2026-12-06", "note": "test", "catalogs": [
        {"id": "parking", "domain": "parking", "tools": tools, "cases": cases}]}))
    template = json.loads(Path(TRAINING_CATALOG).read_text(encoding="utf-8"))
    template["prompt_template"] = template["prompt_template"].replace("{request}", "Tools:\n{tools}\n\n{request}")
    (tmp_path / "template.json").write_text(json.dumps(template))
    assert main([str(tiny_checkpoint), "--set", str(tmp_path / "set.json"), "--template-from",
                 str(tmp_path / "template.json"), "--json", str(tmp_path / "out.json")]) == 0
    report = json.loads((tmp_path / "out.json").read_text())
    (row,) = report["catalogs"]
    answers = [c["model"] for c in row["cases"]]
    assert all(set(a) <= {t["name"] for t in tools} for a in answers)  # the grammar: this catalog's names only
    assert report["model"] == score_unseen(answers, [c["tools"] for c in cases])
    assert [c["overlap"] for c in row["cases"]] == [["pay_parking_session"], ["find_parking_spot"], []]
    assert report["word_overlap"]["all"]["exact_set"] == 2 and report["set"]["complete"]
    # the tool list is in the prompt: longer than any request alone, and the bundle's limit makes room for it
    assert row["prompt_tokens_max"] > 20 and row["max_input_tokens"] >= row["prompt_tokens_max"]
    assert "none rate (no-tool cases answered empty)" in capsys.readouterr().out


def test_request_tools_answer_as_a_bundle_a_catalog(tiny_checkpoint, tmp_path):
    """--request-tools (one bundle, each catalog's tools sent with its requests) gives the answers a bundle a
    catalog gives: a request's tool list renders and encodes as a catalog of it does."""
    unseen = load_unseen()
    subset = [c.id for c in unseen.catalogs if len(c.tools) <= 6][:2] + [max(unseen.catalogs,
                                                                              key=lambda c: len(c.tools)).id]
    template = json.loads(Path(TRAINING_CATALOG).read_text(encoding="utf-8"))
    template["prompt_template"] = template["prompt_template"].replace("{request}", "Tools:\n{tools}\n\n{request}")
    (tmp_path / "template.json").write_text(json.dumps(template))
    reports = []
    for mode in ([], ["--request-tools"]):
        out = tmp_path / f"out{len(reports)}.json"
        assert main([str(tiny_checkpoint), "--template-from", str(tmp_path / "template.json"), "--only", *subset,
                     "--json", str(out), *mode]) == 0
        reports.append(json.loads(out.read_text()))
    per_catalog, request_tools = ([(c["prompt_sha256"], c["model"]) for row in r["catalogs"] for c in row["cases"]]
                                  for r in reports)
    assert per_catalog == request_tools and reports[1]["request_tools"] and len(per_catalog) >= 15
    no_tools = main([str(tiny_checkpoint), "--only", subset[0], "--request-tools"])  # the shipped template
    assert no_tools == EXIT_CODES["template_invalid"]
