"""``builder compile``: checkpoint + catalog → a bundle folder, written atomically and reproducibly.

read → grammar → limits and memory plan → quantize (streamed) → kernels → KV scales (a scaled KV cache) →
canary → catalog probe →
report → contract → rename into place. Nothing hashed holds a timestamp or a path, so the same inputs
and options give a byte-identical bundle; timings are returned to the caller instead.
"""
from __future__ import annotations

import dataclasses
import errno
import json
import os
import shutil
import time
from dataclasses import dataclass
from importlib import metadata
from pathlib import Path

from toolcall.builder.canary import record_canary, written_weights
from toolcall.builder.catalog import TOOLS_PLACEHOLDER, load_catalog
from toolcall.builder.checkpoint import open_checkpoint
from toolcall.builder.kernel_build import check_candidate_columns, check_kernel_shapes, compile_kernels, contract_target
from toolcall.builder.kv_calibration import HEADROOM, KvCacheReport, calibrate_kv_scales, check_against_bf16
from toolcall.builder.memory_plan import (
    default_context_reserve,
    default_prefill_chunks,
    default_step_tokens,
    plan_memory,
    prefix_pages,
    size_pool_for_budget,
)
from toolcall.builder.probe import Probe, probe_refusal, run_probe, tool_request
from toolcall.builder.probe_sample import SAMPLE_SIZE, sample_tools
from toolcall.builder.quantize import quantize_checkpoint
from toolcall.builder.trie import build_grammar
from toolcall.common.errors import BuildError, CatalogError
from toolcall.runtime.batching.prompt import TOKENIZATION, PromptEncoder
from toolcall.runtime.bundle.contract import (
    CONTRACT_FILE,
    FORMAT_NAME,
    FORMAT_VERSION,
    BuildOptions,
    Contract,
    EngineSection,
    Format,
    GrammarSection,
    Limits,
    Precision,
    PromptSection,
    RequestToolsSection,
    candidate_columns,
    compute_bundle_id,
)
from toolcall.runtime.bundle.file_kind import require_file
from toolcall.runtime.bundle.files import (
    GRAMMAR_FILE,
    KERNELS_DIR,
    REPORT_FILE,
    TOKENIZER_FILE,
    WEIGHTS_FILE,
    file_entry,
)
from toolcall.runtime.bundle.kv_scales import KV_SCALES_FILE
from toolcall.runtime.console import done as stage_done
from toolcall.runtime.console import stage
from toolcall.runtime.cpu.backend import kernels_cached
from toolcall.runtime.cpu.warm import NOTE as COLD_CACHE_NOTE_BUILD
from toolcall.runtime.cpu.warm import compile_kernels as compile_cpu_kernels

# Request-supplied tools (a template holding {tools}): most tools a request may bring (its grammar's root then
# has up to 65 edges: the sparse head's buffers widen to that) and most tokens of one description.
DEFAULT_MAX_REQUEST_TOOLS = 64
DEFAULT_MAX_DESCRIPTION_TOKENS = 256


@dataclass
class CompileResult:
    contract: Contract
    out_dir: Path
    timings: dict[str, float]  # seconds per stage (not in the bundle: it would break byte identity)
    source_bytes: int
    probe: Probe | None = None  # the catalog probe, as build-report.json's "probe" records it


def builder_version() -> str:
    try:
        return metadata.version("toolcall-engine")
    except metadata.PackageNotFoundError:
        return "0+unknown"


