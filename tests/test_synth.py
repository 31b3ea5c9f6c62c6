"""Synthetic checkpoints: deterministic bytes, loadable layout, activations in a realistic range."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest

from toolcall.builder.checkpoint import open_checkpoint
from toolcall.builder.synth import SynthOptions, synth_checkpoint
from toolcall.common.formats import KV_FP32
from toolcall.runtime.cpu.kv_pool import PagedKVPool
from toolcall.runtime.cpu.model import CpuModel


def folder_digest(folder) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def test_same_seed_same_bytes_other_seed_other_weights(tmp_path):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    synth_checkpoint(a, SynthOptions(seed=3))
    synth_checkpoint(b, SynthOptions(seed=3))
    synth_checkpoint(c, SynthOptions(seed=4))
    assert folder_digest(a) == folder_digest(b)
    assert folder_digest(a)["model.safetensors"] != folder_digest(c)["model.safetensors"]


def test_sharded_checkpoint_reads_like_single_file(tmp_path, tiny_checkpoint):
    synth_checkpoint(tmp_path, SynthOptions(shards=3))
    assert (tmp_path / "model.safetensors.index.json").is_file()
    sharded, single = open_checkpoint(tmp_path), open_checkpoint(tiny_checkpoint)
    assert sharded.config == single.config
    assert len(set(sharded.files.values())) == 3
    for name in single.tensor_names():
        assert np.array_equal(sharded.read_f32(name), single.read_f32(name)), name


def residual_rms(folder, prompt_len: int = 32) -> tuple[list[float], np.ndarray]:
    ckpt = open_checkpoint(folder)
    model = CpuModel(ckpt.config, ckpt.weights_f32())
    pool = PagedKVPool(ckpt.config, 2, 32, 1, 64, KV_FP32)
    slot = pool.admit(prompt_len)
    trace: list[float] = []
    tokens = np.random.default_rng(0).integers(3, 3000, prompt_len)
    hidden = model.forward(tokens, np.full(prompt_len, slot), np.arange(prompt_len), pool, trace=trace)
    return trace, model.dense_logits(hidden)


def assert_realistic(trace: list[float], logits: np.ndarray) -> None:
    assert np.isfinite(logits).all()
    assert all(0.1 < r < 20 for r in trace), trace  # residual stream neither vanishes nor blows up
    assert 0.5 < logits.std() < 10  # a peaked but not saturated softmax
    top = np.sort(logits, axis=-1)
    assert (top[:, -1] - top[:, -2] > 1e-4).mean() > 0.9  # greedy choices are not ties


@pytest.mark.parametrize("family", ["qwen3", "qwen2", "llama"])
def test_tiny_activations_in_range(make_checkpoint, family):
    assert_realistic(*residual_rms(make_checkpoint(family=family)))


@pytest.mark.slow
def test_qwen3_0_6b_shape_activations_in_range(tmp_path):
    cfg = synth_checkpoint(tmp_path, SynthOptions(shape="qwen3-0.6b"))
    assert (cfg.hidden_size, cfg.num_layers, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim) == (1024, 28, 16, 8, 128)
    assert (cfg.intermediate_size, cfg.vocab_size, cfg.rope_theta) == (3072, 151936, 1e6)
    trace, logits = residual_rms(tmp_path, prompt_len=8)
    assert len(trace) == 28
    assert_realistic(trace, logits)
