"""The contract dataclasses and schemas/contract.schema.json stay in step, and the schema rejects bad contracts."""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import types
import typing
from pathlib import Path

import jsonschema
import pytest

from toolcall.common.errors import EXIT_CODES, Refusal
from toolcall.common.formats import KV_FORMATS, WEIGHT_FORMATS
from toolcall.runtime.bundle.contract import (
    FORMAT_NAME,
    FORMAT_VERSION,
    SUPPORTED_FORMAT_VERSIONS,
    BuildOptions,
    Canary,
    CanaryPrompt,
    CanaryStep,
    Contract,
    EngineSection,
    FileEntry,
    Format,
    GrammarSection,
    Limits,
    Memory,
    Precision,
    PromptSection,
    Target,
    compute_bundle_id,
    parse_contract,
    validate_contract_dict,
)
from toolcall.runtime.bundle.families import FAMILY_NAMES
from toolcall.runtime.bundle.model_config import ModelConfig, RopeScaling
from toolcall.schemas.load import load_schema

SCHEMA_FILE = Path(__file__).resolve().parents[1] / "schemas" / "contract.schema.json"
QWEN3_06B = ModelConfig(family="qwen3", vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_layers=28,
                        num_heads=16, num_kv_heads=8, head_dim=128, rms_norm_eps=1e-6, rope_theta=1000000.0,
                        rope_scaling=None, max_position_embeddings=40960, tie_word_embeddings=True, qkv_bias=False,
                        qk_norm=True, eos_token_ids=(151645, 151643))


def sample_contract(target: str = "cpu", rope_scaling: RopeScaling | None = None) -> Contract:
    gpu = target != "cpu"
    files = {"weights.safetensors": FileEntry(1234, hashlib.sha256(b"w").hexdigest()),
             "tokenizer.json": FileEntry(56, hashlib.sha256(b"t").hexdigest()),
             "grammar.msgpack": FileEntry(78, hashlib.sha256(b"g").hexdigest()),
             "build-report.json": FileEntry(9, hashlib.sha256(b"r").hexdigest())}
    if gpu:
        files["kernels/decode.cubin"] = FileEntry(4096, hashlib.sha256(b"k").hexdigest())
    reserve = 512 << 20 if gpu else 0
    contract = Contract(
        format=Format(FORMAT_NAME, FORMAT_VERSION),
        engine=EngineSection(bundle_id="0" * 64, builder_version="0.1.0",
                             source_checkpoint_sha256=hashlib.sha256(b"ckpt").hexdigest(),
                             build_options=BuildOptions(precision="fp8_e4m3", target=target, max_sequences=8,
                                                        max_input_tokens=1024, max_output_tokens=64, page_size=32,
                                                        max_tokens_per_step=256, prefill_chunk=128,
                                                        memory_budget_bytes=(24 << 30) if gpu else None,
                                                        context_reserve_bytes=reserve, seed=0)),
        model=dataclasses.replace(QWEN3_06B, rope_scaling=rope_scaling),
        target=Target(name=target, gpu_names=("h200",) if gpu else (), compute_capability="9.0" if gpu else None,
                      sm_arch="sm_90" if gpu else None, min_driver_version=12080 if gpu else None),
        precision=Precision(weights="fp8_e4m3"),
        limits=Limits(page_size=32, num_pages=272, max_sequences=8, max_tokens_per_step=256, prefill_chunk=128,
                      max_input_tokens=1024, max_output_tokens=64),
        memory=Memory.from_parts(weights_bytes=1000, kv_pool_bytes=2000, workspace_bytes=300,
                                 graphs_bytes=(64 << 20) if gpu else 0, context_reserve_bytes=reserve),
        grammar=GrammarSection(num_tools=20, bitset_bits=64, nodes=90, edges=89, max_edges_per_node=12,
                               sep_token_id=198, end_token_id=151645, max_tools=4, allow_empty=False),
        canary=Canary(logit_tolerance=0.05, top_k=4, prompts=(
            CanaryPrompt("Book a flight.", (1, 2, 3), (7, 198, 9, 151645), 1.25, (
                CanaryStep((7, 8), (4.5, 3.25)), CanaryStep((198, 151645), (2.0, 0.5)),
                CanaryStep((9,), (1.0,)), CanaryStep((151645,), (3.0,)))),
            CanaryPrompt("Only one tool.", (1, 4), (7, 151645), None, (
                CanaryStep((7,), (4.0,)), CanaryStep((151645,), (2.5,)))))),
        prompt=PromptSection(tokenization="parts-apart/v1", prefix_tokens=2, prefix_token_ids=(1, 2),
                             suffix_token_ids=(151645, 198), shared_pages=0, prefix_pages=1),
        files=files)
    return dataclasses.replace(contract, engine=dataclasses.replace(contract.engine,
                                                                    bundle_id=compute_bundle_id(contract)))


