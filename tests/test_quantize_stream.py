"""The quantization rule, the streamed checkpoint -> weights file conversion, its report, and the
runtime's reading of the result (load_dequantized)."""
from __future__ import annotations

import json
import threading
import time

import ml_dtypes
import numpy as np
import pytest

from toolcall.builder.checkpoint import open_checkpoint
from toolcall.builder.quantize import is_quantized, output_specs, quantize_checkpoint, quantize_tensor
from toolcall.common.errors import CheckpointError, QuantizeError, Refusal
from toolcall.common.formats import BF16, FP8_E4M3, NVFP4, WEIGHT_FORMATS
from toolcall.common.fp8 import dequantize_fp8
from toolcall.common.nvfp4 import dequantize_nvfp4
from toolcall.runtime.bundle.model_config import ModelConfig
from toolcall.runtime.bundle.tensor_file import SafetensorsFile, write_tensors
from toolcall.runtime.cpu.dequant import load_dequantized

CONFIG = ModelConfig(family="qwen3", vocab_size=96, hidden_size=64, intermediate_size=96, num_layers=2,
                     num_heads=2, num_kv_heads=1, head_dim=32, rms_norm_eps=1e-6, rope_theta=1e4,
                     rope_scaling=None, max_position_embeddings=128, tie_word_embeddings=False,
                     qkv_bias=True, qk_norm=True, eos_token_ids=(1,))


class DictSource:
    """Stand-in for toolcall.builder.checkpoint.Checkpoint: read_f32 only, optionally slow, counting reads in flight."""

    def __init__(self, tensors: dict[str, np.ndarray], delay: float = 0.0):
        self.tensors, self.delay = tensors, delay
        self.lock = threading.Lock()
        self.in_flight = self.max_in_flight = 0

    def read_f32(self, name: str) -> np.ndarray:
        with self.lock:
            self.in_flight += 1
            self.max_in_flight = max(self.max_in_flight, self.in_flight)
        time.sleep(self.delay)
        return self.tensors[name].copy()

    def written(self, name: str, done: int, total: int) -> None:
        with self.lock:
            self.in_flight -= 1


def random_tensors(config: ModelConfig, seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: (rng.standard_normal(shape) * 0.05).astype(np.float32)
            for name, shape in config.tensor_shapes().items()}


def whole_model_file(path, tensors: dict[str, np.ndarray], precision: str) -> bytes:
    """The non-streaming result: every tensor quantized up front, written in one go."""
    out = {}
    for name, w in tensors.items():
        out.update(quantize_tensor(name, w, precision))
    write_tensors(path, out)
    return path.read_bytes()


@pytest.mark.parametrize("name, expected", [
    ("model.layers.0.self_attn.q_proj.weight", True), ("model.layers.12.self_attn.k_proj.weight", True),
    ("model.layers.3.self_attn.v_proj.weight", True), ("model.layers.3.self_attn.o_proj.weight", True),
    ("model.layers.27.mlp.gate_proj.weight", True), ("model.layers.1.mlp.up_proj.weight", True),
    ("model.layers.1.mlp.down_proj.weight", True),
    ("model.layers.0.self_attn.q_proj.bias", False), ("model.layers.0.self_attn.q_norm.weight", False),
    ("model.layers.0.input_layernorm.weight", False), ("model.layers.0.post_attention_layernorm.weight", False),
    ("model.embed_tokens.weight", False), ("lm_head.weight", False), ("model.norm.weight", False),
    ("model.mlp.down_proj.weight", False),  # outside model.layers.*
])
def test_is_quantized(name, expected):
    assert is_quantized(name, FP8_E4M3) is expected
    assert is_quantized(name, NVFP4) is expected
    assert is_quantized(name, BF16) is False


