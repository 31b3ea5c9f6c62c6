"""Looking inside a built bundle: ``builder inspect`` (what the contract says, and the build
report's catalog probe) and ``builder verify`` (whether the files say the same).

verify runs the runtime's own checks (contract present, schema, format version, required files
listed, sizes and hashes, bundle_id over the contract; ``runtime/bundle/files.py``; then the contract
against its files, ``runtime/bundle/checks.py``: what hashes cannot catch, a consistent forgery or
a faulty builder), and two of its own: no unlisted file, kernels for the contract's architecture.
Each failure is code ``bundle_invalid`` naming the file, the expected and the found value.
"""
from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer

from toolcall.builder.memory_plan import format_size
from toolcall.common.errors import EngineError
from toolcall.kernels.cubin import sm_number
from toolcall.kernels.declarations import declaration
from toolcall.kernels.geometry import KERNEL_FAMILIES
from toolcall.runtime.bundle.checks import (
    check_canary,
    check_grammar,
    check_limits,
    check_memory,
    check_model,
    check_weights,
)
from toolcall.runtime.bundle.contract import CONTRACT_FILE, CPU_TARGET, Contract
from toolcall.runtime.bundle.files import (
    GRAMMAR_FILE,
    KERNELS_DIR,
    REPORT_FILE,
    TOKENIZER_FILE,
    check_files,
    read_contract,
)
from toolcall.runtime.cuda.modules import required_kernels
from toolcall.runtime.grammar.trie import Grammar

SHA_PREFIX = 12  # hex digits of a file's sha256 shown in the table
CHECKS = ("schema", "hashes", "model", "weights", "limits", "memory", "grammar", "canary", "kernels")


class InconsistentBundle(EngineError):
    """A bundle file that hashes right but disagrees with the contract (code ``bundle_invalid``)."""

    def __init__(self, file: str, what: str, **details):
        super().__init__("bundle_invalid", f"{file}: {what}; the bundle was written by a faulty builder or "
                         "edited with its hashes fixed up: rebuild it with `builder compile`", file=file, **details)


# -- inspect ------------------------------------------------------------------------------------


def inspect_bundle(folder: str | Path) -> dict:
    """contract.json's sections as they are (``files`` as a list, name order) plus the bundle
    path, its id, the files' total bytes, ``probe``: build-report.json's catalog probe (None
    where the report holds none: a bundle built before the probe) and ``gpu_kernels``: the kernel
    families whose cubins the bundle holds (``runtime --gpu-kernels``; empty for a CPU bundle). Reads
    contract.json (schema-checked) and build-report.json (informative: its hash is ``builder verify``'s check)."""
    d = read_contract(folder).to_dict()
    files = [{"name": name, **entry} for name, entry in sorted(d.pop("files").items())]
    return {"bundle": str(folder), "bundle_id": d["engine"]["bundle_id"], **d, "files": files,
            "files_bytes": sum(f["bytes"] for f in files), "probe": read_probe(Path(folder)),
            "gpu_kernels": gpu_kernel_families({f["name"] for f in files})}


def gpu_kernel_families(names: set[str]) -> list[str]:
    """The kernel families (kernels/geometry.py KERNEL_FAMILIES) every cubin of which is among the bundle file
    ``names``: what ``runtime --gpu-kernels`` may pick for this bundle (none for a CPU bundle)."""
    return [name for name, family in KERNEL_FAMILIES.items()
            if all(f"{KERNELS_DIR}/{declaration(fn).file}.cubin" in names for fn in required_kernels(family))]


def read_probe(folder: Path) -> dict | None:
    """build-report.json's ``probe`` object, or None when the file or the object is absent or unreadable."""
    try:
        report = json.loads((folder / REPORT_FILE).read_text())
    except (OSError, ValueError):  # ValueError: not UTF-8 or not JSON
        return None
    probe = report.get("probe") if isinstance(report, dict) else None
    return probe if isinstance(probe, dict) else None


def _count(n: int, noun: str) -> str:
    return f"{n or 'no'} {noun}{'' if n == 1 else 's'}"