# -- dataclasses <-> schema, field by field ----------------------------------------------------


def _resolve(node: dict) -> dict:
    while "$ref" in node:
        assert node["$ref"].startswith("#/$defs/"), node["$ref"]
        node = load_schema("contract")["$defs"][node["$ref"].removeprefix("#/$defs/")]
    return node


def _object_branch(node: dict) -> dict:
    """The object schema inside a property (through $ref and an object-or-null anyOf)."""
    node = _resolve(node)
    if "anyOf" in node:
        (node,) = [_resolve(b) for b in node["anyOf"] if _resolve(b).get("type") == "object"]
    return node


def _check_in_step(cls, node: dict, path: str) -> int:
    node = _object_branch(node)
    fields = [f.name for f in dataclasses.fields(cls)]
    assert set(fields) == set(node["properties"]), \
        f"{path}: dataclass {sorted(fields)} vs schema {sorted(node['properties'])}"
    required = {f.name for f in dataclasses.fields(cls) if not f.metadata.get("optional")}
    assert required == set(node["required"]), f"{path}: every field but the OPTIONAL ones must be required"
    assert node["additionalProperties"] is False, f"{path}: additionalProperties must be false"
    checked = 1
    hints = typing.get_type_hints(cls)
    for name in fields:
        tp = hints[name]
        if typing.get_origin(tp) in (typing.Union, types.UnionType):
            tp = next(a for a in typing.get_args(tp) if a is not type(None))
        if dataclasses.is_dataclass(tp):
            checked += _check_in_step(tp, node["properties"][name], f"{path}.{name}")
        elif typing.get_origin(tp) is tuple and dataclasses.is_dataclass(typing.get_args(tp)[0]):
            checked += _check_in_step(typing.get_args(tp)[0], node["properties"][name]["items"],
                                      f"{path}.{name}[]")
        elif typing.get_origin(tp) is dict:
            checked += _check_in_step(typing.get_args(tp)[1], node["properties"][name]["additionalProperties"],
                                      f"{path}.{name}.*")
    return checked


def test_schema_is_valid_draft_2020_12():
    schema = load_schema("contract")
    jsonschema.Draft202012Validator.check_schema(schema)
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$id"].endswith("contract.schema.json") and schema["title"]


def test_dataclasses_and_schema_in_step():
    # Contract, its 10 dict sections, BuildOptions, RopeScaling, FileEntry, CanaryPrompt and
    # CanaryStep: 16 objects compared.
    assert _check_in_step(Contract, load_schema("contract"), "$") == 17


def test_every_property_has_a_description():
    missing = []

    def walk(node, path):
        if isinstance(node, dict):
            for name, prop in node.get("properties", {}).items():
                if "description" not in prop:
                    missing.append(f"{path}.{name}")
            for key, value in node.items():
                if key not in ("if", "then", "else"):  # constraints on properties described elsewhere
                    walk(value, f"{path}.{key}")
        elif isinstance(node, list):
            for i, value in enumerate(node):
                walk(value, f"{path}[{i}]")

    walk(load_schema("contract"), "$")
    assert not missing


