"""Tool-discovery accuracy of a bundle, and its agreement with transformers on the unquantized checkpoint.

    python models/recipe/eval.py BUNDLE --split test [--json OUT] [--checkpoint models/toolcall-qwen3-tiny]
    python models/recipe/eval.py BUNDLE [BUNDLE ...] --handwritten [--json OUT]

With ``--handwritten``: the hand-written set (models/recipe/handwritten.tsv) per bundle:
exact-set, recall, precision, "none" accuracy (no-tool requests answered empty), the share of
tool-bearing requests answered empty, every miss, and the robustness check (each request
varied by toolcall.models.recipe.variation.vary: the share whose answer set stays the same).

Runs every request of a toolcall.models.recipe.data split through the runtime (Engine.load, one
batched run) and scores the ranked tool lists against the labels: exact-set match, recall and
precision (micro, over tool mentions), order agreement (exact-set matches whose order is the
labelled one) and exact list match; and exact-set counts per template (``by_template``).
Then runs the same requests through transformers' ``generate`` (greedy, float32) on the
checkpoint under a grammar LogitsProcessor written apart from the runtime's stepper (its own
trie over the tokenizer's token paths, its own used-set) and counts requests whose two ranked
lists are identical. Prints one summary line.
"""
from __future__ import annotations

import argparse
import datetime
import json
import platform
import time
from collections.abc import Sequence
from pathlib import Path

from toolcall.builder.catalog import load_catalog
from toolcall.models.recipe.data import SPLITS, make_split
from toolcall.models.recipe.handwritten import HANDWRITTEN, load_handwritten
from toolcall.models.recipe.variation import vary


def score(predicted: Sequence[Sequence[str]], labels: Sequence[Sequence[str]]) -> dict:
    """Counts and rates of predicted ranked lists against labelled ones (same length, in order).

    exact_set: same set of tools; order: of those, how many in the labelled order; exact_list:
    identical lists; recall / precision: correct tool mentions over labelled / predicted ones
    (micro-averaged; 0.0 where the denominator is 0).
    """
    assert len(predicted) == len(labels), f"{len(predicted)} predictions for {len(labels)} labels"
    exact_set = exact_list = hits = n_pred = n_gold = 0
    for pred, gold in zip(predicted, labels):
        pred, gold = list(pred), list(gold)
        exact_set += set(pred) == set(gold)
        exact_list += pred == gold
        hits += len(set(pred) & set(gold))
        n_pred, n_gold = n_pred + len(pred), n_gold + len(gold)
    n = len(labels)
    return {"n": n, "exact_set": exact_set, "exact_list": exact_list, "tool_hits": hits, "predicted_tools": n_pred,
            "labelled_tools": n_gold, "exact_set_rate": exact_set / n if n else 0.0,
            "recall": hits / n_gold if n_gold else 0.0, "precision": hits / n_pred if n_pred else 0.0,
            "order_agreement": exact_list / exact_set if exact_set else 0.0,
            "exact_list_rate": exact_list / n if n else 0.0}


def empty_scores(predicted: Sequence[Sequence[str]], labels: Sequence[Sequence[str]]) -> dict:
    """The empty answer's counts: no-tool requests answered empty (``none_accuracy``) and
    tool-bearing requests answered empty (``tool_requests_empty``, a share of those requests)."""
    assert len(predicted) == len(labels)
    none = [not p for p, g in zip(predicted, labels) if not g]
    tooled = [not p for p, g in zip(predicted, labels) if g]
    return {"no_tool_requests": len(none), "none_answered_empty": sum(none),
            "none_accuracy": sum(none) / len(none) if none else 0.0,
            "tool_requests": len(tooled), "tool_requests_answered_empty": sum(tooled),
            "tool_requests_empty": sum(tooled) / len(tooled) if tooled else 0.0}


