"""`runtime`: check a bundle against this machine, load it behind the canary gate, answer requests."""
from __future__ import annotations

import json
import sys
import time

import click

from .cli_errors import TypedErrorGroup, fail
from common.errors import EngineError
from .generator import HEAD_MODES, Result
from .sampling import Sampling

CPU_BACKENDS = ("fast", "reference")  # runtime.engine.CPU_BACKENDS (not imported here: the engine loads numba)
_backend = click.option("--backend", type=click.Choice(CPU_BACKENDS), default="fast", show_default=True,
                        help="CPU bundles: fast (numba on the stored weights) or reference (numpy float32).")
_threads = click.option("--threads", type=int, default=None,
                        help="Fast CPU backend worker threads [default: the machine's cores].")


@click.group(cls=TypedErrorGroup, context_settings={"help_option_names": ["-h", "--help"]})
def main() -> None:
    """Load contract-bound bundles and answer tool-discovery requests.

    Every refusal has a stable code and its own exit code (see common/errors.py), and
    --json prints it as {"error", "message", "details"}.
    """


@main.command()
@click.argument("path", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Machine-readable result.")
def check(path, as_json):
    """Run every check that needs no loading (contract, schema, version, hashes, target, memory)."""
    from .engine import check_bundle

    try:
        contract = check_bundle(path)
    except EngineError as e:
        fail(e, as_json)
    summary = {"ok": True, "bundle_id": contract.engine.bundle_id, "target": contract.target.name,
               "precision": contract.precision.weights, "memory_total_bytes": contract.memory.total_bytes}
    click.echo(json.dumps(summary, indent=2) if as_json else
               f"ok: {path} ({contract.target.name}, {contract.precision.weights}) can be hosted here")


@main.command()
@click.argument("path", type=click.Path())
@_backend
@_threads
@click.option("--json", "as_json", is_flag=True, help="Machine-readable result.")
def load(path, backend, threads, as_json):
    """Check, load and canary-gate a bundle; exit 0 only when it is bound and ready."""
    from .engine import Engine

    try:
        engine = Engine.load(path, backend=backend, threads=threads)
    except EngineError as e:
        fail(e, as_json)
    c = engine.contract
    summary = {"ok": True, "bundle_id": c.engine.bundle_id, "load_s": engine.load_seconds,
               "canary_tokens": len(c.canary.expected_token_ids)}
    click.echo(json.dumps(summary, indent=2) if as_json else
               f"bound: {path} ({c.target.name}, {c.precision.weights}); canary passed; loaded in {engine.load_seconds:.2f} s")


@main.command()
@click.argument("path", type=click.Path())
@click.argument("requests", nargs=-1, required=True)
@click.option("--head", type=click.Choice(HEAD_MODES), default="sparse", show_default=True,
              help="sparse: logits of allowed tokens only; dense: all rows then mask; check: both, must agree.")
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0 is greedy.")
@click.option("--top-p", type=float, default=1.0, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="Sampling seed (same seed, same answer).")
@_backend
@_threads
@click.option("--json", "as_json", is_flag=True, help="Tool names, token ids and timings as JSON.")
def run(path, requests, head, temperature, top_p, seed, backend, threads, as_json):
    """Answer each REQUEST text with the bundle's tools, ranked in the order the model names them."""
    from .engine import Engine

    try:
        engine = Engine.load(path, head=head, backend=backend, threads=threads)
        start = time.perf_counter()
        results = engine.run(list(requests), Sampling(temperature, top_p, seed))
        wall = time.perf_counter() - start
    except EngineError as e:
        fail(e, as_json)
    if as_json:
        out = [{"request": r, **(res.to_dict() if isinstance(res, Result) else res.to_json())}
               for r, res in zip(requests, results)]
        click.echo(json.dumps({"results": out, "load_s": engine.load_seconds, "wall_s": wall}, indent=2))
    else:
        for r, res in zip(requests, results):
            click.echo(f"> {r}")
            if isinstance(res, Result):
                for rank, tool in enumerate(res.tools, 1):
                    click.echo(f"  {rank}. {tool}")
                click.echo(f"  ({len(res.token_ids)} tokens, {1e3 * res.total_s:.1f} ms"
                           f"{', cut at the output limit' if res.finish == 'length' else ''})")
            else:
                click.echo(f"  refused: {res}")
    if any(not isinstance(res, Result) for res in results):
        sys.exit(max(res.exit_code for res in results if not isinstance(res, Result)))