def test_schema_enums_match_code():
    schema = load_schema("contract")
    assert tuple(schema["$defs"]["weight_precision"]["enum"]) == WEIGHT_FORMATS.bundle_names
    precision = schema["properties"]["precision"]["properties"]
    assert tuple(precision["kv_cache"]["enum"]) == KV_FORMATS.bundle_names
    assert tuple(schema["properties"]["model"]["properties"]["family"]["enum"]) == FAMILY_NAMES
    assert schema["properties"]["format"]["properties"]["name"]["const"] == FORMAT_NAME
    assert FORMAT_VERSION in SUPPORTED_FORMAT_VERSIONS


# -- valid contracts ---------------------------------------------------------------------------


@pytest.mark.parametrize("target,rope", [("cpu", None), ("h200", RopeScaling(8.0, 1.0, 4.0, 8192))])
def test_valid_contract_round_trips(target, rope):
    contract = sample_contract(target, rope)
    d = contract.to_dict()
    validate_contract_dict(d)
    assert parse_contract(d) == contract
    text = contract.to_json()
    assert text.endswith("}\n") and text == sample_contract(target, rope).to_json()
    parsed = json.loads(text)
    assert list(parsed) == sorted(parsed) and list(parsed["engine"]) == sorted(parsed["engine"])
    assert parse_contract(parsed) == contract  # tuples come back as tuples, floats as floats
    assert isinstance(parse_contract(parsed).canary.prompt_token_ids, tuple)
    assert parse_contract(parsed).canary.min_margin == 1.25  # None margins (forced steps) are skipped


def test_float_fields_accept_json_integers():
    d = sample_contract().to_dict()
    d["model"]["rope_theta"] = 1000000
    d["canary"]["prompts"][0]["min_margin"] = 2
    d["limits"]["num_pages"] = 272.0  # the schema's "integer" admits 272.0: it comes back an int
    c = parse_contract(d)
    assert type(c.model.rope_theta) is float and type(c.canary.prompts[0].min_margin) is float
    assert type(c.limits.num_pages) is int


