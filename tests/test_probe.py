"""The catalog probe (builder/probe.py): its warnings fire on a random-weight checkpoint with a small
catalog and stay quiet for the project's own tool model and catalog; `--min-probe-recall` refuses
with its own exit code and writes no bundle; `builder inspect` shows the probe, or says it was not
recorded for an older bundle."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from toolcall.builder.cli import main as builder_cli
from toolcall.builder.probe import MIN_RECALL, NO_TOOL_REQUESTS, SAME_ANSWER_SHARE, probe_warnings, tool_request
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
          "none_rate", "empty_allowed", "warnings"}


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
    assert set(probe) == FIELDS
    assert probe["tools"] + probe["skipped_tools"] == tools and probe["no_tool_requests"] == len(NO_TOOL_REQUESTS)
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
