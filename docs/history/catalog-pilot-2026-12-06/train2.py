"""Pilot 44: trains a small Qwen3 from nothing on generated catalogs with the catalog in the prompt ({tools}).

    nice -n 10 python3 train.py --out run1 [--steps N] [--seed 1] ...

Rows are packed: one catalog prefix and --reqs requests per row, each request attending to the prefix and
itself only (positions restart after the prefix). Answers are the runtime's: the tools' token paths (the
name encoded alone) joined by SEP ("\\n") and closed by END; END alone = no tool.
"""
from __future__ import annotations

import argparse
import copy
import json
import math
import random
import shutil
import sys
import time
from pathlib import Path

import torch

torch.set_num_threads(1)
sys.path.insert(0, str(Path(__file__).parent))
from tokenizers import Tokenizer  # noqa: E402

from gen import Gen, words  # noqa: E402
import re  # noqa: E402
from model import Qwen3, to_hf  # noqa: E402
from toolcall.runtime.batching.prompt import PromptEncoder  # noqa: E402
from toolcall.runtime.grammar.tool_text import Tool, render_template  # noqa: E402

SHIPPED = "/work/main/models/toolcall-qwen3-tiny"
TEMPLATE = ("<|im_start|>system\nTools:\n{tools}<|im_end|>\n<|im_start|>user\n{request}<|im_end|>\n"
            "<|im_start|>assistant\n")
TOOL_FORMAT = "{name}: {description}"
END, PAD = 2, 0


class Encoder:
    def __init__(self):
        self.tok = Tokenizer.from_file(f"{SHIPPED}/tokenizer.json")
        self.base = PromptEncoder.create(self.tok, TEMPLATE.replace("{tools}", "x"))
        self.sep = self.tok.encode("\n", add_special_tokens=False).ids
        assert len(self.sep) == 1
        self.sep = self.sep[0]

    def catalog(self, tools):
        """(prefix ids, suffix ids, {name: path})"""
        rendered = render_template(TEMPLATE, tuple(Tool(n, d) for n, d in tools), TOOL_FORMAT)
        enc = self.base.with_template(rendered)
        paths = {n: self.tok.encode(n, add_special_tokens=False).ids for n, _ in tools}
        pre = rendered.split("{request}")[0]
        e = self.tok.encode(pre, add_special_tokens=False)
        assert e.ids == list(enc.prefix_ids)
        # char span of each tool line
        spans, at = [], pre.index("Tools:\n") + len("Tools:\n")
        for n, d in tools:
            line = TOOL_FORMAT.replace("{name}", n).replace("{description}", d).rstrip()
            assert pre[at:at + len(line)] == line
            spans.append((at, at + len(line), paths[n][0]))
            at += len(line) + 1
        lab = []
        for a, b in e.offsets:
            lab.append(next((p0 for x, y, p0 in spans if x <= a < y), -1))
        return list(enc.prefix_ids), list(enc.suffix_ids), paths, lab

    def answer(self, names, paths):
        if not names:
            return [END]
        out = []
        for i, n in enumerate(names):
            out += paths[n] + [self.sep if i + 1 < len(names) else END]
        return out

    def requests(self, texts):
        return [e.ids for e in self.base.plain_tokenizer.encode_batch(texts, add_special_tokens=False)]

    def requests_off(self, texts):
        return [(e.ids, e.offsets) for e in self.base.plain_tokenizer.encode_batch(texts, add_special_tokens=False)]


def make_row(enc, tools, reqs):
    """ids, pos, per-token segment (-1 prefix), targets [(position, target, weight, request index, kind)]."""
    prefix, suffix, paths, plab = enc.catalog(tools)
    rids = enc.requests_off([r for r, _ in reqs])
    tw = [(words(n.replace("_", " ") + " " + d), paths[n][0]) for n, d in tools]
    ids, pos, seg, tg = list(prefix), list(range(len(prefix))), [-1] * len(prefix), []
    aux1 = list(plab)
    aux2 = [-1] * len(prefix)
    for j, ((text, names), (r, offs)) in enumerate(zip(reqs, rids)):
        ans = enc.answer(names, paths)
        body = r + suffix
        for a, b in offs:
            m = None
            for mm in re.finditer(r"[A-Za-z0-9]+", text):
                if mm.start() <= a < mm.end() or (a < mm.start() < b):
                    m = mm
                    break
            if m is None:
                aux2.append(-1)
                continue
            w = words(m.group())
            hit = [p0 for ws, p0 in tw if w & ws]
            aux2.append(END if not hit else hit[0] if len(set(hit)) == 1 else -1)
        aux2 += [-1] * (len(suffix) + len(ans) - 1)
        aux1 += [-1] * (len(body) + len(ans) - 1)
        start = len(ids)
        seq = body + ans[:-1]
        ids += seq
        pos += range(len(prefix), len(prefix) + len(seq))
        seg += [j] * len(seq)
        first = True
        for k, t in enumerate(ans):
            w = 2.0 if first else 1.0
            tg.append((start + len(body) - 1 + k, t, w, j, len(names), first and k == 0))
            first = t == enc.sep
    assert len(aux1) == len(ids) == len(aux2)
    return ids, pos, seg, tg, aux1, aux2


