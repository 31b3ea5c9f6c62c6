"""Trains the catalog-reading tool model from nothing: the catalog is in the prompt (``{tools}``), so
the model picks tools by what their lines say, for catalogs it has never seen.

    python3 -m toolcall.models.recipe.train_catalog --out OUT [--steps N] [--seed 1] [--threads 2]

The model: masked_qwen3 (Hugging Face Qwen3 names; 6 layers, hidden 256, MLP 512, 4 heads / 2 KV heads
of 64, tied embeddings, the shipped 2,048-token tokenizer: 4.07M parameters), written as a Hugging Face
folder (OUT/) from the exponential moving average of the weights.

Data, per step: with share ``--catalog64`` one row of 32 requests for the shipped 64-tool catalog
(make_split's train split, with train.py's wording), else four rows of 16 requests, each on a catalog
from catalog_gen (2 to n tools, n growing from 4 to ``--max-tools``; first words of one token, then
ever more words of several). The prompt is catalog_rows.TEMPLATE with ``{name}: {description}`` lines.

With share ``--subcatalog`` a step is instead ``--sub-rows`` rows on real-language sub-catalogs of the 64
tools (subcatalogs.py: 2 to ``--sub-max-tools`` tools, renamed with share ``--rename``, a request whose
tools were left out answers none).

``--init DIR`` starts from a Hugging Face folder of this architecture (its shape replaces the shape flags),
for example the shipped model; ``--init-trained`` first trains the shipped model's recipe from nothing
(``toolcall.models.recipe.train``, the same seed and threads) into OUT.init and starts from that.

Losses: the answer tokens (a tool's first token weighs double); and training-only ones, without which
the match was not learnt (docs/history/catalog-pilot-2026-12-06): probes that name a catalog token's
line (``--line-layer``) and a request token's tool (``--request-layer``), and attention targets for
head 0 of three layers: a request word to the same word in its tool's line (``--same-word-layer``),
the answer's first position to the request words that name its tool (``--evidence-layer``), each
answer position to the name token it copies (``--copy-layer``).

Deterministic from the seed and the thread count on one kind of CPU and torch build; another process
on the same cores slows it several times over (the threads spin-wait), so give it the machine.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import random
import subprocess
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from toolcall.builder.catalog import load_catalog
from toolcall.models.recipe.catalog_gen import TOKENIZER, CatalogGenerator
from toolcall.models.recipe.catalog_rows import RowEncoder, collate
from toolcall.models.recipe.data import Wording, make_split
from toolcall.models.recipe.handwritten import without_evaluation_requests
from toolcall.models.recipe.masked_qwen3 import HF_NAMES, Qwen3, to_hf
from toolcall.models.recipe.subcatalogs import SubcatalogSampler
from toolcall.models.recipe.train import TRAIN_COUNTS, write_folder

CATALOG = Path(__file__).parents[2] / "builder" / "data" / "tools-64.json"
TRAIN_WORDING = dict(no_tool=0.15, pooled=0.8, typos=0.05, entity=0.25, swap=0.2, trailers=0.1, statements=0.25,
                     more=True, names=0.2, listed=0.1, lists=0.3, extra=True, vary=0.2)


def catalog64_requests(seed: int, size: int, split: str = "train"):
    """(tools, [(request, names, clause spans)]) for the shipped 64-tool catalog."""
    catalog = load_catalog(CATALOG)
    tools = [(t.name, t.description) for t in catalog.tools]
    if split == "train":
        examples = make_split("train", seed, size=size, noise=0.05, lexicon=0.5, counts=TRAIN_COUNTS,
                              paraphrases=True, wording=Wording(**TRAIN_WORDING))
        examples = without_evaluation_requests(examples)
    else:
        examples = make_split(split, seed, size=size, wording=Wording(no_tool=0.15, pooled=0.8, typos=0.05,
                                                                      phrasings=False))
    out = []
    for e in examples:
        spans = [(a, b, n) for (a, b), n in zip(e.clause_spans(), e.tools)]
        out.append((e.request, list(e.tools), spans))
    return tools, out


def largest_catalog(step: int, args) -> int:
    if step < args.easy_steps:
        return 4
    t = min(1.0, (step - args.easy_steps) / max(1, args.ramp_steps))
    return int(round(4 + t * (args.max_tools - 4)))


def single_word_share(step: int, args) -> float:
    t = min(1.0, max(0.0, (step - args.easy_steps) / max(1, args.ramp_steps)))
    return 1.0 - t * 0.7


def lr_at(step: int, args) -> float:
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    t = min(1.0, (step - args.warmup) / max(1, args.steps - args.warmup))
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def load_init(path: Path) -> Qwen3:
    """The training model holding the weights of the Hugging Face folder ``path`` (float32)."""
    from safetensors.torch import load_file
    if not (path / "config.json").is_file() or not (path / "model.safetensors").is_file():
        raise SystemExit(f"--init {path}: expected a Hugging Face folder with config.json and model.safetensors "
                         "(e.g. models/toolcall-qwen3-tiny); found none there")
    c = json.loads((path / "config.json").read_text())
    model = Qwen3({k: c[name] for k, name in HF_NAMES.items()})
    weights = {k: v.float() for k, v in load_file(str(path / "model.safetensors")).items()}
    missing, unexpected = model.load_state_dict(weights, strict=False)
    if missing or unexpected:
        raise SystemExit(f"--init {path}: not this Qwen3 architecture (missing {sorted(missing)[:3]}, unexpected "
                         f"{sorted(unexpected)[:3]}); give a folder train.py or train_catalog.py wrote")
    return model


def trained_init(out: Path, seed: int, threads: int) -> Path:
    """OUT.init: the shipped model's recipe trained from nothing (kept, so a rerun starts from it)."""
    base = Path(f"{out}.init")
    if not (base / "model.safetensors").exists():
        subprocess.run([sys.executable, "-m", "toolcall.models.recipe.train", "--out", str(base),
                        "--seed", str(seed), "--threads", str(threads)], check=True)
    if (base / "tokenizer.json").read_bytes() != TOKENIZER.read_bytes():
        raise SystemExit(f"{base}: its tokenizer differs from {TOKENIZER}, which the catalog rows encode with; "
                         "the recipe no longer gives the shipped tokenizer")
    return base