def _probe(probe: dict | None) -> str:
    if probe is None:
        return "not recorded (build-report.json holds no probe: built before the catalog probe)"
    try:
        none = (f"none rate {probe['none_rate']:.2f} of {probe['no_tool_requests']} no-tool requests"
                if probe["empty_allowed"] else "no empty answer in this catalog")
        sampled = probe.get("catalog_tools", 0) > probe.get("sampled_tools", 0)  # absent: built before sampling
        of = f" (a seeded sample of {probe['catalog_tools']})" if sampled else ""
        text = (f"recall {probe['recall']:.2f} over {probe['tools']} tools{of}, {probe['distinct_answers']} distinct "
                f"answers, same answer for {probe['same_answer_share']:.2f} of tool requests, {none}; "
                f"{_count(len(probe['warnings']), 'warning')}")
    except (KeyError, TypeError, ValueError):
        return "unreadable (build-report.json's probe is not what this builder writes)"
    return text


def _margin(prompts: list[dict]) -> str:
    found = [p["min_margin"] for p in prompts if p["min_margin"] is not None]
    return f"{min(found):.4g}" if found else "none (every step forced)"


def format_inspection(info: dict, show_warnings: bool = True) -> str:
    """``inspect_bundle``'s dict as aligned text tables; ``show_warnings``: the probe's warnings as
    rows below its line (``builder compile`` prints them on stderr instead)."""
    t, p, lim, g, c = info["target"], info["precision"], info["limits"], info["grammar"], info["canary"]
    m = info["model"]
    target = t["name"] if t["sm_arch"] is None else (
        f"{t['name']} ({t['sm_arch']}, compute capability {t['compute_capability']}, gpu names "
        f"{', '.join(t['gpu_names']) or 'any'}, driver >= {t['min_driver_version']})")
    rows = [("bundle", info["bundle"]), ("bundle id", info["bundle_id"]),
            ("format", f"{info['format']['name']} v{info['format']['version']}, builder "
                       f"{info['engine']['builder_version']}"),
            ("model", f"{m['family']}, {m['num_layers']} layers, hidden {m['hidden_size']}, heads "
                      f"{m['num_heads']}/{m['num_kv_heads']} x {m['head_dim']}, vocab {m['vocab_size']}"),
            ("target", target),
            ("precision", f"weights {p['weights']}, embedding {p['embedding']}, kv cache {p['kv_cache']}, "
                          f"accumulation {p['accumulation']}"),
            ("limits", f"{lim['max_sequences']} sequences of {lim['max_input_tokens']}+{lim['max_output_tokens']} "
                       f"tokens; {lim['max_tokens_per_step']} tokens/step, prefill chunk {lim['prefill_chunk']}; "
                       f"{lim['num_pages']} pages x {lim['page_size']} tokens"),
            ("grammar", f"{g['num_tools']} tools, {g['nodes']} nodes, {g['edges']} edges, <= {g['max_edges_per_node']} "
                        f"edges/node, {g['bitset_bits']}-bit sets, <= {g['max_tools']} tools/answer, sep "
                        f"{g['sep_token_id']}, end {g['end_token_id']}{', empty allowed' if g['allow_empty'] else ''}"),
            ("canary", f"{len(c['prompts'])} prompts, first {len(c['prompts'][0]['prompt_token_ids'])} tokens -> "
                       f"{c['prompts'][0]['expected_token_ids']}; min margin "
                       f"{_margin(c['prompts'])}; logits within {c['logit_tolerance']} (top {c['top_k']})")]
    rt = info.get("request_tools")
    rows.append(("request tools", "none (the template has no {tools}: catalog names only)" if rt is None else
                 f"up to {rt['max_tools']} a request, descriptions <= {rt['max_description_tokens']} tokens"))
    if t["sm_arch"] is not None:
        rows.append(("gpu kernels", f"{', '.join(info['gpu_kernels']) or 'none'} (runtime --gpu-kernels; default fma)"))
    probe = info.get("probe")
    rows.append(("probe", _probe(probe)))
    found = probe.get("warnings") if isinstance(probe, dict) and show_warnings else None
    rows += [("", f"warning: {w}") for w in found if isinstance(w, str)] if isinstance(found, list) else []
    width = max(len(k) for k, _ in rows)
    lines = [f"{k:<{width}}  {v}" for k, v in rows]
    mem = info["memory"]
    lines += ["", f"{'memory':<16} {'bytes':>16} {'size':>10}"]
    for key, label in (("weights_bytes", "weights"), ("kv_pool_bytes", "kv pool"), ("workspace_bytes", "workspace"),
                       ("graphs_bytes", "graphs"), ("context_reserve_bytes", "context reserve"),
                       ("total_bytes", "total")):
        lines.append(f"{label:<16} {mem[key]:>16,} {format_size(mem[key]):>10}")
    name_width = max([len("file")] + [len(f["name"]) for f in info["files"]])
    lines += ["", f"{'file':<{name_width}} {'bytes':>14}  sha256"]
    lines += [f"{f['name']:<{name_width}} {f['bytes']:>14,}  {f['sha256'][:SHA_PREFIX]}" for f in info["files"]]
    lines.append(f"{'(all files)':<{name_width}} {info['files_bytes']:>14,}")
    return "\n".join(lines)