def test_output_specs_layout():
    fp8 = output_specs(CONFIG, "fp8_e4m3")
    nvfp4 = output_specs(CONFIG, "nvfp4")
    bf16 = output_specs(CONFIG, "bf16")
    assert bf16 == [(n, "BF16", s) for n, s in CONFIG.tensor_shapes().items()]
    p = "model.layers.1.mlp.down_proj.weight"
    i = [n for n, _, _ in fp8].index(p)
    assert fp8[i:i + 2] == [(p, "F8_E4M3", (64, 96)), (p + "_scale", "F32", (64,))]
    i = [n for n, _, _ in nvfp4].index(p)
    assert nvfp4[i:i + 3] == [(p, "U8", (64, 48)), (p + "_scale", "F8_E4M3", (64, 6)), (p + "_scale_2", "F32", ())]
    linear = 7 * CONFIG.num_layers
    assert len(fp8) == len(bf16) + linear and len(nvfp4) == len(bf16) + 2 * linear
    for specs in (fp8, nvfp4):
        high = [(n, d) for n, d, _ in specs if not is_quantized(n, NVFP4) and not n.endswith(("_scale", "_scale_2"))]
        assert high == [(n, "BF16") for n in CONFIG.tensor_shapes() if not is_quantized(n, NVFP4)]


def test_output_specs_rejects_unknown_precision_and_nvfp4_misfit():
    with pytest.raises(QuantizeError, match="expected one of fp8_e4m3, nvfp4, bf16"):
        output_specs(CONFIG, "int4")
    odd = ModelConfig(**{**CONFIG.to_dict(), "hidden_size": 40, "eos_token_ids": (1,)})
    with pytest.raises(QuantizeError) as err:
        output_specs(odd, "nvfp4")
    assert err.value.details["tensor"] == "model.layers.0.self_attn.q_proj.weight"
    assert len(output_specs(odd, "fp8_e4m3")) > 0


@pytest.mark.parametrize("precision", WEIGHT_FORMATS.bundle_names)
def test_streamed_file_equals_whole_model_result_for_any_worker_count(tmp_path, precision):
    tensors = random_tensors(CONFIG)
    expected = whole_model_file(tmp_path / "whole.safetensors", tensors, precision)
    for workers in (1, 3):
        out = tmp_path / f"stream{workers}.safetensors"
        quantize_checkpoint(DictSource(tensors), CONFIG, precision, out, workers=workers)
        assert out.read_bytes() == expected
    with SafetensorsFile(tmp_path / "stream1.safetensors") as f:
        assert [(i.name, i.dtype, i.shape) for i in f.tensors.values()] == output_specs(CONFIG, precision)


# per quantized format: its dequantizer on the quantizer's tensors {name: array}, and the bounds of the
# relative RMS error of random normal weights
DEQUANTIZED = {
    FP8_E4M3: (lambda q, n: dequantize_fp8(q[n], q[n + "_scale"]), (0.02, 0.032)),
    NVFP4: (lambda q, n: dequantize_nvfp4(q[n], q[n + "_scale"], q[n + "_scale_2"]), (0.08, 0.11)),
}


@pytest.mark.parametrize("fmt", list(DEQUANTIZED), ids=lambda f: f.name)
def test_load_dequantized_round_trip_and_report_errors(tmp_path, fmt):
    tensors = random_tensors(CONFIG, seed=1)
    report = quantize_checkpoint(DictSource(tensors), CONFIG, fmt.name, tmp_path / "w.safetensors")
    with SafetensorsFile(tmp_path / "w.safetensors") as f:
        loaded = load_dequantized(f)
    assert list(loaded) == list(CONFIG.tensor_shapes())
    by_name = {t.name: t for t in report.tensors}
    for name, w in tensors.items():
        assert loaded[name].dtype == np.float32 and loaded[name].shape == w.shape
        if not is_quantized(name, fmt):
            assert np.array_equal(loaded[name], w.astype(ml_dtypes.bfloat16).astype(np.float32))
            assert by_name[name].rel_rms is None and by_name[name].stored_as == BF16.name
            continue
        q = quantize_tensor(name, w, fmt.name)
        dequantize, (low, high) = DEQUANTIZED[fmt]
        assert np.array_equal(loaded[name], dequantize(q, name))
        err = loaded[name].astype(np.float64) - w
        assert by_name[name].rel_rms == pytest.approx(np.linalg.norm(err) / np.linalg.norm(w), rel=1e-5)
        assert by_name[name].max_abs_error == pytest.approx(np.abs(err).max(), rel=1e-6)
        assert low < by_name[name].rel_rms < high


