"""`builder`: make synthetic checkpoints, compile bundles, inspect and verify them, plan tiers."""
from __future__ import annotations

import json
import resource
import sys
import time

import click

from runtime.cli_errors import TypedErrorGroup, fail, json_text
from common.errors import EngineError

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


EPILOG = """\b
Typical use:
  builder synth --shape qwen3-0.6b --out artifacts/q06
  builder plan artifacts/q06 --gpu-memory 12GiB --precision nvfp4 --target h200
  builder compile artifacts/q06 --catalog builder/data/tools-64.json --precision nvfp4 --target h200
  builder verify artifacts/q06-nvfp4-h200
  builder inspect artifacts/q06-nvfp4-h200

Every failure exits with its error code's number (common/errors.py: usage 2, checkpoint_invalid 10,
catalog_invalid 13, budget_too_small 16, output_exists 17, hash_mismatch 24, bundle_invalid 30, ...);
with --json it prints {"error": CODE, "message": ..., "details": {...}} on stdout."""


@click.group(cls=TypedErrorGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110},
             epilog=EPILOG)
def main() -> None:
    """Compile Hugging Face checkpoints and a tool catalog into contract-bound bundles."""


@main.command()
@click.option("--shape", type=click.Choice(["tiny", "qwen3-0.6b"]), default="tiny", show_default=True,
              help="tiny: seconds, for tests; qwen3-0.6b: the real Qwen3-0.6B shape (~1.2 GB bf16).")
