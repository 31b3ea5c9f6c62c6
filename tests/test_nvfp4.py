"""NVFP4 quantization: E2M1 rounding, nibble order, block/global scale formulas, edges, fast == plain,
and byte equality with an independent torch implementation of ModelOpt's order of operations."""
from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from toolcall.common.errors import QuantizeError
from toolcall.common.nvfp4 import E2M1_VALUES, dequantize_nvfp4, e2m1_codes_reference, pack_e2m1, quantize_nvfp4
from toolcall.runtime.bundle.tensor_file import SafetensorsFile, write_tensors


def float32_patterns() -> np.ndarray:
    """Every finite float32 whose low 16 bits are 0, 1, 0x7FFF, 0x8000, 0x8001 or 0xFFFF (ties
    of E2M1 sit on multiples of 2^16, so each rounding case of each binade and sign is here)."""
    high = np.arange(1 << 16, dtype=np.uint32) << np.uint32(16)
    low = np.array([0, 1, 0x7FFF, 0x8000, 0x8001, 0xFFFF], np.uint32)
    values = (high[:, None] | low[None, :]).reshape(-1).view(np.float32)
    return values[np.isfinite(values)]


def unpack(packed: np.ndarray) -> np.ndarray:
    codes = np.empty((*packed.shape[:-1], 2 * packed.shape[-1]), np.uint8)
    codes[..., 0::2], codes[..., 1::2] = packed & 0xF, packed >> 4
    return codes


@pytest.mark.parametrize("q, code", [
    (0.0, 0), (-0.0, 0),                      # an exact -0.0 is code 0 (ModelOpt: sign = q < 0)
    (0.25, 0), (0.2501, 1), (0.75, 2), (0.7499, 1), (1.25, 2), (1.2501, 3), (1.75, 4), (1.7499, 3),
    (2.5, 4), (2.5001, 5), (3.5, 6), (3.4999, 5), (5.0, 6), (5.0001, 7),   # nearest even at each bound
    (0.5, 1), (1.0, 2), (1.5, 3), (2.0, 4), (3.0, 5), (4.0, 6), (6.0, 7),  # exact values
    (6.5, 7), (1e30, 7), (3.4e38, 7),         # saturate at 6
    (-0.1, 8), (-0.25, 8), (-0.2501, 9), (-3.5, 14), (-6.0, 15), (-1e30, 15), (1e-45, 0), (-1e-45, 8),
])
def test_e2m1_codes(q, code):
    x = np.array([q, 0.0], np.float32)
    assert e2m1_codes_reference(x)[0] == code
    assert pack_e2m1(x)[0] == code