def handwritten_report(engine, path, seed: int = 0) -> dict:
    """One bundle on the hand-written set and on its varied copy (see the module docstring)."""
    from toolcall.runtime.batching.batcher import Result

    items = load_handwritten(path, set(engine.grammar.tool_names))
    texts, labels = [t for t, _ in items], [list(g) for _, g in items]
    varied = [vary(t, seed) for t in texts]
    start = time.perf_counter()
    results = engine.run(texts + varied)
    seconds = time.perf_counter() - start
    answers = [r.tools if isinstance(r, Result) else None for r in results]
    ours, theirs = [a or [] for a in answers[:len(texts)]], [a or [] for a in answers[len(texts):]]
    kept = sum(set(a) == set(b) for a, b in zip(ours, theirs))
    by_count: dict[int, list[int]] = {}
    for pred, gold in zip(ours, labels):
        by_count.setdefault(len(gold), []).append(set(pred) == set(gold))
    return {"precision": engine.contract.precision.weights, "bundle_id": engine.contract.engine.bundle_id,
            "handwritten": str(path), "requests": len(texts), "score": score(ours, labels),
            **empty_scores(ours, labels), "errors": sum(a is None for a in answers), "run_s": seconds,
            "exact_set_by_tool_count": {k: sum(v) / len(v) for k, v in sorted(by_count.items())},
            "robustness": {"seed": seed, "kept": kept, "kept_rate": kept / len(texts),
                           "varied_score": score(theirs, labels), "changed": [
                               {"request": t, "varied": v, "answer": a, "varied_answer": b}
                               for t, v, a, b in zip(texts, varied, ours, theirs) if set(a) != set(b)]},
            "misses": [{"request": t, "label": g, "answer": p, "min_margin": r.min_margin if isinstance(r, Result)
                        else None} for t, g, p, r in zip(texts, labels, ours, results) if set(g) != set(p)]}


def handwritten_line(report: dict) -> str:
    s = report["score"]
    return (f"{report['precision']} handwritten ({report['requests']}): exact-set {s['exact_set_rate']:.2%} "
            f"recall {s['recall']:.2%} precision {s['precision']:.2%} none {report['none_accuracy']:.2%} "
            f"tool-requests-empty {report['tool_requests_empty']:.2%} "
            f"robust {report['robustness']['kept_rate']:.2%}")


def by_template(patterns: Sequence[Sequence[str]], predicted: Sequence[Sequence[str]],
               labels: Sequence[Sequence[str]]) -> list[dict]:
    """Per template (clause pattern): the requests that use it and how many of those are an exact
    set, worst first (ties by pattern). A request of k clauses counts once for each of its patterns."""
    counts: dict[str, list[int]] = {}
    for pats, pred, gold in zip(patterns, predicted, labels, strict=True):
        for pattern in dict.fromkeys(pats):
            c = counts.setdefault(pattern, [0, 0])
            c[0] += 1
            c[1] += set(pred) == set(gold)
    rows = [{"pattern": k, "requests": n, "exact_set": ok} for k, (n, ok) in counts.items()]
    return sorted(rows, key=lambda r: (r["exact_set"] / r["requests"], r["pattern"]))


def identical(a: Sequence[Sequence[str]], b: Sequence[Sequence[str]]) -> int:
    """How many positions hold the same ranked list (same tools, same order) in ``a`` and ``b``."""
    assert len(a) == len(b)
    return sum(list(x) == list(y) for x, y in zip(a, b))


