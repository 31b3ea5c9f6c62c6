"""The PTX executor's speed on this machine: lane-instructions per second, and the seconds of the executor's CI
kernel suite on each target.

    python bench/sim_speed.py [--targets sm_80,sm_90,sm_100a,sm_120a] [--json OUT]

Runs a Qwen3-0.6B-shaped T = 1 layer (the four fp8 linear launches of the fma family and decode attention at
position 511; sanitizers off, as in ``python -m toolcall.kernels.sim stats``) for the lane-instruction rate and the
layer's seconds, then ``python -m toolcall.kernels.sim test`` per target (sanitizers on). The last line is
``executor: N lane-instructions/s; T=1 layer X s; suite S s over K targets``.
"""
from __future__ import annotations

import argparse
import contextlib
import io
import json
import platform
import time
from pathlib import Path

import checkout  # noqa: E402  (bench/checkout.py: this checkout as `toolcall`)
checkout.use()

from toolcall.common.formats import FP8_E4M3  # noqa: E402
from toolcall.kernels.geometry import FMA, matvec_kernel  # noqa: E402
from toolcall.kernels.runner import KernelRunner  # noqa: E402
from toolcall.kernels.sim import layer_stats as ls  # noqa: E402
from toolcall.kernels.sim.cli import main as sim_main  # noqa: E402
from toolcall.kernels.sim.device import SimGpu  # noqa: E402
from toolcall.kernels.sim.stats import LaunchStats  # noqa: E402


def layer_rate(arch: str) -> dict:
    launches = [ls._linear(matvec_kernel(FP8_E4M3, pro, FMA), pro, n_in, n_out, 1) for _, pro, n_in, n_out in ls.LINEARS]
    launches.append(ls._decode(511))
    warm = KernelRunner(SimGpu(arch, sanitize=False))
    for launch in launches:  # compile the PTX once (NVRTC), not timed
        launch(warm)
    stats = LaunchStats()
    runner = KernelRunner(SimGpu(arch, sanitize=False))
    start = time.monotonic()
    for launch in launches:
        launch(runner)
    seconds = time.monotonic() - start
    counted = KernelRunner(SimGpu(arch, sanitize=False, stats=stats))
    for launch in launches:
        launch(counted)
    return dict(layer_seconds=round(seconds, 2), lane_instructions=stats.lane_instructions,
                lane_instructions_per_s=round(stats.lane_instructions / seconds))


def suite_seconds(targets: list[str]) -> dict:
    out = {}
    for target in targets:
        start = time.monotonic()
        with contextlib.redirect_stdout(io.StringIO()) as text:
            code = sim_main(["test", "--target", target])
        out[target] = dict(seconds=round(time.monotonic() - start, 1), exit=code,
                           sim_line=text.getvalue().strip().splitlines()[-1])
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--targets", default="sm_80,sm_90,sm_100a,sm_120a")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    targets = args.targets.split(",")
    rate = layer_rate("sm_90")
    suite = suite_seconds(targets)
    total = sum(s["seconds"] for s in suite.values())
    record = dict(machine=platform.processor() or platform.machine(), rate=rate, suite=suite, suite_seconds=total)
    if args.json:
        args.json.write_text(json.dumps(record, indent=1))
    for t, s in suite.items():
        print(f"{t}: {s['sim_line']}")
    print(f"executor: {rate['lane_instructions_per_s']:,} lane-instructions/s; T=1 layer {rate['layer_seconds']} s; "
          f"suite {total:.0f} s over {len(targets)} targets")


if __name__ == "__main__":
    main()