def resolve_defaults(options: BuildOptions, grammar, catalog=None) -> BuildOptions:
    """Fills the options left None: max_output_tokens (the grammar's longest answer), the context reserve, the
    prefill chunk and step rows (the target's first choice: ``fit_prefill_chunk`` may take a smaller one), and
    for a ``catalog`` whose template holds {tools} the request-supplied tools' limits (BuildError("usage") for
    such limits given with a template that has no {tools})."""
    changes = {}
    takes_tools = catalog is not None and TOOLS_PLACEHOLDER in catalog.template
    for name, default in (("max_request_tools", DEFAULT_MAX_REQUEST_TOOLS),
                          ("max_description_tokens", DEFAULT_MAX_DESCRIPTION_TOKENS)):
        if takes_tools and getattr(options, name) is None:
            changes[name] = default
        elif catalog is not None and not takes_tools and getattr(options, name) is not None:
            raise BuildError("usage", f"--{name.replace('_', '-')} limits tools that requests bring, which needs a "
                             f"catalog prompt_template holding {TOOLS_PLACEHOLDER}; the catalog's has none: add it "
                             "or drop the option", option=name)
    if options.max_output_tokens is None:
        changes["max_output_tokens"] = grammar.max_answer_tokens
    if options.context_reserve_bytes is None:
        changes["context_reserve_bytes"] = default_context_reserve(options.target)
    if options.prefill_chunk is None:
        changes["prefill_chunk"] = default_prefill_chunks(options.target, options.max_input_tokens)[0]
    if options.max_tokens_per_step is None:
        changes["max_tokens_per_step"] = default_step_tokens(options.target, changes.get("prefill_chunk",
                                                             options.prefill_chunk), options.max_sequences)
    return dataclasses.replace(options, **changes)


def fit_prefill_chunk(requested: BuildOptions, options: BuildOptions, cfg, columns: int,
                      pinned_pages: int = 0) -> tuple[Limits, BuildOptions]:
    """(limits, options) with the largest default prefill chunk whose step workspace leaves the memory budget room
    for a sequence, where ``requested`` (the options as given) names no chunk; else plan_limits' as given."""
    chunks = (default_prefill_chunks(options.target, options.max_input_tokens) if requested.prefill_chunk is None
              else (options.prefill_chunk,))
    for i, chunk in enumerate(chunks):
        step = options.max_tokens_per_step if requested.max_tokens_per_step is not None else \
            default_step_tokens(options.target, chunk, options.max_sequences)
        tried = dataclasses.replace(options, prefill_chunk=chunk, max_tokens_per_step=step)
        try:
            return plan_limits(tried, cfg, columns, pinned_pages), tried
        except BuildError as e:
            if e.code != "budget_too_small" or i == len(chunks) - 1:
                raise
    raise AssertionError("unreachable: the last chunk returns or raises")


def request_tools_section(catalog, options: BuildOptions) -> RequestToolsSection | None:
    """The contract's request_tools section: present when the catalog's template holds {tools}."""
    if TOOLS_PLACEHOLDER not in catalog.template:
        return None
    return RequestToolsSection(prompt_template=catalog.template, tool_format=catalog.tool_format,
                               max_tools=options.max_request_tools,
                               max_description_tokens=options.max_description_tokens)


def plan_limits(options: BuildOptions, cfg, columns: int, pinned_pages: int = 0) -> Limits:
    """Limits from the options, the KV pool sized for max_sequences (plus the prompt prefix's
    ``pinned_pages``) or fitted to the memory budget (the sparse head ``columns`` wide: candidate_columns)."""
    for name in ("max_sequences", "max_input_tokens", "max_output_tokens", "page_size", "max_tokens_per_step",
                 "prefill_chunk"):
        if getattr(options, name) < 1:
            raise BuildError("usage", f"--{name.replace('_', '-')} must be at least 1, got {getattr(options, name)}",
                             option=name, found=getattr(options, name))
    if options.max_tokens_per_step < options.max_sequences:
        raise BuildError("usage", f"--max-tokens-per-step {options.max_tokens_per_step} is below --max-sequences "
                         f"{options.max_sequences}: every answering sequence needs a row each step",
                         max_tokens_per_step=options.max_tokens_per_step, max_sequences=options.max_sequences)
    if options.max_input_tokens + options.max_output_tokens > cfg.max_position_embeddings:
        raise BuildError("usage", f"max input + output tokens ({options.max_input_tokens + options.max_output_tokens}) "
                         f"exceed the model's {cfg.max_position_embeddings} positions",
                         limit=cfg.max_position_embeddings)
    limits = Limits(page_size=options.page_size, num_pages=0, max_sequences=options.max_sequences,
                    max_tokens_per_step=options.max_tokens_per_step,
                    prefill_chunk=min(options.prefill_chunk, options.max_tokens_per_step),
                    max_input_tokens=options.max_input_tokens, max_output_tokens=options.max_output_tokens)
    if options.memory_budget_bytes is None:
        pages = options.max_sequences * limits.pages_per_sequence + pinned_pages
    else:
        pages = size_pool_for_budget(cfg, options.precision, limits, options.memory_budget_bytes, options.target,
                                     options.context_reserve_bytes, columns, pinned_pages, options.kv_format)
    return dataclasses.replace(limits, num_pages=pages)


