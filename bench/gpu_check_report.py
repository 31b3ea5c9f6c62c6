"""bench/gpu_check.py's machine facts, summary (token identity, parity, timings vs targets) and table."""
from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import numpy as np

NEAR_TIE = 1e-3  # logits: a CPU step margin below this may legitimately order differently on the GPU
TARGET_TOKENS_PER_S = 2500.0  # qwen3-0.6b fp8, batch 1
NVFP4_SLACK = 1.10  # nvfp4 step time at most 10% above fp8's
SMI_FIELDS = ("name", "driver_version", "clocks.sm", "clocks.mem", "clocks.max.sm", "clocks.max.mem",
              "memory.total", "memory.used", "temperature.gpu", "power.draw", "pstate")


def machine_facts() -> dict:
    """GPU name, driver, clocks (nvidia-smi), compute capability and free memory (toolcall.runtime.bundle.machine), versions."""
    facts = {"host": platform.node(), "cpus": os.cpu_count(), "python": sys.version.split()[0]}
    for fields in (SMI_FIELDS, SMI_FIELDS[:2]):  # the short query if a field name is not known there
        try:
            r = subprocess.run(["nvidia-smi", f"--query-gpu={','.join(fields)}", "--format=csv,noheader"],
                               capture_output=True, text=True, timeout=20)
            values = [v.strip() for v in r.stdout.strip().splitlines()[0].split(",")]
            if r.returncode == 0 and len(values) == len(fields):
                facts["nvidia_smi"] = dict(zip(fields, values))
                break
            facts["nvidia_smi"] = f"nvidia-smi: {(r.stdout + r.stderr).strip()[:200]}"
        except Exception as e:
            facts["nvidia_smi"] = f"unavailable: {type(e).__name__}: {e}"
    try:
        from toolcall.runtime.bundle.machine import gpu_facts
        f = gpu_facts()
        facts.update(gpu_name=f.gpu_name, compute_capability=f.compute_capability, driver_version=f.driver_version,
                     free_bytes=f.free_bytes, no_gpu_reason=f.no_gpu_reason)
    except Exception as e:
        facts["gpu_facts_error"] = f"{type(e).__name__}: {e}"
    for mod in ("numpy", "cuda.bindings", "ml_dtypes", "tokenizers"):
        try:
            facts[f"{mod}_version"] = __import__(mod, fromlist=["__version__"]).__version__
        except Exception as e:
            facts[f"{mod}_version"] = f"? ({type(e).__name__})"
    return facts


def _tokens(e2e: dict, path: str):
    v = e2e.get(path)
    if isinstance(v, dict):
        return v.get("tokens")
    return v if isinstance(v, list) else None


def _compare(cpu: list, got: list | None, margins: list) -> dict:
    if got is None:
        return {"equal": 0, "of": len(cpu), "missing": True}
    bad = [i for i, (c, g) in enumerate(zip(cpu, got)) if c != g]
    return {"equal": len(cpu) - len(bad), "of": len(cpu),
            "mismatch": [{"prompt": i, "cpu_margin": margins[i], "near_tie": (margins[i] or 0) < NEAR_TIE,
                          "cpu": cpu[i], "gpu": got[i]} for i in bad]}


def _hidden_err(work: Path, name: str):
    try:
        cpu = name.partition("+")[0]  # a "<bundle>+<family>" run against its bundle's CPU reference
        g, c = np.load(work / f"{name}-gpu-hidden.npy"), np.load(work / f"{cpu}-cpu-hidden.npy")
        return {"rel_err": float(np.linalg.norm(g - c) / np.linalg.norm(c)), "max_abs": float(np.abs(g - c).max())}
    except Exception as e:
        return {"error": f"{type(e).__name__}: {e}"}


def _load_state(e: dict) -> str:
    if "error" in e and not e.get("partial"):
        return e["error"]
    load = e.get("load")
    if isinstance(load, dict) and "error" in load:
        return load["error"]
    if load is None:
        return e.get("error") or ("graph-free only" if "load_graph_free" in e else "missing")
    return "ok"


def tokens_match(row: dict) -> bool:
    """Every decode path ran and gave the CPU reference's tokens for every prompt."""
    vs = row.get("vs_cpu") or {}
    return bool(vs) and all(not v.get("missing") and v["equal"] == v["of"] for v in vs.values())


def _target(value: dict, ok: bool, judged: bool, why: str) -> dict:
    """A target's verdict: judged only on bundles whose tokens match the CPU reference."""
    return {**value, "judged": judged, "pass": ok if judged else None, **({} if judged else {"why": why})}


