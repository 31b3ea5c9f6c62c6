"""What bench/gpu_check.py runs where (one plan per device of runtime/cuda/devices.py DEVICES): on a card it checks
and measures within a lent device's minutes; on the simulated device it rehearses the stages that check answers,
whose launches there take milliseconds to a second of CPU each (bench/RESULTS.md, "Simulated device: GPU bundles
end to end on the CPU"), and measures nothing.
"""
from __future__ import annotations

from dataclasses import dataclass

from gpu_check_stages import BUNDLES

# seconds per stage process on a card, each also capped by what is left of the budget
CARD_TIMEOUTS = {"build": 330, "kernels": 200, "kernels-while": 60, "cpuref": 300, "e2e": 150, "bench": 120,
                 "kernel-times": 120, "gates": 120, "serving": 240, "engine": 90, "pytest": 180}
TIMED = ("bench", "kernel-times", "engine", "pytest")  # the stages that time a card (pytest: its GPU-marked tests)


@dataclass(frozen=True)
class CheckPlan:
    """``timeouts``: seconds per stage kind; ``budget_s``: the global guard's default; ``work``: the default work
    folder under artifacts/; ``bundles``: the default BUNDLES; ``mma_variants``: bundles whose e2e (and bench) run
    again with the mma kernel family; ``skipped``: stage kinds left out, with the reason the report gives;
    ``ci_kernels``: the kernels stage runs only the cases marked for CI (toolcall.kernels.cases); ``burst``:
    bench/serve_burst.py's options for the serving stage; ``records``: the run merges the device record."""

    timeouts: dict
    budget_s: float
    work: str
    bundles: tuple[str, ...]
    mma_variants: tuple[str, ...]
    skipped: dict
    ci_kernels: bool
    burst: tuple[str, ...]
    records: bool


PLANS = {
    # the Qwen3-0.6B-shaped bundles and their mma runs (prompts long enough for the wide tiling, T >= 64); the
    # nvfp4 kernels of the family are judged by the kernels stage's table (a second bundle would cost a minute)
    "native": CheckPlan(CARD_TIMEOUTS, 450.0, "gpu-check", tuple(BUNDLES), ("q06-fp8",), {}, False,
                        ("--clients", "2048"), True),
    # no q06 bundles (28 layers of the 0.6B shape would take hours); tool-fp8's 256-token prompt takes 64-row chunks
    # for the mma run; the burst: 64 clients over 16 distinct requests, each also run alone as the reference
    "sim": CheckPlan({**CARD_TIMEOUTS, "kernels": 1200, "kernels-while": 300, "e2e": 1500, "gates": 14400,
                      "serving": 3600}, 21600.0, "gpu-check-sim",
                     tuple(n for n in BUNDLES if not n.startswith("q06")), ("tool-fp8",),
                     {kind: "skipped: timing, measured on a card only (--device sim checks answers)" for kind in TIMED},
                     True, ("--clients", "64", "--distinct", "16", "--timeout", "3000"), False),
}
