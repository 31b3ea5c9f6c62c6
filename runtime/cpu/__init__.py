"""The CPU backends: the numpy float32 reference (model.py) and the fast numba one on the stored
weights (fast_model.py), over a paged bf16 KV pool. This module imports neither (no numba here)."""
from __future__ import annotations

CPU_BACKENDS = ("fast", "reference")  # fast: numba on the stored weights; reference: numpy float32, the truth
