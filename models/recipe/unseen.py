"""The unseen-catalog evaluation set (models/recipe/unseen_catalogs.json) and its scoring.

Catalogs and requests written by hand, in domains other than builder/data/tools-64.json's, and
frozen before any training run that reads catalogs: they measure whether a model picks tools from
a catalog it was never trained on. Reporting only: never training, tokenizer or model choice.

File format: a JSON object with the header fields ``frozen`` (the date it was frozen) and ``note``,
and ``catalogs``, a list of ``{"id", "domain", "tools": [{"name", "description"}], "cases":
[{"request", "tools": [expected names]}]}``; ``tools`` is a catalog's tool list as
schemas/catalog.schema.json states it, and a case's expected tools are a set (order irrelevant;
empty: the request needs no tool).

A case's kind is ``none`` (no tool expected), ``one`` (one tool) or ``multi`` (two or more).
Scores (``score_unseen``), per kind and over all cases:

- exact-set: the answer's set of tools equals the expected set (an empty answer is exact for a
  no-tool case);
- top-1: the answer's first tool is in the expected set; for a no-tool case, top-1 is correct iff
  the answer is empty (there is no first tool to be right, and naming any tool is wrong);
- answered-empty: the share of cases answered with no tool. On no-tool cases this is the "none
  rate"; on tool cases it is the share the answerer gave up on.
"""
from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from toolcall.builder.catalog import DEFAULT_MAX_TOOLS, Catalog, Tool, load_catalog
from toolcall.common.errors import CatalogError
from toolcall.models.recipe.eval import empty_scores, score

UNSEEN = Path(__file__).with_name("unseen_catalogs.json")
KINDS = ("none", "one", "multi")
# What a catalog document copies from a template catalog (--template-from): how the prompt reads and
# how an answer is laid out, never its tools.
TEMPLATE_FIELDS = ("prompt_template", "tool_format")


@dataclass(frozen=True)
class Case:
    """One request and the set of tools it expects (in the file's order; empty: no tool)."""

    request: str
    tools: tuple[str, ...]

    @property
    def kind(self) -> str:
        return case_kind(self.tools)