def collate(rows):
    T = max(len(r[0]) for r in rows)
    B = len(rows)
    ids = torch.full((B, T), PAD, dtype=torch.long)
    pos = torch.zeros((B, T), dtype=torch.long)
    mask = torch.zeros((B, T, T), dtype=torch.bool)
    rb, rc, tt, ww, meta = [], [], [], [], []
    a1 = torch.full((B, T), -1, dtype=torch.long)
    a2 = torch.full((B, T), -1, dtype=torch.long)
    for b, (i, p, s, tg, x1, x2) in enumerate(rows):
        a1[b, :len(x1)] = torch.tensor(x1)
        a2[b, :len(x2)] = torch.tensor(x2)
        n = len(i)
        ids[b, :n] = torch.tensor(i)
        pos[b, :n] = torch.tensor(p)
        st = torch.tensor(s)
        causal = torch.ones(n, n, dtype=torch.bool).tril()
        same = (st[:, None] == st[None, :]) | (st[None, :] == -1)
        mask[b, :n, :n] = causal & same
        mask[b, n:, :1] = True  # pad rows look at token 0 (no NaN)
        for (c, t, w, j, kind, is_first) in tg:
            rb.append(b); rc.append(c); tt.append(t); ww.append(w); meta.append((b, j, kind, is_first))
    return ids, pos, mask[:, None], torch.tensor(rb), torch.tensor(rc), torch.tensor(tt), torch.tensor(ww), meta, a1, a2


def n_max_at(step, args):
    if step < args.easy_steps:
        return 4
    t = min(1.0, (step - args.easy_steps) / max(1, args.ramp_steps))
    return int(round(4 + t * (args.max_tools - 4)))


def lr_at(step, args):
    if step < args.warmup:
        return args.lr * (step + 1) / args.warmup
    t = min(1.0, (step - args.warmup) / max(1, args.steps - args.warmup))
    return args.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * t)))


def eval_set(enc, seed=12345, sizes=(3, 8, 16, 32), cats=4, reqs=24):
    g = Gen(seed)
    out = {}
    for n in sizes:
        rows = []
        for _ in range(cats):
            tools = g.catalog(n)
            rows.append(make_row(enc, tools, g.requests(tools, reqs)))
        out[n] = rows
    g = Gen(seed + 1, single_p=1.0, name_p=0.1)
    for n in (3, 8):
        rows = []
        for _ in range(cats):
            tools = g.catalog(n)
            rows.append(make_row(enc, tools, g.requests(tools, reqs)))
        out[f"single{n}"] = rows
    return out


@torch.no_grad()
def evaluate(model, ev):
    model.eval()
    res = {}
    for n, rows in ev.items():
        stats = dict(first_ok=0, first_n=0, none_ok=0, none_n=0, false_none=0, exact=0, total=0)
        for i in range(0, len(rows), 2):
            ids, pos, mask, rb, rc, tt, ww, meta, _, _ = collate(rows[i:i + 2])
            h = model.hidden(ids, pos, mask)
            pred = model.logits_at(h[rb, rc]).argmax(-1)
            ok = (pred == tt)
            per = {}
            for o, p, t, (b, j, kind, is_first) in zip(ok.tolist(), pred.tolist(), tt.tolist(), meta):
                d = per.setdefault((b, j), [True, kind, None])
                d[0] &= o
                if is_first:
                    d[2] = (o, p)
            for allok, kind, (o, p) in per.values():
                stats["total"] += 1
                stats["exact"] += allok
                if kind == 0:
                    stats["none_n"] += 1; stats["none_ok"] += o
                else:
                    stats["first_n"] += 1; stats["first_ok"] += o; stats["false_none"] += (p == END)
        res[n] = {"first_acc": stats["first_ok"] / max(1, stats["first_n"]),
                  "none_rate": stats["none_ok"] / max(1, stats["none_n"]),
                  "false_none": stats["false_none"] / max(1, stats["first_n"]),
                  "exact": stats["exact"] / max(1, stats["total"])}
    model.train()
    return res