def test_report_is_deterministic_apart_from_timings(tmp_path):
    tensors = random_tensors(CONFIG, seed=2)
    dicts = []
    for workers in (1, 2):
        report = quantize_checkpoint(DictSource(tensors), CONFIG, "nvfp4", tmp_path / f"{workers}.st", workers=workers)
        d = report.to_dict()
        assert set(d["timings"]) == {"seconds", "workers", "source_gb_per_s"} and d["timings"]["workers"] == workers
        del d["timings"]
        dicts.append(json.dumps(d, sort_keys=True))
        assert d["totals"]["params"] == CONFIG.param_count()
        assert d["totals"]["bytes_in"] == 4 * CONFIG.param_count()  # a read_f32-only source: float32 bytes
        assert d["totals"]["bytes_out"] == sum(t.nbytes for t in SafetensorsFile(tmp_path / f"{workers}.st").tensors.values())
        assert d["totals"]["quantized"] == 7 * CONFIG.num_layers
    assert dicts[0] == dicts[1]


@pytest.mark.parametrize("workers", [1, 2, 3])
def test_progress_order_and_at_most_workers_tensors_in_flight(tmp_path, workers):
    source = DictSource(random_tensors(CONFIG), delay=0.003)
    calls = []

    def progress(name, done, total):
        source.written(name, done, total)
        calls.append((name, done, total))

    quantize_checkpoint(source, CONFIG, "fp8_e4m3", tmp_path / "w.safetensors", workers=workers, progress=progress)
    names = list(CONFIG.tensor_shapes())
    assert calls == [(n, i + 1, len(names)) for i, n in enumerate(names)]
    assert source.max_in_flight == workers


@pytest.mark.parametrize("bad_name", ["model.layers.1.mlp.up_proj.weight", "model.layers.0.input_layernorm.weight"])
def test_nonfinite_source_tensor_is_an_error_and_leaves_no_file(tmp_path, bad_name):
    tensors = random_tensors(CONFIG)
    tensors[bad_name].reshape(-1)[5] = np.nan
    out = tmp_path / "w.safetensors"
    with pytest.raises(QuantizeError) as err:
        quantize_checkpoint(DictSource(tensors), CONFIG, "nvfp4", out)
    assert err.value.details["tensor"] == bad_name and bad_name in err.value.message
    assert not out.exists()


def test_source_shape_mismatch_is_a_checkpoint_error(tmp_path):
    tensors = random_tensors(CONFIG)
    tensors["model.layers.0.mlp.gate_proj.weight"] = np.zeros((96, 32), np.float32)
    with pytest.raises(CheckpointError) as err:
        quantize_checkpoint(DictSource(tensors), CONFIG, "fp8_e4m3", tmp_path / "w.safetensors")
    assert err.value.code == "tensor_invalid" and err.value.details["found"] == [96, 32]


@pytest.mark.parametrize("precision", WEIGHT_FORMATS.bundle_names)
def test_checkpoint_source_equals_float32_source(tmp_path, tiny_checkpoint, precision):
    # Checkpoint has read(): high-precision tensors are converted from the stored bf16 view
    ckpt = open_checkpoint(tiny_checkpoint)
    report = quantize_checkpoint(ckpt, ckpt.config, precision, tmp_path / "a.safetensors")
    as_f32 = DictSource({n: ckpt.read_f32(n) for n in ckpt.tensor_names()})
    quantize_checkpoint(as_f32, ckpt.config, precision, tmp_path / "b.safetensors")
    assert (tmp_path / "a.safetensors").read_bytes() == (tmp_path / "b.safetensors").read_bytes()
    assert report.bytes_in == ckpt.source_bytes()