@dataclass(frozen=True)
class UnseenCatalog:
    """One hand-written catalog: its tools (catalog order) and its cases."""

    id: str
    domain: str
    tools: tuple[Tool, ...]
    cases: tuple[Case, ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(t.name for t in self.tools)

    @property
    def largest_answer(self) -> int:
        return max((len(c.tools) for c in self.cases), default=0)

    def document(self, template: Mapping | None = None) -> dict:
        """The catalog as a document for ``load_catalog`` or ``builder compile``: its tools, the empty
        answer allowed, room for its largest expected answer, and ``template``'s prompt_template,
        tool_format and answer separator where that (parsed) catalog document has them."""
        template = template or {}
        answer = dict(template.get("answer", {}))
        answer["allow_empty"] = True  # a fifth of the cases need no tool: the empty answer must be reachable
        answer["max_tools"] = max(answer.get("max_tools", DEFAULT_MAX_TOOLS), self.largest_answer)
        tools = [{"name": t.name, **({"description": t.description} if t.description is not None else {})}
                 for t in self.tools]
        doc: dict = {"tools": tools, "answer": answer}
        doc.update({k: template[k] for k in TEMPLATE_FIELDS if k in template})
        return doc

    def catalog(self, template: Mapping | None = None) -> Catalog:
        """``document(template)`` validated by ``load_catalog`` (CatalogError where it is not valid)."""
        return load_catalog(self.document(template))


@dataclass(frozen=True)
class UnseenSet:
    """The frozen set: its header and its catalogs, in file order."""

    frozen: str
    note: str
    catalogs: tuple[UnseenCatalog, ...]

    @property
    def cases(self) -> tuple[Case, ...]:
        return tuple(c for cat in self.catalogs for c in cat.cases)


def case_kind(tools: Sequence[str]) -> str:
    """``none`` (no tool), ``one`` (one tool) or ``multi`` (two or more)."""
    return KINDS[min(len(tools), 2)]


def load_unseen(path: str | Path = UNSEEN) -> UnseenSet:
    """Reads and checks the set; ``CatalogError("catalog_invalid")`` naming the catalog (and case) at
    fault where the file is not the format above, a catalog is not valid for ``load_catalog`` (with the
    empty answer allowed and room for its largest expected answer), ids repeat, or a case expects a
    tool twice or a tool its catalog lacks."""
    path = Path(path)
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CatalogError("catalog_invalid", f"{path}: cannot read the unseen-catalog set ({e}); expected a "
                           "UTF-8 JSON file as models/recipe/unseen.py describes", file=str(path)) from None
    if not isinstance(doc, dict) or not all(isinstance(doc.get(k), str) for k in ("frozen", "note")) \
            or not isinstance(doc.get("catalogs"), list):
        raise CatalogError("catalog_invalid", f"{path}: expected an object with text fields 'frozen' and 'note' "
                           "and a list 'catalogs'", file=str(path))
    catalogs, seen = [], set()
    for i, entry in enumerate(doc["catalogs"]):
        cat = _read_catalog(path, i, entry)
        if cat.id in seen:
            raise CatalogError("catalog_invalid", f"{path}: catalog {i} repeats the id {cat.id!r}; give each "
                               "catalog its own id", file=str(path), catalog=i, id=cat.id)
        seen.add(cat.id)
        catalogs.append(cat)
    return UnseenSet(frozen=doc["frozen"], note=doc["note"], catalogs=tuple(catalogs))


def _read_catalog(path: Path, index: int, entry: object) -> UnseenCatalog:
    where = f"{path}: catalog {index}"
    if not isinstance(entry, dict) or set(entry) != {"id", "domain", "tools", "cases"} \
            or not all(isinstance(entry[k], str) and entry[k] for k in ("id", "domain")) \
            or not isinstance(entry["cases"], list):
        raise CatalogError("catalog_invalid", f"{where}: expected exactly the fields id, domain (non-empty text), "
                           "tools and cases (a list)", file=str(path), catalog=index)
    where = f"{path}: catalog {index} {entry['id']!r}"
    cases = []
    for j, case in enumerate(entry["cases"]):
        if not isinstance(case, dict) or set(case) != {"request", "tools"} or not isinstance(case["request"], str) \
                or not case["request"].strip() or not isinstance(case["tools"], list) \
                or not all(isinstance(t, str) for t in case["tools"]):
            raise CatalogError("catalog_invalid", f"{where}: case {j}: expected {{\"request\": non-blank text, "
                               "\"tools\": [names]}", file=str(path), catalog=index, case=j)
        cases.append(Case(case["request"], tuple(case["tools"])))
    largest = max((len(c.tools) for c in cases), default=0)
    try:  # the tools exactly as a catalog file would hold them, checked by the builder's own loader
        catalog = load_catalog({"tools": entry["tools"],
                                "answer": {"allow_empty": True, "max_tools": max(DEFAULT_MAX_TOOLS, largest)}})
    except CatalogError as e:
        raise CatalogError(e.code, f"{where}: {e.message}", **{**e.details, "file": str(path), "catalog": index,
                                                               "id": entry["id"]}) from None
    names = set(catalog.names)
    for j, case in enumerate(cases):
        unknown = [t for t in case.tools if t not in names]
        if unknown or len(set(case.tools)) != len(case.tools):
            raise CatalogError("catalog_invalid", f"{where}: case {j} {case.request!r} expects {list(case.tools)}: "
                               f"unknown {unknown} or repeated names; expect each tool of this catalog at most once",
                               file=str(path), catalog=index, case=j, unknown=unknown)
    return UnseenCatalog(id=entry["id"], domain=entry["domain"], tools=catalog.tools, cases=tuple(cases))


def top1_correct(predicted: Sequence[str], expected: Sequence[str]) -> bool:
    """The answer's first tool is expected; for a no-tool case, the answer is empty."""
    return not predicted if not expected else bool(predicted) and predicted[0] in expected


def kind_scores(predicted: Sequence[Sequence[str]], labels: Sequence[Sequence[str]]) -> dict:
    """Exact-set, top-1 and answered-empty counts and rates over these cases (rates 0.0 when there are
    none), with models/recipe/eval.py's recall and precision (micro, over tool mentions)."""
    s = score(predicted, labels)
    n = s["n"]
    top1 = sum(top1_correct(list(p), list(g)) for p, g in zip(predicted, labels))
    empty = sum(not p for p in predicted)
    return {"n": n, "exact_set": s["exact_set"], "exact_set_rate": s["exact_set_rate"], "top1": top1,
            "top1_rate": top1 / n if n else 0.0, "answered_empty": empty,
            "answered_empty_rate": empty / n if n else 0.0,
            "recall": s["recall"], "precision": s["precision"]}


def score_unseen(predicted: Sequence[Sequence[str]], labels: Sequence[Sequence[str]]) -> dict:
    """``kind_scores`` over all cases (``all``) and per kind (``none``, ``one``, ``multi``), and the
    none rate (no-tool cases answered empty) beside the share of tool cases answered empty."""
    assert len(predicted) == len(labels), f"{len(predicted)} answers for {len(labels)} cases"
    out = {"all": kind_scores(predicted, labels)}
    for kind in KINDS:
        pairs = [(p, g) for p, g in zip(predicted, labels) if case_kind(g) == kind]
        out[kind] = kind_scores([p for p, _ in pairs], [g for _, g in pairs])
    empty = empty_scores(predicted, labels)
    out["none_rate"], out["tool_cases_empty_rate"] = empty["none_accuracy"], empty["tool_requests_empty"]
    return out
