"""A checkpoint on the hand-written unseen catalogs, beside the word-overlap baseline.

    python3 -m toolcall.models.recipe.eval_unseen CHECKPOINT [--template-from CATALOG] [--json OUT]
        [--precision fp8_e4m3|bf16|nvfp4] [--set PATH] [--only ID ...] [--request-tools]

For each catalog of the frozen set (models/recipe/unseen_catalogs.json, toolcall.models.recipe.unseen):
compiles a CPU bundle of CHECKPOINT with that catalog's tools, in a temporary folder, taking the
prompt template and tool line format from ``--template-from`` (default builder/data/tools-64.json: a
template with ``{tools}`` puts each catalog's tool list into the prompt; one without it gives the
model the request alone), the empty answer allowed and room for the catalog's largest expected answer;
answers every case greedily through the runtime (Engine.load, one batched run); and answers the same
cases with the word-overlap baseline (toolcall.models.recipe.overlap). Prints one table, model against
word overlap on all / one-tool / multi-tool / no-tool cases (exact-set, top-1, answered empty: on
no-tool cases the none rate), and writes every answer and timing with ``--json``.

``--request-tools`` (a template holding ``{tools}``): one bundle of the template catalog instead, each unseen
catalog's tools sent with its requests (the serving path, runtime/batching/request_tools.py): the prompts and
grammars are those of a catalog of the same tools, so the answers are the same and the one build is the only
compile.

A catalog's build takes under a second to a few seconds (the first ones longer: numba compiles the CPU
kernels once per process); the whole set about two and a half minutes on a busy two-core machine.
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import hashlib
import json
import platform
import sys
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path

from toolcall.builder.catalog import load_catalog
from toolcall.common.errors import CatalogError, EngineError
from toolcall.common.formats import WEIGHT_FORMATS
from toolcall.models.recipe.overlap import overlap_answer
from toolcall.models.recipe.unseen import UNSEEN, UnseenCatalog, load_unseen, score_unseen

DEFAULT_TEMPLATE = "builder/data/tools-64.json"
PRECISIONS = sorted(n for f in WEIGHT_FORMATS if f.in_bundles for n in (f.name, *f.aliases))
PAGE_SIZE = 32
ROWS = (("all", "all"), ("one-tool", "one"), ("multi-tool", "multi"), ("no-tool", "none"))


def template_document(path: str | Path) -> dict:
    """The parsed catalog at ``path``, checked by ``load_catalog``: the fields an unseen catalog copies
    (``prompt_template``, ``tool_format``, the answer separator) are taken from it as written, so a
    ``{tools}`` placeholder is rendered with each unseen catalog's own tools."""
    load_catalog(path)  # a typed CatalogError for a missing, unreadable or invalid file
    return json.loads(Path(path).read_text(encoding="utf-8"))


def build_options(precision: str, max_input_tokens: int):
    """CPU build options for one unseen catalog (the tests' shape: 8 sequences, 32-token pages)."""
    from toolcall.runtime.bundle.contract import BuildOptions

    return BuildOptions(precision=precision, target="cpu", max_sequences=8, max_input_tokens=max_input_tokens,
                        max_output_tokens=None, page_size=PAGE_SIZE, max_tokens_per_step=256, prefill_chunk=128,
                        memory_budget_bytes=None, context_reserve_bytes=None, seed=0)


def longest_prompt(tokenizer, template: str, requests: list[str]) -> int:
    """Tokens of the longest of ``requests`` wrapped in the rendered ``template``, as the runtime encodes them."""
    from toolcall.runtime.batching.prompt import PromptEncoder

    encoder = PromptEncoder.create(tokenizer, template)
    return max(len(encoder.encode(r)) for r in requests)


