"""What the executor measures without a GPU, per launch of one Qwen3-0.6B-shaped layer: instructions executed,
the distinct global bytes each warp instruction asks for against the 32-byte sectors they lie in (sector
efficiency: asked / touched bytes; 1.0 is perfectly coalesced), shared-memory bank conflicts (wavefronts
against the fewest the instruction's words need: 1.0 is conflict-free) and sectors
read more than once. Linear layers at T = 1 and T = 64 in both kernel families (fp8_e4m3 weights), decode
attention for one row at positions 511 and 2047. Sanitizers are off (they add no traffic).
"""
from __future__ import annotations

import time

import ml_dtypes
import numpy as np

from toolcall.common.formats import FP8_E4M3
from toolcall.kernels import geometry
from toolcall.kernels.geometry import FMA, MMA, PLAIN, RMSNORM, SWIGLU, matvec_kernel
from toolcall.kernels.runner import KernelRunner, Out
from toolcall.kernels.sim.device import SimGpu
from toolcall.kernels.sim.stats import LaunchStats

HIDDEN, INTERMEDIATE, HEADS, KV_HEADS, HEAD_DIM = 1024, 3072, 16, 8, 128  # Qwen3-0.6B
LINEARS = (("qkv_proj", RMSNORM, HIDDEN, (HEADS + 2 * KV_HEADS) * HEAD_DIM), ("o_proj", PLAIN, HEADS * HEAD_DIM, HIDDEN),
           ("gate_up_proj", RMSNORM, HIDDEN, 2 * INTERMEDIATE), ("down_proj", SWIGLU, INTERMEDIATE, HIDDEN))
BF16 = ml_dtypes.bfloat16


def _measure(arch: str, what: str, launch) -> dict:
    stats = LaunchStats()
    runner = KernelRunner(SimGpu(arch, sanitize=False, stats=stats))
    start = time.monotonic()
    launch(runner)
    seconds = time.monotonic() - start
    reread = stats.bytes_touched_again()
    return dict(launch=what, seconds=round(seconds, 2), lane_instructions=stats.lane_instructions,
                global_bytes=stats.global_bytes, sector_bytes=32 * stats.global_sectors,
                sector_efficiency=round(stats.global_bytes / max(32 * stats.global_sectors, 1), 3),
                bytes_read_again=reread,
                bank_ways=round(stats.shared_wavefronts / max(stats.shared_ideal, 1), 3))


def _linear(fn, pro, n_in, n_out, T):
    rng = np.random.default_rng(0)
    x = rng.standard_normal((T, n_in)).astype(np.float32)
    w = rng.integers(0, 0x7E, (n_out, n_in), dtype=np.uint8)
    head = {PLAIN: dict(x=x), RMSNORM: dict(x=x, norm_w=np.ones(n_in, BF16), eps=np.float32(1e-6)),
            SWIGLU: dict(gate=x, up=x)}[pro]
    return lambda d: d.run(fn, **head, x_stride=n_in, w=w, w_scale=np.full(n_out, 1e-3, np.float32), bias=None,
                           y=Out(np.zeros((T, n_out), np.float32)), T=T, n_in=n_in, n_out=n_out, accumulate=0)


def _decode(position: int):
    rng = np.random.default_rng(0)
    ps = 32
    pages = position // ps + 1
    table = np.arange(pages, dtype=np.int32)[None]
    cache = [rng.standard_normal((pages, ps, KV_HEADS, HEAD_DIM)).astype(BF16) for _ in range(2)]
    S = geometry.decode_max_splits(position + 1)
    q, k, v = (rng.standard_normal((1, n * HEAD_DIM)).astype(np.float32) for n in (HEADS, KV_HEADS, KV_HEADS))
    inv_freq = (1.0 / 1e6 ** (np.arange(0, HEAD_DIM, 2) / HEAD_DIM)).astype(np.float32)
    angles = np.float32(position) * inv_freq
    rope = np.stack([np.cos(angles), np.sin(angles)], -1).astype(np.float32)[None]
    return lambda d: d.run(
        geometry.decode_kernel(HEADS, KV_HEADS), q=q, q_stride=HEADS * HEAD_DIM, k=Out(k), k_stride=KV_HEADS * HEAD_DIM,
        v=v, v_stride=KV_HEADS * HEAD_DIM, seq=np.zeros(1, np.int32), pos=np.array([position], np.int32),
        block_table=table, max_pages_per_seq=pages, page_size=ps, k_cache=Out(cache[0]), v_cache=Out(cache[1]),
        q_norm_w=np.ones(HEAD_DIM, BF16), k_norm_w=np.ones(HEAD_DIM, BF16), rope=rope, eps=np.float32(1e-6),
        n_heads=HEADS, n_kv_heads=KV_HEADS, head_dim=HEAD_DIM, sm_scale=np.float32(HEAD_DIM ** -0.5), max_splits=S,
        part_o=Out(np.zeros((1, HEADS, S, HEAD_DIM), np.float32)), part_ml=Out(np.zeros((1, HEADS, S, 2), np.float32)),
        counters=Out(np.zeros((1, KV_HEADS), np.int32)), out=Out(np.zeros((1, HEADS * HEAD_DIM), np.float32)),
        out_stride=HEADS * HEAD_DIM, prefetch=None, prefetch_bytes=0, T=1)


def layer_stats(arch: str = "sm_90") -> list[dict]:
    """One row per launch (see the module docstring)."""
    rows = []
    for family in (FMA, MMA):
        for T in (1, 64):
            for name, pro, n_in, n_out in LINEARS:
                fn = matvec_kernel(FP8_E4M3, pro, family)
                rows.append(_measure(arch, f"{fn} {name} T={T}", _linear(fn, pro, n_in, n_out, T)))
    for position in (511, 2047):
        rows.append(_measure(arch, f"{geometry.decode_kernel(HEADS, KV_HEADS)} position {position}", _decode(position)))
    return rows


def stats_table(rows: list[dict]) -> str:
    head = f"{'launch':52} {'s':>6} {'lane instr':>11} {'global B':>10} {'sector eff':>10} {'read again':>10} {'bank ways':>9}"
    lines = [head] + [f"{r['launch']:52} {r['seconds']:6.1f} {r['lane_instructions']:11d} {r['global_bytes']:10d} "
                      f"{r['sector_efficiency']:10.3f} {r['bytes_read_again']:10d} {r['bank_ways']:9.3f}" for r in rows]
    return "\n".join(lines)