def export(model, out: Path):
    from toolcall.models.recipe.train import write_folder
    hf = to_hf(copy.deepcopy(model).float())
    write_folder(hf, Tokenizer.from_file(f"{SHIPPED}/tokenizer.json"), out, torch)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--steps", type=int, default=3000)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--warmup", type=int, default=150)
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--reqs", type=int, default=16)
    ap.add_argument("--easy-steps", type=int, default=400)
    ap.add_argument("--ramp-steps", type=int, default=1200)
    ap.add_argument("--max-tools", type=int, default=24)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--mlp", type=int, default=512)
    ap.add_argument("--layers", type=int, default=6)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv", type=int, default=2)
    ap.add_argument("--ema", type=float, default=0.995)
    ap.add_argument("--eval-every", type=int, default=200)
    ap.add_argument("--max-minutes", type=float, default=1e9)
    ap.add_argument("--bench", action="store_true")
    ap.add_argument("--aux", type=float, default=0.3)
    ap.add_argument("--init", default=None, help="state.pt to start from (its model weights)")
    ap.add_argument("--single-hold", type=int, default=0, help="steps with one-token words only")
    ap.add_argument("--single-steps", type=int, default=0, help="then steps to ramp down to --single-end (0: off)")
    ap.add_argument("--single-end", type=float, default=0.3)
    ap.add_argument("--aux1-layer", type=int, default=1)
    ap.add_argument("--aux2-layer", type=int, default=3)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "args.json").write_text(json.dumps(vars(args), indent=1))
    torch.manual_seed(args.seed)
    random.seed(args.seed)
    c = dict(vocab=2048, hidden=args.hidden, mlp=args.mlp, layers=args.layers, heads=args.heads, kv=args.kv)
    model = Qwen3(c)
    print("params", sum(p.numel() for p in model.parameters()), flush=True)
    ema = copy.deepcopy(model) if args.ema else None
    decay, no_decay = [], []
    for n, p in model.named_parameters():
        (no_decay if p.ndim < 2 or "embed" in n else decay).append(p)
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.05}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.98), eps=1e-8)
    enc = Encoder()
    ev = eval_set(enc)
    g = Gen(args.seed)
    if args.init:
        st = torch.load(args.init)
        model.load_state_dict(st["model"])
        if ema is not None:
            ema.load_state_dict(st["model"])
        print("init from", args.init, "step", st["step"], flush=True)
    t0 = time.time()
    log = open(out / "log.txt", "a")
    ema_loss, toks = None, 0
    for step in range(args.steps + 1):
        if step % args.eval_every == 0 or step == args.steps:
            r = evaluate(model, ev)
            line = f"EVAL step {step} t {time.time() - t0:.0f}s " + " | ".join(
                f"n={n}: first {v['first_acc']:.2f} none {v['none_rate']:.2f} fnone {v['false_none']:.2f} "
                f"exact {v['exact']:.2f}" for n, v in r.items())
            if ema is not None and step > 0:
                re_ = evaluate(ema, ev)
                line += " || EMA " + " | ".join(f"n={n}: first {v['first_acc']:.2f} none {v['none_rate']:.2f} "
                                                f"exact {v['exact']:.2f}" for n, v in re_.items())
            print(line, flush=True); log.write(line + "\n"); log.flush()
            if step > 0:
                torch.save({"model": model.state_dict(), "ema": ema.state_dict() if ema else None, "c": c,
                            "step": step}, out / "state.pt")
        if step == args.steps or (time.time() - t0) / 60 > args.max_minutes:
            break
        nmax = n_max_at(step, args)
        if args.single_steps:
            u = min(1.0, max(0.0, (step - args.single_hold) / args.single_steps))
            g.single_p = 1.0 - u * (1.0 - args.single_end)
            g.name_p = 0.1 + u * 0.3
        rows = []
        for _ in range(args.rows):
            tools = g.catalog(random.randint(2, nmax))
            rows.append(make_row(enc, tools, g.requests(tools, args.reqs)))
        ids, pos, mask, rb, rc, tt, ww, meta, a1, a2 = collate(rows)
        toks += ids.numel()
        for gr in opt.param_groups:
            gr["lr"] = lr_at(step, args)
        h, mids = model.hidden(ids, pos, mask, keep=True)
        logits = model.logits_at(h[rb, rc])
        loss = (torch.nn.functional.cross_entropy(logits, tt, reduction="none") * ww).sum() / ww.sum()
        aux = []
        for lab, layer in ((a1, args.aux1_layer), (a2, args.aux2_layer)):
            sel = lab >= 0
            if args.aux > 0 and sel.any():
                z = model.logits_at(model.model.norm(mids[layer][sel]))
                aux.append(torch.nn.functional.cross_entropy(z, lab[sel]))
        main_loss = loss
        if aux:
            loss = loss + args.aux * sum(aux)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if ema is not None:
            with torch.no_grad():
                d = args.ema if step > 200 else 0.0
                for pe, pm in zip(ema.parameters(), model.parameters()):
                    pe.mul_(d).add_(pm.detach(), alpha=1 - d)
        ema_loss = main_loss.item() if ema_loss is None else 0.98 * ema_loss + 0.02 * main_loss.item()
        if step % 25 == 0:
            el = time.time() - t0
            line = f"sp {g.single_p:.2f} step {step} loss {main_loss.item():.3f} aux {[round(a.item(), 2) for a in aux]} avg {ema_loss:.3f} nmax {nmax} T {ids.shape[1]} " \
                   f"lr {lr_at(step, args):.2e} t {el:.0f}s {toks / max(el, 1e-6):.0f} tok/s"
            print(line, flush=True); log.write(line + "\n"); log.flush()
        if args.bench and step == 30:
            break
    export(model, out / "ckpt")
    if ema is not None:
        export(ema, out / "ckpt_ema")
    print("done", time.time() - t0, flush=True)


if __name__ == "__main__":
    main()
