"""The device record (../shared/GPU-RECORD.md): what bench/gpu_check.py measured on a lent GPU, merged into one
JSON file per card, ``bench/device/<card>.json``.

``sections(report)`` maps a gpu_check report (gpu_check.json: its stages and summary) to the record's sections,
each holding only the figures that run measured (a figure not measured is left out, never zero); ``merge``
replaces those sections in an earlier record, each with its own date and commit, and keeps every section the run
did not measure. The check writes the merged record under $OUT/device/ (the files a device run brings back) and
into bench/device/ of the checkout it ran in.

What maps to what (keys as GPU-RECORD.md names them):
  decode   step_ms_p<P>          bench step_ms_p<P> of q06-fp8: the decode step graph at position P; and
           tokens_per_s_p100     1,000 / step_ms_p100
           attention_us_p<P>     kernel-times row "attention_decode pos <P>" (device microseconds a node)
           matvec_layer_us       kernel-times: the four fp8_e4m3 rows of a layer (qkv, o_proj, gate_up, down) at
                                 T = 1 in the default (fma) family: "fp8_e4m3 <proj> <in>-><out>"
           nvfp4_over_fp8        bench step_ms_p100 of q06-nvfp4 / q06-fp8 (else their step_graph_ms)
           launches_per_step     e2e launches_per_token of q06-fp8
           tokens_equal_cpu      every bundle's tokens equal the CPU reference on every path run
  prefill  ttft_ms_512/2048      bench ttft_512_ms / ttft_2048_ms of q06-fp8 (prefill chunks of 512, the GPU default)
           batch_step_ms_64/256  bench batch_step_64_ms / _256_ms of q06-fp8: one step over a 64- / 256-row chunk
           linear_tflops_t512    kernel-times: the four "fp8_e4m3 mma <proj> ... T=512" rows (the tensor-core
                                 family), their multiply-adds x 2 over their summed time
           bits_identical_batch  the kernels stage: every "a row alone vs beside N others" check of both linear
                                 families (tests/test_kernels_gpu_linear.py) held
           tokens_equal_cpu      as decode's
  serving  bit_gates_passed, bit_gates   the gates stage (bench/bit_gates.py on tool-fp8)
           burst_clients, burst_req_s, burst_lost, burst_differ, burst_p50_ms, burst_p99_ms, noop_req_s
                                 the serving stage (bench/serve_burst.py on tool-fp8: its engine round and no-op round)
           engine_req_s          the engine stage (bench/engine_alone.py on tool-fp8)
"""
from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

MATVEC_ROWS = ("qkv", "o_proj", "gate_up", "down")  # gpu_kernel_times.py's names: "<fmt> <proj> <in>-><out>"
FP8, NVFP4 = "q06-fp8", "q06-nvfp4"


def card_name(gpu_name: str) -> str:
    """The record's file stem, as the project names targets: "h200" for "NVIDIA H200", "h100" for "NVIDIA H100
    80GB HBM3", "rtx5090" for "NVIDIA GeForce RTX 5090"; else the name in lower case, each run of other
    characters one "-"."""
    low = gpu_name.lower()
    known = re.search(r"\b(rtx) ?(\d{4})\b", low) or re.search(r"\b([a-z])(\d{3,4})\b", low)
    return "".join(known.groups()) if known else re.sub(r"[^a-z0-9]+", "-", low).strip("-") or "unknown"


def _kernel_rows(report: dict) -> dict[str, float]:
    rows = report.get("stages", {}).get("kernel-times", {}).get("rows") or []
    return {r["name"]: float(r["us"]) for r in rows if isinstance(r.get("us"), (int, float))}


