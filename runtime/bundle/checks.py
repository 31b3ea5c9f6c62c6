"""The contract against what it describes: checks a consistent forgery (hashes and bundle_id
recomputed) or a faulty builder cannot pass, run at load after the hash checks.

- weights: tensor names, dtypes and shapes in weights.safetensors (its header only, nothing
  else is read) equal ``weight_specs(model, precision.weights)``, and their bytes
  ``memory.weights_bytes``;
- limits: against the model's positions and each other (a sequence fits the pool, a step's rows
  hold every sequence);
- memory: ``kv_pool_bytes`` is what ``num_pages`` pages take, ``workspace_bytes`` what steps of
  ``max_tokens_per_step`` rows take (runtime/bundle/layout.py's formulas, the builder's memory plan too);
- grammar: grammar.msgpack's numbers equal the contract's grammar section;
- kernels (GPU bundles): each kernels/*.cubin's kernels take the parameters the sources this runtime
  launches with declare (their layouts read from the cubin: kernels/cubin.py): a bundle compiled from
  other kernel sources is refused, not launched;
- canary: ids inside the vocabulary, lengths inside the limits, answers the grammar allows,
  one recorded step per answer token.

Each failure is a ``Refusal("bundle_invalid")`` naming the file, the expected and the found value.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from toolcall.common.errors import Refusal, RequestError
from toolcall.kernels.cubin import declared_layout, param_layouts
from toolcall.kernels.declarations import declaration, declarations
from toolcall.runtime.bundle.contract import CONTRACT_FILE, Contract
from toolcall.runtime.bundle.files import KERNELS_DIR
from toolcall.runtime.bundle.layout import kv_pool_bytes, weight_specs, weights_bytes, workspace_breakdown
from toolcall.runtime.bundle.tensor_file import SafetensorsFile
from toolcall.runtime.grammar.stepper import GrammarStepper
from toolcall.runtime.grammar.trie import Grammar

# The contract's grammar fields and the Grammar.summary() keys they must equal.
GRAMMAR_FIELDS = {"num_tools": "num_tools", "bitset_bits": "bitset_bits", "nodes": "num_nodes",
                  "edges": "num_edges", "max_edges_per_node": "max_edges_per_node",
                  "sep_token_id": "sep_token_id", "end_token_id": "end_token_id", "max_tools": "max_tools",
                  "allow_empty": "allow_empty"}
# The loosest canary tolerance this runtime accepts (logit units): a contract may state a tighter
# one, never a looser (a tolerance raised by an editor would let changed weights pass).
MAX_LOGIT_TOLERANCE = 0.1


def bundle_invalid(file: str, what: str, **details) -> Refusal:
    """The one error of this module: ``file`` disagrees with the contract in ``what``."""
    return Refusal("bundle_invalid", f"{file}: {what}; the bundle was written by a faulty builder or edited "
                   "with its hashes fixed up: rebuild it with `builder compile`", file=file, **details)


# -- the checks, in load order -------------------------------------------------------------------


def check_model(contract: Contract) -> None:
    """Sizes that make a model at all: heads divide, NVFP4 blocks fit, EOS ids inside the vocabulary."""
    m = contract.model
    if m.num_heads % m.num_kv_heads:
        raise bundle_invalid(CONTRACT_FILE, f"model.num_heads {m.num_heads} is not a multiple of num_kv_heads "
                             f"{m.num_kv_heads}", expected="a multiple", found=[m.num_heads, m.num_kv_heads])
    if m.head_dim % 2:
        raise bundle_invalid(CONTRACT_FILE, f"model.head_dim {m.head_dim} is odd; rotary embeddings need pairs",
                             found=m.head_dim)
    bad = [e for e in m.eos_token_ids if e >= m.vocab_size]
    if bad:
        raise bundle_invalid(CONTRACT_FILE, f"model.eos_token_ids {bad} outside the vocabulary [0, {m.vocab_size})",
                             expected=m.vocab_size, found=bad)
    fmt = contract.precision.weight_format
    odd = {n: s for n, s in m.linear_shapes().items() if s[1] % fmt.stored_multiple}
    if odd:
        raise bundle_invalid(CONTRACT_FILE, f"{fmt.name} weights need input dimensions that are multiples of "
                             f"{fmt.stored_multiple}; {', '.join(odd)} are not",
                             found={k: list(v) for k, v in odd.items()})


def check_weights(folder: Path, contract: Contract, file: str = "weights.safetensors") -> None:
    """Names, dtypes and shapes in file order equal weight_specs; data bytes equal memory.weights_bytes."""
    expected = weight_specs(contract.model, contract.precision.weight_format)
    with SafetensorsFile(folder / file, error_code="bundle_invalid") as st:
        infos = sorted(st.tensors.values(), key=lambda i: i.begin)
        data_bytes = st.data_bytes
    found = [(i.name, i.dtype, tuple(i.shape)) for i in infos]
    for i, (exp, got) in enumerate(zip(expected, found)):
        if exp != got:
            raise bundle_invalid(file, f"tensor {i} is {got[0]} {got[1]}{list(got[2])}, expected {exp[0]} {exp[1]}"
                                 f"{list(exp[2])} for {contract.precision.weights} weights of the contract's model",
                                 tensor=got[0], expected=[exp[0], exp[1], list(exp[2])],
                                 found=[got[0], got[1], list(got[2])])
    if len(found) != len(expected):
        names = {n for n, _, _ in found} ^ {n for n, _, _ in expected}
        raise bundle_invalid(file, f"{len(found)} tensors, the contract's model needs {len(expected)} (differing: "
                             f"{', '.join(sorted(names)[:5])})", expected=len(expected), found=len(found))
    tensor_bytes = sum(i.nbytes for i in infos)
    if not data_bytes == tensor_bytes == contract.memory.weights_bytes:
        raise bundle_invalid(file, f"data section {data_bytes} bytes, tensors {tensor_bytes} bytes, contract "
                             f"memory.weights_bytes {contract.memory.weights_bytes}: all three must be equal",
                             expected=contract.memory.weights_bytes, found=data_bytes, tensor_bytes=tensor_bytes)


def check_limits(contract: Contract) -> None:
    """Limits the model and the pool can honour."""
    lim, m = contract.limits, contract.model
    span = lim.max_input_tokens + lim.max_output_tokens
    if span > m.max_position_embeddings:
        raise bundle_invalid(CONTRACT_FILE, f"limits.max_input_tokens + max_output_tokens = {span} exceeds the "
                             f"model's {m.max_position_embeddings} positions", expected=m.max_position_embeddings,
                             found=span)
    if lim.num_pages < lim.pages_per_sequence:
        raise bundle_invalid(CONTRACT_FILE, f"limits.num_pages {lim.num_pages} cannot hold one sequence of "
                             f"{lim.max_input_tokens}+{lim.max_output_tokens} tokens ({lim.pages_per_sequence} "
                             "pages)", expected=lim.pages_per_sequence, found=lim.num_pages)
    if lim.max_sequences > lim.num_pages:  # every admitted sequence reserves at least one page
        raise bundle_invalid(CONTRACT_FILE, f"limits.max_sequences {lim.max_sequences} exceeds the pool's "
                             f"{lim.num_pages} pages; each sequence holds at least one", expected=lim.num_pages,
                             found=lim.max_sequences)
    if lim.max_tokens_per_step < lim.max_sequences or lim.prefill_chunk > lim.max_tokens_per_step:
        raise bundle_invalid(CONTRACT_FILE, f"limits.max_tokens_per_step {lim.max_tokens_per_step} must hold "
                             f"max_sequences {lim.max_sequences} decode rows and prefill_chunk {lim.prefill_chunk}",
                             found=[lim.max_tokens_per_step, lim.max_sequences, lim.prefill_chunk])


def check_memory(contract: Contract) -> None:
    """memory.kv_pool_bytes and weights_bytes are what the limits and the model take."""
    lim, mem = contract.limits, contract.memory
    kv = kv_pool_bytes(contract.model, lim.num_pages, lim.page_size, contract.precision.kv_format)
    if kv != mem.kv_pool_bytes:
        raise bundle_invalid(CONTRACT_FILE, f"memory.kv_pool_bytes {mem.kv_pool_bytes}, but {lim.num_pages} pages "
                             f"of {lim.page_size} tokens take {kv} bytes", expected=kv, found=mem.kv_pool_bytes)
    ws = sum(workspace_breakdown(contract.model, lim, contract.candidate_columns, contract.target.name).values())
    if ws != mem.workspace_bytes:
        raise bundle_invalid(CONTRACT_FILE, f"memory.workspace_bytes {mem.workspace_bytes}, but steps of "
                             f"{lim.max_tokens_per_step} rows take {ws} bytes with this runtime's step buffers (a "
                             "contract edited, or written by a builder of other buffers: rebuild the bundle)",
                             expected=ws, found=mem.workspace_bytes)
    reserve = contract.engine.build_options.context_reserve_bytes
    if reserve is not None and reserve != mem.context_reserve_bytes:
        raise bundle_invalid(CONTRACT_FILE, f"memory.context_reserve_bytes {mem.context_reserve_bytes}, but the "
                             f"build options asked for {reserve}", expected=reserve, found=mem.context_reserve_bytes)
    w = weights_bytes(contract.model, contract.precision.weight_format)
    if w != mem.weights_bytes:
        raise bundle_invalid(CONTRACT_FILE, f"memory.weights_bytes {mem.weights_bytes}, but the model's "
                             f"{contract.precision.weights} weights take {w} bytes", expected=w,
                             found=mem.weights_bytes)


def check_grammar(grammar: Grammar, contract: Contract, file: str = "grammar.msgpack") -> None:
    """grammar.msgpack's numbers equal the contract's grammar section; its tokens lie in the vocabulary."""
    summary, section = grammar.summary(), contract.grammar
    for field, key in GRAMMAR_FIELDS.items():
        if getattr(section, field) != summary[key]:
            raise bundle_invalid(file, f"{key} is {summary[key]}, the contract's grammar.{field} says "
                                 f"{getattr(section, field)}", field=field, expected=getattr(section, field),
                                 found=summary[key])
    if grammar.end_token_id not in contract.model.eos_token_ids:
        raise bundle_invalid(file, f"end token {grammar.end_token_id} is not one of the model's EOS ids "
                             f"{list(contract.model.eos_token_ids)}", found=grammar.end_token_id,
                             expected=list(contract.model.eos_token_ids))
    top = int(grammar.edge_token.max()) if grammar.num_edges else 0
    if max(top, grammar.sep_token_id) >= contract.model.vocab_size:
        raise bundle_invalid(file, f"token id {max(top, grammar.sep_token_id)} outside the model's vocabulary "
                             f"[0, {contract.model.vocab_size})", expected=contract.model.vocab_size,
                             found=max(top, grammar.sep_token_id))


def check_canary(contract: Contract, grammar: Grammar, vocab: int) -> None:
    """Canary ids inside [0, vocab), lengths inside the limits, answers the grammar allows, one
    recorded step (best candidate first, finite logits) per answer token."""
    c, lim = contract.canary, contract.limits
    if c.logit_tolerance > MAX_LOGIT_TOLERANCE:
        raise bundle_invalid(CONTRACT_FILE, f"canary.logit_tolerance {c.logit_tolerance} is looser than this runtime's "
                             f"{MAX_LOGIT_TOLERANCE} logits", expected=MAX_LOGIT_TOLERANCE, found=c.logit_tolerance)
    for k, p in enumerate(c.prompts):
        where = f"canary.prompts[{k}]"
        for field, ids in (("prompt_token_ids", p.prompt_token_ids), ("expected_token_ids", p.expected_token_ids)):
            bad = [t for t in ids if not 0 <= t < vocab]
            if bad:
                raise bundle_invalid(CONTRACT_FILE, f"{where}.{field} holds ids {bad[:8]} outside the vocabulary "
                                     f"[0, {vocab})", field=field, vocab_size=vocab, bad_ids=bad[:8])
        if len(p.prompt_token_ids) > lim.max_input_tokens or len(p.expected_token_ids) > lim.max_output_tokens:
            raise bundle_invalid(CONTRACT_FILE, f"{where} of {len(p.prompt_token_ids)}+{len(p.expected_token_ids)} "
                                 f"tokens exceeds the limits {lim.max_input_tokens}+{lim.max_output_tokens}",
                                 expected=[lim.max_input_tokens, lim.max_output_tokens],
                                 found=[len(p.prompt_token_ids), len(p.expected_token_ids)])
        if len(p.steps) != len(p.expected_token_ids):
            raise bundle_invalid(CONTRACT_FILE, f"{where} records {len(p.steps)} steps for "
                                 f"{len(p.expected_token_ids)} answer tokens", expected=len(p.expected_token_ids),
                                 found=len(p.steps))
        stepper = GrammarStepper(grammar)
        state = stepper.initial_state()
        for position, (token, step) in enumerate(zip(p.expected_token_ids, p.steps)):
            values = np.asarray(step.logits, np.float64)
            if (len(step.token_ids) != len(step.logits) or len(step.token_ids) > c.top_k
                    or step.token_ids[0] != token or not np.isfinite(values).all()
                    or (np.diff(values) > 0).any()):
                raise bundle_invalid(CONTRACT_FILE, f"{where}.steps[{position}] must list at most top_k {c.top_k} "
                                     f"candidates, best first, with as many finite logits, the first being the "
                                     f"answer token {token}", position=position,
                                     found=[list(step.token_ids), [float(v) for v in step.logits]])
            try:
                state = stepper.advance(state, token)
            except RequestError as e:
                raise bundle_invalid(CONTRACT_FILE, f"{where}.expected_token_ids[{position}] = {token} is not "
                                     f"allowed by the grammar there ({e.message})", position=position,
                                     token=token) from None


def check_cubin(file: str, data: bytes, kernels: list[str]) -> None:
    """Refuses (bundle_invalid) a cubin whose kernels take other parameters than the sources this runtime launches
    with declare: a bundle compiled from other kernel sources. Bytes that are no ELF are left to ``gpu.load``."""
    found = param_layouts(data)
    if not found:
        return
    for fn in kernels:
        want, got = declared_layout([p.kind for p in declaration(fn).params]), found.get(fn)
        if got != want:
            takes = "no such kernel" if got is None else f"{len(got)} parameters ({sum(s for _, s in got)} bytes)"
            raise Refusal("bundle_invalid", f"{KERNELS_DIR}/{file}.cubin: kernel {fn} takes {takes}, this runtime "
                          f"launches it with {len(want)} ({sum(s for _, s in want)} bytes): the bundle was built from "
                          "other kernel sources; rebuild it", file=f"{KERNELS_DIR}/{file}.cubin", kernel=fn,
                          expected=[list(x) for x in want], found=None if got is None else [list(x) for x in got])


def check_kernels(folder: Path, contract: Contract) -> None:
    """Every kernels/*.cubin of a GPU bundle against the declarations of the kernels it holds (check_cubin)."""
    for name in sorted(n for n in contract.files if n.startswith(KERNELS_DIR + "/") and n.endswith(".cubin")):
        stem = name[len(KERNELS_DIR) + 1:-len(".cubin")]
        check_cubin(stem, (folder / name).read_bytes(), [fn for fn, d in declarations().items() if d.file == stem])


def check_consistency(folder: str | Path, contract: Contract, grammar: Grammar | None = None) -> Grammar:
    """Every check of this module, in order; returns the bundle's Grammar (read if not given)."""
    folder = Path(folder)
    check_model(contract)
    check_limits(contract)
    check_memory(contract)
    check_weights(folder, contract)
    check_kernels(folder, contract)
    if grammar is None:
        grammar = Grammar.read(folder / "grammar.msgpack")
    check_grammar(grammar, contract)
    check_canary(contract, grammar, contract.model.vocab_size)
    return grammar


def canary_mismatch(prompt, token_ids: list[int], step_logits, step_candidates, tolerance: float) -> dict | None:
    """Where a run of one canary prompt departs from its record, as Refusal details; None if it
    matches: the same tokens, and at each step every recorded candidate allowed with a logit
    within ``tolerance`` of the recorded one. ``step_logits``/``step_candidates``: Result's."""
    expected = list(prompt.expected_token_ids)
    if token_ids != expected:
        return {"what": "tokens", "expected": expected, "found": list(token_ids)}
    for position, token, value, found in recorded_logits(prompt, step_logits, step_candidates):
        if found is None or not abs(found - value) <= tolerance:
            return {"what": "logits", "step": position, "token": token, "expected": value, "found": found,
                    "tolerance": tolerance}
    return None


def recorded_logits(prompt, step_logits, step_candidates):
    """(step, token, recorded logit, this run's logit or None where the token was not a candidate) of every
    candidate a canary prompt recorded, step by step. ``step_logits``/``step_candidates``: Result's."""
    for position, step in enumerate(prompt.steps):
        got = dict(zip(np.asarray(step_candidates[position]).tolist(), np.asarray(step_logits[position]).tolist()))
        for token, value in zip(step.token_ids, step.logits):
            found = got.get(int(token))
            yield position, int(token), float(value), None if found is None else float(found)
