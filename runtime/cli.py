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
@click.option("--json", "as_json", is_flag=True, help="Machine-readable result.")
def load(path, as_json):
    """Check, load and canary-gate a bundle; exit 0 only when it is bound and ready."""
    from .engine import Engine

    try:
        engine = Engine.load(path)
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
@click.option("--json", "as_json", is_flag=True, help="Tool names, token ids and timings as JSON.")
def run(path, requests, head, temperature, top_p, seed, as_json):
    """Answer each REQUEST text with the bundle's tools, ranked in the order the model names them."""
    from .engine import Engine

    try:
        engine = Engine.load(path, head=head)
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


@main.command()
@click.argument("path", type=click.Path())
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=int, default=8000, show_default=True, help="Port (0: any free one, printed when ready).")
@click.option("--max-queue-requests", type=int, default=None,
              help="Waiting-queue bound in requests [default: 32 x the contract's max_sequences].")
@click.option("--max-queue-tokens", type=int, default=None,
              help="Waiting-queue bound in prompt tokens [default: requests x max_input_tokens / 4].")
@click.option("--request-timeout", type=float, default=60.0, show_default=True,
              help="Deadline of a request without timeout_s, in seconds (past it: 504).")
@click.option("--max-body-bytes", type=int, default=64 * 1024, show_default=True, help="Largest request body.")
@click.option("--head", type=click.Choice(HEAD_MODES), default="sparse", show_default=True)
@click.option("--noop-engine", is_flag=True, hidden=True, help="Benchmarks only: answer every request empty, no model.")
def serve(path, host, port, max_queue_requests, max_queue_tokens, request_timeout, max_body_bytes, head, noop_engine):
    """Serve the bundle over HTTP (discover, OpenAI chat completions, health, metrics) until SIGTERM.

    Loads and canary-gates the bundle while /health answers 503, then prints one `ready:` line.
    SIGTERM drains: no new requests (503), every admitted one answered, exit 0.
    """
    from .serve.server import main as serve_main
    from .serve.state import ServeConfig

    for name, value in (("--max-queue-requests", max_queue_requests), ("--max-queue-tokens", max_queue_tokens),
                        ("--max-body-bytes", max_body_bytes)):
        if value is not None and value < 1:
            raise click.BadParameter(f"needs a positive number, got {value}", param_hint=name)
    if request_timeout <= 0:
        raise click.BadParameter(f"needs seconds > 0, got {request_timeout}", param_hint="--request-timeout")
    serve_main(path, host, port, ServeConfig(max_queue_requests, max_queue_tokens, request_timeout, max_body_bytes),
               head=head, noop=noop_engine)
