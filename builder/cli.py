"""`builder`: make synthetic checkpoints, compile bundles, inspect and verify them, plan tiers."""
from __future__ import annotations

import json
import sys
import time

import click

from runtime.errors import EngineError


def fail(err: EngineError, as_json: bool) -> None:
    """Prints a typed error (JSON on stdout with --json, else a message on stderr) and exits with its code."""
    if as_json:
        click.echo(json.dumps(err.to_json(), indent=2))
    else:
        click.echo(f"error: {err}", err=True)
    sys.exit(err.exit_code)


def progress_printer(label: str):
    """A progress(name, done, total) callback drawing a bar on a terminal, silent elsewhere."""
    if not sys.stderr.isatty():
        return None

    def show(name: str, done: int, total: int) -> None:
        width = 30
        filled = width * done // max(total, 1)
        sys.stderr.write(f"\r{label} [{'#' * filled}{'.' * (width - filled)}] {done}/{total} {name[:40]:<40}")
        if done == total:
            sys.stderr.write("\n")
        sys.stderr.flush()

    return show


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Compile Hugging Face checkpoints and a tool catalog into contract-bound bundles."""


@main.command()
@click.option("--shape", type=click.Choice(["tiny", "qwen3-0.6b"]), default="tiny", show_default=True,
              help="tiny: seconds, for tests; qwen3-0.6b: the real Qwen3-0.6B shape (~1.2 GB bf16).")
@click.option("--family", type=click.Choice(["qwen3", "qwen2", "llama"]), default="qwen3", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="Same seed, same bytes.")
@click.option("--shards", type=int, default=1, show_default=True, help="Split the safetensors into N files with an index.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True, help="Checkpoint folder to write.")
@click.option("--json", "as_json", is_flag=True, help="Print the model config as JSON.")
def synth(shape, family, seed, shards, out_dir, as_json):
    """Write a synthetic Hugging Face checkpoint (config, safetensors, trained BPE tokenizer)."""
    from .synth import SynthOptions, synth_checkpoint

    start = time.perf_counter()
    cfg = synth_checkpoint(out_dir, SynthOptions(shape=shape, family=family, seed=seed, shards=shards),
                           progress=progress_printer("synth"))
    if as_json:
        click.echo(json.dumps({"out": out_dir, "model": cfg.to_dict(), "seconds": time.perf_counter() - start}, indent=2))
    else:
        click.echo(f"wrote {out_dir}: {family} {shape}, {cfg.param_count() / 1e6:.1f}M parameters, "
                   f"{time.perf_counter() - start:.1f} s")


PRECISIONS = {"fp8": "fp8_e4m3", "fp8_e4m3": "fp8_e4m3", "nvfp4": "nvfp4", "bf16": "bf16"}


@main.command(name="compile")
@click.argument("checkpoint", type=click.Path())
@click.option("--catalog", type=click.Path(), required=True, help="Tool catalog JSON (schemas/catalog.schema.json).")
@click.option("--precision", type=click.Choice(sorted(PRECISIONS)), default="fp8", show_default=True,
              help="Weights of the decoder's linear layers; embeddings, norms and head stay bf16.")
@click.option("--target", default="cpu", show_default=True,
              help="cpu (numpy reference), a GPU (h100, h200, b200, rtx5090) or an architecture (sm_90).")
@click.option("--max-sequences", type=int, default=8, show_default=True, help="Concurrent sequences.")
@click.option("--max-input-tokens", type=int, default=512, show_default=True, help="Prompt tokens per sequence.")
@click.option("--max-output-tokens", type=int, default=None,
              help="Answer tokens per sequence, END included  [default: the catalog's longest answer]")
@click.option("--page-size", type=int, default=32, show_default=True, help="Tokens per KV-cache page.")
@click.option("--max-tokens-per-step", type=int, default=256, show_default=True,
              help="Rows in one forward step (decode rows plus prefill chunks).")
@click.option("--prefill-chunk", type=int, default=128, show_default=True,
              help="Most prompt tokens of one sequence per step.")
@click.option("--memory-budget", default=None, help="Size the KV pool to fit this much memory (e.g. 6GiB); "
              "refuses when not even one full-length sequence fits.")
@click.option("--context-reserve", default=None, help="CUDA context reserve (e.g. 512MiB)  [default: per target]")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Bundle folder  [default: artifacts/<checkpoint>-<precision>-<target>]")
@click.option("--force", is_flag=True, help="Replace an existing bundle at --out.")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON (for programs).")
def compile_cmd(checkpoint, catalog, precision, target, max_sequences, max_input_tokens, max_output_tokens,
                page_size, max_tokens_per_step, prefill_chunk, memory_budget, context_reserve, out_dir, force,
                as_json):
    """Compile CHECKPOINT (a Hugging Face folder) and a tool catalog into a bundle with its contract.json."""
    from pathlib import Path

    from runtime.contract import BuildOptions

    from .compile import compile_bundle
    from .memory_plan import parse_size

    try:
        options = BuildOptions(
            precision=PRECISIONS[precision], target=target.lower(), max_sequences=max_sequences,
            max_input_tokens=max_input_tokens, max_output_tokens=max_output_tokens, page_size=page_size,
            max_tokens_per_step=max_tokens_per_step, prefill_chunk=prefill_chunk,
            memory_budget_bytes=parse_size(memory_budget) if memory_budget else None,
            context_reserve_bytes=parse_size(context_reserve) if context_reserve else None, seed=0)
        out = Path(out_dir) if out_dir else Path("artifacts") / f"{Path(checkpoint).name}-{precision}-{target}"
        result = compile_bundle(checkpoint, catalog, options, out, force=force,
                                progress=None if as_json else progress_printer("quantize"))
    except EngineError as e:
        fail(e, as_json)
    c = result.contract
    total_s = sum(result.timings.values())
    if as_json:
        click.echo(json.dumps({"bundle": str(result.out_dir), "bundle_id": c.engine.bundle_id,
                               "target": c.target.name, "precision": c.precision.weights,
                               "limits": c.to_dict()["limits"], "memory": c.to_dict()["memory"],
                               "canary_min_margin": c.canary.min_margin, "timings_s": result.timings,
                               "source_gb_per_s": result.source_bytes / 1e9 / max(result.timings["quantize"], 1e-9)},
                              indent=2))
        return
    mib = 2 ** 20
    rows = [("bundle", str(result.out_dir)), ("bundle id", c.engine.bundle_id[:16]),
            ("target", f"{c.target.name} ({c.target.sm_arch or 'numpy'})"), ("precision", c.precision.weights),
            ("limits", f"{c.limits.max_sequences} seqs, {c.limits.max_input_tokens}+{c.limits.max_output_tokens} tokens, "
                       f"{c.limits.num_pages} pages x {c.limits.page_size}"),
            ("weights", f"{c.memory.weights_bytes / mib:,.1f} MiB"), ("kv pool", f"{c.memory.kv_pool_bytes / mib:,.1f} MiB"),
            ("workspace", f"{c.memory.workspace_bytes / mib:,.1f} MiB"),
            ("graphs + context", f"{(c.memory.graphs_bytes + c.memory.context_reserve_bytes) / mib:,.1f} MiB"),
            ("total memory", f"{c.memory.total_bytes / mib:,.1f} MiB"),
            ("grammar", f"{c.grammar.num_tools} tools, {c.grammar.nodes} nodes, {c.grammar.edges} edges"),
            ("canary", f"{len(c.canary.expected_token_ids)} tokens, min margin {c.canary.min_margin:.3f}"),
            ("time", f"{total_s:.1f} s (" + ", ".join(f"{k} {v:.1f}" for k, v in result.timings.items()) + ")")]
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        click.echo(f"{k:<{width}}  {v}")