def test_fast_packer_equals_reference_on_all_rounding_patterns():
    values = float32_patterns()
    values = values[: values.size // 2 * 2]
    assert np.array_equal(pack_e2m1(values), pack_e2m1(values, fast=False))


def test_nibble_order():
    values = E2M1_VALUES[[1, 2, 3, 4, 15, 9]]  # 0.5, 1, 1.5, 2, -6, -0.5: element 2k -> low nibble
    assert pack_e2m1(values).tolist() == [0x21, 0x43, 0x9F]
    assert pack_e2m1(values, fast=False).tolist() == [0x21, 0x43, 0x9F]


def test_hand_computed_tensor():
    # amax 2688 -> global 1.0; block 0 amax 2688 -> scale 448; block 1 amax 6 -> scale 1.0
    block0 = [2688.0, -1344.0, 672.0] + [0.0] * 13            # q = 6, -3, 1.5, 0...
    block1 = [0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0, 6.0, -0.0, -0.25, -0.2501, 0.2501, -6.0, 0.0, 0.0, 0.0]
    w = np.array([block0 + block1], np.float32)
    for fast in (True, False):
        packed, scale, global_scale = quantize_nvfp4(w, fast=fast)
        assert global_scale.shape == () and global_scale.dtype == np.float32 and global_scale == 1.0
        assert scale.dtype == ml_dtypes.float8_e4m3fn and scale.view(np.uint8).tolist() == [[0x7E, 0x38]]
        assert packed.dtype == np.uint8 and packed.shape == (1, 16)
        assert packed.tolist() == [[0xD7, 0x03, 0, 0, 0, 0, 0, 0,
                                    0x20, 0x42, 0x64, 0x76, 0x80, 0x19, 0x0F, 0x00]]


def test_block_scale_edges():
    blocks = np.zeros((6, 16), np.float32)
    blocks[0, 0] = 2688.0                    # global = 2688 / 2688 = 1
    blocks[1, :2] = [6.375, 1.0]             # scale 1.0625: E4M3 tie -> 1.0; q 6.375 saturates at 6
    blocks[2, :2] = [1e-4, -2.5e-5]          # scale 1.7e-5 -> clamped to 2^-9; q 0.0512 -> 0, -0.0128 -> -0
    blocks[3, 0] = 6 * 3 * 2.0 ** -10        # scale 3 * 2^-10: subnormal tie 2^-9 | 2^-8 -> 2^-8; q 4.5 -> 4
    blocks[5] = -0.0                         # blocks 4, 5: zero -> scale 1.0, codes 0
    w = blocks.reshape(1, 96)
    for fast in (True, False):
        packed, scale, global_scale = quantize_nvfp4(w, fast=fast)
        assert global_scale == 1.0
        assert scale.view(np.uint8).tolist() == [[0x7E, 0x38, 0x01, 0x02, 0x38, 0x38]]
        codes = unpack(packed).reshape(6, 16)
        assert codes[:, :2].tolist() == [[7, 0], [7, 2], [0, 8], [6, 0], [0, 0], [0, 0]]
        assert not codes[:, 2:].any()


def test_subnormal_global_scale_never_gives_nan():
    w = np.zeros((1, 32), np.float32)
    w[0, 0] = 21 * 2.0 ** -141               # amax = 2688 * 2^-148: global 2^-148 (subnormal)
    w[0, 16:18] = [2.0 ** -149, -(2.0 ** -149)]   # block scale 1/12 -> 0.0859375; * global underflows to 0
    for fast in (True, False):
        packed, scale, global_scale = quantize_nvfp4(w, fast=fast)
        assert global_scale == np.float32(2.0 ** -148)
        assert scale.view(np.uint8).tolist() == [[0x7E, 0x1B]]
        assert unpack(packed)[0, [0, 1, 16, 17, 18]].tolist() == [7, 0, 2, 10, 0]  # q = 6, 0, 1, -1, 0


def test_all_zero_tensor():
    w = np.zeros((3, 32), np.float32)
    w[1] = -0.0
    packed, scale, global_scale = quantize_nvfp4(w)
    assert global_scale == 0.0 and global_scale.shape == ()
    assert (scale.view(np.uint8) == 0x38).all() and not packed.any()
    assert not dequantize_nvfp4(packed, scale, global_scale).any()


def modelopt_order_torch(w: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """docs/bundle-format.md's NVFP4 steps ("Weight formats") in torch ops, in ModelOpt's order (an implementation independent of ours)."""
    t = torch.from_numpy(w)
    rows, cols = t.shape
    global_scale = t.abs().amax().float() / (6.0 * 448.0)
    blocks = t.view(rows, cols // 16, 16)
    scale = blocks.abs().amax(dim=-1) / (6.0 * global_scale)
    scale[scale == 0] = 1.0
    scale = scale.clamp(min=2.0 ** -9).to(torch.float8_e4m3fn)
    q = (blocks / (scale.to(torch.float32) * global_scale).unsqueeze(-1)).view(rows, cols)
    mag = q.abs()
    codes = torch.searchsorted(torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0]), mag).to(torch.uint8)
    codes += (mag.unsqueeze(-1) == torch.tensor([0.75, 1.75, 3.5])).any(dim=-1).to(torch.uint8)
    codes += (q < 0).to(torch.uint8) << 3
    packed = codes[:, 0::2] | (codes[:, 1::2] << 4)
    return packed.numpy(), scale.view(torch.uint8).numpy(), global_scale.numpy()


@pytest.mark.parametrize("seed, magnitude, shape", [(0, 1.0, (64, 256)), (1, 0.02, (33, 1024)),
                                                    (2, 1e-30, (8, 64)), (3, 1e20, (16, 48))])
def test_bytes_equal_torch_modelopt_order(seed, magnitude, shape):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal(shape) * magnitude).astype(np.float32)
    w[1, 16:32] = 0.0
    w[2, ::5] *= 40                          # outliers: tiny block scales elsewhere
    w[3, :16] = rng.choice(np.array([0.25, 0.75, 2.5, 3.5, -5.0], np.float32), 16) * np.abs(w).max() / 6
    packed, scale, global_scale = quantize_nvfp4(w)
    ref_packed, ref_scale, ref_global = modelopt_order_torch(w)
    assert global_scale == ref_global
    assert np.array_equal(scale.view(np.uint8), ref_scale)
    assert np.array_equal(packed, ref_packed)


