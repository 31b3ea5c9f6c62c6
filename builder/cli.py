"""`builder`: make synthetic checkpoints, compile bundles, inspect and verify them, plan tiers."""
from __future__ import annotations

import resource
import sys
import time

import click

from toolcall.builder.probe_sample import SAMPLE_SIZE
from toolcall.builder.quantize import weight_format
from toolcall.common.errors import EngineError
from toolcall.common.formats import KV_BF16, KV_FORMATS, WEIGHT_FORMATS
from toolcall.kernels.geometry import FMA, KERNEL_FAMILIES
from toolcall.runtime.bundle.families import FAMILY_NAMES
from toolcall.runtime.console import TypedErrorGroup, exit_code_help, fail, json_text


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


EPILOG = f"""\b
Typical use:
  builder synth --shape qwen3-0.6b --out artifacts/q06
  builder plan artifacts/q06 --gpu-memory 12GiB --precision nvfp4 --target h200
  builder compile artifacts/q06 --catalog builder/data/tools-64.json --precision nvfp4 --target h200
  builder verify artifacts/q06-nvfp4-h200
  builder inspect artifacts/q06-nvfp4-h200
  builder manifest artifacts/q06-nvfp4-h200 --kubernetes --image REG/toolcall-engine:cuda --bundle-pvc bundles

\b
Exit codes: 0 ok; usage 2; internal 70 (a bug: please report it).
{exit_code_help("Input and build failures", 10, 19)}
{exit_code_help("Outputs", 61, 69)}
{exit_code_help("Templates", 90, 90)}
{exit_code_help("Bundle checks (verify, inspect)", 20, 39)}
{exit_code_help("Placement (manifest)", 100, 109)}
With --json a failure prints {{"error": CODE, "message": ..., "details": {{...}}}} on stdout."""


@click.group(cls=TypedErrorGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110},
             epilog=EPILOG)
@click.version_option(package_name="toolcall-engine", prog_name="builder", message="%(prog)s %(version)s")
def main() -> None:
    """Compile Hugging Face checkpoints and a tool catalog into contract-bound bundles.

    A bundle is one model at one precision for one target (cpu or a GPU) with fixed limits:
    quantized weights, the tool trie, compiled kernels and contract.json, which states what
    the bundle needs (GPU, driver, memory) and what it promises (limits, canary answer).
    """


@main.command()
@click.option("--shape", type=click.Choice(["tiny", "qwen3-0.6b"]), default="tiny", show_default=True,
              help="tiny: seconds, for tests; qwen3-0.6b: the real Qwen3-0.6B shape (~1.2 GB bf16).")
@click.option("--family", type=click.Choice(FAMILY_NAMES), default=FAMILY_NAMES[0], show_default=True)
@click.option("--seed", type=int, default=0, show_default=True, help="Same seed, same bytes.")
@click.option("--shards", type=int, default=1, show_default=True, help="Split the safetensors into N files with an index.")
@click.option("--layers", type=int, default=None,
              help="Decoder layers, fewer than the shape's for a quick run of its real kernel shapes (e.g. 1 with "
                   "qwen3-0.6b on the simulated device)  [default: the shape's]")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), required=True, help="Checkpoint folder to write.")
@click.option("--force", is_flag=True, help="Replace an existing non-empty --out folder.")
@click.option("--json", "as_json", is_flag=True, help="Print the model config as JSON.")
def synth(shape, family, seed, shards, layers, out_dir, force, as_json):
    """Write a synthetic Hugging Face checkpoint (config, safetensors, trained BPE tokenizer)."""
    from toolcall.builder.synth import SynthOptions, synth_checkpoint

    start = time.perf_counter()
    try:
        cfg = synth_checkpoint(out_dir, SynthOptions(shape=shape, family=family, seed=seed, shards=shards,
                                                     num_layers=layers),
                               progress=progress_printer("synth"), force=force)
    except EngineError as e:
        fail(e, as_json)
    if as_json:
        click.echo(json_text({"out": out_dir, "model": cfg.to_dict(), "seconds": time.perf_counter() - start}))
    else:
        click.echo(f"wrote {out_dir}: {family} {shape}, {cfg.param_count() / 1e6:.1f}M parameters, "
                   f"{time.perf_counter() - start:.1f} s")


