"""The fast CPU backend's kernels compiled before a first run, half of them in a second process.

numba compiles each kernel at its first call, one after another (its compiler holds a process-wide lock),
and writes it to its on-disk cache; a first build spends most of its canary stage there. ``compile_kernels``
splits a step's kernels (the forward's, the head's, the grammar walks, the sampled pick) in two groups of
about equal compile time (``GROUPS``): a child process
compiles the first while this one compiles the second, and both write numba's cache, from which the canary
then loads them (on two idle cores the compiles take about half the time; on a busy machine no longer than
one after another). Each kernel is called once on zero rows of a real model's own buffers and KV pool, so
it compiles for exactly the argument types a step gives it (a one-row or strided view aside, which
runtime/jit/one_layout.py folds into the same compile) and reads or writes no element. Speed only: a child
that fails leaves the kernels to the canary, which compiles whatever is missing as before.

    python -m toolcall.runtime.cpu.warm   # the child: the job as JSON on stdin (``compile_kernels`` writes it)
"""
from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import numpy as np

from toolcall.common.formats import KV_FORMATS
from toolcall.runtime.batching.sampling import sample_rows
from toolcall.runtime.bundle.contract import Limits
from toolcall.runtime.bundle.machine import available_cpus
from toolcall.runtime.bundle.model_config import ModelConfig
from toolcall.runtime.bundle.rope import cos_sin
from toolcall.runtime.cpu.backend import cpu_model, load_cpu_weights
from toolcall.runtime.cpu.fast_kernels import qk_norm_rope_kv, silu_times
from toolcall.runtime.cpu.fast_model import NO_NORM, FastCpuModel, _attention
from toolcall.runtime.cpu.kv_pool import PagedKVPool
from toolcall.runtime.grammar.stepper import GrammarStepper
from toolcall.runtime.grammar.trie import Grammar

# (child's, this process's) kernels; each one's compile in CPU seconds, model v3 fp8 (bench/RESULTS.md, "Build
# time"): linear 4.3, embedding 0.3, silu 0.4, grammar walks 1.5 | attention 3.1, q/k norm + rope 2.2, rms_norm
# 0.4, head 0.7, sampled pick 0.7; the child also starts Python and numba (~1.5 s), and both compile the load's
# NaN scan (0.4)
GROUPS = (("linear", "embedding", "silu", "grammar"), ("attention", "qk_norm_rope", "rms_norm", "head", "sampling"))
NOTE = "compiling CPU kernels, once: ~10 s on two idle cores, ~15 s on one (later builds and loads reuse them)"


def zero_row_calls(model: FastCpuModel, kv: PagedKVPool, grammar: Grammar) -> dict[str, Callable[[], object]]:
    """Each kernel of a step (by name) called on zero rows of ``model``'s buffers and ``kv``'s pool (the head on
    one row of zeros), with the argument types of runtime/cpu/fast_model.py's layer loop; the grammar's walks
    and the sampled pick on an empty batch, as the step batcher calls them."""
    cfg, w = model.cfg, model.layers[0]
    v = model._views(0)
    rows = np.zeros(0, np.int64)
    cos, sin = cos_sin(model.freqs, rows)
    pages, offsets = kv.rows_at(rows, rows)
    kp, vp = kv.kernel_pool(kv.k[0]), kv.kernel_pool(kv.v[0])
    k_inv, v_inv, k_mult, v_mult = kv.kernel_scales[:, 0]
    qn, kn = (w["q_norm"], w["k_norm"]) if cfg.qk_norm else (NO_NORM, NO_NORM)
    stepper = GrammarStepper(grammar)
    none = stepper.initial_states(0)
    joined = w["qkv"] is not None and w["gate_up"] is not None
    linears = ([(w["qkv"], v["normed"], v["qkv"]), (w["gate_up"], v["normed"], v["gate_up"])] if joined else
               [(w[p], v["normed"], v[p]) for p in ("q", "k", "v", "gate", "up")])
    linears += [(w["o"], v["attn_out"], v["normed"]), (w["down"], v["gate"], v["normed"])]
    return {
        "embedding": lambda: model.embed_rows(rows, v["hidden"]),
        "rms_norm": lambda: model._norm(v["hidden"], w["in_norm"], v["normed"]),
        "linear": lambda: [model.linear(lin, x, y) for lin, x, y in linears],
        "qk_norm_rope": lambda: qk_norm_rope_kv(v["qkv"], cfg.num_heads, qn, kn, model.eps, cos, sin, kp, vp, pages,
                                                offsets, k_inv, v_inv),
        "attention": lambda: _attention(v["q3"], kp, vp, kv.block_table, rows, rows, model.scale, v["attn_scores"],
                                        v["attn_out"], k_mult, v_mult),
        "silu": lambda: silu_times(v["gate_up"]),
        # one row (of zeros, token 0's logit): numpy gives a zero-row copy other strides than the kernel checks
        "head": lambda: model.sparse_logits(np.zeros((1, cfg.hidden_size), np.float32), np.zeros((1, 1), np.int64)),
        "grammar": lambda: (stepper.allowed_mask_batch(none), stepper.take_and_force(none, rows, rows, rows > 0)),
        "sampling": lambda: sample_rows(np.zeros((0, 1), np.float32), np.zeros((0, 1), np.bool_), [], []),
    }


def compile_group(weights_path: Path, grammar_path: Path, cfg: ModelConfig, limits: Limits, kv_format,
                  group: tuple[str, ...]) -> None:
    """Compiles (or loads from numba's cache) the kernels named in ``group`` for this bundle's model."""
    model = cpu_model(cfg, load_cpu_weights(weights_path, cfg, backend="fast"), limits, threads=1)
    calls = zero_row_calls(model, model.new_kv_pool(limits, kv_format), Grammar.read(grammar_path))
    for name in group:
        calls[name]()


def compile_kernels(weights_path: Path, grammar_path: Path, cfg: ModelConfig, limits: Limits, kv_format) -> None:
    """``GROUPS[0]`` in a child process while this one compiles ``GROUPS[1]``; returns when both are done.
    With one CPU, both here. A scaled KV format (its pool needs the bundle's scales) is left to the canary."""
    if kv_format.scaled:
        return
    if available_cpus() < 2:
        compile_group(weights_path, grammar_path, cfg, limits, kv_format, GROUPS[0] + GROUPS[1])
        return
    job = {"weights": str(weights_path), "grammar": str(grammar_path), "model": cfg.to_dict(), "limits": dataclasses.asdict(limits),
           "kv_format": kv_format.name}
    child = subprocess.Popen([sys.executable, "-m", "toolcall.runtime.cpu.warm"], stdin=subprocess.PIPE,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, text=True)
    try:
        try:
            child.stdin.write(json.dumps(job))
            child.stdin.close()
        except OSError:  # the child ended before reading its job: the canary compiles its kernels
            pass
        compile_group(weights_path, grammar_path, cfg, limits, kv_format, GROUPS[1])
    finally:
        child.wait()


def main() -> None:
    job = json.loads(sys.stdin.read())
    compile_group(Path(job["weights"]), Path(job["grammar"]), ModelConfig.from_dict(job["model"]), Limits(**job["limits"]),
                  KV_FORMATS.get(job["kv_format"]), GROUPS[0])


if __name__ == "__main__":
    main()
