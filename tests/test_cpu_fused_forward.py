"""The layer loop as one numba call (runtime/cpu/fused_forward.py) gives the Python loop's bits, on parallel
kernels and on their serial twins, for every fused weight format, over full passes and sampled rows."""
from __future__ import annotations

import numpy as np
import pytest
from test_cpu_fast import bundles  # noqa: F401  (module fixture: fp8_e4m3, nvfp4 and bf16 CPU bundles)

from toolcall.common.formats import BF16, FP8_E4M3, NVFP4
from toolcall.runtime.cpu import fused_forward as ff
from toolcall.runtime.engine import Engine

# (bundle weight format, kernel threads): one thread takes the serial kernels (fused_layers_serial), the lanes'
# path on 2 CPUs; two the parallel ones. Each case compiles every kernel into the loop once (1-2 min on 2 cores): two.
CASES = [(FP8_E4M3, 1), (BF16, 2)]


def rows_of(engine, texts):
    """One step's rows: each prompt prefilled from position 0 into its own slot."""
    tokens, slots, positions = [], [], []
    for text in texts:
        ids = engine.prompt.encode(text)
        slot = engine.generator.kv.admit(len(ids) + 8)
        tokens += list(ids)
        slots += [slot] * len(ids)
        positions += range(len(ids))
    return np.array(tokens, np.int64), np.array(slots, np.int64), np.array(positions, np.int64)


@pytest.mark.parametrize("fmt,threads", CASES, ids=[f"{f.name}-{t}" for f, t in CASES])
@pytest.mark.parametrize("sampled", [False, True])
def test_the_fused_layer_loop_gives_the_python_loops_bits(bundles, fmt, threads, sampled):
    engine = Engine.load(bundles[fmt], threads=threads, prefix_cache=False)
    model, kv = engine.generator.model, engine.generator.kv
    assert model.fused is None and model.enable_fused()  # opt-in
    tokens, slots, positions = rows_of(engine, ["Book a flight to Paris", "Convert 20 euros to yen and call Bob"])
    outputs = np.array([3, 7, len(tokens) - 1], np.int64) if sampled else None
    fused = model.forward(tokens, slots, positions, kv, outputs=outputs)
    k_fused = [a.copy() for a in kv.k]
    arrays, model.fused = model.fused, None  # the Python loop over the same rows, pages rewritten
    try:
        python = model.forward(tokens, slots, positions, kv, outputs=outputs)
    finally:
        model.fused = arrays
    assert fused.shape == python.shape == (len(outputs) if sampled else len(tokens), model.cfg.hidden_size)
    assert np.array_equal(fused.view(np.uint32), python.view(np.uint32))
    for a, b in zip(k_fused, kv.k):  # the K/V written, bit for bit
        assert np.array_equal(a.view(np.uint16) if a.dtype != np.float32 else a.view(np.uint32),
                              b.view(np.uint16) if b.dtype != np.float32 else b.view(np.uint32))


def test_nvfp4_keeps_the_python_loop(bundles):
    engine = Engine.load(bundles[NVFP4], threads=1, prefix_cache=False)
    assert not engine.generator.model.enable_fused() and engine.generator.model.fused is None
    assert ff.layer_arrays(engine.generator.model.layers, np.empty(0, np.float32)) is None


@pytest.mark.parametrize("name", ["rms_norm", "qk_norm_rope_kv", "silu_times", "gather_rows_bf16", "linear_panels"])
def test_the_serial_kernels_are_their_own_numba_functions(name):
    from toolcall.runtime.cpu import fast_kernels as fk
    from toolcall.runtime.cpu import panel_kernels as pk

    serial_module, module = (ff.pk_serial, pk) if hasattr(pk, name) else (ff.fk_serial, fk)
    serial, parallel = getattr(serial_module, name), getattr(module, name)
    assert serial.py_func.__code__ is parallel.py_func.__code__  # the same source
    assert serial.py_func.__qualname__ == name + "_1t" and not serial.targetoptions.get("parallel")
