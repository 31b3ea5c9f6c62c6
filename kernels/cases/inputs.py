"""Random inputs shared by the case families: bf16 arrays, fp8 codes, each weight format's kernel arguments, the
rotary frequencies (and optional q/k norm weights) of a head geometry."""
from __future__ import annotations

import ml_dtypes
import numpy as np

from toolcall.common.formats import BF16 as BF16_WEIGHTS
from toolcall.common.formats import FP8_E4M3, NVFP4

BF16 = ml_dtypes.bfloat16
EPS = np.float32(1e-6)


def bf16(rng, *shape):
    return rng.standard_normal(shape).astype(BF16)


def fp8_codes(rng, *shape):
    c = rng.integers(0, 256, shape, dtype=np.uint8)
    c[(c & 0x7F) == 0x7F] = 0x38  # no NaN codes (the quantizer never writes them)
    return c


# random weight arguments in each format's kernel layout: (w, scales), as kernels/weight_args.py orders them
WEIGHTS = {
    FP8_E4M3: lambda rng, n_out, n_in: (fp8_codes(rng, n_out, n_in), rng.uniform(1e-3, 1e-2, n_out).astype(np.float32)),
    # a per-row global scale: two source tensors of different scales fused (q|k, gate|up)
    NVFP4: lambda rng, n_out, n_in: (rng.integers(0, 256, (n_out, n_in // 2), dtype=np.uint8),
                                     rng.integers(0x28, 0x48, (n_out, n_in // 16), dtype=np.uint8),
                                     np.where(np.arange(n_out) < n_out // 2, 0.01, 0.0037).astype(np.float32)),
    BF16_WEIGHTS: lambda rng, n_out, n_in: (bf16(rng, n_out, n_in),),
}


def rope_inputs(rng, nh, nkv, hd, qk_norm):
    """(inv_freq float32 [hd / 2], q_norm_w, k_norm_w bf16 [hd] or None)."""
    inv_freq = (1.0 / 1e6 ** (np.arange(0, hd, 2) / hd)).astype(np.float32)
    qw, kw = (bf16(rng, hd), bf16(rng, hd)) if qk_norm else (None, None)
    return inv_freq, qw, kw
