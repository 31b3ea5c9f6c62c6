"""FP8 E4M3 per-channel quantization: exact bytes, rounding/clamping edges, fast == plain, errors."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from toolcall.common.errors import QuantizeError
from toolcall.common.fp8 import dequantize_fp8, quantize_fp8
from toolcall.common.minifloat import E4M3_MAX, E4M3_VALUES, e4m3_to_f32, encode_e4m3
from toolcall.runtime.bundle.tensor_file import SafetensorsFile, write_tensors

TINY = 2.0 ** -149  # smallest float32 subnormal


def float32_patterns() -> np.ndarray:
    """Every finite float32 whose low 16 bits are one of the rounding-relevant patterns.

    E4M3 and E2M1 round at bit 16 or above, so their ties sit on multiples of 2^16: with all
    upper halves and low halves {0, 1, just below/at/above half, all ones} every rounding case
    (exact tie, just above/below, sticky bits) of every binade and sign is present.
    """
    high = np.arange(1 << 16, dtype=np.uint32) << np.uint32(16)
    low = np.array([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF], np.uint32)
    values = (high[:, None] | low[None, :]).reshape(-1).view(np.float32)
    return values[np.isfinite(values)]


def nearest_e4m3(x: np.ndarray) -> np.ndarray:
    """Independent reference: nearest finite E4M3 in float64 after the ±448 clamp, ties to the even code."""
    codes = np.arange(256)
    finite = np.isfinite(E4M3_VALUES)
    table, table_codes = E4M3_VALUES[finite].astype(np.float64), codes[finite]
    out = np.empty(x.shape, np.uint8)
    for i, v in enumerate(np.clip(x.astype(np.float64), -E4M3_MAX, E4M3_MAX).reshape(-1)):
        dist = np.abs(table - v)
        best = table_codes[dist == dist.min()]
        if E4M3_VALUES[best[0]] == 0:       # rounds to zero: +0 or -0 by the sign of v
            best = [0x80 if np.signbit(v) else 0x00]
        elif len(best) > 1:                 # a tie: the even code
            best = best[(best & 1) == 0]
        out.reshape(-1)[i] = best[0]
    return out


def test_fast_encoder_equals_ml_dtypes_and_torch_on_all_rounding_patterns():
    values = float32_patterns()
    fast = encode_e4m3(values).view(np.uint8)
    plain = encode_e4m3(values, fast=False).view(np.uint8)
    clamped = torch.from_numpy(np.clip(values, -E4M3_MAX, E4M3_MAX))
    via_torch = clamped.to(torch.float8_e4m3fn).view(torch.uint8).numpy()
    assert np.array_equal(fast, plain)
    assert np.array_equal(plain, via_torch)


@pytest.mark.parametrize("value, byte", [
    (0.0, 0x00), (-0.0, 0x80), (1.0, 0x38), (-3.0, 0xC4), (0.5, 0x30),
    (448.0, 0x7E), (-448.0, 0xFE), (464.0, 0x7E), (1e30, 0x7E), (-3.4e38, 0xFE),  # clamp, never NaN
    (416.0, 0x7D), (432.0, 0x7E),           # 432: tie 416 | 448 -> even mantissa (448)
    (1.0625, 0x38), (1.1875, 0x3A),         # ties 1 | 1.125 -> 1, 1.125 | 1.25 -> 1.25
    (1.0625 + 2 ** -20, 0x39),              # just above a tie rounds up
    (2.0 ** -6, 0x08), (15 * 2.0 ** -10, 0x08),   # min normal; tie 7/512 | 8/512 -> even 8
    (2.0 ** -9, 0x01), (2.0 ** -10, 0x00), (2.0 ** -10 + 2 ** -30, 0x01),  # subnormals
    (3 * 2.0 ** -10, 0x02), (-(2.0 ** -11), 0x80), (TINY, 0x00),
])
def test_e4m3_bytes(value, byte):
    x = np.array([value], np.float32)
    assert encode_e4m3(x).view(np.uint8)[0] == byte
    assert encode_e4m3(x, fast=False).view(np.uint8)[0] == byte
    assert nearest_e4m3(x)[0] == byte


def test_hand_computed_rows():
    w = np.array([[896.0, -448.0, 1.0, 0.0],    # amax 896: scale 2 -> 448, -224, 0.5, 0
                  [0.0, 0.0, 0.0, 0.0],         # all zero: scale 1.0
                  [-0.0, -0.0, 0.0, -0.0],      # zero row keeps its signs (E4M3 has -0)
                  [44.8, 4.48, -0.448, 0.0]],   # scale 0.1: 448, 44.8 -> 44, -4.48 -> -4.5
                 np.float32)
    q, scale = quantize_fp8(w)
    assert q.dtype == ml_dtypes.float8_e4m3fn and scale.dtype == np.float32
    assert scale.tolist() == [2.0, 1.0, 1.0, np.float32(44.8) / np.float32(448)]
    assert q.view(np.uint8).tolist() == [[0x7E, 0xF6, 0x30, 0x00], [0] * 4, [0x80, 0x80, 0x00, 0x80],
                                         [0x7E, 0x63, 0xC9, 0x00]]


def test_clamp_where_an_unclamped_cast_is_nan():
    # amax = 627 * 2^-149: amax / 448 rounds down to 2^-149, so w / scale = 627 > 464
    w = np.array([[627 * TINY, -627 * TINY, TINY, 0.0]], np.float32)
    q, scale = quantize_fp8(w)
    assert scale[0] == np.float32(TINY)
    unclamped = (w / scale[:, None]).astype(ml_dtypes.float8_e4m3fn)
    assert np.isnan(unclamped.astype(np.float32)[0, 0])
    assert q.view(np.uint8)[0].tolist() == [0x7E, 0xFE, 0x38, 0x00]  # 448, -448, 1.0, 0
    assert np.array_equal(q.view(np.uint8), quantize_fp8(w, fast=False)[0].view(np.uint8))


def test_amax_underflow_takes_scale_one():
    w = np.array([[TINY, -TINY, 0.0, 0.0]], np.float32)  # amax / 448 underflows to 0
    q, scale = quantize_fp8(w)
    assert scale[0] == 1.0 and q.view(np.uint8).tolist() == [[0x00, 0x80, 0x00, 0x00]]


def e4m3_half_step(y: np.ndarray) -> np.ndarray:
    """Half the E4M3 step at |y| (float64): 2^(e-3)/2 in binade 2^e, 2^-10 among subnormals."""
    exp = np.floor(np.log2(np.maximum(np.abs(y.astype(np.float64)), 2.0 ** -6)))
    return 2.0 ** (exp - 4)


def test_one_outlier_stretches_only_its_row_and_errors_stay_within_half_a_step():
    rng = np.random.default_rng(1)
    w = rng.standard_normal((4, 256)).astype(np.float32)
    w[2, 17] = 1e6                          # the row's other values fall into E4M3 subnormals
    q, scale = quantize_fp8(w)
    deq = dequantize_fp8(q, scale).astype(np.float64)
    assert abs(deq[2, 17] - 1e6) <= 1e6 * 1e-6
    assert scale[2] > 500 * np.delete(scale, 2).max()
    bound = e4m3_half_step(w / scale[:, None]) * scale[:, None] * (1 + 1e-5)
    assert (np.abs(deq - w) <= bound).all()
    rest = np.delete(np.arange(256), 17)    # every value but the outlier
    rel_err = np.linalg.norm(deq[:, rest] - w[:, rest], axis=1) / np.linalg.norm(w[:, rest], axis=1)
    assert rel_err[2] > 0.1 and np.delete(rel_err, 2).max() < 0.04


@pytest.mark.parametrize("seed, magnitude", [(0, 1.0), (1, 1e-3), (2, 1e-38), (3, 1e30), (4, 2.0 ** -140)])
def test_fast_equals_plain_on_random_tensors(seed, magnitude):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((67, 300)) * magnitude).astype(np.float32)
    w[3] = 0.0
    w[5, ::7] = -0.0
    w[7, 3] *= 1e3                          # one outlier
    w[9] = rng.choice(np.array([0.5, 0.5625, 1.0625, -0.0146484375], np.float32), 300)  # ties
    q_fast, s_fast = quantize_fp8(w)
    q_plain, s_plain = quantize_fp8(w, fast=False)
    assert np.array_equal(q_fast.view(np.uint8), q_plain.view(np.uint8))
    assert np.array_equal(s_fast, s_plain)


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(np.float32, hnp.array_shapes(min_dims=2, max_dims=2, min_side=1, max_side=40),
                  elements=st.floats(np.finfo(np.float32).min, np.finfo(np.float32).max, width=32, allow_subnormal=True)))
def test_fast_equals_plain_property(w):
    q_fast, s_fast = quantize_fp8(w)
    q_plain, s_plain = quantize_fp8(w, fast=False)
    assert np.array_equal(q_fast.view(np.uint8), q_plain.view(np.uint8)) and np.array_equal(s_fast, s_plain)


def test_small_random_against_independent_reference():
    rng = np.random.default_rng(5)
    w = (rng.standard_normal((8, 64)) * rng.uniform(1e-3, 10, (8, 1))).astype(np.float32)
    q, scale = quantize_fp8(w)
    assert np.array_equal(q.view(np.uint8), nearest_e4m3(w / scale[:, None]))


def test_gaussian_relative_rms_error():
    w = np.random.default_rng(0).standard_normal((512, 1024)).astype(np.float32)
    q, scale = quantize_fp8(w)
    deq = dequantize_fp8(q, scale)
    rel_rms = np.sqrt(((deq - w) ** 2).sum() / (w ** 2).sum())
    assert 0.022 < rel_rms < 0.030  # measured 0.0264: 3 mantissa bits, amax ~4.5 sigma per row


def test_e4m3_decode_matches_the_table_for_every_byte():
    codes = np.arange(256, dtype=np.uint8)
    assert np.array_equal(e4m3_to_f32(codes).view(np.uint32), E4M3_VALUES.view(np.uint32))  # NaNs too
    assert np.array_equal(e4m3_to_f32(codes[:100].view(ml_dtypes.float8_e4m3fn)), E4M3_VALUES[:100])
    assert E4M3_VALUES[0x38] == 1.0 and E4M3_VALUES[0x01] == 2.0 ** -9 and E4M3_VALUES[0xFE] == -448.0


def test_e4m3_decode_falls_back_to_the_table_when_subnormals_flush(monkeypatch):
    import toolcall.common.minifloat
    assert not toolcall.common.minifloat.subnormals_flushed()
    monkeypatch.setattr(toolcall.common.minifloat, "subnormals_flushed", lambda: True)
    codes = np.arange(256, dtype=np.uint8)
    assert np.array_equal(e4m3_to_f32(codes).view(np.uint32), E4M3_VALUES.view(np.uint32))


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16])
def test_narrow_source_equals_its_float32_widening(dtype):
    w = (np.random.default_rng(4).standard_normal((70, 200)) * 3).astype(dtype)
    q, scale = quantize_fp8(w)
    q32, scale32 = quantize_fp8(w.astype(np.float32))
    assert np.array_equal(q.view(np.uint8), q32.view(np.uint8)) and np.array_equal(scale, scale32)


def test_dequantize_is_value_times_scale():
    w = np.random.default_rng(2).standard_normal((5, 48)).astype(np.float32)
    q, scale = quantize_fp8(w)
    expected = q.astype(np.float32) * scale[:, None]
    assert np.array_equal(dequantize_fp8(q, scale), expected)


def test_round_trip_through_safetensors(tmp_path):
    w = np.random.default_rng(3).standard_normal((32, 64)).astype(np.float32)
    q, scale = quantize_fp8(w)
    write_tensors(tmp_path / "w.safetensors", {"a.weight": q, "a.weight_scale": scale})
    with SafetensorsFile(tmp_path / "w.safetensors") as f:
        assert f.tensors["a.weight"].dtype == "F8_E4M3"
        assert np.array_equal(f.get("a.weight").view(np.uint8), q.view(np.uint8))
        assert np.array_equal(f.get("a.weight_scale"), scale)


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nonfinite_is_an_error_naming_the_tensor(bad):
    w = np.ones((6, 16), np.float32)
    w[4, 9] = bad
    with pytest.raises(QuantizeError) as err:
        quantize_fp8(w, name="model.layers.3.mlp.up_proj.weight")
    assert err.value.code == "quantize_invalid"
    assert err.value.details == {"tensor": "model.layers.3.mlp.up_proj.weight", "row": 4}
    assert "model.layers.3.mlp.up_proj.weight" in str(err.value)


@pytest.mark.parametrize("w", [np.ones(16, np.float32), np.ones((4, 16), np.float64), np.ones((0, 16), np.float32)])
def test_rejects_non_2d_float32(w):
    with pytest.raises(QuantizeError, match="expected a non-empty 2-D float32"):
        quantize_fp8(w, name="x.weight")
