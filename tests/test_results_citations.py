"""A comment or doc that cites the results page (``bench/RESULTS.md, "Section"``) names a section the page
has now; the history (docs/history/) is cited by no code."""
from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CITATION = re.compile(r'RESULTS\.md[,:]?\s*"([^"]+)"')
SOURCES = (".py", ".cu", ".cuh", ".md")


def sections() -> set[str]:
    return {line.lstrip("#").strip() for line in (ROOT / "bench" / "RESULTS.md").read_text().splitlines()
            if line.startswith("#")}


def cited(text: str) -> list[str]:
    """Every section name cited in ``text``, a name broken over comment lines joined by one space."""
    return [re.sub(r"\s*\n\s*(#|//|\*)?\s*", " ", m.group(1)).strip() for m in CITATION.finditer(text)]


def project_files() -> list[Path]:
    return [p for p in sorted(ROOT.rglob("*")) if p.suffix in SOURCES and p.is_file()
            and not {".git", "history", "build", ".venv"} & set(p.relative_to(ROOT).parts)
            and "egg-info" not in str(p) and p.name != Path(__file__).name]  # this file's own examples


def test_every_cited_section_is_on_the_results_page():
    known = sections()
    bad = [f"{p.relative_to(ROOT)}: {name!r}" for p in project_files() for name in cited(p.read_text(errors="ignore"))
           if name not in known]
    assert not bad, "cited sections not in bench/RESULTS.md:\n" + "\n".join(bad)


def test_no_code_cites_the_history():
    bad = [str(p.relative_to(ROOT)) for p in project_files() if p.suffix != ".md"
           and "docs/history/results-diary" in p.read_text(errors="ignore")]
    assert not bad, bad


def test_a_citation_broken_over_comment_lines_is_read_whole():
    assert cited('# see (bench/RESULTS.md, "GPU decode,\n# Qwen3-0.6B shape")') == ["GPU decode, Qwen3-0.6B shape"]
    assert "No such section" not in sections()