class ToolTrie:
    """The answer language ``tool (SEP tool)* END`` over token paths, replayed from the emitted tokens.

    A state is (node, used tools, count, done). Allowed next: a child token whose subtree holds
    an unused tool; at a node ending an unused tool, END, and SEP while count + 1 < the most
    tools an answer may hold (so SEP never leads to a dead end); with ``allow_empty``, END at
    the root before any tool (the empty answer).
    """

    def __init__(self, names: Sequence[str], paths: Sequence[Sequence[int]], sep: int, end: int, max_tools: int,
                 allow_empty: bool = False):
        self.names, self.sep, self.end, self.allow_empty = list(names), sep, end, allow_empty
        self.limit = min(max_tools, len(names))
        self.children: list[dict[int, int]] = [{}]
        self.below: list[set[int]] = [set()]  # node -> tools whose path passes through it
        self.ends: dict[int, int] = {}  # node -> the tool whose path ends there
        for tool, path in enumerate(paths):
            node = 0
            for token in path:
                if token not in self.children[node]:
                    self.children[node][token] = len(self.children)
                    self.children.append({})
                    self.below.append(set())
                node = self.children[node][token]
                self.below[node].add(tool)
            self.ends[node] = tool
        self.max_answer_tokens = sum(sorted(len(p) + 1 for p in paths)[-self.limit:])

    def state(self, tokens: Sequence[int]) -> tuple[int, frozenset, int, bool]:
        """(node, used, count, done) after ``tokens``; ValueError at the first token the grammar forbids."""
        node, used, done = 0, set(), False
        for i, token in enumerate(tokens):
            if done or token not in self.allowed_at(node, used, done):
                raise ValueError(f"token {token} at answer position {i} is outside the grammar")
            if node == 0 and token == self.end:  # the empty answer
                done = True
            elif token in self.children[node]:
                node = self.children[node][token]
            else:  # SEP or END closes the tool ending here
                used.add(self.ends[node])
                node, done = 0, token == self.end
        return node, frozenset(used), len(used), done

    def allowed_at(self, node: int, used: set | frozenset, done: bool) -> list[int]:
        if done:
            return []
        out = [t for t, child in self.children[node].items() if self.below[child] - used]
        if node == 0 and not used and self.allow_empty:
            out.append(self.end)
        tool = self.ends.get(node)
        if tool is not None and tool not in used:
            out.append(self.end)
            if len(used) + 1 < self.limit:
                out.append(self.sep)
        return sorted(out)

    def allowed(self, tokens: Sequence[int]) -> list[int]:
        """Token ids that may follow ``tokens`` (empty once END was emitted)."""
        node, used, _, done = self.state(tokens)
        return self.allowed_at(node, used, done)

    def decode(self, tokens: Sequence[int]) -> list[str]:
        """Tool names closed by SEP/END in ``tokens`` (stops at END; a trailing open name is dropped)."""
        out, node = [], 0
        for token in tokens:
            if node == 0 and token == self.end:  # the empty answer (or END after nothing open)
                break
            if token in (self.sep, self.end):
                out.append(self.names[self.ends[node]])
                node = 0
                if token == self.end:
                    break
            else:
                node = self.children[node][token]
        return out


def trie_for(catalog, tokenizer, end_id: int) -> ToolTrie:
    """The catalog's trie from standalone encodings of its tool names (as the builder tokenizes them)."""
    paths = [t.token_ids or tokenizer.encode(t.name, add_special_tokens=False).ids for t in catalog.tools]
    (sep,) = tokenizer.encode(catalog.answer.separator, add_special_tokens=False).ids
    return ToolTrie(catalog.names, paths, sep, end_id, catalog.answer.max_tools, catalog.answer.allow_empty)


