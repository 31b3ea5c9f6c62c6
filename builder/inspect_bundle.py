"""Looking inside a built bundle: ``builder inspect`` (what the contract says) and ``builder
verify`` (whether the files say the same).

verify runs the runtime's own checks first (contract present, schema, format version, file
sizes and hashes, bundle_id; ``runtime/bundle.py``), then what hashes cannot catch: a bundle
whose files hash right but disagree with their contract, as a faulty builder would write it.
Each of those is an ``InconsistentBundle`` (code ``bundle_invalid``) naming the file, the
expected and the found value.
"""
from __future__ import annotations

import struct
from pathlib import Path

from tokenizers import Tokenizer

from runtime.bundle import (GRAMMAR_FILE, KERNELS_DIR, TOKENIZER_FILE, WEIGHTS_FILE, check_files,
                            read_contract)
from runtime.contract import CPU_TARGET, CONTRACT_FILE, Contract
from common.errors import EngineError, RequestError
from runtime.grammar import Grammar
from runtime.grammar_stepper import GrammarStepper
from runtime.tensor_file import SafetensorsFile

from .memory_plan import format_size, kv_pool_bytes
from .quantize import output_specs

SHA_PREFIX = 12  # hex digits of a file's sha256 shown in the table
# The contract's grammar fields and the Grammar.summary() keys they must equal.
GRAMMAR_FIELDS = {"num_tools": "num_tools", "bitset_bits": "bitset_bits", "nodes": "num_nodes",
                  "edges": "num_edges", "max_edges_per_node": "max_edges_per_node",
                  "sep_token_id": "sep_token_id", "end_token_id": "end_token_id", "max_tools": "max_tools",
                  "allow_empty": "allow_empty"}
# CUDA cubins are ELF files: e_machine EM_CUDA; with ELF ABI version >= 8 (CUDA 12.8+) bits
# 8..15 of e_flags hold the SM number (0x5a = sm_90), before that bits 0..7 did.
ELF_MAGIC = b"\x7fELF"
EM_CUDA = 190
REQUIRED_FILES = (WEIGHTS_FILE, TOKENIZER_FILE, GRAMMAR_FILE)
CHECKS = ("schema", "hashes", "weights", "memory", "grammar", "canary", "kernels")


class InconsistentBundle(EngineError):
    """A bundle file that hashes right but disagrees with the contract (code ``bundle_invalid``)."""

    def __init__(self, file: str, what: str, **details):
        super().__init__("bundle_invalid", f"{file}: {what}; the bundle was written by a faulty builder or "
                         "edited with its hashes fixed up: rebuild it with `builder compile`", file=file, **details)


# -- inspect ------------------------------------------------------------------------------------


def inspect_bundle(folder: str | Path) -> dict:
    """contract.json's sections as they are (``files`` as a list, name order) plus the bundle
    path, its id and the files' total bytes; reads only contract.json (schema-checked)."""
    d = read_contract(folder).to_dict()
    files = [{"name": name, **entry} for name, entry in sorted(d.pop("files").items())]
    return {"bundle": str(folder), "bundle_id": d["engine"]["bundle_id"], **d, "files": files,
            "files_bytes": sum(f["bytes"] for f in files)}


def format_inspection(info: dict) -> str:
    """``inspect_bundle``'s dict as aligned text tables."""
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
            ("canary", f"{len(c['prompt_token_ids'])} prompt tokens -> {c['expected_token_ids']}, "
                       f"min margin {c['min_margin']:.4g}")]
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
    check_files(folder, contract)  # sizes, sha256, bundle_id
    _check_listing(folder, contract)
    _check_weights(folder, contract)
    _check_memory(contract)
    grammar = _check_grammar(folder, contract)
    _check_canary(folder, contract, grammar)
    _check_kernels(folder, contract)
    return contract


def _check_listing(folder: Path, contract: Contract) -> None:
    """The files every bundle has are listed; nothing in the folder is unlisted."""
    for name in REQUIRED_FILES:
        if name not in contract.files:
            raise InconsistentBundle(CONTRACT_FILE, f"files does not list {name}; every bundle has "
                                     f"{', '.join(REQUIRED_FILES)}", missing=name)
    listed = set(contract.files) | {CONTRACT_FILE}
    extra = sorted(str(p.relative_to(folder)) for p in folder.rglob("*") if p.is_file()
                   and str(p.relative_to(folder)) not in listed)
    if extra:
        raise InconsistentBundle(extra[0], f"not listed in the contract's files ({len(extra)} unlisted: "
                                 f"{', '.join(extra[:5])})", unlisted=extra)


