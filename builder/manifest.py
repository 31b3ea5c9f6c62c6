"""Kubernetes manifests from a bundle's contract: a Deployment placed only on nodes that can honour
the contract (node affinity on GPU Feature Discovery labels, builder/gpu_labels.py), a Service, and on
request a HorizontalPodAutoscaler on the queue (builder/autoscale.py).

Reads only ``contract.json`` (schema-checked), as a provisioner would; ``builder verify`` checks
the files. Every number below is either the contract's or a stated constant a flag overrides.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

from toolcall.builder.autoscale import autoscaler
from toolcall.builder.gpu_labels import GPU_RESOURCE, MIB, PRODUCT, node_selector_terms
from toolcall.common.errors import EngineError
from toolcall.runtime.bundle.contract import CONTRACT_FILE, Contract
from toolcall.runtime.bundle.files import read_contract, sha256_file
from toolcall.runtime.bundle.machine import serving_threads

PORT = 8000
MOUNT_PATH = "/bundle"
LABEL_PREFIX = "toolcall-engine/"
# Label values hold at most 63 characters: labels carry the first 32 hex digits (128 bits) of the
# 64-digit bundle id and contract sha256; the annotations carry them whole.
LABEL_HASH_DIGITS = 32

# Host memory of the serving process besides the bundle: 99 MiB peak RSS measured (python 3.11,
# numpy, tokenizers, fastapi, uvicorn, prometheus-client, cuda-bindings imported; tiny CPU bundle
# loaded and run: see /work/notes/i20.md), rounded up to 256 MiB for request and connection
# buffers under load and allocator growth.
HOST_BASE_BYTES = 256 * MIB
# GPU bundles add the CUDA driver's host side (libcuda mappings, the primary context, loaded
# cubins): an estimate, not measured here (no GPU); --host-overhead replaces the sum.
CUDA_HOST_BYTES = 512 * MIB

# Startup: imports, CUDA context, graph capture and the canary within STARTUP_BASE_S, plus the bundle
# files read twice (hashed, then loaded) at READ_BYTES_PER_S, a slow network volume.
STARTUP_BASE_S = 120
READ_BYTES_PER_S = 100 * 10**6
STARTUP_PERIOD_S = 10
PRE_STOP_S = 5  # endpoints stop routing to the pod before SIGTERM starts the drain
DRAIN_S = 30

DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")  # RFC 1035 (Service names)
DNS_1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")  # namespaces
CPU_QUANTITY = re.compile(r"^([0-9]+(\.[0-9]+)?|\.[0-9]+|[0-9]+m)$")
DNS_SUBDOMAIN = re.compile(r"^(?=.{1,253}$)[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")  # claim names


@dataclass(frozen=True)
class BundleSource:
    """Where the pod finds the bundle: ``pvc`` (claim name), ``host_path`` (node folder) or
    ``image`` (a folder inside the container image, baked in at build time)."""

    kind: str
    value: str
    sub_path: str | None = None  # pvc only: the bundle's folder inside the claim


@dataclass(frozen=True)
class ManifestOptions:
    image: str
    source: BundleSource
    name: str | None = None  # default: default_name(contract)
    namespace: str | None = None
    replicas: int = 1
    cpu_request: str = "2"  # the engine thread and the server's event loop
    host_overhead_bytes: int | None = None  # default HOST_BASE_BYTES (+ CUDA_HOST_BYTES on a GPU)
    startup_seconds: int | None = None  # default startup_seconds(contract)
    drain_seconds: int = DRAIN_S
    allow_shared_gpu: bool = False  # also place on time-sliced GPUs (product label "...-SHARED")
    autoscale: tuple[int, int] | None = None  # (MIN, MAX) replicas: a HorizontalPodAutoscaler (builder/autoscale.py)
    waiting_per_pod: int | None = None  # the autoscaler's target; default: the contract's max_sequences


def engine_threads(cpu_request: str) -> int:
    """`runtime serve --threads` for a CPU bundle: ``serving_threads`` of the CPUs the pod requests (rounded
    up); the container sees the node's cores, not its request."""
    millis = int(cpu_request[:-1]) if cpu_request.endswith("m") else round(float(cpu_request) * 1000)
    return serving_threads(-(-millis // 1000))


def _usage(message: str, **details) -> EngineError:
    return EngineError("usage", message, **details)


def check_options(o: ManifestOptions) -> None:
    """EngineError("usage") for a name, namespace, source or number Kubernetes would reject."""
    if o.name is not None and not DNS_LABEL.match(o.name):
        raise _usage(f"--name {o.name!r}: expected a DNS label (lower-case letters, digits and '-', starting with a "
                     "letter, at most 63 characters), as Kubernetes requires of Service names", option="name")
    if o.namespace is not None and not DNS_1123_LABEL.match(o.namespace):
        raise _usage(f"--namespace {o.namespace!r}: expected a DNS label (lower-case letters, digits and '-', at "
                     "most 63 characters)", option="namespace")
    if not o.image.strip() or any(c.isspace() for c in o.image):
        raise _usage(f"--image {o.image!r}: expected an image reference such as registry/toolcall-engine:0.1.0",
                     option="image")
    if not CPU_QUANTITY.match(o.cpu_request):
        raise _usage(f"--cpu {o.cpu_request!r}: expected a CPU quantity such as 2, 0.5 or 1500m", option="cpu")
    s = o.source
    if s.kind == "pvc" and not DNS_SUBDOMAIN.match(s.value):
        raise _usage(f"--bundle-pvc {s.value!r}: expected a PersistentVolumeClaim name (lower-case DNS subdomain)",
                     option="bundle_pvc")
    if s.kind in ("host_path", "image") and not s.value.startswith("/"):
        flag = "--bundle-host-path" if s.kind == "host_path" else "--bundle-in-image"
        raise _usage(f"{flag} {s.value!r}: expected an absolute path", option=s.kind)
    if s.sub_path is not None and (s.kind != "pvc" or s.sub_path.startswith("/") or ".." in s.sub_path.split("/")):
        raise _usage(f"--bundle-subpath {s.sub_path!r}: expected a relative folder inside the claim, with "
                     "--bundle-pvc", option="bundle_subpath")
    for flag, value, least in (("--replicas", o.replicas, 0), ("--drain-seconds", o.drain_seconds, 0),
                               ("--startup-seconds", o.startup_seconds, 1)):
        if value is not None and value < least:
            raise _usage(f"{flag} must be at least {least}, got {value}", option=flag[2:])


def default_name(contract: Contract) -> str:
    """``toolcall-<target>-<precision>``, '_' as '-' (e.g. toolcall-h200-fp8-e4m3)."""
    return f"toolcall-{contract.target.name}-{contract.precision.weights}".replace("_", "-").lower()


def host_memory_bytes(contract: Contract, overhead_bytes: int | None = None) -> int:
    """Container memory (request = limit): a CPU bundle's contract total is host memory (the fast
    CPU backend `runtime serve` uses holds the weights as stored, memory-mapped, so a load's
    resident memory is that total); a GPU bundle's contract total is device memory."""
    gpu = contract.target.compute_capability is not None
    if overhead_bytes is None:
        overhead_bytes = HOST_BASE_BYTES + (CUDA_HOST_BYTES if gpu else 0)
    if gpu:
        return overhead_bytes
    return contract.memory.total_bytes + overhead_bytes


def startup_seconds(contract: Contract) -> int:
    files = sum(f.bytes for f in contract.files.values())
    return STARTUP_BASE_S + -(-2 * files // READ_BYTES_PER_S)


def _mebibytes(n: int) -> str:
    return f"{-(-n // MIB)}Mi"


def _volume(o: ManifestOptions) -> tuple[list[dict], list[dict], str]:
    """(volumes, volume mounts, the bundle's path in the container)."""
    tmp = ({"name": "tmp", "emptyDir": {"sizeLimit": "256Mi"}}, {"name": "tmp", "mountPath": "/tmp"})
    s = o.source
    if s.kind == "image":
        return [tmp[0]], [tmp[1]], s.value
    if s.kind == "pvc":
        vol = {"name": "bundle", "persistentVolumeClaim": {"claimName": s.value, "readOnly": True}}
    else:
        assert s.kind == "host_path", s.kind
        vol = {"name": "bundle", "hostPath": {"path": s.value, "type": "Directory"}}
    mount = {"name": "bundle", "mountPath": MOUNT_PATH, "readOnly": True, **({"subPath": s.sub_path} if s.sub_path else {})}
    return [vol, tmp[0]], [mount, tmp[1]], MOUNT_PATH


def kubernetes_manifests(contract: Contract, contract_sha256: str, o: ManifestOptions) -> list[dict]:
    """[Deployment, Service] for the bundle; PlacementError (unplaceable) when the target has no labels."""
    check_options(o)
    terms = node_selector_terms(contract, o.allow_shared_gpu)
    gpu = contract.target.compute_capability is not None
    name = o.name or default_name(contract)
    bundle_id = contract.engine.bundle_id
    selector = {"app.kubernetes.io/name": "toolcall-engine", "app.kubernetes.io/instance": name}
    labels = {**selector, "app.kubernetes.io/component": "inference",
              LABEL_PREFIX + "bundle-id": bundle_id[:LABEL_HASH_DIGITS],
              LABEL_PREFIX + "contract-sha256": contract_sha256[:LABEL_HASH_DIGITS],
              LABEL_PREFIX + "target": contract.target.name, LABEL_PREFIX + "precision": contract.precision.weights}
    host_bytes = host_memory_bytes(contract, o.host_overhead_bytes)
    annotations = {LABEL_PREFIX + "bundle-id": bundle_id, LABEL_PREFIX + "contract-sha256": contract_sha256,
                   LABEL_PREFIX + "contract-memory-bytes": str(contract.memory.total_bytes),
                   LABEL_PREFIX + "host-memory-bytes": str(host_bytes)}
    meta = {"name": name, **({"namespace": o.namespace} if o.namespace else {})}
    startup = o.startup_seconds or startup_seconds(contract)
    volumes, mounts, bundle_path = _volume(o)

    resources = {"requests": {"cpu": o.cpu_request, "memory": _mebibytes(host_bytes)},
                 "limits": {"memory": _mebibytes(host_bytes)}}
    if gpu:
        resources["requests"][GPU_RESOURCE] = 1
        resources["limits"][GPU_RESOURCE] = 1
    probe = {"httpGet": {"path": "/health/ready", "port": "http"}}
    container = {
        "name": "engine", "image": o.image, "imagePullPolicy": "IfNotPresent",
        "command": ["runtime", "serve", bundle_path, "--host", "0.0.0.0", "--port", str(PORT),
                    *([] if gpu else ["--threads", str(engine_threads(o.cpu_request))])],
        "ports": [{"name": "http", "containerPort": PORT, "protocol": "TCP"}],
        "resources": resources,
        "startupProbe": {**probe, "periodSeconds": STARTUP_PERIOD_S, "timeoutSeconds": 5,
                         "failureThreshold": -(-startup // STARTUP_PERIOD_S)},
        "readinessProbe": {**probe, "periodSeconds": 5, "timeoutSeconds": 2, "failureThreshold": 2},
        "livenessProbe": {"httpGet": {"path": "/health/live", "port": "http"}, "periodSeconds": 10,
                          "timeoutSeconds": 5, "failureThreshold": 3},
        "lifecycle": {"preStop": {"exec": {"command": ["sleep", str(PRE_STOP_S)]}}},
        "volumeMounts": mounts,
        "securityContext": {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True,
                            "runAsNonRoot": True, "capabilities": {"drop": ["ALL"]}},
    }
    if gpu:  # required: only nodes that honour the contract
        affinity = {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}
    else:  # any node can; leave the GPU nodes to GPU work where there is a choice
        affinity = {"nodeAffinity": {"preferredDuringSchedulingIgnoredDuringExecution": [
            {"weight": 100, "preference": {"matchExpressions": [{"key": PRODUCT, "operator": "DoesNotExist"}]}}]}}
    pod_spec = {
        "enableServiceLinks": False,
        "terminationGracePeriodSeconds": PRE_STOP_S + o.drain_seconds + 5,
        "affinity": affinity,
        **({"tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}]} if gpu else {}),
        "containers": [container],
        "volumes": volumes,
    }
    deployment = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {**meta, "labels": labels, "annotations": annotations},
        "spec": {
            "replicas": o.replicas,
            "progressDeadlineSeconds": max(600, startup + 60),
            "selector": {"matchLabels": selector},
            "template": {
                "metadata": {"labels": labels, "annotations": {
                    **annotations, "prometheus.io/scrape": "true", "prometheus.io/path": "/metrics",
                    "prometheus.io/port": str(PORT)}},
                "spec": pod_spec,
            },
        },
    }
    service = {
        "apiVersion": "v1", "kind": "Service",
        "metadata": {**meta, "labels": labels, "annotations": annotations},
        "spec": {"type": "ClusterIP", "selector": selector,
                 "ports": [{"name": "http", "port": PORT, "targetPort": "http", "protocol": "TCP"}]},
    }
    if o.autoscale is None:
        return [deployment, service]
    deployment["spec"]["replicas"] = o.autoscale[0]
    waiting = o.waiting_per_pod if o.waiting_per_pod is not None else contract.limits.max_sequences
    return [deployment, service, autoscaler(deployment, o.autoscale, waiting)]


def bundle_manifests(folder: str | Path, o: ManifestOptions) -> tuple[Contract, list[dict]]:
    """The bundle's contract and its manifests (Refusal if contract.json is missing or invalid)."""
    contract = read_contract(folder)
    return contract, kubernetes_manifests(contract, sha256_file(Path(folder) / CONTRACT_FILE), o)


def to_yaml(contract: Contract, docs: list[dict]) -> str:
    """Multi-document YAML, keys in the order written, with a header naming the bundle."""
    header = (f"# builder manifest: bundle {contract.engine.bundle_id} ({contract.target.name}, "
              f"{contract.precision.weights}); regenerate from the bundle rather than edit by hand.\n")
    return header + yaml.dump_all(docs, Dumper=_PlainDumper, sort_keys=False, explicit_start=True, width=1000)


class _PlainDumper(yaml.SafeDumper):
    """SafeDumper writing shared dicts out in full (no &anchors / *aliases: plainer for people and tools)."""

    def ignore_aliases(self, data) -> bool:
        return True
