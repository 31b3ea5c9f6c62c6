"""A contract's target as NVIDIA GPU Feature Discovery (GFD) node labels: the node-affinity terms
that select exactly the nodes whose GPU the runtime's target check (runtime/bundle/machine.py) accepts.

GFD (github.com/NVIDIA/k8s-device-plugin, internal/lm) writes, per node:
- ``nvidia.com/gpu.product``: the NVML device name with spaces replaced by ``-`` ("NVIDIA H200" ->
  ``NVIDIA-H200``); under the MIG "single" strategy the parent's name + ``-MIG-`` + the profile
  (``NVIDIA-H100-80GB-HBM3-MIG-1g.10gb``, the CUDA device name being "NVIDIA H100 80GB HBM3 MIG
  1g.10gb"); a time-sliced (shared) GPU gets ``-SHARED`` appended.
- ``nvidia.com/gpu.memory``: MiB of one GPU, or of one MIG slice under the single strategy.
- ``nvidia.com/gpu.compute.major`` / ``.minor``: the compute capability.
- ``nvidia.com/cuda.runtime-version.major`` / ``.minor``: the CUDA version the driver supports
  (NVML's CUDA driver version, the number ``cuDriverGetVersion`` returns and the contract's
  ``min_driver_version`` holds as 1000 * major + 10 * minor).
- ``nvidia.com/cuda.driver-version.major``: the kernel driver branch (580 of 580.95.05).
- ``nvidia.com/gpu.replicas``: pods sharing one GPU by time-slicing (1 when not shared, 0 for MIG).

Node affinity matches label values exactly (In) or as integers (Gt, Lt), never as substrings,
so the contract's lower-case name substrings are expanded over a table of known NVML names
(PRODUCTS). A substring no known product matches is a typed error (``unplaceable``): a manifest
that schedules nowhere would fail silently. Add a row to PRODUCTS for a new GPU.
"""
from __future__ import annotations

import copy
import itertools
import re
from dataclasses import dataclass

from toolcall.common.errors import BuildError
from toolcall.runtime.bundle.contract import Contract

PRODUCT = "nvidia.com/gpu.product"
MEMORY_MIB = "nvidia.com/gpu.memory"
COMPUTE_MAJOR = "nvidia.com/gpu.compute.major"
COMPUTE_MINOR = "nvidia.com/gpu.compute.minor"
CUDA_MAJOR = "nvidia.com/cuda.runtime-version.major"
CUDA_MINOR = "nvidia.com/cuda.runtime-version.minor"
DRIVER_MAJOR = "nvidia.com/cuda.driver-version.major"
REPLICAS = "nvidia.com/gpu.replicas"  # > 1: time-sliced, each pod's share of memory is not guaranteed
GPU_RESOURCE = "nvidia.com/gpu"

MIB = 1 << 20

# Oldest Linux kernel-driver branch of each CUDA driver API version (CUDA toolkit release notes,
# "minimum required driver version" of the GA release): 13.0 -> 580.65.06, 12.9 -> 575.51.03,
# 12.8 -> 570.26. A version missing here gets the cuda.runtime-version terms only.
DRIVER_BRANCH_FOR_CUDA: dict[int, int] = {12080: 570, 12090: 575, 13000: 580}

# MIG profiles (NVIDIA MIG user guide, "Supported MIG Profiles"), by GPU memory. A profile missing
# here only loses that slice size; a listed one too small for a bundle is excluded by gpu.memory.
_MIG_80GB = ("1g.10gb", "1g.20gb", "2g.20gb", "3g.40gb", "4g.40gb", "7g.80gb")
_MIG_94GB = ("1g.12gb", "1g.24gb", "2g.24gb", "3g.47gb", "4g.47gb", "7g.94gb")
_MIG_141GB = ("1g.18gb", "1g.35gb", "2g.35gb", "3g.71gb", "4g.71gb", "7g.141gb")
_MIG_180GB = ("1g.23gb", "1g.45gb", "2g.45gb", "3g.90gb", "4g.90gb", "7g.180gb")


@dataclass(frozen=True)
class GpuProduct:
    """One GPU as NVML and the CUDA driver name it, its compute capability and its MIG profiles."""

    name: str  # NVML / cuDeviceGetName, e.g. "NVIDIA H100 80GB HBM3"
    compute_capability: str  # "9.0"
    mig_profiles: tuple[str, ...] = ()

    @property
    def label(self) -> str:
        return self.name.replace(" ", "-")

    def mig_label(self, profile: str) -> str:
        return f"{self.label}-MIG-{profile}"


