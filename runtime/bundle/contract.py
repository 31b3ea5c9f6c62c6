"""The contract: what a bundle promises, written by the builder, read by runtime and provisioners.

One frozen dataclass per section of ``contract.json``; ``Contract`` holds them. Serialization
is generic over dataclass fields (nested dataclasses, tuples as JSON lists, ``files`` as a dict
of ``FileEntry``), so adding a field to a dataclass and to ``schemas/contract.schema.json`` is
the whole change; ``tests/test_contract_schema.py`` keeps the two in step.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from functools import lru_cache

from jsonschema import Draft202012Validator

from toolcall.common.errors import Refusal
from toolcall.common.formats import KV_BF16, KV_FORMATS, WEIGHT_FORMATS, KvFormat, WeightFormat
from toolcall.runtime.bundle.model_config import ModelConfig
from toolcall.schemas.load import load_schema

FORMAT_NAME = "toolcall-bundle"
# 2: bundle_id covers the contract's own content; the canary records request texts, several
# prompts and each step's top-k logits. Version 1 bundles (bundle_id over the files alone) are
# refused: their contract could be edited without breaking any hash.
# 3: precision.kv_cache may be fp8_e4m3 (E4M3 codes with per-head scales in kv-scales.safetensors,
# build_options.kv_cache); version 2 bundles (bf16 cache, no such file) still load.
FORMAT_VERSION = 3
SUPPORTED_FORMAT_VERSIONS = range(2, FORMAT_VERSION + 1)

CPU_TARGET = "cpu"
CONTRACT_FILE = "contract.json"
OPTIONAL = {"optional": True}  # field metadata: omitted from JSON when None (see the module docstring)


@dataclass(frozen=True)
class Format:
    name: str
    version: int


@dataclass(frozen=True)
class BuildOptions:
    """The options ``builder compile`` was given (after defaults), enough to rebuild the bundle."""

    precision: str
    target: str
    max_sequences: int
    max_input_tokens: int
    max_output_tokens: int
    page_size: int  # tokens per KV page
    max_tokens_per_step: int
    prefill_chunk: int  # tokens
    memory_budget_bytes: int | None  # None: pool sized from max_sequences alone
    context_reserve_bytes: int
    seed: int
    max_request_tools: int | None = dataclasses.field(default=None, metadata=OPTIONAL)
    max_description_tokens: int | None = dataclasses.field(default=None, metadata=OPTIONAL)
    kv_cache: str | None = dataclasses.field(default=None, metadata=OPTIONAL)  # a KV format's name; None: bf16

    @property
    def kv_format(self) -> KvFormat:
        """The KV-cache format asked for (bf16 unless ``kv_cache`` names another)."""
        return KV_FORMATS.get(self.kv_cache or KV_BF16.name)


@dataclass(frozen=True)
class EngineSection:
    bundle_id: str  # compute_bundle_id(contract): the canonical contract content, files' hashes included
    builder_version: str
    source_checkpoint_sha256: str
    build_options: BuildOptions


@dataclass(frozen=True)
class Target:
    name: str  # "cpu", a GPU name ("h200") or an architecture ("sm_90")
    gpu_names: tuple[str, ...]  # accepted device-name substrings, lower case; () for cpu
    compute_capability: str | None  # "9.0"; None for cpu
    sm_arch: str | None  # "sm_90" of the cubins; None for cpu
    min_driver_version: int | None  # CUDA driver API version, e.g. 12080; None for cpu


@dataclass(frozen=True)
class Precision:
    weights: str  # a bundle weight format's name (common/formats.py WEIGHT_FORMATS)
    embedding: str = "bf16"  # embedding and the (tied) head
    kv_cache: str = "bf16"  # a KV format's name (KV_FORMATS)
    accumulation: str = "fp32"
    activations: str = "fp32"

    @property
    def weight_format(self) -> WeightFormat:
        return WEIGHT_FORMATS.get(self.weights)

    @property
    def kv_format(self) -> KvFormat:
        return KV_FORMATS.get(self.kv_cache)


@dataclass(frozen=True)
class Limits:
    page_size: int  # tokens per KV page
    num_pages: int  # pages in the KV pool
    max_sequences: int  # concurrent sequences
    max_tokens_per_step: int  # rows (tokens) in one forward step, decode and prefill together
    prefill_chunk: int  # most prompt tokens of one sequence in one step
    max_input_tokens: int  # per sequence
    max_output_tokens: int  # per sequence, END included

    @property
    def pages_per_sequence(self) -> int:
        """Pages one sequence of max_input + max_output tokens reserves at admission."""
        return -(-(self.max_input_tokens + self.max_output_tokens) // self.page_size)


@dataclass(frozen=True)
class Memory:
    """Device bytes the bundle needs, by use; computed from shapes, never by allocating."""

    weights_bytes: int
    kv_pool_bytes: int
    workspace_bytes: int  # activations and scratch for max_tokens_per_step rows
    graphs_bytes: int  # captured CUDA graphs (0 on cpu)
    context_reserve_bytes: int  # CUDA context and driver (0 on cpu)
    total_bytes: int  # sum of the above

    @classmethod
    def from_parts(cls, *, weights_bytes: int, kv_pool_bytes: int, workspace_bytes: int,
                   graphs_bytes: int, context_reserve_bytes: int) -> "Memory":
        """A Memory whose total is the sum of the parts."""
        total = weights_bytes + kv_pool_bytes + workspace_bytes + graphs_bytes + context_reserve_bytes
        return cls(weights_bytes, kv_pool_bytes, workspace_bytes, graphs_bytes, context_reserve_bytes, total)


@dataclass(frozen=True)
class GrammarSection:
    num_tools: int
    bitset_bits: int  # width of the per-edge tool bitsets, a multiple of 64
    nodes: int  # trie nodes
    edges: int  # trie edges, tool-end edges included
    max_edges_per_node: int  # rows of the sparse head
    sep_token_id: int
    end_token_id: int
    max_tools: int  # per answer
    allow_empty: bool


@dataclass(frozen=True)
class CanaryStep:
    """One output step of a canary prompt: the top-k allowed candidates, best first."""

    token_ids: tuple[int, ...]  # (k,) candidate token ids, by logit descending (ties: lower id first)
    logits: tuple[float, ...]  # (k,) their logits on the CPU reference (float32 values, logit units)


@dataclass(frozen=True)
class CanaryPrompt:
    request: str  # the request text; the bundle's tokenizer and template must give prompt_token_ids
    prompt_token_ids: tuple[int, ...]
    expected_token_ids: tuple[int, ...]  # greedy output, END included
    min_margin: float | None  # smallest top1 - top2 gap over the steps; None: no step had two candidates
    steps: tuple[CanaryStep, ...]  # one per expected token


@dataclass(frozen=True)
class Canary:
    logit_tolerance: float  # most |logit - recorded| any backend may show at a recorded candidate
    top_k: int  # candidates recorded per step (fewer where fewer are allowed)
    prompts: tuple[CanaryPrompt, ...]

    @property
    def prompt_token_ids(self) -> tuple[int, ...]:
        """The first canary prompt's ids (the one benchmarks and GPU checks run)."""
        return self.prompts[0].prompt_token_ids

    @property
    def expected_token_ids(self) -> tuple[int, ...]:
        return self.prompts[0].expected_token_ids

    @property
    def min_margin(self) -> float | None:
        """Smallest margin over every prompt's steps; None when no step had two candidates."""
        found = [p.min_margin for p in self.prompts if p.min_margin is not None]
        return min(found) if found else None


