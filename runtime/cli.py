"""`runtime`: check a bundle against this machine, load it behind the canary gate, answer requests."""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import click

from toolcall.common.errors import EngineError
from toolcall.kernels.geometry import FMA, KERNEL_FAMILIES
from toolcall.runtime import console
from toolcall.runtime.backends import CPU_BACKENDS, DEVICES, NATIVE
from toolcall.runtime.batching.batcher import Result
from toolcall.runtime.batching.picks import HEAD_MODES
from toolcall.runtime.batching.sampling import Sampling, sampling_problem
from toolcall.runtime.console import TypedErrorGroup, exit_code_help, fail, json_text

# Requests longer than this are shown shortened in plain output (a refusal never echoes a whole document).
ECHO_CHARS = 160

_backend = click.option("--backend", type=click.Choice(CPU_BACKENDS), default="fast", show_default=True,
                        help="CPU bundles: fast (numba on the stored weights) or reference (numpy float32).")
_threads = click.option("--threads", type=int, default=None,
                        help="Fast CPU backend worker threads [default: the CPUs this process may use].")
_gpu_kernels = click.option("--gpu-kernels", type=click.Choice(tuple(KERNEL_FAMILIES)), default=FMA.name,
                            show_default=True, help="GPU bundles: the kernels of the linear layers and prefill "
                            "attention; " + "; ".join(f"{f.name}: {f.summary}" for f in KERNEL_FAMILIES.values()) + ".")

_device = click.option("--device", type=click.Choice(tuple(DEVICES)), default=NATIVE, show_default=True,
                       help="; ".join(f"{d.name}: {d.summary}" for d in DEVICES.values()) + ".")


EPILOG = f"""\b
Typical use:
  runtime check artifacts/toolcall-cpu
  runtime run artifacts/toolcall-cpu "Convert 100 dollars to euros and book a taxi"
  runtime run artifacts/toolcall-cpu -i requests.txt --json
  runtime run artifacts/toolcall-h200 --device sim "Book a taxi"   (a GPU bundle checked on this CPU)

\b
Exit codes: 0 ok; usage 2; internal 70 (a bug: please report it).
{exit_code_help("Load refusals, in load order", 20, 39)}
{exit_code_help("Request refusals", 40, 49)}
{exit_code_help("GPU", 50, 59)}
{exit_code_help("Numerics", 60, 60)}
{exit_code_help("Serving (HTTP)", 80, 89)}
{exit_code_help("Prompt and prefix", 90, 99)}
With --json a refusal prints {{"error": CODE, "message": ..., "details": {{...}}}} on stdout."""


@click.group(cls=TypedErrorGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100},
             epilog=EPILOG)
@click.version_option(package_name="toolcall-engine", prog_name="runtime", message="%(prog)s %(version)s")
def main() -> None:
    """Load contract-bound bundles and answer tool-discovery requests.

    A bundle (made by `builder compile`) is served only on a machine that can honour its
    contract.json, and only after it reproduces its recorded canary answer. Every refusal
    names its reason with the numbers behind it and exits with the reason's own code.
    """


def shorten(text: str, limit: int = ECHO_CHARS) -> str:
    """The request as shown back: whole when short, else its start and its length."""
    return text if len(text) <= limit else f"{text[:limit - 40]}... ({len(text):,} characters)"


def read_requests(requests: tuple[str, ...], input_file) -> list[str]:
    """The request texts: the arguments, then the lines of --input (newline removed, empty lines skipped).

    Lines are decoded as UTF-8 with invalid bytes kept as lone surrogates, so the engine refuses
    that one request (request_invalid) and answers the others.
    """
    texts = list(requests)
    if input_file is not None:
        for line in input_file.read().split(b"\n"):
            line = line.removesuffix(b"\r")
            if line:
                texts.append(line.decode("utf-8", errors="surrogateescape"))
    if not texts:
        raise click.UsageError("no requests: give REQUEST texts or --input FILE ('-' for stdin), one per line")
    return texts


@main.command(short_help="Can this machine host the bundle? Loads nothing.")
@click.argument("path", type=click.Path())
@_device
@click.option("--json", "as_json", is_flag=True, help="Machine-readable result.")
def check(path, device, as_json):
    """Run every check that needs no loading (contract, schema, version, hashes, target, memory)."""
    from toolcall.runtime.engine import check_bundle

    try:
        contract = check_bundle(path, device=device)
    except EngineError as e:
        fail(e, as_json)
    summary = {"ok": True, "bundle_id": contract.engine.bundle_id, "target": contract.target.name,
               "precision": contract.precision.weights, "memory_total_bytes": contract.memory.total_bytes,
               "device": device}
    where = "on the simulated device" if device == "sim" else "here"
    click.echo(json_text(summary) if as_json else
               f"ok: {path} ({contract.target.name}, {contract.precision.weights}) can be hosted {where}")


NO_PREFIX_CACHE_HELP = ("Compute every prompt in full: no shared pinned prefix pages, no reuse of finished "
                        "prompts' pages (the cross-check: answers are the same).")