def answer_catalog(checkpoint: str, catalog: UnseenCatalog, template: Mapping, precision: str,
                   work: Path) -> dict:
    """Builds ``catalog``'s bundle under ``work`` and answers its cases: per case the model's answer
    (``[]`` where the runtime refused the request, counted in ``errors``), and the seconds spent."""
    from toolcall.builder.checkpoint import open_checkpoint
    from toolcall.builder.compile import compile_bundle
    from toolcall.runtime.batching.batcher import Result
    from toolcall.runtime.engine import Engine

    doc = catalog.document(template)
    rendered = load_catalog(doc).prompt_template
    requests = [c.request for c in catalog.cases]
    longest = longest_prompt(open_checkpoint(checkpoint).tokenizer(), rendered, requests)
    # room for the longest prompt, in whole pages, and never below the tests' 128 tokens
    max_input = max(128, -(-(longest + 1) // PAGE_SIZE) * PAGE_SIZE)
    path = work / f"{catalog.id}.json"
    path.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    start = time.perf_counter()
    compiled = compile_bundle(checkpoint, path, build_options(precision, max_input), work / catalog.id)
    compile_s = time.perf_counter() - start
    engine = Engine.load(compiled.out_dir)
    load_s = time.perf_counter() - start - compile_s
    try:
        results = engine.run(requests)
    finally:
        engine.close()
    run_s = time.perf_counter() - start - compile_s - load_s
    return {"answers": [r.tools if isinstance(r, Result) else [] for r in results],
            "errors": [None if isinstance(r, Result) else str(r) for r in results],
            "prompts": [prompt_digest(r.prompt_token_ids) if isinstance(r, Result) else None for r in results],
            "prompt_tokens_max": longest, "max_input_tokens": max_input, "compile_s": compile_s,
            "compile_stages_s": compiled.timings, "load_s": load_s, "run_s": run_s}


def request_tools_answerer(checkpoint: str, catalogs: list[UnseenCatalog], template: Mapping, precision: str,
                           work: Path):
    """One bundle of ``template`` (its ``{tools}`` taking each unseen catalog's tools per request; the empty
    answer allowed, room for the largest expected answer and for the longest prompt, in whole pages); returns
    ``answer_catalog``'s stand-in, which answers a catalog's cases with its tools sent along."""
    from toolcall.builder.checkpoint import open_checkpoint
    from toolcall.builder.compile import compile_bundle
    from toolcall.runtime.batching.batcher import Result
    from toolcall.runtime.batching.sampling import Sampling
    from toolcall.runtime.engine import Engine

    if "{tools}" not in template.get("prompt_template", ""):
        raise CatalogError("template_invalid", "--request-tools needs a --template-from catalog whose "
                           "prompt_template holds {tools}: the tools a request brings go there")
    tokenizer = open_checkpoint(checkpoint).tokenizer()
    longest = max(longest_prompt(tokenizer, load_catalog(c.document(template)).prompt_template,
                                 [case.request for case in c.cases]) for c in catalogs)
    max_input = max(128, -(-(longest + 1) // PAGE_SIZE) * PAGE_SIZE)
    doc = dict(template)
    doc["answer"] = {**template.get("answer", {}), "allow_empty": True,
                     "max_tools": max([template.get("answer", {}).get("max_tools", 4)]
                                      + [c.largest_answer for c in catalogs])}
    (work / "template.json").write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
    options = dataclasses.replace(build_options(precision, max_input),
                                  max_request_tools=max(64, max(len(c.tools) for c in catalogs)))
    start = time.perf_counter()
    compiled = compile_bundle(checkpoint, work / "template.json", options, work / "bundle")
    engine = Engine.load(compiled.out_dir)
    setup_s = [time.perf_counter() - start]  # charged to the first catalog

    def answer(catalog: UnseenCatalog) -> dict:
        begin = time.perf_counter()
        requests = [engine.request(c.request, Sampling(), list(catalog.tools)) for c in catalog.cases]
        results = engine.generator.generate(requests)
        spent, setup_s[0] = setup_s[0], 0.0
        return {"answers": [r.tools if isinstance(r, Result) else [] for r in results],
                "errors": [None if isinstance(r, Result) else str(r) for r in results],
                "prompts": [prompt_digest(r.prompt_ids) for r in requests],
                "prompt_tokens_max": max(len(r.prompt_ids) for r in requests), "max_input_tokens": max_input,
                "compile_s": spent, "compile_stages_s": {}, "load_s": 0.0, "run_s": time.perf_counter() - begin}

    return answer, engine


def prompt_digest(ids) -> str:
    """sha256 (hex, first 16 digits) of a prompt's token ids: two paths gave the model the same input."""
    return hashlib.sha256(json.dumps([int(t) for t in ids]).encode()).hexdigest()[:16]


def table(model: dict, overlap: dict) -> str:
    """The model and word-overlap scores side by side, one row per case kind."""
    head = f"{'cases':<11}{'n':>5}  {'model: exact-set':>16} {'top-1':>7} {'empty':>7}   " \
           f"{'overlap: exact-set':>18} {'top-1':>7} {'empty':>7}"
    lines = [head, "-" * len(head)]
    for label, key in ROWS:
        m, o = model[key], overlap[key]
        lines.append(f"{label:<11}{m['n']:>5}  {m['exact_set_rate']:>16.1%} {m['top1_rate']:>7.1%} "
                     f"{m['answered_empty_rate']:>7.1%}   {o['exact_set_rate']:>18.1%} {o['top1_rate']:>7.1%} "
                     f"{o['answered_empty_rate']:>7.1%}")
    lines.append(f"none rate (no-tool cases answered empty): model {model['none_rate']:.1%}, "
                 f"word overlap {overlap['none_rate']:.1%}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("checkpoint", help="a Hugging Face checkpoint folder (e.g. models/toolcall-qwen3-tiny)")
    ap.add_argument("--template-from", default=DEFAULT_TEMPLATE,
                    help="catalog whose prompt_template and tool_format every unseen catalog takes "
                         f"(default {DEFAULT_TEMPLATE})")
    ap.add_argument("--precision", choices=PRECISIONS, default="fp8_e4m3", help="bundle weights (default fp8_e4m3)")
    ap.add_argument("--set", dest="set_path", default=str(UNSEEN),
                    help="the unseen-catalog set (default: the frozen one)")
    ap.add_argument("--only", nargs="+", default=None, metavar="ID", help="only these catalogs (a quick look; "
                    "figures on a part of the set are not the set's)")
    ap.add_argument("--json", dest="json_out", default=None, help="write the scores, every answer and the timings here")
    ap.add_argument("--request-tools", action="store_true",
                    help="one bundle of --template-from (its template must hold {tools}); each catalog's tools "
                         "sent with its requests instead of a bundle a catalog")
    args = ap.parse_args(argv)

    try:
        unseen = load_unseen(args.set_path)
        template = template_document(args.template_from)
    except CatalogError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    catalogs = [c for c in unseen.catalogs if args.only is None or c.id in args.only]
    missing = sorted(set(args.only or ()) - {c.id for c in catalogs})
    if missing:
        ap.error(f"no catalog with id {missing} in {args.set_path}")

    precision = WEIGHT_FORMATS.get(args.precision).name  # an alias ("fp8") builds under its format's name
    start = time.perf_counter()
    rows, model_answers, overlap_answers, labels = [], [], [], []
    with tempfile.TemporaryDirectory(prefix="unseen-") as tmp:
        engine = None
        try:
            if args.request_tools:
                answer, engine = request_tools_answerer(args.checkpoint, catalogs, template, precision, Path(tmp))
            else:
                def answer(catalog: UnseenCatalog) -> dict:
                    return answer_catalog(args.checkpoint, catalog, template, precision, Path(tmp))
        except EngineError as e:
            print(f"error: {e}", file=sys.stderr)
            return e.exit_code
        try:
            for k, catalog in enumerate(catalogs, 1):
                try:
                    got = answer(catalog)
                except EngineError as e:
                    print(f"error: catalog {catalog.id!r}: {e}", file=sys.stderr)
                    return e.exit_code
                theirs = [overlap_answer(c.request, catalog.tools) for c in catalog.cases]
                gold = [list(c.tools) for c in catalog.cases]
                model_answers += got["answers"]
                overlap_answers += theirs
                labels += gold
                exact = sum(set(a) == set(g) for a, g in zip(got["answers"], gold))
                base = sum(set(a) == set(g) for a, g in zip(theirs, gold))
                print(f"[{k}/{len(catalogs)}] {catalog.id} ({len(catalog.tools)} tools, {len(gold)} cases): "
                      f"compile {got['compile_s']:.1f} s, load {got['load_s']:.1f} s, run {got['run_s']:.1f} s; "
                      f"exact-set model {exact}/{len(gold)}, word overlap {base}/{len(gold)}", flush=True)
                rows.append({"id": catalog.id, "domain": catalog.domain, "tools": len(catalog.tools),
                             **{k: v for k, v in got.items() if k not in ("answers", "errors", "prompts")},
                             "cases": [{"request": c.request, "expected": list(c.tools), "kind": c.kind, "model": a,
                                        "overlap": b, "prompt_sha256": p, **({"error": err} if err else {})}
                                       for c, a, b, err, p in zip(catalog.cases, got["answers"], theirs,
                                                                  got["errors"], got["prompts"])]})
        finally:
            if engine is not None:
                engine.close()
    total_s = time.perf_counter() - start
    model, overlap = score_unseen(model_answers, labels), score_unseen(overlap_answers, labels)
    errors = sum("error" in c for r in rows for c in r["cases"])
    print(f"\nunseen catalogs ({unseen.frozen} set): {len(catalogs)} catalogs, {len(labels)} cases; model "
          f"{args.checkpoint} ({precision}, CPU), prompt template from {args.template_from}")
    print(table(model, overlap))
    print(f"{total_s:.0f} s in all (compile {sum(r['compile_s'] for r in rows):.0f} s, load "
          f"{sum(r['load_s'] for r in rows):.0f} s, answer {sum(r['run_s'] for r in rows):.1f} s)"
          + (f"; {errors} requests refused by the runtime, counted as empty answers" if errors else ""))
    if args.json_out:
        report = {"date": datetime.date.today().isoformat(), "machine": {"platform": platform.platform(),
                                                                        "processor": platform.processor()},
                  "checkpoint": args.checkpoint, "precision": precision, "template_from": args.template_from,
                  "request_tools": args.request_tools,
                  "set": {"path": args.set_path, "frozen": unseen.frozen, "catalogs": len(catalogs),
                          "cases": len(labels), "complete": args.only is None},
                  "model": model, "word_overlap": overlap, "refused_requests": errors, "total_s": total_s,
                  "catalogs": rows}
        Path(args.json_out).write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
