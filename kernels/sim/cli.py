"""``python -m toolcall.kernels.sim test|stats``: the kernel cases on the PTX executor, sanitizers on.

``test`` runs the case table (toolcall.kernels.cases; by default the cases marked for CI, ``--all`` for every
one) on each target, one line per failure (target, case, the kernel and what/where), then
``SIM kernels=<n> cases=<n> failed=<n> races=<n> out_of_bounds=<n> sync=<n> seconds=<s>``; exit 0 only when
every case passes and, without --kernel, every entry point of kernels/*.cu ran. ``stats`` prints what the
executor measures per launch of one Qwen3-0.6B-shaped layer (toolcall.kernels.sim.layer_stats).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from toolcall.common.errors import BuildError
from toolcall.kernels.cuda_source import kernel_sources
from toolcall.kernels.declarations import declarations
from toolcall.kernels.runner import DryRunGpu, KernelRunner
from toolcall.kernels.sim.errors import SimFault, SimUnsupported

DEFAULT_TARGETS = ("sm_80", "sm_90", "sm_100a", "sm_120a")


def launched_kernels(case) -> list[str]:
    """The entry points a case launches, from a dry run (arguments packed, nothing computed)."""
    from toolcall.kernels.cases import run_case
    dry = KernelRunner(DryRunGpu())
    try:
        run_case(dry, case)
    except AssertionError:
        pass  # a dry run's zeros may fail a case's own checks; the launches are what we want
    return list(dict.fromkeys(dry.gpu.launches))


def run_one(case, target: str, kernels_dir: Path | None, approximate: dict | None = None):
    """(kernels launched, failure kind or None, message) of one case on one target; ``approximate`` collects
    kernel -> the approximate instructions it ran (their bits are the executor's model)."""
    from toolcall.kernels.cases import run_case
    from toolcall.kernels.sim.device import SimGpu
    gpu = SimGpu(target, sanitize=True, kernels_dir=kernels_dir)
    try:
        run_case(KernelRunner(gpu), case)
        return gpu.launches, None, None
    except SimFault as e:
        return gpu.launches + [gpu.current], e.kind, e.what
    except SimUnsupported as e:
        return gpu.launches + [gpu.current], "unsupported", e.message
    except AssertionError as e:
        return gpu.launches, "mismatch", str(e).splitlines()[0][:300] if str(e) else "mismatch"
    except BuildError as e:  # a changed copy of the kernels (--kernels-dir) that NVRTC refuses
        return gpu.launches + [gpu.current], "compile", e.message.splitlines()[0]
    finally:
        for kernel, ops in gpu.approximate.items():
            (approximate if approximate is not None else {}).setdefault(kernel, set()).update(ops)


def test(args) -> int:
    from toolcall.kernels.cases import all_cases
    start = time.monotonic()
    cases = [c for c in all_cases() if args.all or c.ci]
    if args.kernel:
        unknown = sorted(set(args.kernel) - set(declarations()))
        if unknown:
            print(f"error: no kernel named {', '.join(unknown)} (kernels: {', '.join(sorted(declarations()))})",
                  file=sys.stderr)
            return 2
        cases = [c for c in cases if set(launched_kernels(c)) & set(args.kernel)]
    ran, failures, counts, approximate = set(), [], {"race": 0, "out_of_bounds": 0, "sync": 0}, {}
    for target in args.target:
        for case in cases:
            launches, kind, message = run_one(case, target, args.kernels_dir, approximate)
            launches = [k for k in launches if k]
            ran.update(launches)
            if kind:
                counts[kind] = counts.get(kind, 0) + 1
                kernel = launches[-1] if launches else "?"
                failures.append(dict(target=target, case=case.id, kernel=kernel, what=kind, where=message))
                if not args.json:
                    print(f"FAIL {target} {case.id} {kernel}: {kind}: {message}", flush=True)
    missing = [] if args.kernel else sorted(set(declarations()) - ran)
    for name in missing:
        failures.append(dict(target=",".join(args.target), case="-", kernel=name, what="not run",
                             where="no case runs this kernel on the executor"))
        if not args.json:
            print(f"FAIL {name}: no case runs this kernel on the executor")
    seconds = time.monotonic() - start
    approx = {k: sorted(v) for k, v in sorted(approximate.items())}
    if approx and not args.json:
        ops = sorted({op for v in approx.values() for op in v})
        print(f"approximate ({', '.join(ops)}: the executor's model, compare with a card within a tolerance): "
              f"{', '.join(approx)}")
    summary = dict(kernels=len(ran), cases=len(cases) * len(args.target), failed=len(failures), races=counts["race"],
                   out_of_bounds=counts["out_of_bounds"], sync=counts["sync"], seconds=round(seconds, 1))
    if args.json:
        print(json.dumps(dict(summary, failures=failures, targets=list(args.target), approximate=approx)))
    print("SIM " + " ".join(f"{k}={v}" for k, v in summary.items()))
    return 1 if failures else 0


def stats(args) -> int:
    from toolcall.kernels.sim.layer_stats import layer_stats, stats_table
    rows = layer_stats(args.target[0])
    print(json.dumps(rows, indent=1) if args.json else stats_table(rows))
    return 0


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(prog="python -m toolcall.kernels.sim",
                                     description="Run the kernels' PTX on the CPU executor, sanitizers on.")
    sub = parser.add_subparsers(dest="command", required=True)
    for name, help_text in (("test", "run the kernel cases against their numpy references"),
                            ("stats", "instructions, sectors, bank conflicts of one Qwen3-0.6B-shaped layer")):
        p = sub.add_parser(name, help=help_text)
        p.add_argument("--kernel", action="append", default=[], help="only cases launching this entry point")
        p.add_argument("--target", action="append", default=[], help="SM architecture (default: the four)")
        p.add_argument("--kernels-dir", type=Path, default=None, help="compile the .cu/.cuh of this folder instead")
        p.add_argument("--all", action="store_true", help="every case, not only the CI table")
        p.add_argument("--json", action="store_true", help="one JSON object (then the SIM line)")
    args = parser.parse_args(argv)
    args.target = args.target or (list(DEFAULT_TARGETS) if args.command == "test" else ["sm_90"])
    from toolcall.kernels.targets import SM_ARCHS
    bad = [t for t in args.target if t not in SM_ARCHS]
    if bad:
        print(f"error: unknown target {', '.join(bad)} (targets: {', '.join(SM_ARCHS)})", file=sys.stderr)
        return 2
    if args.kernels_dir is not None:
        missing = [p.name for p in kernel_sources() if not (args.kernels_dir / p.name).is_file()]
        if missing:
            print(f"error: --kernels-dir {args.kernels_dir} lacks {', '.join(missing)} (it takes a copy of kernels/: "
                  "every .cu and .cuh, changed or not)", file=sys.stderr)
            return 2
    return test(args) if args.command == "test" else stats(args)
