"""The model-family registry (runtime/bundle/families.py): one entry a family, read by the checkpoint
reader, the synthetic checkpoints, the CLI and the model config; no other code compares a family's name,
keys a table by one or lists them, and every table outside the registry that holds one value per family (the
contract schema's enum, transformers' causal-LM classes) has this registry's families."""
from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from toolcall.builder.checkpoint import open_checkpoint
from toolcall.builder.synth import SynthOptions, hf_config_json, model_config_for
from toolcall.runtime.bundle.families import FAMILIES, FAMILY_NAMES, HEAD_NORM_NAMES, family
from toolcall.schemas.load import load_schema

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("common", "kernels", "runtime", "builder", "models")
REGISTRY = ROOT / "runtime" / "bundle" / "families.py"


def name_uses(path: Path) -> list[str]:
    """Where ``path`` compares a family name (``==``, ``in`` ...), keys a dict by one, or lists two or more."""
    names, found = set(FAMILY_NAMES), []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Compare):
            consts = [c for o in (node.left, *node.comparators)
                      for c in ([o] if isinstance(o, ast.Constant) else getattr(o, "elts", []))]
            if any(isinstance(c, ast.Constant) and c.value in names for c in consts):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} compares a family name")
        elif isinstance(node, ast.Dict) and any(isinstance(k, ast.Constant) and k.value in names for k in node.keys):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} keys a dict by family names")
        elif isinstance(node, (ast.List, ast.Tuple, ast.Set)):
            if sum(isinstance(e, ast.Constant) and e.value in names for e in node.elts) >= 2:
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} lists family names")
    return found


def test_no_family_name_is_compared_outside_the_registry():
    bad = [use for package in SCANNED for f in sorted((ROOT / package).rglob("*.py")) if f != REGISTRY
           for use in name_uses(f)]
    assert not bad, "\n".join(bad)


def test_the_scan_finds_each_kind_of_use(monkeypatch):
    fake = ROOT / "builder" / "fake.py"
    code = 'if f == "qwen2":\n    x = {"llama": 1}\nchoices = ["qwen3", "llama"]\n'
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: code)
    assert sorted(name_uses(fake)) == ["builder/fake.py:1 compares a family name",
                                       "builder/fake.py:2 keys a dict by family names",
                                       "builder/fake.py:3 lists family names"]


def test_the_contract_schema_enum_holds_every_family():
    enum = load_schema("contract")["properties"]["model"]["properties"]["family"]["enum"]
    assert tuple(enum) == FAMILY_NAMES


def test_transformers_knows_every_family_by_its_architecture():
    auto = pytest.importorskip("transformers.models.auto.modeling_auto")
    missing = [f.name for f in FAMILIES if auto.MODEL_FOR_CAUSAL_LM_MAPPING_NAMES.get(f.name) != f.architecture]
    assert not missing, f"transformers has no causal LM class for {missing} under the registry's architecture"


def test_an_unknown_family_is_refused_with_the_known_ones():
    with pytest.raises(KeyError, match="qwen3, qwen2, llama"):
        family("mistral")


@pytest.mark.parametrize("fam", FAMILIES, ids=lambda f: f.name)
def test_a_synthetic_checkpoint_reads_back_with_its_familys_features(fam, make_checkpoint):
    """The synth writes a family's features into config.json; the reader gets them back from it."""
    cfg = open_checkpoint(make_checkpoint(family=fam.name)).config
    assert cfg.family == fam.name and cfg.qk_norm == fam.qk_norm and cfg.qkv_bias == fam.has_qkv_bias(False)
    assert (cfg.rope_scaling is not None) == (fam.rope_scaling is not None)
    norms = {n.split(".", 3)[3].removesuffix(".weight") for n in cfg.tensor_shapes() if "_norm." in n and "self_attn" in n}
    assert norms == set(fam.head_norm_names) and set(fam.head_norm_names) <= set(HEAD_NORM_NAMES)
    written = hf_config_json(model_config_for(SynthOptions(family=fam.name), 2048), "bfloat16")
    assert written["model_type"] == fam.name and written["architectures"] == [fam.architecture]
    assert all(written[k] == v for k, v in fam.hf_keys.items() if k != "rope_scaling")
    json.dumps(written)  # a config.json transformers reads