# -- verify -------------------------------------------------------------------------------------


def verify_bundle(folder: str | Path) -> Contract:
    """Every check in CHECKS order; returns the contract, or raises the first problem's EngineError."""
    folder = Path(folder)
    contract = read_contract(folder)  # schema, format version
    check_files(folder, contract)  # required files listed, sizes, sha256, bundle_id over the contract
    _check_listing(folder, contract)
    check_model(contract)
    check_weights(folder, contract)
    check_limits(contract)
    check_memory(contract)
    grammar = Grammar.read(folder / GRAMMAR_FILE)  # Refusal bundle_invalid if malformed
    check_grammar(grammar, contract)
    tokenizer = load_bundle_tokenizer(folder / TOKENIZER_FILE)
    check_canary(contract, grammar, min(contract.model.vocab_size, tokenizer.get_vocab_size(with_added_tokens=True)))
    _check_kernels(folder, contract)
    return contract


def load_bundle_tokenizer(path: Path) -> Tokenizer:
    try:
        return Tokenizer.from_str(path.read_bytes().decode("utf-8"))
    except Exception as e:  # tokenizers raises plain Exceptions for malformed files
        raise InconsistentBundle(TOKENIZER_FILE, f"not a tokenizer file ({type(e).__name__}: {str(e)[:200]})",
                                 reason=type(e).__name__) from None


def _check_listing(folder: Path, contract: Contract) -> None:
    """Nothing in the folder is unlisted (the runtime's check_files covers the required files)."""
    listed = set(contract.files) | {CONTRACT_FILE}
    extra = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()
                   and str(p.relative_to(folder)) not in listed)
    if extra:
        raise InconsistentBundle(extra[0], f"not listed in the contract's files ({len(extra)} unlisted: "
                                 f"{', '.join(extra[:5])})", unlisted=extra)


def _check_kernels(folder: Path, contract: Contract) -> None:
    """kernels/*.cubin exactly for GPU targets, each an ELF for the contract's SM architecture."""
    cubins = sorted(n for n in contract.files if n.startswith(KERNELS_DIR + "/"))
    if contract.target.name == CPU_TARGET or contract.target.sm_arch is None:
        if cubins:
            raise InconsistentBundle(cubins[0], f"a {contract.target.name} bundle carries kernels ({len(cubins)} "
                                     "files); only GPU targets have kernels/", found=cubins)
        return
    if not cubins:
        raise InconsistentBundle(KERNELS_DIR, f"a {contract.target.name} bundle ({contract.target.sm_arch}) has no "
                                 "kernels/*.cubin", expected=contract.target.sm_arch)
    want = int("".join(ch for ch in contract.target.sm_arch[3:] if ch.isdigit()))
    for name in cubins:
        with open(folder / name, "rb") as fh:
            sm = sm_number(fh.read(64)) if name.endswith(".cubin") else None
        if sm != want:
            raise InconsistentBundle(name, f"compiled for {'sm_' + str(sm) if sm else 'no CUDA architecture'}, the "
                                     f"contract's target needs {contract.target.sm_arch}",
                                     expected=contract.target.sm_arch, found=None if sm is None else f"sm_{sm}")