def transformers_lists(checkpoint: str, texts: Sequence[str], catalog, batch: int = 64) -> list[list[str]]:
    """Greedy, grammar-constrained ranked lists from transformers (float32), prompts grouped by length."""
    import torch
    import transformers
    from tokenizers import Tokenizer

    torch.set_num_threads(2)
    config = json.loads((Path(checkpoint) / "generation_config.json").read_text())
    eos = config["eos_token_id"]
    end_id = eos[0] if isinstance(eos, list) else eos
    tokenizer = Tokenizer.from_file(str(Path(checkpoint) / "tokenizer.json"))
    trie = trie_for(catalog, tokenizer, end_id)
    model = transformers.AutoModelForCausalLM.from_pretrained(checkpoint, dtype=torch.float32).eval()

    class GrammarProcessor(transformers.LogitsProcessor):
        def __init__(self, prompt_len: int):
            self.prompt_len = prompt_len

        def __call__(self, input_ids, scores):
            mask = torch.full_like(scores, float("-inf"))
            for b, row in enumerate(input_ids[:, self.prompt_len:].tolist()):
                if end_id in row:  # finished (generate pads it with END): nothing but padding
                    mask[b, end_id] = 0.0
                else:
                    mask[b, trie.allowed(row)] = 0.0
            return scores + mask

    prompts = [tokenizer.encode(catalog.prompt_template.replace("{request}", t)).ids for t in texts]
    by_len: dict[int, list[int]] = {}
    for i, p in enumerate(prompts):
        by_len.setdefault(len(p), []).append(i)
    out: list[list[str]] = [[] for _ in texts]
    for length, members in sorted(by_len.items()):
        for start in range(0, len(members), batch):
            idx = members[start:start + batch]
            ids = torch.tensor([prompts[i] for i in idx])
            with torch.no_grad():
                gen = model.generate(ids, attention_mask=torch.ones_like(ids), do_sample=False,
                                     max_new_tokens=trie.max_answer_tokens, eos_token_id=end_id,
                                     pad_token_id=end_id,
                                     logits_processor=transformers.LogitsProcessorList([GrammarProcessor(length)]))
            for i, row in zip(idx, gen[:, length:].tolist()):
                out[i] = trie.decode(row)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle", nargs="+", help="one bundle (a split), or one or more (--handwritten)")
    ap.add_argument("--handwritten", nargs="?", const=str(HANDWRITTEN), default=None,
                    help="score the hand-written set (default path: models/recipe/handwritten.tsv)")
    ap.add_argument("--split", choices=SPLITS, default="test")
    ap.add_argument("--seed", type=int, default=0, help="the data generator's seed (the training seed)")
    ap.add_argument("--limit", type=int, default=None, help="only the first N requests")
    ap.add_argument("--catalog", default="builder/data/tools-64.json")
    ap.add_argument("--checkpoint", default="models/toolcall-qwen3-tiny", help="unquantized checkpoint for transformers")
    ap.add_argument("--no-transformers", action="store_true", help="skip the transformers comparison")
    ap.add_argument("--json", dest="json_out", default=None)
    args = ap.parse_args()

    from toolcall.runtime.batching.batcher import Result
    from toolcall.runtime.engine import Engine

    if args.handwritten:
        reports = [handwritten_report(Engine.load(b), args.handwritten, args.seed) for b in args.bundle]
        for b, r in zip(args.bundle, reports):
            r["bundle"] = b
            print(handwritten_line(r))
        if args.json_out:
            Path(args.json_out).write_text(json.dumps({"date": datetime.date.today().isoformat(),
                                                       "machine": {"platform": platform.platform()},
                                                       "reports": reports}, indent=2) + "\n")
        return
    if len(args.bundle) != 1:
        ap.error("a split is scored on one bundle; pass several only with --handwritten")
    args.bundle = args.bundle[0]
    examples = make_split(args.split, args.seed)[:args.limit]
    texts, labels = [e.request for e in examples], [list(e.tools) for e in examples]
    start = time.perf_counter()
    engine = Engine.load(args.bundle)
    results = engine.run(texts)
    runtime_s = time.perf_counter() - start
    ours = [r.tools if isinstance(r, Result) else [] for r in results]
    report = {"bundle": args.bundle, "bundle_id": engine.contract.engine.bundle_id,
              "precision": engine.contract.precision.weights, "split": args.split, "seed": args.seed,
              "date": datetime.date.today().isoformat(), "machine": {"platform": platform.platform(),
                                                                    "processor": platform.processor()},
              "runtime": score(ours, labels), "runtime_s": runtime_s,
              "by_template": by_template([e.patterns for e in examples], ours, labels),
              "errors": sum(not isinstance(r, Result) for r in results)}
    line = (f"{report['precision']} {args.split}: exact-set {report['runtime']['exact_set_rate']:.2%} "
            f"recall {report['runtime']['recall']:.2%} precision {report['runtime']['precision']:.2%} "
            f"order {report['runtime']['order_agreement']:.2%}")
    if not args.no_transformers:
        start = time.perf_counter()
        theirs = transformers_lists(args.checkpoint, texts, load_catalog(args.catalog))
        same = identical(ours, theirs)
        report.update(transformers=score(theirs, labels), transformers_s=time.perf_counter() - start,
                      identical_to_transformers=same, checkpoint=args.checkpoint,
                      differences=[{"request": t, "runtime": a, "transformers": b}
                                   for t, a, b in zip(texts, ours, theirs) if a != b][:50])
        line += f" identical-to-transformers {same}/{len(texts)}"
    report["mistakes"] = [{"request": t, "label": g, "runtime": p}
                          for t, g, p in zip(texts, labels, ours) if set(g) != set(p)][:100]
    print(line)
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(report, indent=2) + "\n")


if __name__ == "__main__":
    main()