def eval_rows(enc: RowEncoder, seed: int):
    gen = CatalogGenerator(seed, single_p=0.3)
    out = {}
    for n in (3, 8, 16, 32, 40):
        rows = []
        for _ in range(3):
            tools = gen.catalog(n)
            rows.append(enc.row(tools, [(t, a, None) for t, a in gen.requests(tools, 24)]))
        out[f"n={n}"] = rows
    tools, reqs = catalog64_requests(seed, 96, split="val")
    out["64-val"] = [enc.row(tools, reqs[i:i + 24]) for i in range(0, 96, 24)]
    _, pool = catalog64_requests(seed, 2000, split="val")
    sub = SubcatalogSampler(tools, pool, seed, rename_p=0.5)
    out["64-sub"] = [enc.row(*sub.row(k, 24)) for k in (4, 8, 16, 24, 32, 40)]
    return out


@torch.no_grad()
def evaluate(model, sets) -> dict:
    """Per set, teacher-forced: first-token accuracy of tool requests, none rate, exact answers."""
    model.eval()
    res = {}
    for name, rows in sets.items():
        s = dict(first=0, tools=0, none=0, nones=0, exact=0, total=0)
        for i in range(0, len(rows), 2):
            b = collate(rows[i:i + 2])
            h = model.hidden(b["ids"], b["pos"], b["mask"])
            pred = model.logits_at(h[b["rows"], b["cols"]]).argmax(-1)
            per = {}
            for ok, p, (row, j, kind, first) in zip((pred == b["targets"]).tolist(), pred.tolist(), b["meta"]):
                d = per.setdefault((row, j), [True, kind, None])
                d[0] &= ok
                if first:
                    d[2] = ok
            for all_ok, kind, first_ok in per.values():
                s["total"] += 1
                s["exact"] += all_ok
                s["nones" if kind == 0 else "tools"] += 1
                s["none" if kind == 0 else "first"] += first_ok
        res[name] = (s["first"] / max(1, s["tools"]), s["none"] / max(1, s["nones"]), s["exact"] / max(1, s["total"]))
    model.train()
    return res