def summarize(stages: dict, work: Path, built: list[str]) -> dict:
    """Kernel parity, per bundle (and per "<bundle>+<family>" run of gpu_check_e2e.variant) the tokens against the
    CPU reference and the bench, and the speed targets."""
    s: dict = {"kernels": {}, "bundles": {}, "targets": {}}
    recs, errors = [], {}
    for key in ("kernels", "kernels-while"):
        k = stages.get(key, {})
        recs += k.get("records", [])
        errors.update(k.get("errors") or {})
        for extra in ("error", "stuck", "close_error"):
            if k.get(extra):
                errors[f"{key} {extra}"] = k[extra]
    worst = max(recs, key=lambda r: r["rel_err"], default=None)
    s["kernels"] = {"checks": len(recs), "failed": [f"{r['case']}: {r['check']}" for r in recs if not r["ok"]],
                    "errors": errors, "worst": worst}
    cpuref = stages.get("cpuref", {})
    runs = built + [key[len("e2e-"):] for key in stages if key.startswith("e2e-") and "+" in key]
    for name in runs:
        e, cpu = stages.get(f"e2e-{name}", {}), cpuref.get(name.partition("+")[0], {})
        row = {"load": _load_state(e)}
        if e.get("stuck"):
            row["stuck"] = e["stuck"]
        paths = {p: _tokens(e, p) for p in ("generator", "generator_check_head", "host_loop", "graph")}
        if cpu.get("tokens"):
            row["vs_cpu"] = {p: _compare(cpu["tokens"], t, cpu["margins"]) for p, t in paths.items()}
        ran = [t for t in paths.values() if t is not None]
        row["paths_identical"] = len(ran) == len(paths) and all(t == ran[0] for t in ran)
        row["tokens_match_cpu"] = tokens_match(row)
        row["hidden"] = _hidden_err(work, name)
        b = stages.get(f"bench-{name}", {})
        if isinstance(b.get("bench"), dict):
            row["bench"] = b["bench"]
        s["bundles"][name] = row
    fp8_row, fp4_row = s["bundles"].get("q06-fp8", {}), s["bundles"].get("q06-nvfp4", {})
    fp8, fp4 = fp8_row.get("bench", {}), fp4_row.get("bench", {})
    why = "tokens differ from the CPU reference (or a path is missing): speed is not judged on wrong answers"
    if "step_graph_ms" in fp8:
        ok8 = fp8_row["tokens_match_cpu"]
        s["targets"]["fp8_tokens_per_s"] = _target(
            {"value": fp8["tokens_per_s"], "target": TARGET_TOKENS_PER_S}, fp8["tokens_per_s"] >= TARGET_TOKENS_PER_S,
            ok8, why)
        s["targets"]["graph_faster_than_host"] = _target(
            {"in_loop_ms": fp8.get("in_loop_ms"), "host_loop_ms": fp8.get("host_loop_ms")},
            fp8.get("in_loop_ms", 1e9) < fp8.get("host_loop_ms", 0)
            and fp8.get("answer_graph_wall_ms", 1e9) < fp8.get("answer_host_wall_ms", 0), ok8, why)
    if "step_graph_ms" in fp8 and "step_graph_ms" in fp4:
        ratio = fp4["step_graph_ms"] / fp8["step_graph_ms"]
        s["targets"]["nvfp4_vs_fp8"] = _target({"ratio": ratio, "limit": NVFP4_SLACK}, ratio <= NVFP4_SLACK,
                                               fp8_row["tokens_match_cpu"] and fp4_row["tokens_match_cpu"], why)
    return s


def _f(v, fmt=".3g", na="-"):
    return na if not isinstance(v, (int, float)) else format(v, fmt)


