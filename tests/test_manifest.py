"""`builder manifest --kubernetes`: the YAML validates strictly against Kubernetes' schemas, and
carries the contract's resources, probes, identity and volume; bad options are typed errors.

Placement (node affinity against GFD label sets) is tests/test_manifest_placement.py.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import subprocess
import sys
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from click.testing import CliRunner

from toolcall.builder.cli import main
from toolcall.builder.kernel_build import contract_target
from toolcall.builder.manifest import (
    CUDA_HOST_BYTES,
    HOST_BASE_BYTES,
    LABEL_HASH_DIGITS,
    BundleSource,
    ManifestOptions,
    kubernetes_manifests,
    startup_seconds,
)
from toolcall.builder.memory_plan import MIB, plan_memory
from toolcall.runtime.bundle.files import read_contract

# The newest Kubernetes minor kubernetes-validate 1.37 ships schemas for, and the oldest one still
# maintained upstream when it was released: the manifests use nothing newer than either.
K8S_VERSIONS = ("1.37.0", "1.35.0")
IMAGE = "registry.example/toolcall-engine:0.1.0"


@pytest.fixture(scope="module")
def gpu_bundle(tiny_bundle, tmp_path_factory):
    """A folder holding only contract.json: the tiny bundle's contract re-targeted to h200 (the
    manifest reads nothing else; no kernels are compiled)."""
    base = read_contract(tiny_bundle)
    t = contract_target("h200")
    contract = dataclasses.replace(base, target=t, memory=plan_memory(base.model, "fp8_e4m3", base.limits, t.name))
    folder = tmp_path_factory.mktemp("h200-contract")
    (folder / "contract.json").write_text(contract.to_json())
    return folder


def manifest_cli(*args) -> tuple[int, str, str]:
    result = CliRunner().invoke(main, ["manifest", *map(str, args)], catch_exceptions=False)
    return result.exit_code, result.stdout, result.stderr


def docs_of(folder, *extra, source=("--bundle-pvc", "bundles")) -> list[dict]:
    code, out, err = manifest_cli(folder, "--kubernetes", "--image", IMAGE, *source, *extra)
    assert code == 0, err
    return list(yaml.safe_load_all(out))


SOURCES = {"pvc": ("--bundle-pvc", "toolcall-bundles", "--bundle-subpath", "q06-fp8"),
           "host_path": ("--bundle-host-path", "/srv/bundles/q06"),
           "image": ("--bundle-in-image", "/opt/bundle")}


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("source", sorted(SOURCES))
@pytest.mark.parametrize("kind", ["cpu", "gpu"])
def test_manifests_validate_strictly(tiny_bundle, gpu_bundle, kind, source, version):
    folder = tiny_bundle if kind == "cpu" else gpu_bundle
    docs = docs_of(folder, "--namespace", "inference", "--replicas", "3", source=SOURCES[source])
    assert [d["kind"] for d in docs] == ["Deployment", "Service"]
    for d in docs:
        assert kubernetes_validate.validate(d, version, strict=True) == version.rsplit(".", 1)[0]


@pytest.mark.parametrize("version", K8S_VERSIONS)
def test_the_autoscaler_scales_the_deployment_on_waiting_requests(gpu_bundle, version):
    from toolcall.builder.autoscale import ADAPTER_RULE, WAITING_METRIC
    from toolcall.runtime.bundle.files import read_contract

    docs = docs_of(gpu_bundle, "--namespace", "inference", "--autoscale", "2:9")
    assert [d["kind"] for d in docs] == ["Deployment", "Service", "HorizontalPodAutoscaler"]
    for d in docs:
        assert kubernetes_validate.validate(d, version, strict=True) == version.rsplit(".", 1)[0]
    deployment, _, hpa = docs
    spec = hpa["spec"]
    assert (spec["minReplicas"], spec["maxReplicas"], deployment["spec"]["replicas"]) == (2, 9, 2)
    assert spec["scaleTargetRef"]["name"] == deployment["metadata"]["name"] == hpa["metadata"]["name"]
    assert hpa["metadata"]["namespace"] == "inference"
    (metric,) = spec["metrics"]
    assert metric["pods"]["metric"]["name"] == WAITING_METRIC and WAITING_METRIC.replace("toolcall_", "") in \
        ADAPTER_RULE and "toolcall:num_requests_waiting" in ADAPTER_RULE
    limits = read_contract(gpu_bundle).limits
    assert metric["pods"]["target"]["averageValue"] == str(limits.max_sequences)
    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    assert ADAPTER_RULE.strip() in readme  # the README shows the rule the autoscaler needs
    custom = docs_of(gpu_bundle, "--autoscale", "1:3", "--waiting-per-pod", "40")[2]
    assert custom["spec"]["metrics"][0]["pods"]["target"]["averageValue"] == "40"


def test_strict_validation_catches_a_stray_field(tiny_bundle):
    (deployment, _service) = docs_of(tiny_bundle)
    deployment["spec"]["template"]["spec"]["containers"][0]["startupprobe"] = {}
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(deployment, K8S_VERSIONS[0], strict=True)


def test_cli_file_validates_with_kubernetes_validate_command(gpu_bundle, tmp_path):
    out = tmp_path / "deploy.yaml"
    code, _, err = manifest_cli(gpu_bundle, "--kubernetes", "--image", IMAGE, "--bundle-pvc", "bundles",
                                "--out", out)
    assert code == 0 and "wrote" in err
    cmd = [sys.executable, "-m", "kubernetes_validate", "--strict", "-k", K8S_VERSIONS[0], str(out)]
    run = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert run.stdout.count("passed") == 2 and "WARN" not in run.stdout, run.stdout


def test_gpu_resources_probes_and_drain(gpu_bundle):
    contract = read_contract(gpu_bundle)
    deployment, service = docs_of(gpu_bundle, "--drain-seconds", "45")
    pod = deployment["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    assert c["resources"]["requests"]["nvidia.com/gpu"] == 1 == c["resources"]["limits"]["nvidia.com/gpu"]
    host = f"{-(-(HOST_BASE_BYTES + CUDA_HOST_BYTES) // MIB)}Mi"
    assert c["resources"]["requests"]["memory"] == host == c["resources"]["limits"]["memory"]
    assert c["command"] == ["runtime", "serve", "/bundle", "--host", "0.0.0.0", "--port", "8000"]
    assert c["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    assert c["readinessProbe"]["httpGet"]["path"] == "/health/ready"
    assert c["livenessProbe"]["httpGet"]["path"] == "/health/live"
    s = c["startupProbe"]
    assert s["httpGet"]["path"] == "/health/ready"
    assert s["periodSeconds"] * s["failureThreshold"] >= startup_seconds(contract) >= 120
    pre_stop = int(c["lifecycle"]["preStop"]["exec"]["command"][1])
    assert pod["terminationGracePeriodSeconds"] >= pre_stop + 45
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in pod["tolerations"]
    terms = pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    keys = {e["key"] for t in terms for e in t["matchExpressions"]}
    assert {"nvidia.com/gpu.product", "nvidia.com/gpu.compute.major", "nvidia.com/gpu.compute.minor",
            "nvidia.com/cuda.driver-version.major", "nvidia.com/gpu.memory"} <= keys
    need_mib = -(-contract.memory.total_bytes // MIB)
    assert all({"key": "nvidia.com/gpu.memory", "operator": "Gt", "values": [str(need_mib - 1)]}
               in t["matchExpressions"] for t in terms)
    assert service["spec"]["ports"][0]["port"] == 8000 and service["spec"]["selector"] == deployment["spec"]["selector"]["matchLabels"]


def test_cpu_memory_is_the_contract_plus_float32_weights_plus_overhead(tiny_bundle):
    contract = read_contract(tiny_bundle)
    (deployment, _service) = docs_of(tiny_bundle, "--host-overhead", "1GiB", "--cpu", "1500m")
    (c,) = deployment["spec"]["template"]["spec"]["containers"]
    want = contract.memory.total_bytes + (1 << 30)
    assert c["resources"]["requests"] == {"cpu": "1500m", "memory": f"{-(-want // MIB)}Mi"}
    assert c["resources"]["limits"] == {"memory": f"{-(-want // MIB)}Mi"}
    assert c["command"][-2:] == ["--threads", "1"]  # 1.5 CPUs requested: 2, one kept for the HTTP loop
    assert "requiredDuringSchedulingIgnoredDuringExecution" not in deployment["spec"]["template"]["spec"]["affinity"]["nodeAffinity"]


def test_identity_labels_and_scrape_annotations(tiny_bundle):
    contract = read_contract(tiny_bundle)
    sha = hashlib.sha256((tiny_bundle / "contract.json").read_bytes()).hexdigest()
    deployment, service = docs_of(tiny_bundle, "--name", "tools-a")
    template = deployment["spec"]["template"]["metadata"]
    for meta in (deployment["metadata"], service["metadata"], template):
        assert meta["labels"]["toolcall-engine/bundle-id"] == contract.engine.bundle_id[:LABEL_HASH_DIGITS]
        assert meta["labels"]["toolcall-engine/contract-sha256"] == sha[:LABEL_HASH_DIGITS]
        assert meta["annotations"]["toolcall-engine/bundle-id"] == contract.engine.bundle_id
        assert meta["annotations"]["toolcall-engine/contract-sha256"] == sha
        assert all(len(v) <= 63 for v in meta["labels"].values())
    assert template["annotations"]["prometheus.io/scrape"] == "true"
    assert template["annotations"]["prometheus.io/path"] == "/metrics"
    assert template["annotations"]["prometheus.io/port"] == "8000"
    # the selector names the deployment, not the bundle: a new bundle rolls out under the same Deployment
    assert deployment["spec"]["selector"]["matchLabels"] == {"app.kubernetes.io/name": "toolcall-engine",
                                                             "app.kubernetes.io/instance": "tools-a"}
    assert deployment["metadata"]["name"] == service["metadata"]["name"] == "tools-a"


@pytest.mark.parametrize("source,volume", [
    ("pvc", {"name": "bundle", "persistentVolumeClaim": {"claimName": "toolcall-bundles", "readOnly": True}}),
    ("host_path", {"name": "bundle", "hostPath": {"path": "/srv/bundles/q06", "type": "Directory"}}),
    ("image", None)])
def test_bundle_volume_is_read_only(tiny_bundle, source, volume):
    (deployment, _service) = docs_of(tiny_bundle, source=SOURCES[source])
    pod = deployment["spec"]["template"]["spec"]
    (c,) = pod["containers"]
    bundle_mounts = [m for m in c["volumeMounts"] if m["name"] == "bundle"]
    if volume is None:
        assert not bundle_mounts and c["command"][2] == "/opt/bundle"
        assert all(v["name"] != "bundle" for v in pod["volumes"])
    else:
        assert volume in pod["volumes"]
        assert bundle_mounts[0]["readOnly"] is True and bundle_mounts[0]["mountPath"] == "/bundle"
        assert bundle_mounts[0].get("subPath") == ("q06-fp8" if source == "pvc" else None)
    assert c["securityContext"]["readOnlyRootFilesystem"] is True


def test_output_is_deterministic(gpu_bundle):
    args = (gpu_bundle, "--kubernetes", "--image", IMAGE, "--bundle-host-path", "/srv/b")
    assert manifest_cli(*args)[1] == manifest_cli(*args)[1]
    assert "&id" not in manifest_cli(*args)[1]  # no YAML anchors


@pytest.mark.parametrize("args,code,problem", [
    (("--image", IMAGE, "--bundle-pvc", "b"), 2, "--kubernetes"),
    (("--kubernetes", "--image", IMAGE), 2, "exactly one"),
    (("--kubernetes", "--image", IMAGE, "--bundle-pvc", "b", "--bundle-host-path", "/x"), 2, "exactly one"),
    (("--kubernetes", "--image", IMAGE, "--bundle-pvc", "b", "--name", "Tools_A"), 2, "DNS label"),
    (("--kubernetes", "--image", IMAGE, "--bundle-pvc", "b", "--namespace", "a.b"), 2, "DNS label"),
    (("--kubernetes", "--image", IMAGE, "--bundle-host-path", "relative/x"), 2, "absolute"),
    (("--kubernetes", "--image", IMAGE, "--bundle-host-path", "/x", "--bundle-subpath", "y"), 2, "--bundle-pvc"),
    (("--kubernetes", "--image", IMAGE, "--bundle-pvc", "b", "--replicas", "-1"), 2, "at least 0"),
    (("--kubernetes", "--image", "", "--bundle-pvc", "b"), 2, "image reference"),
    (("--kubernetes", "--image", IMAGE, "--bundle-pvc", "b", "--cpu", "two"), 2, "CPU quantity"),
    (("--kubernetes", "--image", IMAGE, "--bundle-pvc", "b", "--host-overhead", "lots"), 2, "lots"),
    (("--kubernetes", "--image", IMAGE, "--bundle-pvc", "b", "--autoscale", "8:2"), 2, "MIN:MAX"),
    (("--kubernetes", "--image", IMAGE, "--bundle-pvc", "b", "--autoscale", "0:2"), 2, "MIN:MAX"),
    (("--kubernetes", "--image", IMAGE, "--bundle-pvc", "b", "--autoscale", "two"), 2, "MIN:MAX"),
    (("--kubernetes", "--image", IMAGE, "--bundle-pvc", "b", "--waiting-per-pod", "4"), 2, "--autoscale"),
])
def test_bad_options_are_usage_errors(tiny_bundle, args, code, problem):
    result = CliRunner().invoke(main, ["manifest", str(tiny_bundle), *args, "--json"])
    assert result.exit_code == code
    err = json.loads(result.stdout)
    assert err["error"] == "usage" and problem in err["message"]


def test_missing_contract_is_refused(tmp_path):
    code, out, _ = manifest_cli(tmp_path, "--kubernetes", "--image", IMAGE, "--bundle-pvc", "b", "--json")
    assert code == 20 and json.loads(out)["error"] == "missing_contract"


def test_unknown_gpu_name_exits_unplaceable(gpu_bundle, tmp_path):
    data = json.loads((gpu_bundle / "contract.json").read_text())
    data["target"]["gpu_names"] = ["mi300x"]
    (tmp_path / "contract.json").write_text(json.dumps(data))
    code, out, _ = manifest_cli(tmp_path, "--kubernetes", "--image", IMAGE, "--bundle-pvc", "b", "--json")
    err = json.loads(out)
    assert code == 100 and err["error"] == "unplaceable" and err["details"]["gpu_name"] == "mi300x"


def test_manifest_options_direct_use(tiny_bundle):
    """The library call gives the documents the CLI prints."""
    contract = read_contract(tiny_bundle)
    sha = hashlib.sha256((tiny_bundle / "contract.json").read_bytes()).hexdigest()
    docs = kubernetes_manifests(contract, sha, ManifestOptions(image=IMAGE, source=BundleSource("pvc", "bundles")))
    assert docs == docs_of(tiny_bundle)


@pytest.mark.parametrize("cpu,threads", [("2", 1), ("1500m", 1), ("0.5", 1), ("4", 3), ("8000m", 7), ("2.5", 2)])
def test_cpu_engine_threads_follow_the_cpu_request(cpu, threads):
    from toolcall.builder.manifest import engine_threads

    assert engine_threads(cpu) == threads