@dataclass(frozen=True)
class PromptSection:
    """How request text becomes prompt ids (runtime/batching/prompt.py) and the fixed prefix shared at load."""

    tokenization: str  # toolcall.runtime.batching.prompt.TOKENIZATION: template parts and request encoded apart
    prefix_tokens: int  # tokens of the template before {request}: computed once, shared
    prefix_token_ids: tuple[int, ...]
    suffix_token_ids: tuple[int, ...]  # the template after {request}
    shared_pages: int  # whole prefix pages every sequence's block table points at
    prefix_pages: int  # pinned pages: shared_pages, plus the partial last page copied per sequence


@dataclass(frozen=True)
class RequestToolsSection:
    """Tools a request may bring itself (names outside the catalog, with descriptions): its prompt is
    ``prompt_template`` with ``{tools}`` rendered from them (one ``tool_format`` line a tool,
    runtime/grammar/tool_text.py) and its answer's grammar is built for them, under the catalog's answer
    format. Present only when the catalog's template holds ``{tools}``."""

    prompt_template: str  # as the catalog wrote it: {tools} and {request} each once
    tool_format: str
    max_tools: int  # most tools one request may bring
    max_description_tokens: int  # most tokens one tool's description may take

    @property
    def candidate_columns(self) -> int:
        """Most allowed edges at one node of a request's grammar: T + 1 for T tools (runtime/grammar/build.py)."""
        return self.max_tools + 1


@dataclass(frozen=True)
class FileEntry:
    bytes: int
    sha256: str  # lower-case hex


@dataclass(frozen=True)
class Contract:
    """The whole of ``contract.json``."""

    format: Format
    engine: EngineSection
    model: ModelConfig
    target: Target
    precision: Precision
    limits: Limits
    memory: Memory
    grammar: GrammarSection
    canary: Canary
    prompt: PromptSection
    files: dict[str, FileEntry]  # bundle-relative path -> entry; never contract.json itself
    request_tools: RequestToolsSection | None = dataclasses.field(default=None, metadata=OPTIONAL)

    @property
    def candidate_columns(self) -> int:
        return candidate_columns(self.grammar.max_edges_per_node, self.request_tools)

    def to_dict(self) -> dict:
        """JSON-ready dict: tuples become lists, nested dataclasses dicts."""
        return _encode(self)

    @classmethod
    def from_dict(cls, d: Mapping) -> "Contract":
        """The Contract of a dict that passed ``validate_contract_dict`` (not re-validated here)."""
        return _decode(cls, d)

    def to_json(self) -> str:
        """Deterministic text: sorted keys, indent 2, trailing newline (bundles are byte-identical)."""
        return json.dumps(self.to_dict(), sort_keys=True, indent=2, allow_nan=False) + "\n"