def table(report: dict) -> str:
    m, s = report["machine"], report["summary"]
    smi = m.get("nvidia_smi") if isinstance(m.get("nvidia_smi"), dict) else {}
    spent = f"{report.get('elapsed_s', 0):.0f} s of {report['budget_s']:.0f} s"
    if report.get("device") == "sim":
        head = f"== gpu_check on the simulated device (answers only, no timings; {m.get('cpus')} CPUs): {spent}"
    else:
        head = (f"== gpu_check: {m.get('gpu_name') or smi.get('name')} (cc {m.get('compute_capability')}), driver "
                f"{smi.get('driver_version', m.get('driver_version'))}, SM clock {smi.get('clocks.sm', '?')} / max "
                f"{smi.get('clocks.max.sm', '?')}; {spent}")
    lines = [head, f"{'stage':22} {'seconds':>8}  result"]
    for key, res in report["stages"].items():
        result = res.get("error", res.get("skipped", "ok")) + (f" ({len(res.get('records', []))} records kept)" if res.get("partial")
                                          and "records" in res else "")
        if key == "pytest":  # its last line: "N passed, M failed in S s"
            result = ([ln for ln in res.get("log_tail", "").splitlines() if ln.strip()] or ["?"])[-1]
        lines.append(f"{key:22} {_f(res.get('stage_seconds'), '8.1f'):>8}  {result[:100]}")
    k = s["kernels"]
    w = k.get("worst") or {}
    lines.append(f"kernel parity: {k['checks']} checks, {len(k['failed'])} failed {k['failed'][:4]}; worst rel err "
                 f"{_f(w.get('rel_err'))} ({w.get('case')}: {w.get('check')}); errors {str(k.get('errors') or 'none')[:600]}")
    lines.append(f"{'bundle':12} {'load+canary':12} {'cpu==gen':>8} {'cpu==chk':>8} {'cpu==graph':>10} "
                 f"{'cpu==host':>9} {'paths==':>7} {'hidden err':>10}")
    for name, row in s["bundles"].items():
        vs = row.get("vs_cpu", {})
        cell = lambda p: f"{vs[p]['equal']}/{vs[p]['of']}" if p in vs else "-"
        lines.append(f"{name:12} {str(row['load'])[:12]:12} {cell('generator'):>8} {cell('generator_check_head'):>8} "
                     f"{cell('graph'):>10} {cell('host_loop'):>9} {str(row['paths_identical']):>7} "
                     f"{_f(row['hidden'].get('rel_err')):>10}")
    lines.append(f"{'bundle':12} {'step ms':>8} {'tok/s':>7} {'in-loop':>8} {'host-loop':>9} {'generator':>9} "
                 f"{'ttft512':>8} {'ttft2048':>8} {'weight GB/s':>11} {'copy GB/s':>9} {'% copy':>6}")
    for name, row in s["bundles"].items():
        b = row.get("bench")
        if not b:
            continue
        gen = report["stages"].get(f"e2e-{name}", {}).get("generator")
        gen = (gen.get("ms_per_token") if isinstance(gen, dict) else None) or []
        share = 100 * b["weight_gbs"] / b["copy_gbs"] if "copy_gbs" in b and "weight_gbs" in b else None
        lines.append(f"{name:12} {_f(b.get('step_graph_ms'), '8.4f')} {_f(b.get('tokens_per_s'), '7.0f')} "
                     f"{_f(b.get('in_loop_ms'), '8.4f')} {_f(b.get('host_loop_ms'), '9.3f')} "
                     f"{_f(float(np.median(gen)) if gen else None, '9.3f')} {_f(b.get('ttft_512_ms'), '8.2f')} "
                     f"{_f(b.get('ttft_2048_ms'), '8.2f')} {_f(b.get('weight_gbs'), '11.0f')} "
                     f"{_f(b.get('copy_gbs'), '9.0f')} {_f(share, '6.1f')}")
    for name, row in s["bundles"].items():
        b = row.get("bench") or {}
        if "step_graph_programmatic_ms" in b:
            lines.append(f"{name}: decode step {_f(b.get('step_graph_ms'), '.4f')} ms, "
                         f"{_f(b['step_graph_programmatic_ms'], '.4f')} ms with programmatic edges"
                         + (f" (refused: {b['programmatic_error']})" if b.get("programmatic_error") else ""))
    gates, burst = report["stages"].get("gates", {}), report["stages"].get("serving", {})
    if "bit_gates" in gates:
        failed = [name for name, g in gates.get("gates", {}).items() if not g["passed"]]
        lines.append(f"bit gates: {gates['bit_gates_passed']} of {gates['bit_gates']} passed"
                     + (f"; failed {failed}" if failed else ""))
    if "clients" in burst:
        lines.append(f"serving burst: {burst['clients']} clients, lost {burst['lost']}, "
                     f"{burst['different_from_solo']} differ from the same request alone, kv pages in use after "
                     f"{burst['kv_pages_in_use_after']:.0f}")
    rows = report["stages"].get("kernel-times", {}).get("rows") or []
    if rows:
        lines.append(f"{'kernel (chain of graph nodes; T = 1 unless named)':36} {'us':>7} {'us pdl':>7} {'GB/s':>6}")
        lines += [f"{r['name']:36} {r['us']:7.2f} {_f(r['us_pdl'], '7.2f'):>7} {r['gbs']:6.0f}" for r in rows]
    for key, t in s["targets"].items():
        verdict = "NOT JUDGED" if not t["judged"] else "PASS" if t["pass"] else "FAIL"
        shown = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in t.items() if k not in ("pass", "judged")}
        lines.append(f"target {key}: {verdict} {shown}")
    return "\n".join(lines)
