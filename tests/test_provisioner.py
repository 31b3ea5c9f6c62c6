"""Acting as a provisioner: someone else's program with nothing but ``json``, ``jsonschema`` and the
schema file's path, deciding where a real GPU bundle can be placed.

The bundles (tiny model, --target h200, fp8 and nvfp4) are built once per session by a fixture;
the kernels are compiled by NVRTC without a GPU, once for both (NVRTC results are cached per process).
The provisioner functions below import nothing from this project.
"""
from __future__ import annotations

import json
from pathlib import Path

import jsonschema
import pytest
from click.testing import CliRunner

SCHEMA_FILE = Path(__file__).resolve().parents[1] / "schemas" / "contract.schema.json"
CATALOG = Path(__file__).resolve().parents[1] / "builder" / "data" / "tools-64.json"
GB = 10**9


@pytest.fixture(scope="session")
def h200_bundles(tmp_path_factory, tiny_checkpoint) -> dict[str, Path]:
    """precision -> folder of a tiny-model h200 bundle with compiled kernels."""
    from toolcall.builder.compile import compile_bundle
    from toolcall.runtime.bundle.contract import BuildOptions

    root = tmp_path_factory.mktemp("h200-bundles")
    out = {}
    for precision in ("fp8_e4m3", "nvfp4"):
        options = BuildOptions(precision=precision, target="h200", max_sequences=8, max_input_tokens=128,
                               max_output_tokens=None, page_size=32, max_tokens_per_step=128, prefill_chunk=64,
                               memory_budget_bytes=None, context_reserve_bytes=None, seed=0)
        out[precision] = compile_bundle(tiny_checkpoint, CATALOG, options, root / precision).out_dir
    return out


# -- the provisioner: json + jsonschema + the schema file, nothing else ----------------------------


def read_placeable_contract(bundle: Path) -> dict:
    """contract.json, validated against the schema file; jsonschema.ValidationError if it is not valid."""
    schema = json.loads(SCHEMA_FILE.read_text())
    jsonschema.Draft202012Validator.check_schema(schema)
    contract = json.loads((bundle / "contract.json").read_text())
    jsonschema.Draft202012Validator(schema).validate(contract)
    return contract


def placement_facts(contract: dict) -> dict:
    t, m = contract["target"], contract["memory"]
    return {"target": t["name"], "gpu_names": t["gpu_names"], "compute_capability": t["compute_capability"],
            "min_driver_version": t["min_driver_version"], "total_bytes": m["total_bytes"]}


def can_host(contract: dict, device_name: str, compute_capability: str, driver_version: int, free_bytes: int) -> bool:
    f = placement_facts(contract)
    return (compute_capability == f["compute_capability"] and driver_version >= f["min_driver_version"]
            and free_bytes >= f["total_bytes"]
            and (not f["gpu_names"] or any(n in device_name.lower() for n in f["gpu_names"])))


# -- tests ---------------------------------------------------------------------------------------


@pytest.mark.parametrize("precision", ["fp8_e4m3", "nvfp4"])
def test_contract_validates_with_jsonschema_alone(h200_bundles, precision):
    contract = read_placeable_contract(h200_bundles[precision])
    assert contract["precision"]["weights"] == precision
    broken = dict(contract, memory=dict(contract["memory"], total_bytes="2 GB"))
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.Draft202012Validator(json.loads(SCHEMA_FILE.read_text())).validate(broken)


@pytest.mark.parametrize("precision", ["fp8_e4m3", "nvfp4"])
def test_placement_facts(h200_bundles, precision):
    contract = read_placeable_contract(h200_bundles[precision])
    facts = placement_facts(contract)
    assert facts["target"] == "h200" and facts["gpu_names"] == ["h200"]
    assert facts["compute_capability"] == "9.0" and contract["target"]["sm_arch"] == "sm_90"
    assert isinstance(facts["min_driver_version"], int) and facts["min_driver_version"] >= 12000
    m = contract["memory"]
    assert facts["total_bytes"] == m["weights_bytes"] + m["kv_pool_bytes"] + m["workspace_bytes"] + \
        m["graphs_bytes"] + m["context_reserve_bytes"]
    assert m["context_reserve_bytes"] > 0 and m["graphs_bytes"] > 0  # a GPU bundle reserves both
    assert any(name.startswith("kernels/") and name.endswith(".cubin") for name in contract["files"])


def test_nvfp4_needs_less_weight_memory_than_fp8(h200_bundles):
    fp8, fp4 = (read_placeable_contract(h200_bundles[p])["memory"] for p in ("fp8_e4m3", "nvfp4"))
    assert fp4["weights_bytes"] < fp8["weights_bytes"]
    assert fp4["kv_pool_bytes"] == fp8["kv_pool_bytes"]


# device name, compute capability, driver version, free bytes, placeable
NODES = [
    ("NVIDIA H200", "9.0", 13000, 140 * GB, True),
    ("NVIDIA H200 NVL", "9.0", 13010, 2 * GB, True),
    ("NVIDIA H100 80GB HBM3", "9.0", 13000, 80 * GB, False),  # same architecture, not an accepted name
    ("NVIDIA H200", "9.0", 12080, 140 * GB, False),  # driver too old
    ("NVIDIA H200", "9.0", 13000, 100 * 10**6, False),  # the large model left too little memory
    ("NVIDIA B200", "10.0", 13000, 180 * GB, False),
]


@pytest.mark.parametrize("name,cc,driver,free,placeable", NODES, ids=[f"{n} {d} {f}" for n, _, d, f, _ in NODES])
def test_provisioner_places_by_contract(h200_bundles, name, cc, driver, free, placeable):
    for bundle in h200_bundles.values():
        assert can_host(read_placeable_contract(bundle), name, cc, driver, free) is placeable


@pytest.mark.parametrize("precision", ["fp8_e4m3", "nvfp4"])
def test_builder_verifies_the_bundles_it_hands_to_provisioners(h200_bundles, precision):
    from toolcall.builder.cli import main as builder_cli

    result = CliRunner().invoke(builder_cli, ["verify", str(h200_bundles[precision]), "--json"])
    assert result.exit_code == 0, result.output
    assert "kernels" in json.loads(result.stdout)["checks"]