@pytest.mark.parametrize("seed, magnitude", [(0, 1.0), (1, 1e-3), (2, 1e-36), (3, 1e30), (4, 2.0 ** -130),
                                              (5, 2.0 ** -138)])  # subnormal global scale
def test_fast_equals_plain_on_random_tensors(seed, magnitude):
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal((41, 320)) * magnitude).astype(np.float32)
    w[0] = 0.0
    w[4, :48] = -0.0
    w[6, 7] *= 1e4
    fast, plain = quantize_nvfp4(w), quantize_nvfp4(w, fast=False)
    assert np.array_equal(fast[0], plain[0])
    assert np.array_equal(fast[1].view(np.uint8), plain[1].view(np.uint8))
    assert fast[2] == plain[2]


@settings(max_examples=60, deadline=None)
@given(hnp.arrays(np.float32, st.tuples(st.integers(1, 9), st.sampled_from([16, 32, 64])),
                  elements=st.floats(np.finfo(np.float32).min, np.finfo(np.float32).max, width=32)))
def test_fast_equals_plain_property(w):
    fast, plain = quantize_nvfp4(w), quantize_nvfp4(w, fast=False)
    assert np.array_equal(fast[0], plain[0]) and np.array_equal(fast[1].view(np.uint8), plain[1].view(np.uint8))
    assert fast[2] == plain[2]


def test_dequantize_is_code_value_times_block_times_global():
    w = np.random.default_rng(7).standard_normal((6, 64)).astype(np.float32)
    packed, scale, global_scale = quantize_nvfp4(w)
    block = np.repeat(scale.astype(np.float32), 16, axis=1)                  # (6, 64)
    expected = (E2M1_VALUES[unpack(packed)] * block) * global_scale          # the format's order, as the kernel
    assert np.array_equal(dequantize_nvfp4(packed, scale, global_scale), expected)
    # the other association rounds twice and differs in the last bit somewhere here
    assert not np.array_equal(E2M1_VALUES[unpack(packed)] * (block * global_scale), expected)


@pytest.mark.parametrize("dtype", [ml_dtypes.bfloat16, np.float16])
def test_narrow_source_equals_its_float32_widening(dtype):
    w = (np.random.default_rng(4).standard_normal((70, 208)) * 3).astype(dtype)
    fast, wide = quantize_nvfp4(w), quantize_nvfp4(w.astype(np.float32))
    assert np.array_equal(fast[0], wide[0]) and np.array_equal(fast[1].view(np.uint8), wide[1].view(np.uint8))
    assert fast[2] == wide[2]


def test_gaussian_relative_rms_error():
    w = np.random.default_rng(0).standard_normal((512, 1024)).astype(np.float32)
    deq = dequantize_nvfp4(*quantize_nvfp4(w))
    rel_rms = np.sqrt(((deq - w) ** 2).sum() / (w ** 2).sum())
    assert 0.085 < rel_rms < 0.105  # measured 0.0951: 1 mantissa bit, per-16 E4M3 scales


def test_round_trip_through_safetensors(tmp_path):
    w = np.random.default_rng(3).standard_normal((8, 32)).astype(np.float32)
    packed, scale, global_scale = quantize_nvfp4(w)
    write_tensors(tmp_path / "w.safetensors", {"m.weight": packed, "m.weight_scale": scale,
                                               "m.weight_scale_2": global_scale})
    with SafetensorsFile(tmp_path / "w.safetensors") as f:
        assert [(i.dtype, i.shape) for i in f.tensors.values()] == [("U8", (8, 16)), ("F8_E4M3", (8, 2)), ("F32", ())]
        assert np.array_equal(f.get("m.weight"), packed)
        assert np.array_equal(f.get("m.weight_scale").view(np.uint8), scale.view(np.uint8))
        assert f.get("m.weight_scale_2")[()] == global_scale


def test_input_dim_not_multiple_of_16_names_the_tensor():
    with pytest.raises(QuantizeError) as err:
        quantize_nvfp4(np.ones((4, 24), np.float32), name="model.layers.0.mlp.down_proj.weight")
    assert err.value.code == "quantize_invalid" and err.value.details["tensor"] == "model.layers.0.mlp.down_proj.weight"
    assert "multiple of 16" in err.value.message and "[4, 24]" in err.value.message


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_nonfinite_is_an_error_naming_the_tensor(bad):
    w = np.ones((5, 32), np.float32)
    w[3, 30] = bad
    with pytest.raises(QuantizeError) as err:
        quantize_nvfp4(w, name="model.layers.1.self_attn.o_proj.weight")
    assert err.value.details == {"tensor": "model.layers.1.self_attn.o_proj.weight", "row": 3}
