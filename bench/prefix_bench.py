"""Shared prompt prefix on the CPU backend: the same 256 requests with and without sharing, side by side.

    python bench/prefix_bench.py [--requests 256] [--json OUT] [--work DIR]

Builds (once, under --work) a synthetic ``tiny`` checkpoint and a CPU FP8 bundle of the 64-tool
catalog whose system prompt lists every tool (builder/data/qwen3-tools-64.json, >= 1,500 prompt
tokens with the synthetic tokenizer), then in one process:

1. ``Engine.load(prefix_cache=False)``: every prompt computed in full; ``Engine.run`` of all requests.
2. ``Engine.load(prefix_cache=True)``: the fixed prefix prefilled once at load into pinned pages.
3. Checks every answer's tokens are identical; reports mean TTFT (admission to first token, as
   Result.ttft_s measures it), requests/s (wall time of ``Engine.run``), and how many concurrent
   sequences of this prompt the bundle's KV pool (contract num_pages) admits, sharing or not.

Prints one summary line; writes JSON with the machine recorded.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import checkout  # noqa: E402  (bench/checkout.py: this checkout as `toolcall`)
checkout.use()

CATALOG = Path(__file__).resolve().parents[1] / "builder" / "data" / "qwen3-tools-64.json"
ASKS = ("Book a flight to {p}", "What's the weather in {p} tomorrow?", "Find a hotel in {p} for two nights",
        "Send an email to {n} about the trip to {p}", "Convert 100 euros to dollars before {p}",
        "Remind me to call {n} when I land in {p}", "Translate a message to {n} for {p}",
        "Find a restaurant in {p} tonight and book a table")
PLACES = ("Paris", "Oslo", "Tokyo", "Rome", "Lima", "Cairo", "Berlin", "Dublin")
NAMES = ("Alice", "Bob", "Carol", "Dave")


def requests(n: int) -> list[str]:
    """n deterministic, mostly distinct request texts."""
    out = []
    for i in range(n):
        ask = ASKS[i % len(ASKS)]
        out.append(ask.format(p=PLACES[(i // len(ASKS)) % len(PLACES)], n=NAMES[(i // 64) % len(NAMES)]))
    return out


def build(work: Path) -> Path:
    from toolcall.builder.compile import compile_bundle
    from toolcall.builder.synth import SynthOptions, synth_checkpoint
    from toolcall.runtime.bundle.contract import BuildOptions

    ckpt, bundle = work / "tiny", work / "tiny-tools64-prompt-cpu"
    if not (ckpt / "config.json").exists():
        synth_checkpoint(ckpt, SynthOptions(shape="tiny"))
    if not (bundle / "contract.json").exists():
        options = BuildOptions(precision="fp8_e4m3", target="cpu", max_sequences=16, max_input_tokens=1920,
                               max_output_tokens=None, page_size=32, max_tokens_per_step=256, prefill_chunk=256,
                               memory_budget_bytes=None, context_reserve_bytes=None, seed=0)
        compile_bundle(ckpt, CATALOG, options, bundle)
    return bundle


def pool_capacity(engine, prompt: tuple[int, ...], sharing: bool) -> int:
    """Sequences of ``prompt`` (+ max answer) a pool of the contract's num_pages admits at once (slots unbounded)."""
    from toolcall.common.errors import RequestError
    from toolcall.runtime.batching.prefix_cache import prefill_prefix
    from toolcall.runtime.cpu.kv_pool import PagedKVPool

    c = engine.contract
    lim = c.limits
    pool = PagedKVPool(c.model, lim.num_pages, lim.page_size, lim.num_pages, lim.max_input_tokens + lim.max_output_tokens)
    if sharing:
        pool.enable_prefix_cache(c.engine.bundle_id)
        prefill_prefix(engine.model, pool, engine.prompt.prefix_ids, lim.prefill_chunk)
    n = 0
    while True:
        try:
            # a fresh request text each time would differ only after the prefix: the prompt's own pages
            pool.admit(len(prompt) + lim.max_output_tokens, prompt)
        except RequestError:
            return n
        n += 1


def run_side(bundle: Path, texts: list[str], sharing: bool) -> dict:
    from toolcall.runtime.batching.batcher import Result
    from toolcall.runtime.engine import Engine

    start = time.perf_counter()
    engine = Engine.load(bundle, prefix_cache=sharing)
    load_s = time.perf_counter() - start
    start = time.perf_counter()
    results = engine.run(texts)
    wall = time.perf_counter() - start
    assert all(isinstance(r, Result) for r in results), [r for r in results if not isinstance(r, Result)][:1]
    prompt = engine.encode(texts[0])
    return {"sharing": sharing, "load_s": load_s, "wall_s": wall, "requests_per_s": len(texts) / wall,
            "mean_ttft_ms": 1e3 * statistics.fmean(r.ttft_s for r in results),
            "mean_cached_prompt_tokens": statistics.fmean(r.cached_prompt_tokens for r in results),
            "mean_prompt_tokens": statistics.fmean(len(r.prompt_token_ids) for r in results),
            "pool_sequences": pool_capacity(engine, prompt, sharing),
            "tokens": [r.token_ids for r in results]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--requests", type=int, default=256)
    ap.add_argument("--work", default="/tmp/prefix-bench")
    ap.add_argument("--json", dest="json_out", default=None)
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    bundle = build(work)
    texts = requests(args.requests)
    off = run_side(bundle, texts, sharing=False)
    on = run_side(bundle, texts, sharing=True)
    identical = off["tokens"] == on["tokens"]
    contract = json.loads((bundle / "contract.json").read_text())
    summary = {
        "requests": len(texts), "prefix_tokens": contract["prompt"]["prefix_tokens"],
        "mean_prompt_tokens": on["mean_prompt_tokens"], "num_pages": contract["limits"]["num_pages"],
        "answers_identical": identical,
        "ttft_ratio": on["mean_ttft_ms"] / off["mean_ttft_ms"],
        "throughput_ratio": on["requests_per_s"] / off["requests_per_s"],
        "pool_ratio": on["pool_sequences"] / max(off["pool_sequences"], 1),
        "with_sharing": {k: v for k, v in on.items() if k != "tokens"},
        "without_sharing": {k: v for k, v in off.items() if k != "tokens"},
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count()},
    }
    print(f"prefix {summary['prefix_tokens']} tok, {len(texts)} requests: TTFT {off['mean_ttft_ms']:.1f} -> "
          f"{on['mean_ttft_ms']:.1f} ms ({summary['ttft_ratio']:.3f}x), {off['requests_per_s']:.2f} -> "
          f"{on['requests_per_s']:.2f} req/s ({summary['throughput_ratio']:.1f}x), pool holds "
          f"{off['pool_sequences']} -> {on['pool_sequences']} sequences, answers identical: {identical}")
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(summary, indent=2) + "\n")


if __name__ == "__main__":
    main()