def step_loss(model, b, args):
    h, mids = model.hidden(b["ids"], b["pos"], b["mask"], keep=True)
    w = b["weights"]
    logits = model.logits_at(h[b["rows"], b["cols"]])
    answer = (F.cross_entropy(logits, b["targets"], reduction="none") * w).sum() / w.sum()
    extra = []
    for labels, layer in ((b["line_labels"], args.line_layer), (b["request_labels"], args.request_layer)):
        sel = labels >= 0
        if sel.any():
            extra.append(args.probe * F.cross_entropy(model.logits_at(model.model.norm(mids[layer][sel])), labels[sel]))
    for key, layer in (("same_word", args.same_word_layer), ("evidence", args.evidence_layer),
                       ("copy", args.copy_layer)):
        rows, queries, keys, groups, n = b["supervised"][key]
        if n:
            mass = torch.zeros(n).index_add(0, groups, model.model.layers[layer].self_attn.probs[rows, queries, keys])
            extra.append(-args.attention * torch.log(mass + 1e-6).mean())
    return answer, extra


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, help="folder for the Hugging Face checkpoint (and OUT.log, OUT.state.pt)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--steps", type=int, default=2400)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=150)
    ap.add_argument("--easy-steps", type=int, default=300, help="steps on catalogs of 2-4 tools")
    ap.add_argument("--ramp-steps", type=int, default=1200, help="then steps to grow catalogs to --max-tools")
    ap.add_argument("--max-tools", type=int, default=32)
    ap.add_argument("--catalog64", type=float, default=0.2, help="share of steps on the shipped 64-tool catalog")
    ap.add_argument("--rows64", type=int, default=1, help="rows of a 64-tool step")
    ap.add_argument("--requests64", type=int, default=32, help="requests per 64-tool row")
    ap.add_argument("--subcatalog", type=float, default=0.0, help="share of steps on sub-catalogs of the 64 tools")
    ap.add_argument("--sub-rows", type=int, default=2, help="rows of a sub-catalog step")
    ap.add_argument("--sub-requests", type=int, default=24, help="requests per sub-catalog row")
    ap.add_argument("--sub-max-tools", type=int, default=40)
    ap.add_argument("--rename", type=float, default=0.3, help="share of sub-catalogs whose tools are renamed")
    ap.add_argument("--init", type=Path, default=None,
                    help="start from this Hugging Face folder (e.g. the shipped model)")
    ap.add_argument("--init-trained", action="store_true",
                    help="train the shipped model's recipe first (OUT.init) and start from it")
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--mlp", type=int, default=512)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--ema", type=float, default=0.995)
    ap.add_argument("--probe", type=float, default=0.3, help="weight of each probe loss")
    ap.add_argument("--attention", type=float, default=0.5, help="weight of each attention-target loss")
    ap.add_argument("--line-layer", type=int, default=1)
    ap.add_argument("--request-layer", type=int, default=3)
    ap.add_argument("--same-word-layer", type=int, default=2)
    ap.add_argument("--evidence-layer", type=int, default=4)
    ap.add_argument("--copy-layer", type=int, default=5)
    ap.add_argument("--eval-every", type=int, default=500)
    ap.add_argument("--stop-step", type=int, default=None,
                    help="stop after this step (the LR schedule still spans --steps)")
    ap.add_argument("--max-seconds", type=float, default=None,
                    help="stop (evaluate and write OUT) once training has run this long; the log names the step, "
                         "and --stop-step at it repeats the run")
    args = ap.parse_args()

    if args.init_trained:
        args.init = trained_init(Path(args.out), args.seed, args.threads)
    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    out = Path(args.out)
    log = open(f"{out}.log", "a")

    def say(line: str) -> None:
        print(line, flush=True)
        log.write(line + "\n")
        log.flush()

    say(json.dumps(vars(args), default=str))
    shape = dict(vocab=2048, hidden=args.hidden, mlp=args.mlp, layers=args.layers, heads=args.heads, kv=args.kv_heads)
    model = Qwen3(shape) if args.init is None else load_init(args.init)
    shape = model.c
    ema = copy.deepcopy(model)
    for layer in (args.same_word_layer, args.evidence_layer, args.copy_layer):
        model.model.layers[layer].self_attn.capture = True
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embed" not in n]
    other = [p for n, p in model.named_parameters() if p.ndim < 2 or "embed" in n]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": other, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.98), eps=1e-8)
    enc = RowEncoder()
    sets = eval_rows(enc, 12345)
    tools64, train64 = catalog64_requests(args.seed, 120_000)
    gen = CatalogGenerator(args.seed)
    sub = SubcatalogSampler(tools64, train64, args.seed + 2, rename_p=args.rename)
    pick = random.Random(args.seed + 1)
    at64 = 0
    say(f"{sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters, shape {shape}; "
        f"{len(train64)} 64-tool requests")
    t0, avg = time.time(), None
    last = args.steps if args.stop_step is None else min(args.steps, args.stop_step)
    for step in range(last + 1):
        out_of_time = args.max_seconds is not None and time.time() - t0 > args.max_seconds
        if step % args.eval_every == 0 or step == last or out_of_time:
            res = evaluate(ema if step else model, sets)
            say(f"EVAL step {step} t {time.time() - t0:.0f}s " + " | ".join(
                f"{k}: first {a:.2f} none {b:.2f} exact {c:.2f}" for k, (a, b, c) in res.items()))
        if step == last or out_of_time:
            if out_of_time:
                say(f"--max-seconds: stopped at step {step}; --stop-step {step} repeats this run")
            last = step
            break
        draw = pick.random()
        if draw < args.subcatalog:
            rows = [enc.row(*sub.row(pick.randint(2, args.sub_max_tools), args.sub_requests))
                    for _ in range(args.sub_rows)]
        elif draw < args.subcatalog + args.catalog64:
            rows = []
            for _ in range(args.rows64):
                rows.append(enc.row(tools64, [train64[(at64 + i) % len(train64)] for i in range(args.requests64)]))
                at64 += args.requests64
        else:
            gen.single_p = single_word_share(step, args)
            rows = []
            for _ in range(4):
                tools = gen.catalog(pick.randint(2, largest_catalog(step, args)))
                rows.append(enc.row(tools, [(t, a, None) for t, a in gen.requests(tools, 16)]))
        for group in opt.param_groups:
            group["lr"] = lr_at(step, args)
        answer, extra = step_loss(model, collate(rows), args)
        opt.zero_grad(set_to_none=True)
        (answer + sum(extra)).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        with torch.no_grad():
            d = args.ema if step > 200 else 0.0
            for pe, pm in zip(ema.parameters(), model.parameters()):
                pe.mul_(d).add_(pm.detach(), alpha=1 - d)
        avg = answer.item() if avg is None else 0.98 * avg + 0.02 * answer.item()
        if step % 25 == 0:
            say(f"step {step} loss {answer.item():.3f} avg {avg:.3f} extra {[round(x.item(), 2) for x in extra]} "
                f"T {max(len(r.ids) for r in rows)} lr {lr_at(step, args):.2e} t {time.time() - t0:.0f}s")
    torch.save({"model": model.state_dict(), "ema": ema.state_dict(), "shape": shape, "step": last},
               f"{out}.state.pt")
    write_folder(to_hf(ema.float()), enc.tokenizer, out, torch)
    say(f"done in {time.time() - t0:.0f}s: {out}")


if __name__ == "__main__":
    main()