def prompt_section(encoder: PromptEncoder, options: BuildOptions) -> PromptSection:
    """The contract's prompt section: the template's fixed prefix and suffix ids (``encoder``: the runtime's,
    runtime/batching/prompt.py) and the prefix's pages."""
    fixed = len(encoder.prefix_ids) + len(encoder.suffix_ids)
    if fixed >= options.max_input_tokens:
        raise BuildError("usage", f"the prompt template alone is {fixed} tokens ({len(encoder.prefix_ids)} before "
                         f"{{request}}, {len(encoder.suffix_ids)} after); --max-input-tokens {options.max_input_tokens} "
                         "leaves no room for a request: raise it", template_tokens=fixed,
                         max_input_tokens=options.max_input_tokens)
    n, page = len(encoder.prefix_ids), max(options.page_size, 1)  # page_size < 1: plan_limits refuses it
    return PromptSection(tokenization=TOKENIZATION, prefix_tokens=n, prefix_token_ids=encoder.prefix_ids,
                         suffix_token_ids=encoder.suffix_ids, shared_pages=n // page, prefix_pages=prefix_pages(n, page))


def compile_bundle(checkpoint: str | Path, catalog_path: str | Path, options: BuildOptions, out_dir: str | Path,
                   force: bool = False, progress=None, min_probe_recall: float | None = None,
                   probe_all: bool = False) -> CompileResult:
    """Builds the bundle into ``out_dir``; BuildError/CheckpointError/CatalogError on bad input;
    BuildError("probe_failed"), with no bundle written, when the catalog probe's recall is below
    ``min_probe_recall``. The probe and the canary's own requests try a seeded sample of the tools
    (builder/probe_sample.py), every tool with ``probe_all``."""
    out = Path(out_dir)
    check_out_path(out, {"checkpoint": Path(checkpoint), "catalog": Path(catalog_path)})
    if out.exists() and not force:
        raise BuildError("output_exists", f"{out} exists; pass --force to replace it or choose another --out",
                         path=str(out))
    timings: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        timings[name] = now - clock
        clock = now

    ckpt = open_checkpoint(checkpoint)
    cfg = ckpt.config
    tokenizer = ckpt.tokenizer()
    require_file(catalog_path, lambda msg, **d: CatalogError("catalog_invalid", msg, **d), "a tool catalog JSON file")
    catalog = load_catalog(catalog_path)
    grammar = build_grammar(catalog, tokenizer, cfg.eos_token_ids[0])
    target = contract_target(options.target)
    check_kernel_shapes(target, cfg, options.precision)
    kv_format = options.kv_format
    if kv_format.scaled and target.sm_arch:
        raise BuildError("usage", f"--kv-cache {kv_format.name} runs on the CPU target only: the GPU kernels keep K/V "
                         "in bf16; build this target with --kv-cache bf16", option="kv_cache", found=kv_format.name,
                         target=options.target)
    requested, options = options, resolve_defaults(options, grammar, catalog)
    request_tools = request_tools_section(catalog, options)
    check_candidate_columns(target, grammar.max_edges_per_node, options.max_request_tools)
    columns = candidate_columns(grammar.max_edges_per_node, request_tools)
    # Engine.encode's encoder (runtime/batching/prompt.py): the load re-encodes each canary request with it
    encoder = PromptEncoder.create(tokenizer, grammar.prompt_template)
    prompt = prompt_section(encoder, options)
    limits, options = fit_prefill_chunk(requested, options, cfg, columns, prompt.prefix_pages)
    memory = plan_memory(cfg, options.precision, limits, options.target, options.context_reserve_bytes, columns,
                         options.kv_format)
    lap("plan")

    claimed = False
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        if not force:  # the claim: one atomic mkdir, so a second build racing for this --out refuses now
            try:
                out.mkdir()
            except FileExistsError:
                raise BuildError("output_exists", f"{out} exists (another build claimed it); pass --force to "
                                 "replace it or choose another --out", path=str(out)) from None
            claimed = True
        tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    except OSError as e:
        if claimed:
            out.rmdir()
        raise _unwritable(out, e) from None
    try:
        quant = quantize_checkpoint(ckpt, cfg, options.precision, tmp / WEIGHTS_FILE, progress=progress)
        lap("quantize")
        ckpt.release_maps()  # the canary maps the written weights; the source's pages need not stay resident too
        shutil.copyfile(ckpt.folder / TOKENIZER_FILE, tmp / TOKENIZER_FILE)
        grammar.write(tmp / GRAMMAR_FILE)
        if target.sm_arch:
            stage(f"compiling kernels for {target.sm_arch}")
        kernels = compile_kernels(target, tmp / KERNELS_DIR)
        lap("kernels")
        descriptions = tuple(t.description for t in catalog.tools)
        weights = written_weights(tmp / WEIGHTS_FILE, cfg)  # mapped and checked once for every run below
        sample = sample_tools(catalog.names, None if probe_all else SAMPLE_SIZE)
        kv_scales = kv_report = None
        if kv_format.scaled:
            stage(f"calibrating the {kv_format.name} KV cache's scales")
            kv_scales, calibrated = calibrate_kv_scales(weights, cfg, grammar, limits, descriptions, encoder,
                                                        sample.tool_ids)
            kv_scales.write(tmp / KV_SCALES_FILE)
            stage_done()
            lap("kv_calibration")
        if not kernels_cached():  # a first build on this machine: numba compiles, two processes at once
            stage(COLD_CACHE_NOTE_BUILD)
            compile_cpu_kernels(tmp / WEIGHTS_FILE, tmp / GRAMMAR_FILE, cfg, limits, kv_format)
        stage("recording the canary")
        canary = record_canary(weights, cfg, grammar, limits, encoder.encode, kv_format, kv_scales,
                               tuple(tool_request(catalog.tools[t].name, descriptions[t]) for t in sample.tool_ids))
        if kv_format.scaled:
            change = check_against_bf16(canary, weights, cfg, grammar, limits)
            kv_report = KvCacheReport(kv_format.name, HEADROOM, calibrated,
                                      (float(kv_scales.k.min()), float(kv_scales.k.max())),
                                      (float(kv_scales.v.min()), float(kv_scales.v.max())), True, change)
        stage_done()
        lap("canary")
        stage("probing the catalog")
        probe = run_probe(weights, cfg, grammar, limits, descriptions, encoder, sample, kv_format,
                          kv_scales)
        stage_done()
        lap("probe")
        if min_probe_recall is not None and probe.recall < min_probe_recall:
            raise probe_refusal(probe, min_probe_recall)
        quant_report = quant.to_dict()
        quant_report.pop("timings")  # hashed content holds no timings: they go to the caller
        # The options and limits make a bundle that differs only in them (same weights, same
        # kernels) a different bundle, with its own bundle_id.
        report = {"quantization": quant_report, "kernels": kernels, "grammar": grammar.summary(),
                  "build_options": dataclasses.asdict(options), "target": dataclasses.asdict(target),
                  "limits": dataclasses.asdict(limits), "memory": dataclasses.asdict(memory),
                  "probe": probe.to_dict()}
        if kv_report is not None:
            report["kv_cache"] = kv_report.to_dict()
        (tmp / REPORT_FILE).write_text(json.dumps(report, indent=2, sort_keys=True, allow_nan=False) + "\n")
        files = {str(p.relative_to(tmp)): file_entry(p) for p in sorted(tmp.rglob("*")) if p.is_file()}
        s = grammar.summary()
        contract = Contract(
            format=Format(FORMAT_NAME, FORMAT_VERSION),
            engine=EngineSection("0" * 64, builder_version(), ckpt.sha256(), options),
            model=cfg, target=target, precision=Precision(weights=options.precision, kv_cache=kv_format.name),
            limits=limits, memory=memory,
            grammar=GrammarSection(num_tools=s["num_tools"], bitset_bits=s["bitset_bits"], nodes=s["num_nodes"],
                                   edges=s["num_edges"], max_edges_per_node=s["max_edges_per_node"],
                                   sep_token_id=s["sep_token_id"], end_token_id=s["end_token_id"],
                                   max_tools=s["max_tools"], allow_empty=s["allow_empty"]),
            canary=canary, prompt=prompt, files=files, request_tools=request_tools)
        contract = dataclasses.replace(contract, engine=dataclasses.replace(
            contract.engine, bundle_id=compute_bundle_id(contract)))
        (tmp / CONTRACT_FILE).write_text(contract.to_json())
        lap("write")
        _replace_dir(tmp, out, claimed)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if claimed:
            try:
                out.rmdir()  # our empty claim only; a finished bundle is never removed here
            except OSError:
                pass
        if isinstance(e, OSError):
            raise _unwritable(out, e) from None
        raise
    return CompileResult(contract, out, timings, ckpt.source_bytes(), probe)


def check_out_path(out: Path, inputs: dict[str, Path]) -> None:
    """BuildError("output_unsafe") when --out is, is inside, or holds an input: replacing it
    (with --force, or when a build fails) would delete what is being compiled."""
    o = Path(os.path.realpath(out))  # realpath, not resolve(): a symlink loop must not raise here
    for role, path in inputs.items():
        p = Path(os.path.realpath(path))
        relation = "is" if o == p else "is inside" if p in o.parents else "contains" if o in p.parents else None
        if relation:
            raise BuildError("output_unsafe", f"--out {out} {relation} the {role} {path}; a build replaces its "
                             "--out, which would destroy its own input (even with --force): choose another --out",
                             path=str(out), input=str(path), role=role, relation=relation)


def _unwritable(out: Path, e: OSError) -> BuildError:
    return BuildError("output_unwritable", f"cannot write the bundle at {out}: {e.strerror or e} "
                      f"({e.filename or out}); free disk space, fix permissions or choose another --out",
                      path=str(out), errno=e.errno, reason=e.strerror or str(e))


def _replace_dir(tmp: Path, out: Path, claimed: bool) -> None:
    """Renames the finished folder into place. ``claimed``: ``out`` is our own empty claim, which
    the rename replaces atomically (it fails if anything was written into it meanwhile);
    otherwise (--force) an old bundle goes only after the new one is in place."""
    if claimed:
        try:
            tmp.rename(out)
        except OSError as e:
            if e.errno in (errno.ENOTEMPTY, errno.EEXIST):
                raise BuildError("output_exists", f"{out} was filled by someone else during the build; the new "
                                 "bundle is not installed: choose another --out or pass --force",
                                 path=str(out)) from None
            raise
        return
    old = None
    if out.exists():
        old = out.parent / f".{out.name}.old-{os.getpid()}"
        out.rename(old)
    tmp.rename(out)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
