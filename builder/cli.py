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
