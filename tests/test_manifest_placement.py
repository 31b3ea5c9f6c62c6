"""Node selection of `builder manifest`: the Deployment's node affinity and resource requests,
evaluated against node label sets as GPU Feature Discovery writes them (tests/fixtures/gfd_nodes.json),
select exactly the nodes whose GPU the runtime's own target check (runtime/bundle/machine.py) accepts.

Contracts are the tiny CPU bundle's, re-targeted with the builder's own target and memory plan
(no kernels compiled: placement reads only the target and memory sections).
"""
from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import pytest

from toolcall.builder.gpu_labels import LABEL_VALUE, PRODUCTS, PlacementError, accepted_products
from toolcall.builder.kernel_build import contract_target
from toolcall.builder.manifest import BundleSource, ManifestOptions, kubernetes_manifests
from toolcall.builder.memory_plan import MIB, plan_memory
from toolcall.common.errors import EngineError
from toolcall.runtime.bundle.contract import Contract
from toolcall.runtime.bundle.files import read_contract
from toolcall.runtime.bundle.machine import MachineFacts, check_target

NODES = json.loads((Path(__file__).parent / "fixtures" / "gfd_nodes.json").read_text())["nodes"]
PRECISIONS = ("fp8_e4m3", "nvfp4", "bf16")
TARGETS = ("cpu", "h100", "h200", "b200", "rtx5090", "sm_90")
GIB = 1 << 30


# -- the scheduler's filter, as far as these manifests use it ---------------------------------------


def expression_matches(expr: dict, labels: dict[str, str]) -> bool:
    """One NodeSelectorRequirement (Kubernetes API, core/v1): In/NotIn on the value, Exists/DoesNotExist
    on the key, Gt/Lt on the value read as an integer (a value that is not one never matches)."""
    key, op, values = expr["key"], expr["operator"], expr.get("values", [])
    present = key in labels
    if op == "In":
        return present and labels[key] in values
    if op == "NotIn":
        return not present or labels[key] not in values
    if op in ("Exists", "DoesNotExist"):
        assert not values, "Exists/DoesNotExist take no values"
        return present == (op == "Exists")
    if op in ("Gt", "Lt"):
        assert len(values) == 1, "Gt/Lt take exactly one value"
        if not present or not re.fullmatch(r"-?[0-9]+", labels[key]):
            return False
        have, bound = int(labels[key]), int(values[0])
        return have > bound if op == "Gt" else have < bound
    raise AssertionError(f"unknown operator {op}")


def term_matches(term: dict, labels: dict[str, str]) -> bool:
    """A NodeSelectorTerm: its expressions ANDed; an empty term matches no node."""
    assert set(term) <= {"matchExpressions"}, "matchFields not evaluated"
    exprs = term.get("matchExpressions") or []
    return bool(exprs) and all(expression_matches(e, labels) for e in exprs)


