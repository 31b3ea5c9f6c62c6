"""Build targets: which GPUs a bundle's kernels are compiled for and may run on.

A target name (``--target``) maps to the SM architecture the cubins are compiled for, the
compute capability a device must report, the device-name substrings accepted (empty: any
device of that compute capability) and the minimum driver version (``cuDriverGetVersion``:
1000 * major + 10 * minor). ``cpu`` has no kernels.
"""
from __future__ import annotations

from dataclasses import dataclass

from toolcall.common.errors import BuildError

# cuda-bindings 13.x needs a CUDA 13.0 driver (>= 580); cubins from NVRTC 13 need it too.
MIN_DRIVER_VERSION = 13000

# SM architectures NVRTC 13 turns into cubin without a GPU, and we ship kernels for. The arch-specific
# sm_100a / sm_120a cubins run only on compute capability 10.0 / 12.0 (as every cubin here: see
# Target.accepts) and use those chips' own instructions (the hardware e2m1 conversion, kernels/common.cuh);
# plain sm_100 / sm_120 are the fallback for any device of that capability.
SM_ARCHS: tuple[str, ...] = ("sm_80", "sm_89", "sm_90", "sm_100", "sm_100a", "sm_120", "sm_120a")


@dataclass(frozen=True)
class Target:
    """One build target. ``sm_arch``/``compute_capability`` are None for ``cpu``."""

    name: str
    sm_arch: str | None
    compute_capability: tuple[int, int] | None
    gpu_names: tuple[str, ...]
    min_driver_version: int

    @property
    def is_gpu(self) -> bool:
        return self.sm_arch is not None

    def accepts(self, device_name: str, compute_capability: tuple[int, int]) -> bool:
        """True if a device of this name and compute capability may run this target's cubins.

        A plain ``sm_XY`` cubin runs only on compute capability X.Y here: we never rely on
        forward-compatible JIT of PTX, because the bundle carries no PTX.
        """
        if not self.is_gpu or tuple(compute_capability) != self.compute_capability:
            return False
        return not self.gpu_names or any(s.lower() in device_name.lower() for s in self.gpu_names)

    def to_dict(self) -> dict:
        return {"name": self.name, "sm_arch": self.sm_arch,
                "compute_capability": list(self.compute_capability) if self.compute_capability else None,
                "gpu_names": list(self.gpu_names), "min_driver_version": self.min_driver_version}


def _gpu(name: str, arch: str, names: tuple[str, ...]) -> Target:
    return Target(name, arch, arch_capability(arch), names, MIN_DRIVER_VERSION)


def arch_capability(arch: str) -> tuple[int, int]:
    """``sm_90`` -> (9, 0), ``sm_120a`` -> (12, 0): last digit minor, the rest major (a suffix dropped)."""
    digits = arch[3:].rstrip("abcdefghijklmnopqrstuvwxyz")
    return int(digits[:-1]), int(digits[-1])


TARGETS: dict[str, Target] = {
    "cpu": Target("cpu", None, None, (), 0),
    "h100": _gpu("h100", "sm_90", ("H100",)),
    "h200": _gpu("h200", "sm_90", ("H200",)),
    "b200": _gpu("b200", "sm_100a", ("B200",)),
    "rtx5090": _gpu("rtx5090", "sm_120a", ("RTX 5090",)),
}
TARGETS.update({arch: _gpu(arch, arch, ()) for arch in SM_ARCHS})


class TargetError(BuildError):
    """An unknown target name or SM architecture; ``details["known"]`` lists the known ones."""


def known_targets() -> list[str]:
    return list(TARGETS)


def resolve_target(name: str) -> Target:
    """The target for a name (case-insensitive); ``TargetError`` (code ``usage``) if unknown."""
    key = str(name).strip().lower()
    if key not in TARGETS:
        raise TargetError("usage", f"unknown target {name!r}; known targets: "
                          f"{', '.join(TARGETS)}", target=str(name), known=known_targets())
    return TARGETS[key]


def check_arch(arch: str) -> str:
    """``arch`` if it is one of SM_ARCHS; ``TargetError`` otherwise."""
    if arch not in SM_ARCHS:
        raise TargetError("usage", f"unsupported SM architecture {arch!r}; supported: "
                          f"{', '.join(SM_ARCHS)}", arch=str(arch), known=list(SM_ARCHS))
    return arch