@main.command(short_help="Check, load and pass the canary; exit 0 when bound.")
@click.argument("path", type=click.Path())
@click.option("--no-prefix-cache", is_flag=True, help=NO_PREFIX_CACHE_HELP)
@_backend
@_threads
@_gpu_kernels
@_device
@click.option("--json", "as_json", is_flag=True, help="Machine-readable result.")
def load(path, no_prefix_cache, backend, threads, gpu_kernels, device, as_json):
    """Check, load and canary-gate a bundle; exit 0 only when it is bound and ready."""
    from toolcall.runtime.engine import Engine

    console.enable(console.wanted(as_json))
    try:
        engine = Engine.load(path, prefix_cache=not no_prefix_cache, backend=backend, threads=threads,
                             gpu_kernels=gpu_kernels, device=device)
    except EngineError as e:
        fail(e, as_json)
    c = engine.contract
    summary = {"ok": True, "bundle_id": c.engine.bundle_id, "load_s": engine.load_seconds,
               "canary_tokens": len(c.canary.expected_token_ids),
               "prefix_cache": not no_prefix_cache, "prefix_tokens": c.prompt.prefix_tokens,
               "pinned_pages": engine.generator.kv.pinned_pages, "device": device}
    click.echo(json_text(summary) if as_json else
               f"bound: {path} ({c.target.name}, {c.precision.weights}); canary passed; loaded in {engine.load_seconds:.2f} s")


@main.command(short_help="Answer requests (arguments, or one per line from a file or stdin).")
@click.argument("path", type=click.Path())
@click.argument("requests", nargs=-1)
@click.option("-i", "--input", "input_file", type=click.File("rb"), default=None,
              help="Also read requests from FILE, one per line ('-' reads stdin); empty lines are skipped.")
@click.option("--head", type=click.Choice(HEAD_MODES), default="sparse", show_default=True,
              help="sparse: logits of allowed tokens only; dense: all rows then mask; check: both, must agree.")
@click.option("--temperature", type=float, default=0.0, show_default=True, help="0 is greedy.")
@click.option("--top-p", type=float, default=1.0, show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="Sampling seed (same seed, same answer).")
@_backend
@_threads
@_gpu_kernels
@_device
@click.option("--no-prefix-cache", is_flag=True, help=NO_PREFIX_CACHE_HELP)
@click.option("--json", "as_json", is_flag=True,
              help="Tool names, token ids (prompt_token_ids, cached_prompt_tokens too) and timings as JSON.")
def run(path, requests, input_file, head, temperature, top_p, seed, no_prefix_cache, backend, threads, gpu_kernels,
        device, as_json):
    """Answer each REQUEST with the bundle's tools, in the order the model names them.

    Each request is wrapped in the catalog's prompt template; requests that cannot run (too
    long, empty) are refused one by one and the others still answered. The exit code is 0
    when every request was answered, else the highest refusal code.
    """
    from toolcall.runtime.engine import Engine

    texts = read_requests(requests, input_file)
    problem = sampling_problem(temperature, top_p, seed)
    if problem:  # before loading: a bad option costs nothing
        field, why = problem
        fail(EngineError("usage", f"--{field.replace('_', '-')}: {why}. See `runtime run --help`.", option=field,
                         temperature=repr(temperature), top_p=repr(top_p), seed=seed), as_json)
    if threads is not None and threads < 1:
        fail(EngineError("usage", f"--threads: needs a whole number >= 1, got {threads}. See `runtime run --help`.",
                         option="threads", found=threads), as_json)
    console.enable(console.wanted(as_json))
    try:
        engine = Engine.load(path, head=head, prefix_cache=not no_prefix_cache, backend=backend, threads=threads,
                             gpu_kernels=gpu_kernels, device=device)
        start = time.perf_counter()
        results = engine.run(texts, Sampling(temperature, top_p, seed))
        wall = time.perf_counter() - start
    except EngineError as e:
        fail(e, as_json)
    if as_json:
        out = [{"request": shorten(r, 10 * ECHO_CHARS),
                **(res.to_dict() if isinstance(res, Result) else res.to_json())}
               for r, res in zip(texts, results)]
        click.echo(json_text({"results": out, "load_s": engine.load_seconds, "wall_s": wall, "device": device}))
    else:
        c = engine.contract
        click.echo(f"bound {path} ({c.target.name}, {c.precision.weights}): loaded and canary passed "
                   f"in {engine.load_seconds:.2f} s")
        for r, res in zip(texts, results):
            click.echo(f"> {shorten(r)}")
            if isinstance(res, Result):
                for rank, tool in enumerate(res.tools, 1):
                    click.echo(f"  {rank}. {tool}")
                if not res.tools:
                    click.echo("  (no tool)")
                click.echo(f"  answer: {len(res.token_ids)} tokens, END included, in {1e3 * res.total_s:.1f} ms"
                           f"{'; cut at the output limit' if res.finish == 'length' else ''}")
            else:
                click.echo(f"  refused: {res}")
    if any(not isinstance(res, Result) for res in results):
        sys.exit(max(res.exit_code for res in results if not isinstance(res, Result)))