# the bundle weight formats by name, and their older spellings (fp8 for fp8_e4m3)
PRECISIONS = sorted(n for f in WEIGHT_FORMATS if f.in_bundles for n in (f.name, *f.aliases))
# every count option's range, checked before anything is read or allocated (a value outside: a usage error)
SEQUENCES = click.IntRange(1, 1 << 16)
TOKENS = click.IntRange(1, 1 << 20)  # a prompt, an answer, a step or a chunk
PAGE = click.IntRange(1, 1 << 12)


@main.command(name="compile")
@click.argument("checkpoint", type=click.Path())
@click.option("--catalog", type=click.Path(), required=True, help="Tool catalog JSON: {\"tools\": [{\"name\", \"description\"}, ...], separator, max tools per answer, prompt template}.")
@click.option("--precision", type=click.Choice(PRECISIONS), default="fp8_e4m3", show_default=True,
              help="Weights of the decoder's linear layers; embeddings, norms and head stay bf16.")
@click.option("--target", default="cpu", show_default=True,
              help="cpu (numpy reference), a GPU (h100, h200, b200, rtx5090) or an architecture (sm_90).")
@click.option("--max-sequences", type=SEQUENCES, default=8, show_default=True, help="Concurrent sequences.")
@click.option("--max-input-tokens", type=TOKENS, default=512, show_default=True, help="Prompt tokens per sequence.")
@click.option("--max-output-tokens", type=TOKENS, default=None,
              help="Answer tokens per sequence, END included  [default: the catalog's longest answer]")
@click.option("--page-size", type=PAGE, default=32, show_default=True, help="Tokens per KV-cache page.")
@click.option("--max-tokens-per-step", type=TOKENS, default=None,
              help="Rows in one forward step (decode rows plus prefill chunks)  [default: 256 on cpu; on a GPU the "
                   "prefill chunk plus --max-sequences, at least 256]")
@click.option("--prefill-chunk", type=TOKENS, default=None,
              help="Most prompt tokens of one sequence per step  [default: 128 on cpu; on a GPU 512, or 256 or 128 "
                   "where --memory-budget leaves no room for 512]")
@click.option("--memory-budget", default=None, help="Size the KV pool to fit this much memory (e.g. 6GiB); "
              "refuses when not even one full-length sequence fits.")
@click.option("--context-reserve", default=None, help="CUDA context reserve (e.g. 512MiB)  [default: per target]")
@click.option("--kv-cache", type=click.Choice(KV_FORMATS.bundle_names), default=KV_BF16.name, show_default=True,
              help="KV-cache elements: bf16, or fp8_e4m3 (half the bytes: E4M3 codes with per-head scales calibrated "
                   "on the catalog's requests; refused, kv_cache_unsafe, where the canary's answers change; CPU "
                   "target only so far).")
@click.option("--max-request-tools", type=click.IntRange(1, 4096), default=None,
              help="Most tools one request may bring itself (names outside the catalog, with descriptions); needs a "
                   "catalog prompt_template holding {tools}; GPU targets take at most 511 (their draw holds 512 "
                   "candidates a row)  [default: 64 with {tools}]")
@click.option("--max-description-tokens", type=click.IntRange(0, 65536), default=None,
              help="Most tokens of one request-supplied tool's description  [default: 256 with {tools}]")
@click.option("--out", "out_dir", type=click.Path(file_okay=False), default=None,
              help="Bundle folder  [default: artifacts/<checkpoint>-<precision>-<target>]")
@click.option("--force", is_flag=True, help="Replace an existing bundle at --out.")
@click.option("--min-probe-recall", type=click.FloatRange(0.0, 1.0), default=None,
              help="Refuse (probe_failed, no bundle written) when the catalog probe's recall, the share of tools "
                   "the model picks for a request made from their own description, is below this (0-1)  "
                   "[default: warn only]")
