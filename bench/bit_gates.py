"""The bit-identity gates of a serving engine: a row's bits served alone against its bits in twelve company.

    python3 bench/bit_gates.py BUNDLE [--device sim] [--gates NAME,...] [--json OUT.json]

A row's bits: its answer tokens and, step by step, its candidates and the float32 bits of their logits (the
engine's keep_logits record). The row is served alone once; then each gate serves it again and compares:
  batch_2, batch_8, batch_64, batch_256   in a burst of that many requests (beyond the bundle's sequences they
                                          queue: the row shares its steps with as many as fit)
  shuffled_a, shuffled_b                  batch_64's requests in two other seeded orders
  beside_prefill                          beside a prompt of max(512, the bundle's input limit) tokens prefilled
  beside_prefix_sibling                   after and beside a request with the same prompt (shared cached pages)
  after_traffic                           after 1,000 steps of unrelated traffic
  sampled_top_p                           the row sampled (top-p) alone, then in a burst of 16
  admitted_mid_burst                      submitted while 16 others are mid-answer
  neighbours_cancelled                    in a burst of 16 whose other rows are cancelled after two steps
The same gates run on any Engine: the CPU backends in the tests, a GPU bundle in the device check (its record's
``serving.bit_gates_passed``), or a GPU bundle on the simulated device (``--device sim``; slow: every launch runs on the
executor, whose speed bench/RESULTS.md states). Every loop is bounded in steps.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import checkout  # noqa: E402  (bench/checkout.py: this checkout as `toolcall`)

checkout.use()

GATES = ("batch_2", "batch_8", "batch_64", "batch_256", "shuffled_a", "shuffled_b", "beside_prefill",
         "beside_prefix_sibling", "after_traffic", "sampled_top_p", "admitted_mid_burst", "neighbours_cancelled")
MAX_STEPS = 100_000  # no gate's loop runs longer
TRAFFIC_STEPS = 1_000
PREFILL_TOKENS = 512


def texts(n: int) -> list[str]:
    """``n`` varied tool requests (the tool model's test split, repeated as needed)."""
    from toolcall.models.recipe.data import make_split
    pool = [e.request for e in make_split("test", size=64)]
    return [pool[i % len(pool)] for i in range(n)]


def bits_differ(alone, got) -> str | None:
    """Where ``got`` (a Result) departs from ``alone`` bit for bit; None if nowhere."""
    if not hasattr(got, "token_ids"):
        return f"not answered: {got}"
    if list(got.token_ids) != list(alone.token_ids):
        return f"tokens {list(got.token_ids)} != {list(alone.token_ids)}"
    for step, (a, b, ca, cb) in enumerate(zip(alone.step_logits, got.step_logits, alone.step_candidates,
                                              got.step_candidates)):
        if not np.array_equal(ca, cb):
            return f"step {step}: candidates differ"
        if not np.array_equal(np.asarray(a, np.float32).view(np.uint32), np.asarray(b, np.float32).view(np.uint32)):
            return f"step {step}: logit bits differ (largest |change| {float(np.max(np.abs(a - b))):.3g})"
    return None


class Gates:
    """The gates over one engine's generator (runtime/batching/batcher.py StepBatcher)."""

    def __init__(self, engine):
        from toolcall.runtime.batching.batcher import Request
        self.Request, self.engine, self.gen = Request, engine, engine.generator
        self.others = [engine.encode(t) for t in texts(256)]
        self.row = self.others[0]
        self.limit = engine.contract.limits.max_input_tokens

    def request(self, prompt, **kw):
        return self.Request(tuple(prompt), **kw)

    def target(self, **kw):
        return self.request(self.row, keep_logits=True, **kw)

    def burst(self, n: int, order_seed: int | None = None, **kw):
        """The target's Result in a burst of n requests (the target in the middle, or the burst in a seeded order)."""
        reqs = [self.request(p) for p in self.others[1:n]]
        middle = len(reqs) // 2
        reqs.insert(middle, self.target(**kw))
        order = list(range(n)) if order_seed is None else np.random.default_rng(order_seed).permutation(n).tolist()
        return self.gen.generate([reqs[i] for i in order])[order.index(middle)]

    def drive(self, handles: set, until: int | None = None, on_step=None) -> dict:
        """Steps until every handle finished (or ``until`` steps); {handle: result}."""
        out, steps = {}, 0
        while self.gen.busy and steps < MAX_STEPS and (until is None or steps < until):
            for handle, res in self.gen.step():
                out[handle] = res
            steps += 1
            if on_step is not None:
                on_step(steps)
            if until is None and handles <= set(out):
                break
        return out

    def run(self, on_gate=None, gates=GATES) -> dict[str, dict]:
        """{gate: {passed, why?, seconds}} for ``gates`` in their order; ``on_gate(name, record)`` as each gate
        ends (progress on slow devices)."""
        from toolcall.runtime.batching.sampling import Sampling
        alone = self.gen.generate([self.target()])[0]
        sampling = Sampling(0.8, 0.9, 7)
        alone_sampled = self.gen.generate([self.target(sampling=sampling)])[0]
        cases = {f"batch_{n}": lambda n=n: self.burst(n) for n in (2, 8, 64, 256)}
        cases["shuffled_a"] = lambda: self.burst(64, order_seed=1)
        cases["shuffled_b"] = lambda: self.burst(64, order_seed=2)
        cases["beside_prefill"] = self.beside_prefill
        cases["beside_prefix_sibling"] = self.beside_prefix_sibling
        cases["after_traffic"] = self.after_traffic
        cases["sampled_top_p"] = lambda: self.burst(16, sampling=sampling)
        cases["admitted_mid_burst"] = self.admitted_mid_burst
        cases["neighbours_cancelled"] = self.neighbours_cancelled
        out = {}
        for name in gates:
            start = time.monotonic()
            try:
                why = bits_differ(alone_sampled if name == "sampled_top_p" else alone, cases[name]())
            except Exception as e:  # one gate's failure never hides the others
                why = f"{type(e).__name__}: {e}"
            self.gen.abort_all()
            out[name] = {"passed": why is None, **({"why": why} if why else {}),
                         "seconds": round(time.monotonic() - start, 1)}
            if on_gate is not None:
                on_gate(name, out[name])
        return out

    def beside_prefill(self):
        long = list(self.engine.encode(" ".join(texts(64))))[:min(PREFILL_TOKENS, self.limit)]
        return self.gen.generate([self.request(long), self.target()])[1]

    def beside_prefix_sibling(self):
        """A sibling with the same prompt answered first (its pages and answer rows cached at release), then the
        row beside another: its prompt pages shared, its answer rows copied where the sibling computed them."""
        self.gen.generate([self.request(self.row)])
        return self.gen.generate([self.request(self.row), self.target()])[1]

    def after_traffic(self):
        for _ in range(TRAFFIC_STEPS):
            if not self.gen.busy:
                for p in self.others[1:17]:
                    self.gen.submit(self.request(p))
            self.gen.step()
        self.gen.abort_all()
        return self.gen.generate([self.target()])[0]

    def admitted_mid_burst(self):
        handles = {self.gen.submit(self.request(p)) for p in self.others[1:17]}
        self.drive(handles, until=3)
        mine = self.gen.submit(self.target())
        return self.drive(handles | {mine})[mine]

    def neighbours_cancelled(self):
        others = [self.gen.submit(self.request(p)) for p in self.others[1:17]]
        mine = self.gen.submit(self.target())
        self.drive(set(others), until=2)
        for handle in others[::2]:
            self.gen.abort(handle)
        return self.drive({mine})[mine]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bundle")
    from toolcall.runtime.cuda.devices import DEVICES, NATIVE
    ap.add_argument("--device", choices=list(DEVICES), default=NATIVE,
                    help="sim: a GPU bundle on the simulated device (runtime --device sim)")
    ap.add_argument("--gates", default=",".join(GATES),
                    help="comma-separated gates to run, in this order [default: all twelve]")
    ap.add_argument("--json", help="also write {gate: {passed, why}} and the counts here")
    args = ap.parse_args()
    chosen = [g for g in args.gates.split(",") if g]
    unknown = sorted(set(chosen) - set(GATES))
    if unknown or not chosen:
        ap.error(f"--gates: expected names from {', '.join(GATES)}; found {', '.join(unknown) or 'none'}")
    from toolcall.runtime.engine import Engine
    engine = Engine.load(args.bundle, device=args.device)
    try:
        gates = Gates(engine).run(on_gate=lambda name, g: print(
            f"{name:24} {'pass' if g['passed'] else 'FAIL ' + g['why']} ({g['seconds']} s)", flush=True), gates=chosen)
    finally:
        engine.close()
    passed = sum(g["passed"] for g in gates.values())
    print(f"bit gates: {passed} of {len(gates)} passed")
    if args.json:
        Path(args.json).write_text(json.dumps({"gates": gates, "bit_gates_passed": passed, "bit_gates": len(gates)},
                                              indent=1))


if __name__ == "__main__":
    main()
