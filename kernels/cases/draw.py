"""sample_draw (kernels/sample_draw.cu) against its numpy reference (kernels/reference_draw.py), bit for bit: the
picked column of each row over top_p, temperature (0: a greedy row, out -1), how many candidates are allowed and
the width; a row alone gives the pick it gives in a batch (its draw depends on its own seed and token only)."""
from __future__ import annotations

import numpy as np

from toolcall.kernels import reference_draw as ref_draw
from toolcall.kernels.cases import KernelCase
from toolcall.kernels.runner import KernelRunner, Out

ROWS = 5  # rows of one launch
TINY_TOP_P = float(np.float32(1e-30))  # top_p * total rounds to (near) 0: the kept prefix must still hold one


def draw_rows(rng, allowed: str, width: int, temperature: float, top_p: float) -> dict:
    """ROWS rows of ``width`` candidates in a stride of width + 3 (the kernel reads the first width): logits float32
    [ROWS, stride] (3x normal, every 5th a tie with column 0; all 0.5 when ``allowed`` is "equal"), valid uint8
    ("some": 70 % allowed, "one", "none", "equal": every candidate), inverse temperature (0: greedy), top_p, seed
    uint64, token int32 [ROWS]."""
    stride = width + 3
    logits = (rng.standard_normal((ROWS, stride)) * 3).astype(np.float32)
    logits[:, 1:width:5] = logits[:, :1]  # ties: equal e in column order
    valid = (rng.random((ROWS, stride)) < 0.7).astype(np.uint8)
    if allowed == "equal":
        logits[:], valid[:] = 0.5, 1
    elif allowed in ("one", "none"):
        valid[:] = 0
        if allowed == "one":
            valid[np.arange(ROWS), rng.integers(0, width, ROWS)] = 1
    valid[:, width:] = 1  # past the width: never read
    inv_t = np.float32(1.0 / temperature) if temperature > 0 else np.float32(0.0)
    return dict(logits=logits, valid=valid, inv_temperature=np.full(ROWS, inv_t, np.float32),
                top_p=np.full(ROWS, top_p, np.float32), seed=rng.integers(0, 2**64 - 1, ROWS, dtype=np.uint64),
                token=rng.integers(0, 4096, ROWS).astype(np.int32))


def launch(d: KernelRunner, rows: dict, width: int) -> np.ndarray:
    B, stride = rows["logits"].shape
    return d.run("sample_draw", logits=rows["logits"], valid=rows["valid"], stride=stride, width=width,
                 inv_temperature=rows["inv_temperature"], top_p=rows["top_p"], seed=rows["seed"], token=rows["token"],
                 B=B, out=Out(np.full(B, -7, np.int32)))["out"]


def reference(rows: dict, width: int) -> np.ndarray:
    return ref_draw.sample_draw(rows["logits"][:, :width], rows["valid"][:, :width], rows["inv_temperature"],
                                rows["top_p"], rows["seed"], rows["token"])


def case_draw(d: KernelRunner, rng, allowed: str, width: int, temperature: float, top_p: float):
    """ROWS rows of one kind against the reference; row 2 alone gives the pick it gave in the batch."""
    rows = draw_rows(rng, allowed, width, temperature, top_p)
    got = launch(d, rows, width)
    d.same(got, reference(rows, width), f"sample_draw {allowed} width {width} T {temperature} top_p {top_p}")
    one = {k: a[2:3] for k, a in rows.items()}
    d.same(launch(d, one, width), got[2:3], "sample_draw: row 2 alone vs in a batch")


def case_draw_mixed(d: KernelRunner, rng):
    """One launch of rows of every kind (each row its own temperature, top_p, allowed set) at width 64 against the
    reference; each row alone gives the pick it gave among the others."""
    kinds = [("some", 0.7, 1.0), ("some", 1.5, 0.5), ("some", 0.0, 1.0), ("one", 0.7, 0.9), ("none", 0.7, 0.9),
             ("equal", 1.0, 0.5), ("some", 0.7, 0.05)]
    parts = [draw_rows(rng, a, 64, t, p) for a, t, p in kinds]
    rows = {k: np.concatenate([p[k][i:i + 1] for i, p in enumerate(parts)]) for k in parts[0]}
    got = launch(d, rows, 64)
    d.same(got, reference(rows, 64), "sample_draw, mixed rows")
    for r in range(len(kinds)):
        d.same(launch(d, {k: a[r:r + 1] for k, a in rows.items()}, 64), got[r:r + 1],
               f"sample_draw: mixed row {r} {kinds[r]} alone vs in a batch")


# (allowed, width, temperature, top_p); temperature 0: greedy rows (out -1)
DRAWS = [("some", 200, 0.7, 1.0), ("some", 200, 0.7, 0.5), ("some", 200, 0.7, TINY_TOP_P), ("some", 200, 0.7, 0.0),
         ("some", 200, 0.0, 1.0),
         ("some", 200, 1.5, 0.9), ("one", 33, 0.7, 0.9), ("none", 33, 0.7, 0.9), ("equal", 32, 1.0, 0.5),
         ("some", 1, 0.7, 1.0), ("some", 31, 0.7, 0.9), ("some", 32, 1.5, 0.9), ("some", 33, 0.7, 0.5),
         ("equal", 200, 0.7, 1.0), ("some", 512, 1.0, 0.95)]
CASES = ([KernelCase(f"draw-{a}-w{w}-T{t}-p{p:g}", case_draw, (a, w, t, p), ci=True) for a, w, t, p in DRAWS]
         + [KernelCase("draw-mixed", case_draw_mixed, (), ci=True)])