@click.option("--probe-all", is_flag=True,
              help=f"Probe every tool of the catalog (one request each: time grows with the catalog)  [default: "
                   f"every tool up to {SAMPLE_SIZE}, else a seeded sample of {SAMPLE_SIZE}]")
@click.option("--json", "as_json", is_flag=True, help="Print the result as JSON (for programs).")
def compile_cmd(checkpoint, catalog, precision, target, max_sequences, max_input_tokens, max_output_tokens,
                page_size, max_tokens_per_step, prefill_chunk, memory_budget, context_reserve, kv_cache,
                max_request_tools, max_description_tokens, out_dir, force, min_probe_recall, probe_all, as_json):
    """Compile CHECKPOINT (a Hugging Face folder) and a tool catalog into a bundle with its contract.json.

    After the canary the catalog probe asks the model one request per tool (its description) for a
    catalog of up to 256 tools, else for a seeded sample of 256 (--probe-all: every tool), and a few
    that need no tool; the sample and the recall over it are recorded in build-report.json's "probe",
    and each finding (a recall under 0.5, answers nearly all the same) is printed on stderr as a line
    starting "warning:".
    """
    from pathlib import Path

    from toolcall.builder.compile import compile_bundle
    from toolcall.builder.memory_plan import parse_size
    from toolcall.runtime.bundle.contract import BuildOptions

    try:
        options = BuildOptions(
            precision=weight_format(precision).name, target=target.lower(), max_sequences=max_sequences,
            max_input_tokens=max_input_tokens, max_output_tokens=max_output_tokens, page_size=page_size,
            max_tokens_per_step=max_tokens_per_step, prefill_chunk=prefill_chunk,
            memory_budget_bytes=parse_size(memory_budget) if memory_budget else None,
            context_reserve_bytes=parse_size(context_reserve) if context_reserve else None, seed=0,
            max_request_tools=max_request_tools, max_description_tokens=max_description_tokens,
            kv_cache=None if kv_cache == KV_BF16.name else kv_cache)
        out = Path(out_dir) if out_dir else Path("artifacts") / f"{Path(checkpoint).name}-{precision}-{target.lower()}"
        result = compile_bundle(checkpoint, catalog, options, out, force=force,
                                progress=None if as_json else progress_printer("quantize"),
                                min_probe_recall=min_probe_recall, probe_all=probe_all)
    except EngineError as e:
        fail(e, as_json)
    c = result.contract
    if as_json:  # peak RSS: ru_maxrss is KiB on Linux
        click.echo(json_text({"bundle": str(result.out_dir), "bundle_id": c.engine.bundle_id,
                               "target": c.target.name, "precision": c.precision.weights,
                               "limits": c.to_dict()["limits"], "memory": c.to_dict()["memory"],
                               "canary_min_margin": c.canary.min_margin, "probe": result.probe.to_dict(),
                               "warnings": list(result.probe.warnings), "timings_s": result.timings,
                               "source_bytes": result.source_bytes,
                               "source_gb_per_s": result.source_bytes / 1e9 / max(result.timings["quantize"], 1e-9),
                               "peak_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}))
        print_warnings(result.probe.warnings)
        return
    from toolcall.builder.inspect_bundle import format_inspection, inspect_bundle

    click.echo(format_inspection(inspect_bundle(result.out_dir), show_warnings=False))  # on stderr, below
    click.echo(f"\nbuilt in {sum(result.timings.values()):.1f} s ("
               + ", ".join(f"{k} {v:.1f}" for k, v in result.timings.items()) + ")")
    print_warnings(result.probe.warnings)


def print_warnings(warnings) -> None:
    """One stderr line per warning, starting "warning:" (last, so a terminal shows them below the tables)."""
    for warning in warnings:
        click.echo(f"warning: {warning}", err=True)


@main.command()
@click.argument("bundle", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print the contract's sections and the file list as JSON.")
def inspect(bundle, as_json):
    """Show what BUNDLE's contract.json promises: target, precision, limits, memory, grammar, canary, files,
    and the catalog probe build-report.json records.

    Reads contract.json (schema-checked) and build-report.json's probe; `builder verify` checks the files
    against the contract.
    """
    from toolcall.builder.inspect_bundle import format_inspection, inspect_bundle

    try:
        info = inspect_bundle(bundle)
    except EngineError as e:
        fail(e, as_json)
    click.echo(json_text(info) if as_json else format_inspection(info))


@main.command()
@click.argument("bundle", type=click.Path())
@click.option("--simulate", is_flag=True,
              help="GPU bundles: then load it on the simulated device (its kernels' PTX run on this CPU) and pass "
                   "its canary there, through the serving step and the captured decode loop (minutes: answers are "
                   "checked, not speed).")
@click.option("--gpu-kernels", type=click.Choice(tuple(KERNEL_FAMILIES)), default=FMA.name, show_default=True,
              help="With --simulate: the kernel family of the linear layers and prefill attention to run.")
@click.option("--json", "as_json", is_flag=True, help='Print {"ok": true, "checks": [...]} or the typed error.')
def verify(bundle, simulate, gpu_kernels, as_json):
    """Check that BUNDLE is complete and agrees with its contract; exit 0 and print "ok" if so.

    \b
    schema   contract.json is valid against the contract schema, format version supported
    hashes   every listed file present with its size and sha256; bundle_id matches; nothing unlisted
    weights  tensor names, dtypes and shapes are those of the contract's model and precision;
             the data section's bytes equal memory.weights_bytes
    memory   memory.kv_pool_bytes is what limits.num_pages pages take
    grammar  grammar.msgpack parses and its sizes and token ids equal the contract's grammar section
    canary   canary ids lie in the vocabulary and the expected answer follows the grammar
    kernels  kernels/*.cubin present exactly for GPU targets, each compiled for the contract's sm_arch
    simulate (--simulate) loaded on the simulated device of the contract's GPU, canary passed there
    """
    from toolcall.builder.inspect_bundle import CHECKS, verify_bundle

    checks = list(CHECKS)
    try:
        contract = verify_bundle(bundle)
        if simulate:
            simulate_seconds = simulate_canary(bundle, contract, gpu_kernels)
            checks.append("simulate")
    except EngineError as e:
        fail(e, as_json)
    if as_json:
        click.echo(json_text({"ok": True, "bundle": str(bundle), "bundle_id": contract.engine.bundle_id,
                               "checks": checks, **({"simulate_s": simulate_seconds} if simulate else {})}))
    else:
        click.echo(f"ok: {bundle} ({contract.target.name}, {contract.precision.weights}, bundle id "
                   f"{contract.engine.bundle_id[:16]}): {', '.join(checks)}"
                   + (f" (simulated {simulate_seconds:.0f} s)" if simulate else ""))


def simulate_canary(bundle, contract, gpu_kernels: str) -> float:
    """Loads a GPU bundle on the simulated device (runtime/cuda/devices.py), which checks its canary through the
    serving step and the decode graph, then frees it; the seconds it took."""
    from toolcall.runtime.bundle.contract import CPU_TARGET
    from toolcall.runtime.engine import Engine

    if contract.target.name == CPU_TARGET:
        raise EngineError("usage", f"--simulate runs GPU bundles on the simulated device; {bundle} targets cpu, whose "
                          "canary `runtime load` checks on this machine", target=contract.target.name)
    start = time.perf_counter()
    Engine.load(bundle, gpu_kernels=gpu_kernels, device="sim").close()
    return time.perf_counter() - start


@main.command()
@click.argument("checkpoint", type=click.Path())
@click.option("--gpu-memory", default=None,
              help="Device memory the bundle may take, e.g. 24GiB: what the large model leaves free  [required for "
                   "a GPU target; cpu: the host's available memory]")
@click.option("--precision", type=click.Choice(PRECISIONS), default="fp8_e4m3", show_default=True,
              help="Weights of the decoder's linear layers.")
@click.option("--target", default="h200", show_default=True, help="A GPU (h100, h200, b200, rtx5090), sm_XY or cpu.")
@click.option("--page-size", type=PAGE, default=32, show_default=True, help="Tokens per KV-cache page.")
@click.option("--max-input-tokens", type=TOKENS, default=None,
              help="Prompt tokens per sequence in the batch tiers  [default: 1024]")
@click.option("--max-output-tokens", type=TOKENS, default=None,
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

    from toolcall.builder.checkpoint import parse_config
    from toolcall.builder.kernel_build import check_kernel_shapes, contract_target
    from toolcall.builder.memory_plan import format_size, parse_size
    from toolcall.builder.tiers import (
        DEFAULT_MAX_INPUT_TOKENS,
        DEFAULT_MAX_OUTPUT_TOKENS,
        TIER_COLUMNS,
        plan_tiers,
        tier_rows,
    )
    from toolcall.kernels.targets import resolve_target
    from toolcall.runtime.bundle.machine import cpu_facts

    try:
        max_in = DEFAULT_MAX_INPUT_TOKENS if max_input_tokens is None else max_input_tokens
        max_out = DEFAULT_MAX_OUTPUT_TOKENS if max_output_tokens is None else max_output_tokens
        for name, value in (("page-size", page_size), ("max-input-tokens", max_in), ("max-output-tokens", max_out)):
            if value < 1:
                raise EngineError("usage", f"--{name} must be at least 1, got {value}", option=name, found=value)
        t = resolve_target(target)
        if gpu_memory is None and t.sm_arch is not None:
            raise EngineError("usage", f"--gpu-memory is needed for the GPU target {t.name}: the device memory the "
                              "bundle may take, e.g. 24GiB", option="gpu-memory")
        budget = parse_size(gpu_memory) if gpu_memory is not None else cpu_facts().free_bytes
        reserve = parse_size(context_reserve) if context_reserve else None
        if not Path(checkpoint).is_dir():
            raise EngineError("checkpoint_invalid", f"{checkpoint}: not a folder; expected a Hugging Face checkpoint "
                              "folder with config.json", path=str(checkpoint))
        cfg = parse_config(Path(checkpoint))
        check_kernel_shapes(contract_target(t.name), cfg, weight_format(precision).name)  # as `compile` does, first
        if max_in + max_out > cfg.max_position_embeddings:
            raise EngineError("usage", f"max input + output tokens ({max_in + max_out}) exceed the model's "
                              f"{cfg.max_position_embeddings} positions", limit=cfg.max_position_embeddings)
        tiers = plan_tiers(cfg, weight_format(precision).name, budget, t.name, page_size, max_input_tokens=max_in,
                           max_output_tokens=max_out, context_reserve_bytes=reserve)
    except EngineError as e:
        fail(e, as_json)

    def compile_args(limits) -> list[str]:  # every Limits field but num_pages, which compile derives
        args = ["--precision", precision, "--target", t.name] + [
            a for k, v in asdict(limits).items() if k != "num_pages" for a in (f"--{k.replace('_', '-')}", str(v))]
        return args + (["--context-reserve", str(reserve)] if reserve is not None else [])

    if as_json:
        click.echo(json_text({"checkpoint": str(checkpoint), "gpu_memory_bytes": budget, "target": t.name,
                               "precision": weight_format(precision).name, "page_size": page_size,
                               "tiers": [{"tier": x.name, "limits": asdict(x.limits), "memory": asdict(x.memory),
                                          "compile_args": compile_args(x.limits)} for x in tiers]}))
        return
    click.echo(f"{checkpoint}: {cfg.family}, {cfg.param_count() / 1e6:.1f}M parameters\n"
               f"{t.name}{' (' + t.sm_arch + ')' if t.sm_arch else ''}, {weight_format(precision).name} weights, "
               f"{format_size(budget)} to fill, pages of {page_size} tokens")
    rows = [tuple(str(v) for v in r) for r in [TIER_COLUMNS, *tier_rows(tiers)]]
    widths = [max(len(r[i]) for r in rows) for i in range(len(TIER_COLUMNS))]
    for r in rows:
        click.echo("  ".join(v.ljust(w) if i == 0 else v.rjust(w) for i, (v, w) in enumerate(zip(r, widths))))
    largest = [x for x in tiers if x.name != "long"][-1]
    click.echo(f"(sizes rounded up; step: tokens per step; chunk: prefill chunk; input, output: tokens per "
               f"sequence)\nto build {largest.name}:")
    click.echo(wrap_command(["builder", "compile", str(checkpoint), "--catalog", "CATALOG",
                             *compile_args(largest.limits)]))


def wrap_command(words: list[str], width: int = 100) -> str:
    """A shell command broken with backslashes so that no line exceeds ``width`` (option and value kept together)."""
    import shlex

    parts, i = [], 0
    while i < len(words):  # "--option value" pairs stay on one line
        take = 2 if words[i].startswith("--") and i + 1 < len(words) and not words[i + 1].startswith("--") else 1
        parts.append(" ".join(shlex.quote(w) for w in words[i:i + take]))
        i += take
    lines, line = [], "  "
    for part in parts:
        if len(line) + len(part) + 3 > width and line.strip():
            lines.append(line + " \\")
            line = "      "
        line += ("" if not line.strip() else " ") + part
    return "\n".join([*lines, line])


@main.command()
@click.argument("bundle", type=click.Path())
@click.option("--kubernetes", is_flag=True, help="Write Kubernetes manifests (the one format so far; required).")
@click.option("--image", required=True, help="Container image running `runtime serve` (Dockerfile or Dockerfile.cuda).")
@click.option("--replicas", type=int, default=1, show_default=True, help="Pods; each GPU pod takes one whole GPU.")
@click.option("--name", default=None, help="Deployment and Service name  [default: toolcall-<target>-<precision>]")
@click.option("--namespace", default=None, help="Namespace to write into the manifests  [default: none, kubectl's]")
@click.option("--out", "out_file", type=click.Path(dir_okay=False), default=None,
              help="Write the YAML here (replaced if present)  [default: stdout]")
@click.option("--bundle-pvc", default=None, help="Mount the bundle from this PersistentVolumeClaim, read-only.")
@click.option("--bundle-subpath", default=None, help="With --bundle-pvc: the bundle's folder inside the claim.")
@click.option("--bundle-host-path", default=None, help="Mount the bundle from this folder on the node, read-only.")
@click.option("--bundle-in-image", default=None, help="The bundle is baked into --image at this absolute path.")
@click.option("--cpu", "cpu_request", default="2", show_default=True, help="CPU request (no CPU limit is set).")
@click.option("--host-overhead", default=None,
              help="Host memory besides the bundle, e.g. 1GiB  [default: 256MiB; GPU bundles 768MiB]")
@click.option("--startup-seconds", type=int, default=None,
              help="Time allowed for load + canary  [default: 120 s + the bundle files read twice at 100 MB/s]")
@click.option("--drain-seconds", type=int, default=30, show_default=True,
              help="Time SIGTERM's drain of admitted requests may take before the pod is killed.")
@click.option("--allow-shared-gpu", is_flag=True,
              help="Also place on time-sliced GPUs (GFD product '...-SHARED'); memory is then checked only at load.")
@click.option("--autoscale", default=None, metavar="MIN:MAX",
              help="Add a HorizontalPodAutoscaler between MIN and MAX replicas on the pods' waiting requests "
                   "(the Prometheus adapter rule it needs: README, \"Scaling out\"); the Deployment starts at MIN.")
@click.option("--waiting-per-pod", type=click.IntRange(1, 1 << 20), default=None,
              help="With --autoscale: the average of waiting requests a pod to hold  [default: the contract's "
                   "max_sequences]")
@click.option("--json", "as_json", is_flag=True, help="Print a typed error as JSON (the manifests stay YAML).")
def manifest(bundle, kubernetes, image, replicas, name, namespace, out_file, bundle_pvc, bundle_subpath,
             bundle_host_path, bundle_in_image, cpu_request, host_overhead, startup_seconds, drain_seconds,
             allow_shared_gpu, autoscale, waiting_per_pod, as_json):
    """Write a Deployment and a Service (multi-document YAML) that run BUNDLE only where its contract holds.

    \b
    Placement (GPU bundles), from contract.json on NVIDIA GPU Feature Discovery labels:
      nvidia.com/gpu.product           In the known products the contract's GPU names match
                                       (whole GPUs and MIG slices)
      nvidia.com/gpu.compute.major/minor      = the contract's compute capability
      nvidia.com/cuda.runtime-version.major/minor, cuda.driver-version.major >= its driver minimum
      nvidia.com/gpu.memory (MiB)      >= memory.total_bytes (a MIG slice's label is the slice's)
      nvidia.com/gpu.replicas          < 2: not time-sliced (unless --allow-shared-gpu)
    plus 1 nvidia.com/gpu. A CPU bundle goes anywhere, preferring nodes without GPUs.
    An unknown GPU name fails with `unplaceable` (exit 100) instead of a manifest that never schedules.

    \b
    The bundle is mounted read-only at /bundle; give exactly one of:
      --bundle-pvc CLAIM [--bundle-subpath DIR]  a PersistentVolumeClaim (ReadOnlyMany for replicas
                                                 on several nodes) holding the bundle folder
      --bundle-host-path /srv/bundles/NAME       a folder already on every candidate node
      --bundle-in-image /opt/bundle              no volume: the bundle was COPYed into --image

    \b
    Example:
      builder manifest artifacts/q06-nvfp4-h200 --kubernetes --image registry/toolcall-engine:cuda \\
        --bundle-pvc toolcall-bundles --bundle-subpath q06-nvfp4-h200 --replicas 4 --out deploy.yaml
      kubectl apply -f deploy.yaml
    """
    from toolcall.builder.autoscale import parse_range
    from toolcall.builder.manifest import BundleSource, ManifestOptions, bundle_manifests, to_yaml
    from toolcall.builder.memory_plan import parse_size

    try:
        if not kubernetes:
            raise EngineError("usage", "give --kubernetes: Kubernetes manifests are the one output format so far",
                              option="kubernetes")
        sources = [(k, v) for k, v in (("pvc", bundle_pvc), ("host_path", bundle_host_path),
                                        ("image", bundle_in_image)) if v is not None]
        if len(sources) != 1:
            raise EngineError("usage", "give exactly one of --bundle-pvc, --bundle-host-path, --bundle-in-image "
                              f"(where the pod finds the bundle); found {len(sources)}", option="bundle_pvc")
        (kind, value), = sources
        options = ManifestOptions(
            image=image, source=BundleSource(kind, value, bundle_subpath), name=name, namespace=namespace,
            replicas=replicas, cpu_request=cpu_request,
            host_overhead_bytes=parse_size(host_overhead) if host_overhead is not None else None,
            startup_seconds=startup_seconds, drain_seconds=drain_seconds, allow_shared_gpu=allow_shared_gpu,
            autoscale=parse_range(autoscale) if autoscale is not None else None, waiting_per_pod=waiting_per_pod)
        if waiting_per_pod is not None and autoscale is None:
            raise EngineError("usage", "--waiting-per-pod goes with --autoscale", option="waiting_per_pod")
        contract, docs = bundle_manifests(bundle, options)
        text = to_yaml(contract, docs)
    except EngineError as e:
        fail(e, as_json)
    if out_file is None:
        click.echo(text, nl=False)
    else:
        from pathlib import Path

        try:
            Path(out_file).write_text(text)
        except OSError as e:
            fail(EngineError("usage", f"cannot write {out_file}: {e.strerror}; choose a writable --out",
                             path=str(out_file)), as_json)
        kinds = " and ".join(", ".join(d["kind"] for d in docs).rsplit(", ", 1))
        click.echo(f"wrote {out_file}: {kinds} {docs[0]['metadata']['name']} "
                   f"({contract.target.name}, {contract.precision.weights}, {replicas} replicas)", err=True)
