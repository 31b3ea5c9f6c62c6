"""runtime/cpu/warm.py: the kernels a first build compiles ahead of its canary, half in a child process,
are the ones a run then uses: a later process compiles none of the forward's kernels again."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

COMPILE = textwrap.dedent("""
    import sys
    from pathlib import Path
    from toolcall.common.formats import KV_FORMATS
    from toolcall.runtime.bundle.files import read_contract
    from toolcall.runtime.cpu.warm import compile_kernels
    c = read_contract(Path(sys.argv[1]))
    b = Path(sys.argv[1])
    compile_kernels(b / "weights.safetensors", b / "grammar.msgpack", c.model, c.limits, KV_FORMATS.get(c.precision.kv_cache))
""")

RUN = textwrap.dedent("""
    import json, sys
    from toolcall.runtime.engine import Engine
    from toolcall.runtime.bundle.machine import MachineFacts
    from toolcall.runtime.batching.sampling import Sampling, draw_rows
    from toolcall.runtime.cpu import fast_kernels as fk, fast_model as fm, linear_high as lh, stored_weights as sw
    from toolcall.runtime.grammar.walks import allowed_edges, take_and_force
    from toolcall.runtime.jit.one_layout import AnyLayout
    engine = Engine.load(sys.argv[1], facts=MachineFacts(free_bytes=1 << 40))  # loads, runs the canary
    engine.run(["Book a flight to Oslo"], Sampling(temperature=0.7, seed=1))  # a sampled pick too
    kernels = [fk.rms_norm, fk.qk_norm_rope_kv, fk.silu_times, fk.gather_rows_bf16, lh.candidate_logits,
               allowed_edges, take_and_force, draw_rows]
    kernels += [v.calls for m in (fm, sw) for v in vars(m).values() if isinstance(v, AnyLayout)]
    print(json.dumps({k.__name__: [len(k.signatures), sum(k.stats.cache_misses.values())] for k in kernels}))
""")


@pytest.mark.slow
def test_a_run_after_the_warm_up_compiles_no_forward_kernel(tiny_bundle, tmp_path):
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba")}  # an empty cache: a first build's

    def run(code: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", code, str(tiny_bundle)], cwd=ROOT, env=env, capture_output=True,
                              text=True, timeout=900)

    warmed = run(COMPILE)
    assert warmed.returncode == 0, warmed.stderr[-3000:]
    used = run(RUN)
    assert used.returncode == 0, used.stderr[-3000:]
    found = json.loads(used.stdout.strip().splitlines()[-1])
    assert set(found) == {"rms_norm", "qk_norm_rope_kv", "silu_times", "gather_rows_bf16", "candidate_logits",
                          "allowed_edges", "take_and_force", "draw_rows", "linear_panels", "attention"}
    assert all(signatures >= 1 for signatures, _ in found.values()), found  # each one ran
    assert not any(misses for _, misses in found.values()), f"compiled again after the warm-up: {found}"