@click.option("--family", type=click.Choice(["qwen3", "qwen2", "llama"]), default="qwen3", show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="Same seed, same bytes.")
@click.option("--shards", type=int, default=1, show_default=True, help="Split the safetensors into N files with an index.")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True, help="Checkpoint folder to write.")
@click.option("--force", is_flag=True, help="Replace an existing non-empty --out folder.")
@click.option("--json", "as_json", is_flag=True, help="Print the model config as JSON.")
def synth(shape, family, seed, shards, out_dir, force, as_json):
    """Write a synthetic Hugging Face checkpoint (config, safetensors, trained BPE tokenizer)."""
    from .synth import SynthOptions, synth_checkpoint

    start = time.perf_counter()
    try:
        cfg = synth_checkpoint(out_dir, SynthOptions(shape=shape, family=family, seed=seed, shards=shards),
                               progress=progress_printer("synth"), force=force)
    except EngineError as e:
        fail(e, as_json)
    if as_json:
        click.echo(json_text({"out": out_dir, "model": cfg.to_dict(), "seconds": time.perf_counter() - start}))
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
        out = Path(out_dir) if out_dir else Path("artifacts") / f"{Path(checkpoint).name}-{precision}-{target.lower()}"
        result = compile_bundle(checkpoint, catalog, options, out, force=force,
                                progress=None if as_json else progress_printer("quantize"))
    except EngineError as e:
        fail(e, as_json)
    c = result.contract
    if as_json:  # peak RSS: ru_maxrss is KiB on Linux
        click.echo(json_text({"bundle": str(result.out_dir), "bundle_id": c.engine.bundle_id,
                               "target": c.target.name, "precision": c.precision.weights,
                               "limits": c.to_dict()["limits"], "memory": c.to_dict()["memory"],
                               "canary_min_margin": c.canary.min_margin, "timings_s": result.timings,
                               "source_bytes": result.source_bytes,
                               "source_gb_per_s": result.source_bytes / 1e9 / max(result.timings["quantize"], 1e-9),
                               "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
        return
    from .inspect_bundle import format_inspection, inspect_bundle

    click.echo(format_inspection(inspect_bundle(result.out_dir)))
    click.echo(f"\nbuilt in {sum(result.timings.values()):.1f} s ("
               + ", ".join(f"{k} {v:.1f}" for k, v in result.timings.items()) + ")")


@main.command()
@click.argument("bundle", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print the contract's sections and the file list as JSON.")
def inspect(bundle, as_json):
    """Show what BUNDLE's contract.json promises: target, precision, limits, memory, grammar, canary, files.

    Reads only contract.json (schema-checked); `builder verify` checks the files against it.
    """
    from .inspect_bundle import format_inspection, inspect_bundle

    try:
        info = inspect_bundle(bundle)
    except EngineError as e:
        fail(e, as_json)
    click.echo(json_text(info) if as_json else format_inspection(info))


@main.command()
@click.argument("bundle", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help='Print {"ok": true, "checks": [...]} or the typed error.')
def verify(bundle, as_json):
    """Check that BUNDLE is complete and agrees with its contract; exit 0 and print "ok" if so.

    \b
    schema   contract.json is valid against schemas/contract.schema.json, format version supported
    hashes   every listed file present with its size and sha256; bundle_id matches; nothing unlisted
    weights  tensor names, dtypes and shapes are those of the contract's model and precision;
             the data section's bytes equal memory.weights_bytes
    memory   memory.kv_pool_bytes is what limits.num_pages pages take
    grammar  grammar.msgpack parses and its sizes and token ids equal the contract's grammar section
    canary   canary ids lie in the vocabulary and the expected answer follows the grammar
    kernels  kernels/*.cubin present exactly for GPU targets, each compiled for the contract's sm_arch
    """
    from .inspect_bundle import CHECKS, verify_bundle

    try:
        contract = verify_bundle(bundle)
    except EngineError as e:
        fail(e, as_json)
    if as_json:
        click.echo(json_text({"ok": True, "bundle": str(bundle), "bundle_id": contract.engine.bundle_id,
                               "checks": list(CHECKS)}))
    else:
        click.echo(f"ok: {bundle} ({contract.target.name}, {contract.precision.weights}, bundle id "
                   f"{contract.engine.bundle_id[:16]}): {', '.join(CHECKS)}")


@main.command()
@click.argument("checkpoint", type=click.Path())
@click.option("--gpu-memory", required=True,
              help="Device memory the bundle may take, e.g. 24GiB: what the large model leaves free.")
@click.option("--precision", type=click.Choice(sorted(PRECISIONS)), default="fp8", show_default=True,
              help="Weights of the decoder's linear layers.")
@click.option("--target", default="h200", show_default=True, help="A GPU (h100, h200, b200, rtx5090), sm_XY or cpu.")
@click.option("--page-size", type=int, default=32, show_default=True, help="Tokens per KV-cache page.")
@click.option("--max-input-tokens", type=int, default=None,
              help="Prompt tokens per sequence in the batch tiers  [default: 1024]")
@click.option("--max-output-tokens", type=int, default=None,
              help="Answer tokens per sequence, END included  [default: 64]")
@click.option("--context-reserve", default=None, help="CUDA context reserve (e.g. 512MiB)  [default: per target]")
@click.option("--json", "as_json", is_flag=True, help="Print the tiers (limits, memory in bytes, compile options).")
def plan(checkpoint, gpu_memory, precision, target, page_size, max_input_tokens, max_output_tokens,
         context_reserve, as_json):
    """Show which limits fit in --gpu-memory for CHECKPOINT's model (read from its config.json). Writes nothing.

    Batch tiers double the tokens per step (half decode rows, one per sequence; half prefill),
    each with a KV pool holding every sequence at full length; a "long" tier follows with 4
    sequences and the longest prompt that fits. Pass a tier's compile_args to `builder compile`.
    """
    from dataclasses import asdict
    from pathlib import Path

    from kernels.targets import resolve_target

    from .checkpoint import parse_config
    from .memory_plan import GIB, parse_size
    from .tiers import DEFAULT_MAX_INPUT_TOKENS, DEFAULT_MAX_OUTPUT_TOKENS, TIER_COLUMNS, plan_tiers, tier_rows

    try:
        max_in = DEFAULT_MAX_INPUT_TOKENS if max_input_tokens is None else max_input_tokens
        max_out = DEFAULT_MAX_OUTPUT_TOKENS if max_output_tokens is None else max_output_tokens
        for name, value in (("page-size", page_size), ("max-input-tokens", max_in), ("max-output-tokens", max_out)):
            if value < 1:
                raise EngineError("usage", f"--{name} must be at least 1, got {value}", option=name, found=value)
        budget, t = parse_size(gpu_memory), resolve_target(target)
        reserve = parse_size(context_reserve) if context_reserve else None
        if not Path(checkpoint).is_dir():
            raise EngineError("checkpoint_invalid", f"{checkpoint}: not a folder; expected a Hugging Face checkpoint "
                              "folder with config.json", path=str(checkpoint))
        cfg = parse_config(Path(checkpoint))
        if max_in + max_out > cfg.max_position_embeddings:
            raise EngineError("usage", f"max input + output tokens ({max_in + max_out}) exceed the model's "
                              f"{cfg.max_position_embeddings} positions", limit=cfg.max_position_embeddings)
        tiers = plan_tiers(cfg, PRECISIONS[precision], budget, t.name, page_size, max_input_tokens=max_in,
                           max_output_tokens=max_out, context_reserve_bytes=reserve)
    except EngineError as e:
        fail(e, as_json)

    def compile_args(limits) -> list[str]:  # every Limits field but num_pages, which compile derives
        args = ["--precision", precision, "--target", t.name] + [
            a for k, v in asdict(limits).items() if k != "num_pages" for a in (f"--{k.replace('_', '-')}", str(v))]
        return args + (["--context-reserve", str(reserve)] if reserve is not None else [])

    if as_json:
        click.echo(json_text({"checkpoint": str(checkpoint), "gpu_memory_bytes": budget, "target": t.name,
                               "precision": PRECISIONS[precision], "page_size": page_size,
                               "tiers": [{"tier": x.name, "limits": asdict(x.limits), "memory": asdict(x.memory),
                                          "compile_args": compile_args(x.limits)} for x in tiers]}))
        return
    click.echo(f"{checkpoint}: {cfg.family}, {cfg.param_count() / 1e6:.1f}M parameters; {t.name}"
               f"{' (' + t.sm_arch + ')' if t.sm_arch else ''}, {PRECISIONS[precision]} weights, "
               f"{budget / GIB:.2f} GiB, pages of {page_size} tokens")
    rows = [tuple(str(v) for v in r) for r in [TIER_COLUMNS, *tier_rows(tiers)]]
    widths = [max(len(r[i]) for r in rows) for i in range(len(TIER_COLUMNS))]
    for r in rows:
        click.echo("  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths))))
    largest = [x for x in tiers if x.name != "long"][-1]
    click.echo(f"(MiB rounded up) to build {largest.name}: builder compile {checkpoint} --catalog CATALOG "
               + " ".join(compile_args(largest.limits)))