# Products the targets of kernels/targets.py can name (their lower-case substrings are matched
# against these names, as the runtime matches them against the device's name), plus neighbours
# of the same families so that a substring's reach is visible. GH200 and GB200 contain "h200" /
# "b200" and share the compute capability: the runtime accepts them, so placement does too.
PRODUCTS: tuple[GpuProduct, ...] = (
    GpuProduct("NVIDIA A100-SXM4-80GB", "8.0"),
    GpuProduct("NVIDIA A100-SXM4-40GB", "8.0"),
    GpuProduct("NVIDIA A100 80GB PCIe", "8.0"),
    GpuProduct("NVIDIA A10", "8.6"),
    GpuProduct("NVIDIA L4", "8.9"),
    GpuProduct("NVIDIA L40S", "8.9"),
    GpuProduct("NVIDIA H100 80GB HBM3", "9.0", _MIG_80GB),
    GpuProduct("NVIDIA H100 PCIe", "9.0", _MIG_80GB),
    GpuProduct("NVIDIA H100 NVL", "9.0", _MIG_94GB),
    GpuProduct("NVIDIA H200", "9.0", _MIG_141GB),
    GpuProduct("NVIDIA H200 NVL", "9.0", _MIG_141GB),
    GpuProduct("NVIDIA GH200 480GB", "9.0"),
    GpuProduct("NVIDIA GH200 144G HBM3e", "9.0"),
    GpuProduct("NVIDIA H20", "9.0"),
    GpuProduct("NVIDIA B200", "10.0", _MIG_180GB),
    GpuProduct("NVIDIA GB200", "10.0"),
    GpuProduct("NVIDIA GeForce RTX 5090", "12.0"),
    GpuProduct("NVIDIA GeForce RTX 4090", "8.9"),
)

# Kubernetes label values: at most 63 characters, alphanumeric at both ends, - _ . inside.
LABEL_VALUE = re.compile(r"^(?:[A-Za-z0-9](?:[-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)?$")


class PlacementError(BuildError):
    """The contract's target cannot be expressed in node labels (code ``unplaceable``)."""


def accepted_products(contract: Contract, allow_shared: bool = False) -> list[str]:
    """``nvidia.com/gpu.product`` values of every known GPU (whole, or a MIG slice) the runtime
    would accept for this contract; [] when the contract names no GPU (any of its compute capability).

    PlacementError when a name substring matches no known product of the contract's compute capability.
    """
    t = contract.target
    if not t.gpu_names:
        return []
    values = []
    for wanted in t.gpu_names:
        matched = [p for p in PRODUCTS if wanted.lower() in p.name.lower()]
        usable = [p for p in matched if p.compute_capability == t.compute_capability]
        if not usable:
            known = sorted({p.name for p in PRODUCTS})
            raise PlacementError(
                "unplaceable", f"the contract accepts GPUs named like {wanted!r} with compute capability "
                f"{t.compute_capability}, but no known GPU product matches "
                + (f"(found {[p.name + ' ' + p.compute_capability for p in matched]} of another compute capability)"
                   if matched else "it")
                + "; node labels (nvidia.com/gpu.product) can only name exact products: add the GPU's NVML "
                "name to builder/gpu_labels.py PRODUCTS, or build for an architecture target (sm_XY)",
                gpu_name=wanted, compute_capability=t.compute_capability, known=known)
        for p in usable:
            values += [p.label] + [p.mig_label(m) for m in p.mig_profiles]
    values = list(dict.fromkeys(values))  # several substrings may match one product
    if allow_shared:
        values += [v + "-SHARED" for v in values]
    for v in values:
        assert LABEL_VALUE.match(v), f"not a label value: {v!r}"
    return values


def _expr(key: str, op: str, values: list[str] | None = None) -> dict:
    return {"key": key, "operator": op, **({"values": values} if values is not None else {})}


def _at_least(major_key: str, minor_key: str, major: int, minor: int) -> list[list[dict]]:
    """Alternatives (ORed) of ANDed expressions: the integer version (major, minor) >= (major, minor)."""
    if minor == 0:
        return [[_expr(major_key, "Gt", [str(major - 1)])]]
    return [[_expr(major_key, "Gt", [str(major)])],
            [_expr(major_key, "In", [str(major)]), _expr(minor_key, "Gt", [str(minor - 1)])]]


def node_selector_terms(contract: Contract, allow_shared: bool = False) -> list[dict]:
    """``nodeSelectorTerms`` (ORed; each a list of ANDed matchExpressions) selecting the nodes whose GPU
    honours a GPU contract: product, compute capability, driver and memory. [] for a CPU contract."""
    t = contract.target
    if t.compute_capability is None:
        return []
    clauses: list[list[list[dict]]] = []  # AND over clauses of OR over alternatives
    products = accepted_products(contract, allow_shared)
    if products:
        clauses.append([[_expr(PRODUCT, "In", products)]])
    if not allow_shared:  # also where no product list names the "-SHARED" suffix (sm_XY targets)
        clauses.append([[_expr(REPLICAS, "Lt", ["2"])]])
    major, minor = t.compute_capability.split(".")
    clauses.append([[_expr(COMPUTE_MAJOR, "In", [major]), _expr(COMPUTE_MINOR, "In", [minor])]])
    if t.min_driver_version is not None:
        v = t.min_driver_version  # 1000 * major + 10 * minor
        clauses.append(_at_least(CUDA_MAJOR, CUDA_MINOR, v // 1000, (v % 1000) // 10))
        if v in DRIVER_BRANCH_FOR_CUDA:
            clauses.append([[_expr(DRIVER_MAJOR, "Gt", [str(DRIVER_BRANCH_FOR_CUDA[v] - 1)])]])
    need_mib = -(-contract.memory.total_bytes // MIB)
    clauses.append([[_expr(MEMORY_MIB, "Gt", [str(need_mib - 1)])]])
    # deep copies: terms share no dicts, so a caller may edit one without changing another
    return copy.deepcopy([{"matchExpressions": [e for alt in combo for e in alt]}
                          for combo in itertools.product(*clauses)])