def test_bundle_id_is_sha256_of_the_canonical_contract():
    contract = sample_contract()
    d = contract.to_dict()
    del d["engine"]["bundle_id"]
    canonical = json.dumps(d, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    assert contract.engine.bundle_id == hashlib.sha256(canonical).hexdigest() == compute_bundle_id(contract)
    assert compute_bundle_id(contract.to_dict()) == contract.engine.bundle_id  # dict or Contract alike
    # Every section counts, the files' hashes included; bundle_id itself does not.
    for edit in (_set("limits/num_pages", 273), _set("model/num_layers", 27), _set("precision/weights", "nvfp4"),
                 _set("canary/logit_tolerance", 1e9), _set("files/weights.safetensors/sha256", "f" * 64),
                 _delete("files/tokenizer.json")):
        d = copy.deepcopy(contract.to_dict())
        edit(d)
        assert compute_bundle_id(d) != contract.engine.bundle_id
    d = contract.to_dict()
    d["engine"]["bundle_id"] = "e" * 64
    assert compute_bundle_id(d) == contract.engine.bundle_id


# -- invalid contracts -------------------------------------------------------------------------


def _set(path: str, value):
    def mutate(d):
        *parents, last = path.split("/")
        for p in parents:
            d = d[int(p)] if isinstance(d, list) else d[p]
        d[last] = value
    return mutate


def _delete(path: str):
    def mutate(d):
        *parents, last = path.split("/")
        for p in parents:
            d = d[p]
        del d[last]
    return mutate


MUTATIONS = {
    "missing section": (_delete("canary"), "$", "'canary' is a required property"),
    "missing field": (_delete("limits/num_pages"), "$.limits", "'num_pages' is a required property"),
    "extra field": (_set("limits/num_page", 3), "$.limits", "'num_page' was unexpected"),
    "extra nested field": (_set("engine/build_options/sede", 1), "$.engine.build_options", "'sede' was unexpected"),
    "wrong type": (_set("limits/num_pages", "272"), "$.limits.num_pages", "is not of type 'integer'"),
    "bool for int": (_set("grammar/max_tools", True), "$.grammar.max_tools", "is not of type 'integer'"),
    "negative": (_set("memory/kv_pool_bytes", -1), "$.memory.kv_pool_bytes", "less than the minimum of 0"),
    "bad enum": (_set("precision/weights", "int8"), "$.precision.weights", "'int8' is not one of"),
    "bad family": (_set("model/family", "gpt2"), "$.model.family", "'gpt2' is not one of"),
    "bad format name": (_set("format/name", "bundle"), "$.format.name", "'toolcall-bundle' was expected"),
    "bad hash": (_set("files/weights.safetensors/sha256", "ABCD"), "$.files['weights.safetensors'].sha256",
                 "does not match"),
    "upper-case bundle id": (_set("engine/bundle_id", "A" * 64), "$.engine.bundle_id", "does not match"),
    "bitset width": (_set("grammar/bitset_bits", 100), "$.grammar.bitset_bits", "multiple of 64"),
    "cpu with sm_arch": (_set("target/sm_arch", "sm_90"), "$.target.sm_arch", "is not of type 'null'"),
    "bad rope scaling": (_set("model/rope_scaling", {"factor": 8.0}), "$.model.rope_scaling", "is not valid"),
    "escaping file name": (lambda d: d["files"].update({"../evil": {"bytes": 1, "sha256": "0" * 64}}), "$.files",
                           "does not match"),
    "contract lists itself": (_set("files/contract.json", {"bytes": 1, "sha256": "0" * 64}), "$.files",
                              "should not be valid"),
    "memory total": (_set("memory/total_bytes", 1), "$.memory.total_bytes", "parts sum to 3300"),
    "NaN logit": (_set("canary/prompts/0/steps/0/logits", [float("nan"), 1.0]),
                  "$.canary.prompts[0].steps[0].logits[0]", "non-finite"),
    "infinite tolerance": (_set("canary/logit_tolerance", float("inf")), "$.canary.logit_tolerance", "non-finite"),
    "NaN eps": (_set("model/rms_norm_eps", float("nan")), "$.model.rms_norm_eps", "non-finite"),
    "zero tolerance": (_set("canary/logit_tolerance", 0), "$.canary.logit_tolerance", "less than or equal"),
    "no canary prompts": (_set("canary/prompts", []), "$.canary.prompts", "should be non-empty"),
}


@pytest.mark.parametrize("case", sorted(MUTATIONS))
def test_mutated_contract_is_refused(case):
    mutate, path, problem = MUTATIONS[case]
    d = copy.deepcopy(sample_contract().to_dict())
    mutate(d)
    with pytest.raises(Refusal) as info:
        validate_contract_dict(d)
    err = info.value
    assert err.code == "schema_invalid" and err.exit_code == EXIT_CODES["schema_invalid"]
    assert err.details["path"] == path, err.message
    assert problem in err.message and path in err.message


def test_gpu_target_needs_its_architecture():
    d = sample_contract("h200").to_dict()
    d["target"]["compute_capability"] = None
    with pytest.raises(Refusal, match=r"\$\.target\.compute_capability: None is not of type 'string'"):
        validate_contract_dict(d)


def test_first_error_in_path_order_and_not_a_dict():
    d = sample_contract().to_dict()
    d["model"]["vocab_size"] = "big"
    d["canary"]["top_k"] = 0
    with pytest.raises(Refusal) as info:
        validate_contract_dict(d)
    assert info.value.details["path"] == "$.canary.top_k" and info.value.details["errors"] == 2
    with pytest.raises(Refusal, match=r"at \$: \[\] is not of type 'object'"):
        validate_contract_dict([])


def test_unsupported_version_is_schema_valid():
    # The runtime, not the schema, refuses a version it does not support (format_unsupported).
    d = sample_contract().to_dict()
    d["format"]["version"] = max(SUPPORTED_FORMAT_VERSIONS) + 1
    validate_contract_dict(d)


# -- a provisioner: nothing but jsonschema and the schema file ---------------------------------

PROVISIONER_CONTRACT = json.loads("""{
 "canary": {"logit_tolerance": 0.05, "top_k": 4, "prompts": [{"request": "Book a flight.",
  "expected_token_ids": [7, 151645], "min_margin": 1.25, "prompt_token_ids": [1, 2, 3],
  "steps": [{"token_ids": [7, 8], "logits": [4.5, 3.25]}, {"token_ids": [151645], "logits": [2.0]}]}]},
 "prompt": {"tokenization": "parts-apart/v1", "prefix_tokens": 2, "prefix_token_ids": [1, 2],
  "suffix_token_ids": [151645, 198], "shared_pages": 0, "prefix_pages": 1},
 "engine": {"builder_version": "0.1.0",
  "bundle_id": "7a1b1ad1c1b4dfa4a8a8ad5ba9d47b5a43f9a3e7c0b2b1a1a0f3e3d2c1b0a9f8",
  "source_checkpoint_sha256": "0000000000000000000000000000000000000000000000000000000000000000",
  "build_options": {"context_reserve_bytes": 536870912, "max_input_tokens": 1024, "max_output_tokens": 64,
   "max_sequences": 8, "max_tokens_per_step": 256, "memory_budget_bytes": 25769803776, "page_size": 32,
   "precision": "nvfp4", "prefill_chunk": 128, "seed": 0, "target": "h200"}},
 "files": {"kernels/decode.cubin":
   {"bytes": 4096, "sha256": "1111111111111111111111111111111111111111111111111111111111111111"},
  "weights.safetensors": {"bytes": 1234, "sha256": "2222222222222222222222222222222222222222222222222222222222222222"}},
 "format": {"name": "toolcall-bundle", "version": 2},
 "grammar": {"allow_empty": false, "bitset_bits": 64, "edges": 89, "end_token_id": 151645, "max_edges_per_node": 12,
  "max_tools": 4, "nodes": 90, "num_tools": 20, "sep_token_id": 198},
 "limits": {"max_input_tokens": 1024, "max_output_tokens": 64, "max_sequences": 8, "max_tokens_per_step": 256,
  "num_pages": 272, "page_size": 32, "prefill_chunk": 128},
 "memory": {"context_reserve_bytes": 536870912, "graphs_bytes": 67108864, "kv_pool_bytes": 998244352,
  "total_bytes": 2002319360, "weights_bytes": 400000000, "workspace_bytes": 95232},
 "model": {"eos_token_ids": [151645, 151643], "family": "qwen3", "head_dim": 128, "hidden_size": 1024,
  "intermediate_size": 3072, "max_position_embeddings": 40960, "num_heads": 16, "num_kv_heads": 8, "num_layers": 28,
  "qk_norm": true, "qkv_bias": false, "rms_norm_eps": 1e-06, "rope_scaling": null, "rope_theta": 1000000.0,
  "tie_word_embeddings": true, "vocab_size": 151936},
 "precision": {"accumulation": "fp32", "activations": "fp32", "embedding": "bf16", "kv_cache": "bf16",
  "weights": "nvfp4"},
 "target": {"compute_capability": "9.0", "gpu_names": ["h200"], "min_driver_version": 12080, "name": "h200",
  "sm_arch": "sm_90"}
}""")


def test_provisioner_places_bundle_with_jsonschema_alone():
    schema = json.loads(SCHEMA_FILE.read_text())
    validator = jsonschema.Draft202012Validator(schema)
    contract = copy.deepcopy(PROVISIONER_CONTRACT)
    assert list(validator.iter_errors(contract)) == []
    free_bytes, device = 30 << 30, "nvidia h200"
    fits = (contract["memory"]["total_bytes"] <= free_bytes
            and any(n in device for n in contract["target"]["gpu_names"]))
    assert fits
    contract["memory"]["total_bytes"] = "2 GB"
    assert [e.json_path for e in validator.iter_errors(contract)] == ["$.memory.total_bytes"]


def test_provisioner_example_is_a_real_contract():
    # Keeps the literal above honest: the project reads it back to the same dict.
    assert parse_contract(PROVISIONER_CONTRACT).to_dict() == PROVISIONER_CONTRACT
