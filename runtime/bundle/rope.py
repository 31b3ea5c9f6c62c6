"""Rotary position embedding (rotate-half convention), with Llama-3 frequency scaling."""
from __future__ import annotations

import numpy as np

from toolcall.runtime.bundle.model_config import ModelConfig


def inv_freq(cfg: ModelConfig) -> np.ndarray:
    """(head_dim/2,) float32 inverse frequencies, scaled as the config's rope_scaling asks."""
    d = cfg.head_dim
    freq = 1.0 / (cfg.rope_theta ** (np.arange(0, d, 2, dtype=np.float64) / d))
    s = cfg.rope_scaling
    if s is not None:  # llama3: long wavelengths slowed by `factor`, a smooth ramp between the two bands
        low_wavelen = s.original_max_position_embeddings / s.low_freq_factor
        high_wavelen = s.original_max_position_embeddings / s.high_freq_factor
        wavelen = 2 * np.pi / freq
        scaled = np.where(wavelen > low_wavelen, freq / s.factor, freq)
        smooth = (s.original_max_position_embeddings / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor)
        smoothed = (1 - smooth) * scaled / s.factor + smooth * scaled
        medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
        freq = np.where(medium, smoothed, scaled)
    return freq.astype(np.float32)


def cos_sin(freqs: np.ndarray, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(T, head_dim) float32 cos and sin for integer positions (T,); angles in float32 as HF does."""
    angles = positions.astype(np.float32)[:, None] * freqs[None, :]
    angles = np.concatenate([angles, angles], axis=-1)
    return np.cos(angles), np.sin(angles)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """x (T, heads, head_dim) → x·cos + rotate_half(x)·sin, rotate_half(x) = (-x2, x1)."""
    half = x.shape[-1] // 2
    rotated = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    return x * cos[:, None, :] + rotated * sin[:, None, :]
