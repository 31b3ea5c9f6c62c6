"""How far canary logits move between builds, the yardstick for builder/canary.py's LOGIT_TOLERANCE.

    python bench/canary_spread.py CHECKPOINT_DIR [CHECKPOINT_DIR ...] [--json OUT]

For each checkpoint: builds CPU bundles in bf16, fp8_e4m3 and nvfp4 (temporary folders), then
runs the bf16 bundle's canary prompts on each and reports the largest |logit - recorded| over the
recorded candidates (a weight change the size of one quantization step), and the same for the
bf16 bundle through the dense head (a float32 path that only sums in another order). One line per
comparison; the JSON adds the machine.
"""
from __future__ import annotations

import argparse
import json
import platform
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
import checkout  # noqa: E402  (bench/checkout.py: this checkout as `toolcall`)
checkout.use()

CATALOG = ROOT / "builder" / "data" / "tools-64.json"


def largest_shift(engine, canary, head: str = "sparse") -> tuple[float, int, int]:
    """(max |dlogit| over recorded candidates, candidates compared, prompts with the same tokens)."""
    from toolcall.runtime.batching.batcher import Request
    engine.generator.head = head
    worst, n, same = 0.0, 0, 0
    for p in canary.prompts:
        (r,) = engine.generator.generate([Request(p.prompt_token_ids, keep_logits=True)])
        same += r.token_ids == list(p.expected_token_ids)
        for step, logits, cand in zip(p.steps, r.step_logits, r.step_candidates):
            got = dict(zip(cand.tolist(), logits.tolist()))
            for token, value in zip(step.token_ids, step.logits):
                if token in got:
                    worst, n = max(worst, abs(got[token] - value)), n + 1
    return worst, n, same


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("checkpoints", nargs="+")
    ap.add_argument("--json", dest="json_out")
    args = ap.parse_args()
    from toolcall.builder.canary import LOGIT_TOLERANCE
    from toolcall.builder.compile import compile_bundle
    from toolcall.runtime.bundle.contract import BuildOptions
    from toolcall.runtime.engine import Engine

    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for ckpt in args.checkpoints:
            engines = {}
            for precision in ("bf16", "fp8_e4m3", "nvfp4"):
                options = BuildOptions(precision=precision, target="cpu", max_sequences=4, max_input_tokens=128,
                                       max_output_tokens=None, page_size=32, max_tokens_per_step=128,
                                       prefill_chunk=64, memory_budget_bytes=None, context_reserve_bytes=None, seed=0)
                out = Path(tmp) / f"{Path(ckpt).name}-{precision}"
                compile_bundle(ckpt, CATALOG, options, out)
                engines[precision] = Engine.load(out)
            record = engines["bf16"].contract.canary
            for name, engine, head in (("bf16 dense head", engines["bf16"], "dense"),
                                       ("fp8_e4m3", engines["fp8_e4m3"], "sparse"),
                                       ("nvfp4", engines["nvfp4"], "sparse")):
                worst, n, same = largest_shift(engine, record, head)
                rows.append({"checkpoint": str(ckpt), "against_bf16_record": name, "max_abs_dlogit": worst,
                             "candidates": n, "same_tokens": same, "prompts": len(record.prompts)})
                print(f"{ckpt}: {name} vs the bf16 record: max |dlogit| {worst:.3g} over {n} candidates, same "
                      f"tokens {same}/{len(record.prompts)} (tolerance {LOGIT_TOLERANCE})")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps({"machine": platform.uname()._asdict(), "rows": rows,
                                                   "tolerance": LOGIT_TOLERANCE}, indent=2) + "\n")


if __name__ == "__main__":
    main()
