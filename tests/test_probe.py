"""The catalog probe (builder/probe.py): its warnings fire on a random-weight checkpoint with a small
catalog and stay quiet for the project's own tool model and catalog; `--min-probe-recall` refuses
with its own exit code and writes no bundle; `builder inspect` shows the probe, or says it was not
recorded for an older bundle; a catalog over 256 tools is probed in a seeded sample
(builder/probe_sample.py), recorded, the same on every build, and whole with `--probe-all`."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from toolcall.builder.cli import main as builder_cli
from toolcall.builder.probe import MIN_RECALL, NO_TOOL_REQUESTS, SAME_ANSWER_SHARE, probe_warnings, tool_request
from toolcall.builder.probe_sample import METHOD_ALL, METHOD_SHA256_RANK, SAMPLE_SEED, SAMPLE_SIZE, sample_tools
from toolcall.common.errors import EXIT_CODES
from toolcall.runtime.bundle.files import REPORT_FILE

FIXTURES = Path(__file__).resolve().parent / "fixtures"
# Small limits keep a tiny CPU build to a few seconds (as tests/test_compile.py's FAST).
FAST = ["--max-input-tokens", "128", "--max-tokens-per-step", "128", "--prefill-chunk", "64"]
# A user's own small catalog: tools the random-weight checkpoint cannot know.
SMALL_CATALOG = {
    "tools": [
        {"name": "get_weather", "description": "Show the current weather in a city."},
        {"name": "send_email", "description": "Send an email message to a contact."},
        {"name": "book_taxi", "description": "Book a taxi ride to an address."},
        {"name": "play_music", "description": "Play a song or a playlist."},
        {"name": "convert_currency"},  # no description: its request is "convert currency"
    ],
    "answer": {"allow_empty": True},
}
FIELDS = {"tools", "skipped_tools", "no_tool_requests", "recall", "distinct_answers", "same_answer_share",
          "none_rate", "empty_allowed", "warnings", "catalog_tools", "sampled_tools", "sample_seed", "sample_method"}


def cli(*args):
    return CliRunner().invoke(builder_cli, [str(a) for a in args])


@pytest.fixture
def small_catalog(tmp_path) -> Path:
    path = tmp_path / "small-catalog.json"
    path.write_text(json.dumps(SMALL_CATALOG))
    return path


def report_probe(bundle: Path) -> dict:
    return json.loads((bundle / REPORT_FILE).read_text())["probe"]


def check_ranges(probe: dict, tools: int) -> None:
    assert set(probe) == FIELDS and probe["catalog_tools"] == tools and probe["sample_seed"] == SAMPLE_SEED
    assert probe["sampled_tools"] == min(tools, SAMPLE_SIZE)
    assert probe["sample_method"] == (METHOD_ALL if tools <= SAMPLE_SIZE else METHOD_SHA256_RANK)
    assert probe["tools"] + probe["skipped_tools"] == probe["sampled_tools"] and probe["no_tool_requests"] == len(NO_TOOL_REQUESTS)
    for share in ("recall", "same_answer_share", "none_rate"):
        assert 0.0 <= probe[share] <= 1.0, (share, probe)
    assert 1 <= probe["distinct_answers"] <= probe["tools"] + probe["no_tool_requests"]
    assert isinstance(probe["warnings"], list) and all(isinstance(w, str) for w in probe["warnings"])


# -- the figures' rules ---------------------------------------------------------------------------

# id, tools probed, picked, skipped, same-answer share, tools in the catalog -> warning kinds
RULES = [
    ("knows_every_tool", 64, 64, 0, 1 / 64, 64, set()),
    ("recall_at_the_bound", 4, 2, 0, 0.25, 4, set()),
    ("recall_below", 5, 1, 0, 0.4, 5, {"recall"}),
    ("one_answer_for_all", 5, 1, 0, 1.0, 5, {"recall", "same"}),
    ("four_of_five_alike", 5, 4, 0, 0.8, 5, {"same"}),
    ("two_tools_alike", 2, 1, 0, 1.0, 2, {"same"}),
    ("two_tools_apart", 2, 2, 0, 0.5, 2, set()),
    ("one_tool_catalog", 1, 1, 0, 1.0, 1, set()),  # one tool: every answer naming it is the same
    ("descriptions_too_long", 3, 3, 2, 1 / 3, 5, {"skipped"}),
    ("nothing_fits", 0, 0, 3, 0.0, 3, {"recall", "skipped"}),
]


@pytest.mark.parametrize("name,tools,picked,skipped,share,catalog_tools,kinds", RULES, ids=[r[0] for r in RULES])
def test_warning_rules(name, tools, picked, skipped, share, catalog_tools, kinds):
    found = probe_warnings(tools, picked, skipped, share, ("send_email",), catalog_tools)
    markers = {"recall": f"below {MIN_RECALL}", "same": f"warned at {SAME_ANSWER_SHARE}", "skipped": "not probed"}
    assert {k for k, m in markers.items() if any(m in w for w in found)} == kinds and len(found) == len(kinds)
    if "recall" in kinds:  # what was found, the numbers and what to do
        (w,) = [w for w in found if markers["recall"] in w]
        assert f"{picked} of {tools} tools" in w and "{tools}" in w and "checkpoint" in w


def test_tool_request_is_the_description_or_the_name():
    assert tool_request("get_weather", "  Show the weather. ") == "Show the weather."
    assert tool_request("get_weather", None) == tool_request("get_weather", " ") == "get weather"


# -- builds -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
def test_warning_fires_on_a_random_weight_checkpoint(tmp_path, tiny_checkpoint, small_catalog, as_json):
    out = tmp_path / "small"
    result = cli("compile", tiny_checkpoint, "--catalog", small_catalog, "--out", out, *FAST,
                 *(["--json"] if as_json else []))
    assert result.exit_code == 0, result.output
    probe = report_probe(out)
    check_ranges(probe, len(SMALL_CATALOG["tools"]))
    assert probe["recall"] < MIN_RECALL and probe["empty_allowed"] is True
    if as_json:
        printed = json.loads(result.stdout)
        assert printed["probe"] == probe and printed["warnings"] == probe["warnings"]
        assert printed["timings_s"]["probe"] > 0
    else:  # the table shows the probe's line; its warnings go to stderr only
        assert f"recall {probe['recall']:.2f}" in result.stdout and "warning:" not in result.stdout
    lines = [line for line in result.stderr.splitlines() if line.startswith("warning: ")]
    assert lines == [f"warning: {w}" for w in probe["warnings"]] and any(f"below {MIN_RECALL}" in w for w in lines)
    shown = cli("inspect", out)
    assert shown.exit_code == 0 and f"recall {probe['recall']:.2f} over 5 tools" in shown.stdout
    assert all(f"warning: {w}" in shown.stdout for w in probe["warnings"])
    assert cli("verify", out).exit_code == 0  # the report, probe included, is listed and hashed


def test_min_probe_recall_refuses_and_writes_nothing(tmp_path, tiny_checkpoint, small_catalog):
    out = tmp_path / "builds" / "refused"
    result = cli("compile", tiny_checkpoint, "--catalog", small_catalog, "--out", out, *FAST,
                 "--min-probe-recall", "0.5", "--json")
    assert result.exit_code == EXIT_CODES["probe_failed"] == 18, result.output
    err = json.loads(result.stdout)
    assert err["error"] == "probe_failed" and err["details"]["min_probe_recall"] == 0.5
    assert err["details"]["recall"] < 0.5 and "--min-probe-recall" in err["message"]
    assert not out.exists() and list(out.parent.iterdir()) == []  # no bundle, no partial folder, no claim
    assert cli("compile", tiny_checkpoint, "--catalog", small_catalog, "--out", out,
               "--min-probe-recall", "1.5").exit_code == EXIT_CODES["usage"]
    assert "probe_failed 18" in " ".join(cli("--help").stdout.split())


def test_shipped_model_knows_its_catalog(shipped_bundle, tiny_bundle):
    probe = report_probe(shipped_bundle)
    check_ranges(probe, 64)
    # measured: recall 0.97 (62 of 64), 65 distinct answers, none rate 0.75
    assert probe["recall"] >= 0.9 and probe["warnings"] == [] and probe["distinct_answers"] >= 60
    check_ranges(report_probe(tiny_bundle), 64)  # the random-weight checkpoint with the same catalog
    shown = cli("inspect", shipped_bundle, "--json")
    assert shown.exit_code == 0 and json.loads(shown.stdout)["probe"] == probe


def test_inspect_says_when_no_probe_was_recorded():
    bundle = FIXTURES / "format2-cpu-bundle"  # built before the probe
    assert "probe" not in json.loads((bundle / REPORT_FILE).read_text())
    shown = cli("inspect", bundle)
    assert shown.exit_code == 0 and "probe" in shown.stdout and "not recorded" in shown.stdout
    assert json.loads(cli("inspect", bundle, "--json").stdout)["probe"] is None


# -- the sample ---------------------------------------------------------------------------------------

def test_a_small_catalog_is_probed_whole_and_a_large_one_in_a_seeded_sample():
    names = [f"tool_{i}" for i in range(1000)]
    assert sample_tools(names[:SAMPLE_SIZE]).tool_ids == tuple(range(SAMPLE_SIZE))
    assert sample_tools(names[:SAMPLE_SIZE]).method == METHOD_ALL
    assert sample_tools(names, None).tool_ids == tuple(range(1000))  # --probe-all
    s = sample_tools(names)
    assert s.method == METHOD_SHA256_RANK and s.catalog_tools == 1000 and s.seed == SAMPLE_SEED
    assert len(s.tool_ids) == SAMPLE_SIZE == len(set(s.tool_ids)) and list(s.tool_ids) == sorted(s.tool_ids)
    assert s == sample_tools(list(names))  # the same names, the same sample
    # the sample follows the names, not their order in the catalog
    shuffled = names[::-1]
    assert {shuffled[t] for t in sample_tools(shuffled).tool_ids} == {names[t] for t in s.tool_ids}
    assert sample_tools(names, seed=1).tool_ids != s.tool_ids
    # the draw is its definition, written out here: the 256 smallest sha256("0:<name>"), not a library's random stream
    ranked = sorted(range(1000), key=lambda i: hashlib.sha256(f"0:tool_{i}".encode()).hexdigest())
    assert s.tool_ids == tuple(sorted(ranked[:SAMPLE_SIZE]))


def test_a_catalog_over_the_sample_size_records_its_sample_and_probe_all_probes_every_tool(tmp_path, tiny_checkpoint):
    catalog = tmp_path / "wide.json"
    tools = SAMPLE_SIZE + 44
    catalog.write_text(json.dumps({"tools": [{"name": f"tool_{i}"} for i in range(tools)]}))
    built = {}
    for name, extra in (("a", []), ("b", []), ("all", ["--probe-all"])):
        result = cli("compile", tiny_checkpoint, "--catalog", catalog, "--out", tmp_path / name, *FAST, "--json",
                     *extra)
        assert result.exit_code == 0, result.output
        built[name] = json.loads(result.stdout)
    probe = report_probe(tmp_path / "a")
    check_ranges(probe, tools)
    assert probe["tools"] == SAMPLE_SIZE and built["a"]["probe"] == probe
    assert any(f"of {SAMPLE_SIZE} tools sampled of the catalog's {tools}" in w for w in probe["warnings"])
    assert built["a"]["bundle_id"] == built["b"]["bundle_id"]  # the same inputs, the same bytes
    every = report_probe(tmp_path / "all")
    assert every["sample_method"] == METHOD_ALL and every["tools"] + every["skipped_tools"] == tools
    assert built["all"]["bundle_id"] != built["a"]["bundle_id"]  # the report records another probe
    shown = cli("inspect", tmp_path / "a")
    assert f"over {SAMPLE_SIZE} tools (a seeded sample of {tools})" in shown.stdout


def test_the_probe_answers_the_same_however_many_requests_run_at_once(shipped_bundle, monkeypatch):
    """The probe widens the bundle's limits (probe_limits: up to PROBE_SEQUENCES requests at once, within
    PROBE_KV_BYTES of KV pages) only for time: every figure equals the probe run at the bundle's own 8."""
    import tokenizers

    from toolcall.builder import probe
    from toolcall.builder.catalog import load_catalog
    from toolcall.runtime.batching.prompt import PromptEncoder
    from toolcall.runtime.bundle.files import GRAMMAR_FILE, TOKENIZER_FILE, WEIGHTS_FILE, read_contract
    from toolcall.runtime.grammar.trie import Grammar

    contract = read_contract(shipped_bundle)
    grammar = Grammar.read(shipped_bundle / GRAMMAR_FILE)
    catalog = load_catalog("builder/data/tools-64.json")
    encoder = PromptEncoder.create(tokenizers.Tokenizer.from_file(str(shipped_bundle / TOKENIZER_FILE)),
                                   grammar.prompt_template)
    args = (shipped_bundle / WEIGHTS_FILE, contract.model, grammar, contract.limits,
            tuple(t.description for t in catalog.tools), encoder, sample_tools(catalog.names))
    limits = contract.limits
    assert probe.probe_limits(limits, contract.model, 68).max_sequences == 64 > limits.max_sequences
    wide = probe.run_probe(*args)
    monkeypatch.setattr(probe, "PROBE_SEQUENCES", limits.max_sequences)
    assert probe.probe_limits(limits, contract.model, 68) == limits
    assert probe.run_probe(*args) == wide and wide.to_dict() == report_probe(shipped_bundle)
    # a model whose sequences need more KV bytes than PROBE_KV_BYTES holds keeps the bundle's own limits
    from toolcall.builder.synth import SynthOptions, model_config_for
    q06 = model_config_for(SynthOptions(shape="qwen3-0.6b"), 151_000)
    assert probe.probe_limits(limits, q06, 68).max_sequences == limits.max_sequences
