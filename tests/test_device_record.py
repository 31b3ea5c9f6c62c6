"""The device record (bench/device_record.py, ../shared/GPU-RECORD.md): a gpu_check report's measured figures go
to their keys, unmeasured ones stay out (never zero), a merge replaces only the sections a run measured, each
stamped with its date and commit, and the file lands in the record folder and under $OUT/device/."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
import device_record  # noqa: E402


def report(tokens_match: bool = True, with_bench: bool = True) -> dict:
    """A gpu_check.json of the shape bench/gpu_check.py writes (its stages and summary), figures made up."""
    rows = [{"name": "embed_gather (floor)", "us": 1.1}, {"name": "attention_decode pos 100", "us": 4.5},
            {"name": "attention_decode pos 511", "us": 7.25}, {"name": "attention_decode pos 2047", "us": 15.0}]
    rows += [{"name": f"fp8_e4m3 {p} 1024->4096", "us": us} for p, us in
             (("qkv", 5.0), ("o_proj", 3.0), ("gate_up", 6.0), ("down", 4.8))]
    rows += [{"name": "nvfp4 qkv 1024->4096", "us": 4.0}, {"name": "fp8_e4m3 mma qkv 1024->4096", "us": 2.0}]
    # prefill-sized rows (T = 512; us, TFLOP/s) of both families: only the mma family's make linear_tflops_t512
    wide = {"qkv": (40.0, 100.0), "o_proj": (10.0, 50.0), "gate_up": (30.0, 200.0), "down": (20.0, 100.0)}
    rows += [{"name": f"fp8_e4m3 {family}{p} 1024->4096 T=512", "us": us, "tflops": tf if family else tf / 20}
             for family in ("", "mma ") for p, (us, tf) in wide.items()]
    bench = {"q06-fp8": {"step_graph_ms": 1.4, "step_ms_p100": 0.5, "step_ms_p511": 0.625, "ttft_512_ms": 65.3,
                         "ttft_2048_ms": 328.5, "batch_step_64_ms": 0.9, "batch_step_256_ms": 2.5},
             "q06-nvfp4": {"step_graph_ms": 1.05, "step_ms_p100": 0.35}} if with_bench else {}
    bundles = {name: {"vs_cpu": {"graph": {"equal": 5, "of": 5}}, "tokens_match_cpu": tokens_match,
                      **({"bench": bench[name]} if name in bench else {})} for name in ("q06-fp8", "q06-nvfp4")}
    return {"machine": {"gpu_name": "NVIDIA H200", "nvidia_smi": {"name": "NVIDIA H200", "driver_version": "580.1"}},
            "stages": {"kernel-times": {"rows": rows}, "e2e-q06-fp8": {"launches_per_token": 145},
                       "kernels": {"records": [{"check": "fp8_e4m3_linear_mma: a row alone vs beside 255 others",
                                                "ok": True}, {"check": "fp8_e4m3_matvec T=1", "ok": False}]},
                       "gates": {"bit_gates_passed": 12, "bit_gates": 12}, "engine": {"requests_per_s": 5100.0},
                       "serving": {"clients": 2048, "requests_per_s": 2100.0, "noop_requests_per_s": 2500.0, "lost": 0,
                                   "different_from_solo": 0,
                                   "rounds": [{"engine": {"p50_ms": 400.0, "p99_ms": 900.0}}]}},
            "summary": {"bundles": bundles}}


def test_measured_figures_go_to_their_keys():
    got = device_record.sections(report())
    assert got["decode"] == {"attention_us_p100": 4.5, "attention_us_p511": 7.25, "attention_us_p2047": 15.0,
                             "matvec_layer_us": pytest.approx(18.8), "nvfp4_over_fp8": pytest.approx(0.7),
                             "step_ms_p100": 0.5, "step_ms_p511": 0.625, "tokens_per_s_p100": 2000.0,
                             "launches_per_step": 145, "tokens_equal_cpu": True}
    # (100 x 40 + 50 x 10 + 200 x 30 + 100 x 20) / 100 us: the four projections' multiply-adds over their time
    assert got["prefill"] == {"ttft_ms_512": 65.3, "ttft_ms_2048": 328.5, "linear_tflops_t512": pytest.approx(125.0),
                              "batch_step_ms_64": 0.9, "batch_step_ms_256": 2.5, "bits_identical_batch": True,
                              "tokens_equal_cpu": True}
    assert got["serving"] == {"bit_gates_passed": 12, "bit_gates": 12, "engine_req_s": 5100.0, "burst_clients": 2048,
                              "burst_req_s": 2100.0, "burst_lost": 0, "burst_differ": 0, "burst_p50_ms": 400.0,
                              "burst_p99_ms": 900.0, "noop_req_s": 2500.0}
    assert "step_ms_p2047" not in got["decode"] and "gpu_memory_bytes" not in got["serving"]  # not measured


def test_a_run_without_figures_writes_no_section_and_wrong_tokens_say_so():
    bare = report(tokens_match=False, with_bench=False)
    bare["stages"] = {}
    assert device_record.sections(bare) == {"decode": {"tokens_equal_cpu": False}}
    bare["summary"] = {}
    assert device_record.sections(bare) == {}


def test_a_merge_keeps_the_sections_a_run_did_not_measure():
    earlier = {"card": "NVIDIA H200", "date": "2026-12-04", "commit": "old",
               "serving": {"date": "2026-12-04", "commit": "old", "burst_req_s": 900.0},
               "decode": {"date": "2026-12-04", "commit": "old", "attention_us_p100": 9.0, "matvec_layer_us": 30.0}}
    merged = device_record.merge(earlier, {"decode": {"attention_us_p100": 4.5}}, "NVIDIA H200", "580.1",
                                 "2026-12-06", "abc1234")
    assert merged["serving"] == earlier["serving"]  # untouched, its old date kept
    assert merged["decode"] == {"date": "2026-12-06", "commit": "abc1234", "attention_us_p100": 4.5}
    assert (merged["date"], merged["commit"], merged["driver"]) == ("2026-12-06", "abc1234", "580.1")


@pytest.mark.parametrize("name, card", [("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100"),
                                        ("NVIDIA B200", "b200"), ("NVIDIA GeForce RTX 5090", "rtx5090"),
                                        ("Tesla V100-SXM2-16GB", "v100"), ("Some Accelerator", "some-accelerator")])
def test_card_names(name, card):
    assert device_record.card_name(name) == card


def test_the_record_lands_in_its_folder_and_under_out(tmp_path, monkeypatch):
    monkeypatch.setenv("GPU_CHECK_COMMIT", "abc1234")
    folder, out = tmp_path / "bench" / "device", tmp_path / "out"
    folder.mkdir(parents=True)
    (folder / "h200.json").write_text(json.dumps({"serving": {"date": "2026-12-04", "commit": "old", "x": 1}}))
    run = report()
    for stage in ("gates", "engine", "serving"):  # this run measured no serving figure: the earlier section stays
        del run["stages"][stage]
    path = device_record.write_record(run, folder, out, "2026-12-06", tmp_path)
    assert path == folder / "h200.json"
    written = json.loads(path.read_text())
    assert written == json.loads((out / "device" / "h200.json").read_text())
    assert written["serving"] == {"date": "2026-12-04", "commit": "old", "x": 1}
    assert written["decode"]["commit"] == written["prefill"]["commit"] == "abc1234"
    assert device_record.write_record({"machine": {}}, folder, out, "2026-12-06", tmp_path) is None


def test_a_run_on_the_simulated_device_writes_no_record(tmp_path):
    """`gpu_check.py --device sim` (the rehearsal) measures no card: its report, even naming a GPU, writes nothing."""
    run = report()
    run["device"] = "sim"
    folder, out = tmp_path / "device", tmp_path / "out"
    assert device_record.write_record(run, folder, out, "2026-12-07", tmp_path) is None
    assert not folder.exists() and not out.exists()