def candidate_columns(max_edges_per_node: int, request_tools: RequestToolsSection | None) -> int:
    """Columns of the sparse head's buffers: the most allowed edges at one node of any grammar a request may
    bring (the catalog's, with ``max_edges_per_node``, or one built for a request's own tools)."""
    return max(max_edges_per_node, 0 if request_tools is None else request_tools.candidate_columns)


def canonical_content(contract: "Contract | Mapping") -> bytes:
    """The bytes ``bundle_id`` hashes: every section (``files`` and its hashes included) but
    ``engine.bundle_id``, as JSON with sorted keys and no whitespace (UTF-8, no NaN).

    A Contract is encoded through its dataclasses, so a float field written as ``2`` in
    contract.json hashes as ``2.0``, exactly as the builder wrote it."""
    d = dict(contract.to_dict() if isinstance(contract, Contract) else Contract.from_dict(contract).to_dict())
    d["engine"] = {k: v for k, v in d["engine"].items() if k != "bundle_id"}
    return json.dumps(d, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def compute_bundle_id(contract: "Contract | Mapping") -> str:
    """sha256 (lower-case hex) of ``canonical_content(contract)``."""
    return hashlib.sha256(canonical_content(contract)).hexdigest()


@lru_cache(maxsize=1)
def _validator() -> Draft202012Validator:
    return Draft202012Validator(load_schema("contract"))


def _nonfinite_path(value, path: str = "$") -> str | None:
    """JSON path of the first NaN/Infinity in a parsed document (Python's json reads both), or None."""
    if isinstance(value, float) and not math.isfinite(value):
        return path
    if isinstance(value, dict):
        items = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return None
    for k, v in items:
        found = _nonfinite_path(v, f"{path}[{k}]" if isinstance(k, int) else f"{path}.{k}")
        if found:
            return found
    return None


def validate_contract_dict(d: object) -> None:
    """Raises Refusal("schema_invalid") naming the first bad JSON path (in path order) and the problem."""
    bad = _nonfinite_path(d)
    if bad:
        raise Refusal("schema_invalid", f"contract holds a non-finite number (NaN or Infinity) at {bad}; JSON has "
                      "none and no field takes one: rebuild the bundle", path=bad, problem="non-finite number")
    errors = list(_validator().iter_errors(d))
    if errors:
        # Path order: the shallowest/earliest path first; a missing section ("$") before its fields.
        first = min(errors, key=lambda e: ([str(p) for p in e.absolute_path], e.message))
        problem = first.message if len(first.message) <= 300 else first.message[:300] + "..."
        raise Refusal("schema_invalid",
                      f"contract is not valid against schemas/contract.schema.json at {first.json_path}: {problem}. "
                      f"Expected a {FORMAT_NAME} contract; rebuild the bundle with a matching builder.",
                      path=first.json_path, problem=problem, errors=len(errors))
    memory = d["memory"]
    parts = sum(v for k, v in memory.items() if k != "total_bytes")
    if memory["total_bytes"] != parts:
        raise Refusal("schema_invalid",
                      f"contract is not consistent at $.memory.total_bytes: {memory['total_bytes']} bytes, but the "
                      f"parts sum to {parts}; it was edited or written by a faulty builder: rebuild the bundle.",
                      path="$.memory.total_bytes", expected=parts, found=memory["total_bytes"])


def parse_contract(d: object) -> Contract:
    """Validates a parsed contract.json and returns its Contract."""
    validate_contract_dict(d)
    return Contract.from_dict(d)


# -- generic (de)serialization over dataclass fields ------------------------------------------


def _encode(value):
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: _encode(getattr(value, f.name)) for f in dataclasses.fields(value)
                if not (f.metadata.get("optional") and getattr(value, f.name) is None)}
    if isinstance(value, (tuple, list)):
        return [_encode(v) for v in value]
    if isinstance(value, Mapping):
        return {k: _encode(v) for k, v in value.items()}
    return value


def _decode(tp, value):
    """``value`` (parsed JSON) as type ``tp`` (a resolved annotation)."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None:
            assert type(None) in typing.get_args(tp), f"None for non-optional {tp}"
            return None
        (inner,) = [a for a in typing.get_args(tp) if a is not type(None)]
        return _decode(inner, value)
    if origin is tuple:
        (item, _ellipsis) = typing.get_args(tp)
        return tuple(_decode(item, v) for v in value)
    if origin is dict:
        _key, item = typing.get_args(tp)
        return {k: _decode(item, v) for k, v in value.items()}
    if dataclasses.is_dataclass(tp):
        hints = typing.get_type_hints(tp)
        return tp(**{f.name: _decode(hints[f.name], value[f.name]) for f in dataclasses.fields(tp)
                     if f.name in value or not f.metadata.get("optional")})
    if tp is float:
        return float(value)  # JSON may write 1000000.0 as 1000000
    if tp is int and isinstance(value, float):
        return int(value)  # the schema's "integer" admits 2.0; only integral values get here
    return value