def _check_weights(folder: Path, contract: Contract) -> None:
    """Tensor names, dtypes and shapes in file order equal output_specs; data bytes equal the plan."""
    expected = [(n, d, tuple(s)) for n, d, s in output_specs(contract.model, contract.precision.weights)]
    with SafetensorsFile(folder / WEIGHTS_FILE) as st:
        infos = sorted(st.tensors.values(), key=lambda i: i.begin)
        found = [(i.name, i.dtype, tuple(i.shape)) for i in infos]
    with open(folder / WEIGHTS_FILE, "rb") as fh:  # data section: after the u64 header length and the header
        (header_bytes,) = struct.unpack("<Q", fh.read(8))
    data_bytes = (folder / WEIGHTS_FILE).stat().st_size - 8 - header_bytes
    for i, (exp, got) in enumerate(zip(expected, found)):
        if exp != got:
            raise InconsistentBundle(WEIGHTS_FILE, f"tensor {i} is {got[0]} {got[1]}{list(got[2])}, expected "
                                     f"{exp[0]} {exp[1]}{list(exp[2])} for {contract.precision.weights} weights of "
                                     "the contract's model", tensor=got[0], expected=[exp[0], exp[1], list(exp[2])],
                                     found=[got[0], got[1], list(got[2])])
    if len(found) != len(expected):
        names = {n for n, _, _ in found} ^ {n for n, _, _ in expected}
        raise InconsistentBundle(WEIGHTS_FILE, f"{len(found)} tensors, the contract's model needs {len(expected)} "
                                 f"(differing: {', '.join(sorted(names)[:5])})", expected=len(expected),
                                 found=len(found))
    tensor_bytes = sum(i.nbytes for i in infos)
    if not data_bytes == tensor_bytes == contract.memory.weights_bytes:
        raise InconsistentBundle(WEIGHTS_FILE, f"data section {data_bytes} bytes, tensors {tensor_bytes} bytes, "
                                 f"contract memory.weights_bytes {contract.memory.weights_bytes}: all three must be "
                                 "equal", expected=contract.memory.weights_bytes, found=data_bytes,
                                 tensor_bytes=tensor_bytes)


def _check_memory(contract: Contract) -> None:
    lim = contract.limits
    kv = kv_pool_bytes(contract.model, lim.num_pages, lim.page_size)
    if kv != contract.memory.kv_pool_bytes:
        raise InconsistentBundle(CONTRACT_FILE, f"memory.kv_pool_bytes {contract.memory.kv_pool_bytes}, but "
                                 f"{lim.num_pages} pages of {lim.page_size} tokens take {kv} bytes",
                                 expected=kv, found=contract.memory.kv_pool_bytes)
    if lim.num_pages < lim.pages_per_sequence:
        raise InconsistentBundle(CONTRACT_FILE, f"limits.num_pages {lim.num_pages} cannot hold one sequence of "
                                 f"{lim.max_input_tokens}+{lim.max_output_tokens} tokens ({lim.pages_per_sequence} "
                                 "pages)", expected=lim.pages_per_sequence, found=lim.num_pages)


def _check_grammar(folder: Path, contract: Contract) -> Grammar:
    grammar = Grammar.read(folder / GRAMMAR_FILE)  # Refusal bundle_invalid if malformed
    summary, section = grammar.summary(), contract.to_dict()["grammar"]
    for field, key in GRAMMAR_FIELDS.items():
        if section[field] != summary[key]:
            raise InconsistentBundle(GRAMMAR_FILE, f"{key} is {summary[key]}, the contract's grammar.{field} says "
                                     f"{section[field]}", field=field, expected=section[field], found=summary[key])
    if grammar.end_token_id not in contract.model.eos_token_ids:
        raise InconsistentBundle(GRAMMAR_FILE, f"end token {grammar.end_token_id} is not one of the model's EOS ids "
                                 f"{list(contract.model.eos_token_ids)}", found=grammar.end_token_id,
                                 expected=list(contract.model.eos_token_ids))
    return grammar


def _check_canary(folder: Path, contract: Contract, grammar: Grammar) -> None:
    """Canary ids lie in the tokenizer's and the model's vocabulary; the answer follows the grammar."""
    vocab = min(contract.model.vocab_size,
                Tokenizer.from_file(str(folder / TOKENIZER_FILE)).get_vocab_size(with_added_tokens=True))
    c = contract.canary
    for field, ids in (("prompt_token_ids", c.prompt_token_ids), ("expected_token_ids", c.expected_token_ids)):
        bad = [t for t in ids if not 0 <= t < vocab]
        if bad:
            raise InconsistentBundle(CONTRACT_FILE, f"canary.{field} holds ids {bad[:8]} outside the vocabulary "
                                     f"[0, {vocab})", field=field, vocab_size=vocab, bad_ids=bad[:8])
    if len(c.prompt_token_ids) > contract.limits.max_input_tokens or \
            len(c.expected_token_ids) > contract.limits.max_output_tokens:
        raise InconsistentBundle(CONTRACT_FILE, f"canary of {len(c.prompt_token_ids)}+{len(c.expected_token_ids)} "
                                 f"tokens exceeds the limits {contract.limits.max_input_tokens}+"
                                 f"{contract.limits.max_output_tokens}")
    stepper = GrammarStepper(grammar)
    state = stepper.initial_state()
    for position, token in enumerate(c.expected_token_ids):
        try:
            state = stepper.advance(state, token)
        except RequestError as e:
            raise InconsistentBundle(CONTRACT_FILE, f"canary.expected_token_ids[{position}] = {token} is not "
                                     f"allowed by the grammar there ({e.message})", position=position,
                                     token=token) from None


def cubin_sm(data: bytes) -> int | None:
    """The SM number (90 for sm_90) in a cubin's ELF header, or None if it is not a CUDA ELF."""
    if len(data) < 52 or data[:4] != ELF_MAGIC or data[4] != 2:  # 64-bit ELF only
        return None
    (machine,) = struct.unpack_from("<H", data, 18)
    (flags,) = struct.unpack_from("<I", data, 48)
    if machine != EM_CUDA:
        return None
    return (flags >> 8) & 0xFF if data[8] >= 8 else flags & 0xFF


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
            sm = cubin_sm(fh.read(64)) if name.endswith(".cubin") else None
        if sm != want:
            raise InconsistentBundle(name, f"compiled for {'sm_' + str(sm) if sm else 'no CUDA architecture'}, the "
                                     f"contract's target needs {contract.target.sm_arch}",
                                     expected=contract.target.sm_arch, found=None if sm is None else f"sm_{sm}")