def _use_system_allocator() -> None:
    """Re-executes this process (same pid, same arguments) on the C allocator, unless PYTHONMALLOC is set.

    A burst of thousands of concurrent requests leaves Python's small-object arenas pinned by a
    few survivors, so the server's RSS stays at the burst's high-water mark (measured +19% after a
    2,048-client burst); with the C allocator the idle server's malloc_trim hands the freed pages
    back (+7%). An explicit PYTHONMALLOC (e.g. pymalloc) is kept as it is."""
    if os.environ.get("PYTHONMALLOC"):
        return
    os.environ["PYTHONMALLOC"] = "malloc"
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])


@main.command(short_help="Serve the bundle over HTTP (needs the serve extra).")
@click.argument("path", type=click.Path())
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on.")
@click.option("--port", type=int, default=8000, show_default=True, help="Port (0: any free one, printed when ready).")
@click.option("--max-queue-requests", type=int, default=None,
              help="Waiting-queue bound in requests [default: 32 x the contract's max_sequences].")
@click.option("--max-queue-tokens", type=int, default=None,
              help="Waiting-queue bound in prompt tokens [default: requests x max_input_tokens / 4].")
@click.option("--request-timeout", type=float, default=None,
              help="Deadline of a request without timeout_s, in seconds (past it: 504) [default: " + "; ".join(
                  f"{d.request_timeout_s:g} on {d.name}" for d in DEVICES.values()) + "].")
@click.option("--max-body-bytes", type=int, default=64 * 1024, show_default=True, help="Largest request body.")
@click.option("--head", type=click.Choice(HEAD_MODES), default="sparse", show_default=True)
@click.option("--threads", type=int, default=None,
              help="Fast CPU backend worker threads, fixed, in one lane unless --lanes says more [default: the "
                   "CPUs this process may use, split between the lanes].")
@click.option("--lanes", type=int, default=None,
              help="Groups of sequences whose steps overlap, each stepping on its own thread (fast CPU backend) "
                   "[default: 2 on 2+ CPUs; 1 with --threads; with one lane the threads follow the spare CPU].")
@click.option("--served-model-name", "served_model_names", multiple=True, metavar="NAME",
              help="A name clients may use for the model (repeatable; vLLM's flag) [default: the bundle folder's "
                   "name]; the bundle id is always accepted.")
@click.option("--drain-grace", type=float, default=1.0, show_default=True,
              help="After SIGTERM: seconds (at least 1) of no new arrival before the listener closes; arrivals "
                   "meanwhile are answered 503.")
@_gpu_kernels
@_device
def serve(path, host, port, max_queue_requests, max_queue_tokens, request_timeout, max_body_bytes, head, threads,
          lanes, served_model_names, drain_grace, gpu_kernels, device):
    """Serve the bundle over HTTP (discover, OpenAI chat completions, health, metrics) until SIGTERM.

    Loads and canary-gates the bundle while /health answers 503, then prints one `ready:` line.
    SIGTERM drains: no new requests (503), every admitted one answered, exit 0.
    Runs on the C allocator (PYTHONMALLOC=malloc) unless PYTHONMALLOC is set, so memory freed after
    a burst goes back to the system.
    """
    try:
        from toolcall.runtime.serve.schemas import MAX_TIMEOUT_S
        from toolcall.runtime.serve.server import main as serve_main
        from toolcall.runtime.serve.state import ServeConfig
    except ImportError as e:
        raise click.UsageError(f"`runtime serve` needs the serve extra ({e.name} is not installed): "
                               "pip install 'toolcall-engine[serve]'") from None

    for name, value in (("--max-queue-requests", max_queue_requests), ("--max-queue-tokens", max_queue_tokens),
                        ("--max-body-bytes", max_body_bytes), ("--threads", threads), ("--lanes", lanes)):
        if value is not None and value < 1:
            raise click.BadParameter(f"needs a positive number, got {value}", param_hint=name)
    if not 0 <= port <= 65_535:
        raise click.BadParameter(f"needs a TCP port from 0 to 65535, got {port}", param_hint="--port")
    if request_timeout is None:
        request_timeout = DEVICES[device].request_timeout_s
    if not 0 < request_timeout <= MAX_TIMEOUT_S:  # NaN fails too: a deadline is compared, never NaN
        raise click.BadParameter(f"needs seconds > 0 and at most {MAX_TIMEOUT_S:g} (timeout_s's bound), got "
                                 f"{request_timeout}", param_hint="--request-timeout")
    if not 1.0 <= drain_grace <= MAX_TIMEOUT_S:
        raise click.BadParameter(f"needs seconds from 1 to {MAX_TIMEOUT_S:g}, got {drain_grace}",
                                 param_hint="--drain-grace")
    if any(not name.strip() for name in served_model_names):
        raise click.BadParameter("needs a non-blank name", param_hint="--served-model-name")
    _use_system_allocator()
    config = ServeConfig(max_queue_requests, max_queue_tokens, request_timeout, max_body_bytes,
                         adaptive_threads=threads is None, lanes=lanes,
                         served_model_names=tuple(served_model_names) or (Path(path).name,), drain_grace_s=drain_grace)
    serve_main(path, host, port, config, head=head, threads=threads, gpu_kernels=gpu_kernels, device=device)