def quantity(q) -> float:
    """A Kubernetes resource quantity, as used here: plain numbers, milli (m), binary suffixes."""
    m = re.fullmatch(r"([0-9.]+)(m|Ki|Mi|Gi|Ti)?", str(q))
    assert m, f"unparsed quantity {q!r}"
    scale = {None: 1, "m": 1e-3, "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}[m.group(2)]
    return float(m.group(1)) * scale


def schedulable(pod_spec: dict, node: dict) -> bool:
    """Required node affinity holds and every container request fits the node's allocatable resources."""
    required = pod_spec.get("affinity", {}).get("nodeAffinity", {}).get("requiredDuringSchedulingIgnoredDuringExecution")
    if required is not None and not any(term_matches(t, node["labels"]) for t in required["nodeSelectorTerms"]):
        return False
    for c in pod_spec["containers"]:
        for name, amount in c["resources"].get("requests", {}).items():
            if quantity(amount) > quantity(node["allocatable"].get(name, 0)):
                return False
    return True


def preference_score(pod_spec: dict, node: dict) -> int:
    preferred = pod_spec.get("affinity", {}).get("nodeAffinity", {}).get("preferredDuringSchedulingIgnoredDuringExecution", [])
    return sum(p["weight"] for p in preferred if term_matches(p["preference"], node["labels"]))


# -- the oracle: the runtime's check on the node's device --------------------------------------------


def runtime_accepts(contract: Contract, node: dict, allow_shared: bool = False) -> bool:
    """check_target on one GPU of the node (free memory = the GPU's or slice's memory, nothing else
    running), for a pod that could get one (allocatable nvidia.com/gpu); CPU bundles run anywhere."""
    if contract.target.compute_capability is None:
        return True
    d = node["device"]
    if d is None or quantity(node["allocatable"].get("nvidia.com/gpu", 0)) < 1 or (d["shared"] and not allow_shared):
        return False
    facts = MachineFacts(free_bytes=d["memory_mib"] * MIB, gpu_name=d["name"],
                         compute_capability=d["compute_capability"], driver_version=d["driver_version"])
    try:
        check_target(contract, facts)
    except EngineError:
        return False
    return True


@pytest.fixture(scope="module")
def base_contract(tiny_bundle) -> Contract:
    return read_contract(tiny_bundle)


def retarget(base: Contract, target: str, precision: str, device_bytes: int | None = None) -> Contract:
    """The tiny model's contract for ``target`` and ``precision``; with ``device_bytes``, a KV pool
    sized so the memory total is at least that much."""
    t = contract_target(target)
    limits = base.limits
    memory = plan_memory(base.model, precision, limits, t.name)
    if device_bytes is not None:
        per_page = memory.kv_pool_bytes // limits.num_pages
        limits = dataclasses.replace(limits, num_pages=limits.num_pages + -(-(device_bytes - memory.total_bytes) // per_page))
        memory = plan_memory(base.model, precision, limits, t.name)
        assert memory.total_bytes >= device_bytes
    return dataclasses.replace(base, target=t, limits=limits, memory=memory,
                               precision=dataclasses.replace(base.precision, weights=precision))


def pod_spec(contract: Contract, **kw) -> dict:
    options = ManifestOptions(image="registry.example/toolcall-engine:test", source=BundleSource("pvc", "bundles"), **kw)
    deployment, _service = kubernetes_manifests(contract, "0" * 64, options)
    return deployment["spec"]["template"]["spec"]


def selected(contract: Contract, **kw) -> set[str]:
    spec = pod_spec(contract, **kw)
    return {n["name"] for n in NODES if schedulable(spec, n)}


# -- tests ----------------------------------------------------------------------------------------


# A CPU bundle's memory is a host-memory request, not a node label: one size for cpu.
CASES = [(p, t, s) for p in PRECISIONS for t in TARGETS for s in ("tiny", "20GiB") if t != "cpu" or s == "tiny"]


@pytest.mark.parametrize("precision,target,size", CASES)
def test_selection_is_what_the_runtime_accepts(base_contract, precision, target, size):
    contract = retarget(base_contract, target, precision, 20 * GIB if size == "20GiB" else None)
    expected = {n["name"] for n in NODES if runtime_accepts(contract, n)}
    assert selected(contract) == expected


# Hand-written for the tiny bundle and for one needing 20 GiB of device memory: the oracle above is
# the runtime's check, these are what a reader expects of it.
EXPECTED = {
    ("h200", "tiny"): {"h200", "h200-nvl", "h200-mig-1g-18gb", "h200-mig-3g-71gb", "gh200"},
    ("h200", "20GiB"): {"h200", "h200-nvl", "h200-mig-3g-71gb", "gh200"},
    ("h100", "tiny"): {"h100", "h100-mig-1g-10gb"},
    ("h100", "20GiB"): {"h100"},
    ("sm_90", "tiny"): {"h100", "h100-mig-1g-10gb", "h200", "h200-nvl", "h200-mig-1g-18gb", "h200-mig-3g-71gb", "gh200"},
    ("b200", "tiny"): {"b200"},
    ("rtx5090", "tiny"): {"rtx5090"},
    ("rtx5090", "20GiB"): {"rtx5090"},
}


@pytest.mark.parametrize("target,size", sorted(EXPECTED))
def test_selection_by_hand(base_contract, target, size):
    contract = retarget(base_contract, target, "nvfp4", 20 * GIB if size == "20GiB" else None)
    assert selected(contract) == EXPECTED[target, size]


def test_rtx5090_too_small_for_40gib(base_contract):
    assert selected(retarget(base_contract, "rtx5090", "fp8_e4m3", 40 * GIB)) == set()


def test_old_driver_mig_mixed_and_a10_never_selected(base_contract):
    for target in TARGETS[1:]:
        chosen = selected(retarget(base_contract, target, "fp8_e4m3"))
        assert not chosen & {"h200-old-driver", "h200-mig-mixed", "a10", "cpu-only", "h200-shared"}, target


def test_cpu_bundle_anywhere_preferring_nodes_without_gpus(base_contract):
    for precision in PRECISIONS:
        spec = pod_spec(retarget(base_contract, "cpu", precision))
        assert {n["name"] for n in NODES if schedulable(spec, n)} == {n["name"] for n in NODES}
        best = max(preference_score(spec, n) for n in NODES)
        assert {n["name"] for n in NODES if preference_score(spec, n) == best} == {"cpu-only"}
        assert "nvidia.com/gpu" not in json.dumps(spec["containers"][0]["resources"])


def test_shared_gpus_only_when_allowed(base_contract):
    contract = retarget(base_contract, "h200", "fp8_e4m3")
    assert "h200-shared" not in selected(contract)
    assert "h200-shared" in selected(contract, allow_shared_gpu=True)
    assert selected(contract, allow_shared_gpu=True) == {n["name"] for n in NODES
                                                         if runtime_accepts(contract, n, allow_shared=True)}


def cuda_variant(node: dict, cuda: tuple[int, int], branch: int) -> dict:
    """``node`` with another driver: CUDA version ``cuda`` (major, minor), kernel driver ``branch``."""
    labels = dict(node["labels"], **{"nvidia.com/cuda.runtime-version.major": str(cuda[0]),
                                     "nvidia.com/cuda.runtime-version.minor": str(cuda[1]),
                                     "nvidia.com/cuda.driver-version.major": str(branch)})
    device = dict(node["device"], driver_version=cuda[0] * 1000 + cuda[1] * 10)
    return dict(node, name=f"{node['name']}-cuda-{cuda[0]}.{cuda[1]}", labels=labels, device=device)


@pytest.mark.parametrize("min_driver", [12080, 12090, 13000, 13010, 14000])
def test_driver_minimum_with_a_minor_version(base_contract, min_driver):
    """Versions compare as (major, minor) integer pairs: 12.10 > 12.9, 13.0 > 12.9, 14.0 > 13.1."""
    h200 = next(n for n in NODES if n["name"] == "h200")
    nodes = [cuda_variant(h200, c, b) for c, b in [((12, 6), 560), ((12, 8), 570), ((12, 9), 575), ((12, 10), 578),
                                                    ((13, 0), 580), ((13, 1), 590), ((14, 0), 600)]]
    base = retarget(base_contract, "h200", "bf16")
    contract = dataclasses.replace(base, target=dataclasses.replace(base.target, min_driver_version=min_driver))
    spec = pod_spec(contract)
    assert {n["name"] for n in nodes if schedulable(spec, n)} == {n["name"] for n in nodes if runtime_accepts(contract, n)}
    assert any(runtime_accepts(contract, n) for n in nodes) and not runtime_accepts(contract, nodes[0])


def test_unknown_gpu_name_is_a_typed_error(base_contract):
    base = retarget(base_contract, "h200", "fp8_e4m3")
    for names, cc in ((("mi300x",), "9.0"), (("h200",), "8.0")):
        contract = dataclasses.replace(base, target=dataclasses.replace(base.target, gpu_names=names, compute_capability=cc))
        with pytest.raises(PlacementError) as e:
            pod_spec(contract)
        assert e.value.code == "unplaceable" and e.value.exit_code == 100
        assert e.value.details["gpu_name"] == names[0] and "PRODUCTS" in e.value.message


def test_every_product_label_is_a_valid_label_value_and_unique():
    labels = [p.label for p in PRODUCTS] + [p.mig_label(m) for p in PRODUCTS for m in p.mig_profiles]
    assert len(labels) == len(set(labels))
    assert all(LABEL_VALUE.match(v) and LABEL_VALUE.match(v + "-SHARED") for v in labels)


def test_products_follow_the_targets_table(base_contract):
    """Every GPU target's names reach a known product of its compute capability (else: unplaceable)."""
    from toolcall.kernels.targets import TARGETS as KERNEL_TARGETS

    for name, t in KERNEL_TARGETS.items():
        if t.is_gpu:
            values = accepted_products(retarget(base_contract, name, "fp8_e4m3"))
            assert bool(values) == bool(t.gpu_names), name


@pytest.mark.parametrize("labels,expr,want", [
    ({"k": "a"}, {"key": "k", "operator": "In", "values": ["a", "b"]}, True),
    ({"k": "c"}, {"key": "k", "operator": "In", "values": ["a"]}, False),
    ({}, {"key": "k", "operator": "In", "values": ["a"]}, False),
    ({}, {"key": "k", "operator": "NotIn", "values": ["a"]}, True),
    ({"k": "a"}, {"key": "k", "operator": "NotIn", "values": ["a"]}, False),
    ({"k": ""}, {"key": "k", "operator": "Exists"}, True),
    ({}, {"key": "k", "operator": "DoesNotExist"}, True),
    ({"k": "10"}, {"key": "k", "operator": "Gt", "values": ["9"]}, True),
    ({"k": "9"}, {"key": "k", "operator": "Gt", "values": ["9"]}, False),
    ({"k": "10"}, {"key": "k", "operator": "Lt", "values": ["9"]}, False),
    ({"k": "8"}, {"key": "k", "operator": "Lt", "values": ["9"]}, True),
    ({"k": "9.0"}, {"key": "k", "operator": "Gt", "values": ["1"]}, False),  # not an integer
    ({}, {"key": "k", "operator": "Lt", "values": ["9"]}, False),
])
def test_evaluator_semantics(labels, expr, want):
    assert expression_matches(expr, labels) is want


def test_empty_term_matches_nothing():
    assert not term_matches({"matchExpressions": []}, {"a": "b"})


@pytest.fixture(scope="module")
def h200_bundle(tmp_path_factory, tiny_checkpoint):
    """A real tiny-model h200 nvfp4 bundle, kernels compiled by NVRTC (cached per process, shared
    with tests/test_provisioner.py's bundles in one session)."""
    from toolcall.builder.compile import compile_bundle
    from toolcall.runtime.bundle.contract import BuildOptions

    options = BuildOptions(precision="nvfp4", target="h200", max_sequences=8, max_input_tokens=128,
                           max_output_tokens=None, page_size=32, max_tokens_per_step=128, prefill_chunk=64,
                           memory_budget_bytes=None, context_reserve_bytes=None, seed=0)
    catalog = Path(__file__).resolve().parents[1] / "builder" / "data" / "tools-64.json"
    return compile_bundle(tiny_checkpoint, catalog, options, tmp_path_factory.mktemp("h200") / "b").out_dir


@pytest.mark.slow
def test_built_gpu_bundle_end_to_end(h200_bundle):
    """`builder manifest` on a compiled h200 bundle: strict validation, and the selection the runtime's check makes."""
    import kubernetes_validate
    import yaml
    from click.testing import CliRunner

    from toolcall.builder.cli import main

    result = CliRunner().invoke(main, ["manifest", str(h200_bundle), "--kubernetes", "--image", "r/e:cuda",
                                       "--bundle-pvc", "bundles"], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    deployment, service = yaml.safe_load_all(result.stdout)
    for d in (deployment, service):
        kubernetes_validate.validate(d, "1.37.0", strict=True)
    contract = read_contract(h200_bundle)
    spec = deployment["spec"]["template"]["spec"]
    chosen = {n["name"] for n in NODES if schedulable(spec, n)}
    assert chosen == {n["name"] for n in NODES if runtime_accepts(contract, n)} == EXPECTED["h200", "tiny"]