@pytest.mark.parametrize("tensors, culprit", [
    ({"m.weight": np.zeros((4, 8), np.uint8), "m.weight_scale": np.zeros((4, 2), ml_dtypes.float8_e4m3fn),
      "m.weight_scale_2": np.float32(1.0).reshape(())}, "m.weight_scale"),           # 16 inputs: 1 block
    ({"m.weight": np.zeros((4, 16), np.float32), "m.weight_scale": np.ones(4, np.float32)}, "m.weight"),
    ({"m.weight": np.zeros((4, 16), ml_dtypes.float8_e4m3fn), "m.weight_scale": np.ones(3, np.float32)},
     "m.weight_scale"),
    ({"m.weight": np.zeros((4, 16), np.uint8)}, "m.weight"),                          # U8 without scales
])
def test_load_dequantized_refuses_inconsistent_tensors(tmp_path, tensors, culprit):
    write_tensors(tmp_path / "w.safetensors", tensors)
    with SafetensorsFile(tmp_path / "w.safetensors") as f, pytest.raises(Refusal) as err:
        load_dequantized(f, ["m.weight"])
    assert err.value.code == "bundle_invalid" and err.value.details["tensor"] == culprit



class _File:
    """A raw file whose write() is ``write(file, view)``: stands in for what a file system does."""

    def __init__(self, path, write):
        self.raw, self._write = open(path, "wb", buffering=0), write

    def write(self, data):
        return self._write(self.raw, memoryview(data).cast("B"))

    def close(self):
        self.raw.close()


def _writes_through(monkeypatch, write):
    import builtins

    import toolcall.runtime.bundle.tensor_file as tf
    monkeypatch.setattr(tf, "open", lambda path, mode="r", **kw: _File(path, write) if mode == "wb"
                        else builtins.open(path, mode, **kw), raising=False)


def test_writer_continues_short_writes_and_reads_its_file_back(tmp_path, monkeypatch):
    tensors = {"a": np.arange(1000, dtype=np.float32), "s": np.float32(3.5).reshape(()),
               "q": (np.arange(77, dtype=np.uint8) % 120).view(ml_dtypes.float8_e4m3fn)}
    write_tensors(tmp_path / "whole.safetensors", tensors, {"k": "v"})
    _writes_through(monkeypatch, lambda f, view: f.write(view[:1000]))  # at most 1000 bytes a call
    write_tensors(tmp_path / "short.safetensors", tensors, {"k": "v"})
    assert (tmp_path / "short.safetensors").read_bytes() == (tmp_path / "whole.safetensors").read_bytes()
    with SafetensorsFile(tmp_path / "short.safetensors") as f:
        assert f.get("s") == np.float32(3.5) and np.array_equal(f.get("a"), tensors["a"])


def test_writer_refuses_a_file_that_reads_back_differently(tmp_path, monkeypatch):
    """Zeros where the header's padding was written (an H200 machine's failure) raise, naming the byte."""
    calls = []

    def write(f, view):  # the header (first call) loses its last 4 bytes; the file position still advances
        calls.append(len(view))
        if len(calls) == 1:
            f.write(view[:-4])
            f.seek(4, 1)
            return len(view)
        return f.write(view)
    _writes_through(monkeypatch, write)
    with pytest.raises(OSError, match="reads back differently") as e:
        write_tensors(tmp_path / "bad.safetensors", {"a": np.arange(10, dtype=np.float32)}, {"k": "v"})
    assert e.value.errno == 5 and "header byte" in str(e.value) and "differs" in str(e.value)
    assert not (tmp_path / "bad.safetensors").exists()  # removed, not left at its name