def sections(report: dict) -> dict[str, dict]:
    """{section: {key: figure}} of what ``report`` measured (empty sections left out)."""
    summary, stages = report.get("summary") or {}, report.get("stages") or {}
    bundles = summary.get("bundles") or {}
    decode, prefill = {}, {}
    kernels = _kernel_rows(report)
    for name, us in kernels.items():
        hit = re.fullmatch(r"attention_decode pos (\d+)", name)
        if hit:
            decode[f"attention_us_p{hit.group(1)}"] = us
    layer = [us for name, us in kernels.items() if re.fullmatch(rf"fp8_e4m3 ({'|'.join(MATVEC_ROWS)}) \S+", name)]
    if len(layer) == len(MATVEC_ROWS):
        decode["matvec_layer_us"] = sum(layer)
    fp8, fp4 = (bundles.get(n, {}).get("bench") or {} for n in (FP8, NVFP4))
    for key, ms in fp8.items():
        if re.fullmatch(r"step_ms_p\d+", key) and isinstance(ms, (int, float)):
            decode[key] = ms
    if isinstance(fp8.get("step_ms_p100"), (int, float)):
        decode["tokens_per_s_p100"] = 1e3 / fp8["step_ms_p100"]
    for key in ("step_ms_p100", "step_graph_ms"):
        if fp8.get(key) and fp4.get(key):
            decode["nvfp4_over_fp8"] = fp4[key] / fp8[key]
            break
    launches = (stages.get(f"e2e-{FP8}") or {}).get("launches_per_token")
    if isinstance(launches, int):
        decode["launches_per_step"] = launches
    wide = [r for r in (report.get("stages", {}).get("kernel-times", {}).get("rows") or [])
            if re.fullmatch(r"fp8_e4m3 mma (qkv|o_proj|gate_up|down) \S+ T=512", str(r.get("name")))
            and isinstance(r.get("tflops"), (int, float)) and isinstance(r.get("us"), (int, float))]
    if len(wide) == len(MATVEC_ROWS):
        prefill["linear_tflops_t512"] = sum(r["tflops"] * r["us"] for r in wide) / sum(r["us"] for r in wide)
    beside = [r for r in (stages.get("kernels") or {}).get("records") or [] if "alone vs beside" in str(r.get("check"))]
    if beside:
        prefill["bits_identical_batch"] = all(r.get("ok") for r in beside)
    for length in (512, 2048):
        if isinstance(fp8.get(f"ttft_{length}_ms"), (int, float)):
            prefill[f"ttft_ms_{length}"] = fp8[f"ttft_{length}_ms"]
    for rows in (64, 256):
        if isinstance(fp8.get(f"batch_step_{rows}_ms"), (int, float)):
            prefill[f"batch_step_ms_{rows}"] = fp8[f"batch_step_{rows}_ms"]
    judged = [row for row in bundles.values() if row.get("vs_cpu")]
    if judged:
        equal = all(row.get("tokens_match_cpu") for row in judged)
        decode["tokens_equal_cpu"] = equal
        if prefill:
            prefill["tokens_equal_cpu"] = equal
    gates = stages.get("gates") or {}
    serving = {k: gates[k] for k in ("bit_gates_passed", "bit_gates") if isinstance(gates.get(k), int)}
    burst = stages.get("serving") or {}
    if burst.get("rounds"):
        ours = burst["rounds"][0]["engine"]
        serving.update(burst_clients=burst["clients"], burst_req_s=burst["requests_per_s"], burst_lost=burst["lost"],
                       burst_differ=burst["different_from_solo"], burst_p50_ms=ours["p50_ms"],
                       burst_p99_ms=ours["p99_ms"], noop_req_s=burst["noop_requests_per_s"])
    engine = stages.get("engine") or {}
    if isinstance(engine.get("requests_per_s"), (int, float)):
        serving["engine_req_s"] = engine["requests_per_s"]
    return {name: body for name, body in (("decode", decode), ("prefill", prefill), ("serving", serving)) if body}


def merge(earlier: dict | None, measured: dict[str, dict], card: str, driver: str, date: str, commit: str) -> dict:
    """The record with ``measured``'s sections replaced (each stamped with date and commit), the others kept."""
    record = dict(earlier or {})
    record.update(card=card, driver=driver, date=date, commit=commit)
    for name, body in measured.items():
        record[name] = {"date": date, "commit": commit, **body}
    return record


def commit_of(repo: Path) -> str:
    """GPU_CHECK_COMMIT from the environment (a device machine's copy has no .git), else git's, else "unknown"."""
    if os.environ.get("GPU_CHECK_COMMIT"):
        return os.environ["GPU_CHECK_COMMIT"]
    try:
        done = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=repo, capture_output=True, text=True,
                              timeout=10, check=False)
        return done.stdout.strip() or "unknown"
    except OSError:
        return "unknown"


def write_record(report: dict, folder: Path, out: Path, date: str, repo: Path) -> Path | None:
    """Merges ``report``'s measured sections into ``folder``/<card>.json (the checkout's bench/device) and copies the
    result to ``out``/device/; the path written in ``folder``, or None where the report names no GPU or measured
    nothing, or for a run on the simulated device (a rehearsal measures no card). ``repo``: the checkout, for the
    commit."""
    if report.get("device", "native") != "native":
        return None
    machine = report.get("machine") or {}
    smi = machine.get("nvidia_smi") if isinstance(machine.get("nvidia_smi"), dict) else {}
    gpu = machine.get("gpu_name") or smi.get("name")
    measured = sections(report)
    if not gpu or not measured:
        return None
    card = card_name(gpu)
    path = folder / f"{card}.json"
    earlier = json.loads(path.read_text()) if path.is_file() else None
    record = merge(earlier, measured, gpu, str(smi.get("driver_version") or machine.get("driver_version") or "?"),
                   date, commit_of(repo))
    text = json.dumps(record, indent=2, sort_keys=True) + "\n"
    for target in (path, out / "device" / f"{card}.json"):
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = target.with_suffix(".tmp")
        tmp.write_text(text)
        os.replace(tmp, target)
    return path
