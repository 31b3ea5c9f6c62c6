"""bench/gpu_check.py --device sim, the device check rehearsed on the simulated device: the same stages with the
same code, the kernels (and the WHILE graph loops) on the PTX executor, the bundles built and checked against the
CPU reference, the timed stages skipped with their reason, and no device record written (bench/device/ holds cards'
measurements only). The end-to-end, gates and serving stages' own code runs on the simulated device in
tests/test_sim_end_to_end.py; the whole rehearsal's figures are on bench/RESULTS.md."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
import gpu_check_plans  # noqa: E402

from toolcall.runtime.cuda.devices import DEVICES  # noqa: E402


def test_every_device_has_a_plan_and_only_cards_keep_records():
    plans = gpu_check_plans.PLANS
    assert set(plans) == set(DEVICES)
    assert [d for d, plan in plans.items() if plan.records] == ["native"]
    assert set(plans["sim"].skipped) == set(gpu_check_plans.TIMED) and not plans["native"].skipped


@pytest.mark.slow
def test_the_rehearsal_checks_answers_on_the_simulated_device_and_records_no_card(tmp_path):
    out, record = tmp_path / "out", tmp_path / "device"
    r = subprocess.run([sys.executable, str(REPO / "bench" / "gpu_check.py"), "--device", "sim", "--work",
                        str(tmp_path / "work"), "--device-record", str(record), "--bundles", "tool-fp8",
                        "--only", "kernels,kernels-while,build,cpuref,bench,pytest", "--cases", "rmsnorm-T3,prefix"],
                       cwd=REPO, env={**os.environ, "OUT": str(out)}, capture_output=True, text=True,
                       timeout=1200)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    report = json.loads((out / "gpu_check.json").read_text())
    stages = report["stages"]
    assert report["device"] == "sim" and report["budget_s"] == gpu_check_plans.PLANS["sim"].budget_s
    kernels, loops = stages["kernels"], stages["kernels-while"]
    assert kernels["device"] == loops["device"] == "simulated H200"
    assert kernels["records"] and all(rec["ok"] for rec in kernels["records"]) and not kernels["errors"]
    assert {rec["case"] for rec in loops["records"]} == {"loop-while-graph-prefix"} and not loops["errors"]
    assert "path" in stages["build-tool"]["tool-fp8"] and stages["cpuref"]["tool-fp8"]["tokens"]
    for timed in ("bench", "pytest"):
        assert stages[timed] == {"skipped": "skipped: timing, measured on a card only (--device sim checks answers)"}
    assert not record.exists() and "device_record" not in report
    assert "gpu_check on the simulated device" in r.stdout
