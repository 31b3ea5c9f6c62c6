"""Hugging Face checkpoint folders: config.json → ModelConfig, safetensors → lazy tensors.

A ``Checkpoint`` memory-maps every safetensors file and hands out one tensor at a time, so
the model is never held in memory twice. Every problem is a CheckpointError naming the
file or tensor, what was expected and what was found.
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path

import numpy as np

from common.errors import CheckpointError
from runtime.model_config import FAMILIES, ModelConfig, RopeScaling
from runtime.tensor_file import SafetensorsFile

SOURCE_DTYPES = ("BF16", "F16", "F32")


def _read_json(path: Path, required: bool = True) -> dict | None:
    if not path.is_file():
        if required:
            raise CheckpointError("checkpoint_invalid", f"{path}: missing; a checkpoint folder needs it",
                                  file=str(path))
        return None
    try:
        return json.loads(path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise CheckpointError("checkpoint_invalid", f"{path}: not valid JSON ({e})", file=str(path)) from None


def _eos_ids(folder: Path, cfg_json: dict) -> tuple[int, ...]:
    gen = _read_json(folder / "generation_config.json", required=False) or {}
    eos = gen.get("eos_token_id", cfg_json.get("eos_token_id"))
    if eos is None:  # fall back to the tokenizer's eos_token, looked up in the tokenizer
        tok_cfg = _read_json(folder / "tokenizer_config.json", required=False) or {}
        name = tok_cfg.get("eos_token")
        name = name.get("content") if isinstance(name, dict) else name
        if name:
            from tokenizers import Tokenizer
            eos = Tokenizer.from_file(str(folder / "tokenizer.json")).token_to_id(name)
    if eos is None:
        raise CheckpointError("checkpoint_invalid", f"{folder}: no EOS token id in generation_config.json, "
                              "config.json or tokenizer_config.json; add eos_token_id", file=str(folder))
    return tuple(int(e) for e in (eos if isinstance(eos, list) else [eos]))


def parse_config(folder: Path) -> ModelConfig:
    """The ModelConfig of a checkpoint folder (config.json plus EOS from the generation config)."""
    path = folder / "config.json"
    c = _read_json(path)
    family = c.get("model_type")
    if family not in FAMILIES:
        raise CheckpointError("checkpoint_invalid", f"{path}: model_type {family!r} is not supported; "
                              f"expected one of {', '.join(FAMILIES)}", file=str(path), found=family)
    if c.get("mlp_bias"):
        raise CheckpointError("checkpoint_invalid", f"{path}: mlp_bias=true is not supported", file=str(path))
    try:
        rope = c.get("rope_parameters") or {}
        scaling = c.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
        rope_scaling = None
        if scaling:
            kind = scaling.get("rope_type", scaling.get("type"))
            if kind != "llama3":
                raise CheckpointError("checkpoint_invalid", f"{path}: rope_scaling type {kind!r} is not supported; "
                                      "expected llama3 or none", file=str(path), found=kind)
            rope_scaling = RopeScaling(float(scaling["factor"]), float(scaling["low_freq_factor"]),
                                       float(scaling["high_freq_factor"]),
                                       int(scaling["original_max_position_embeddings"]))
        heads = int(c["num_attention_heads"])
        return ModelConfig(
            family=family, vocab_size=int(c["vocab_size"]), hidden_size=int(c["hidden_size"]),
            intermediate_size=int(c["intermediate_size"]), num_layers=int(c["num_hidden_layers"]),
            num_heads=heads, num_kv_heads=int(c.get("num_key_value_heads", heads)),
            head_dim=int(c.get("head_dim") or c["hidden_size"] // heads),
            rms_norm_eps=float(c.get("rms_norm_eps", 1e-6)),
            rope_theta=float(c.get("rope_theta", rope.get("rope_theta", 10000.0))),
            rope_scaling=rope_scaling, max_position_embeddings=int(c.get("max_position_embeddings", 32768)),
            tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
            qkv_bias=True if family == "qwen2" else bool(c.get("attention_bias", False)),
            qk_norm=family == "qwen3", eos_token_ids=_eos_ids(folder, c))
    except KeyError as e:
        raise CheckpointError("checkpoint_invalid", f"{path}: missing field {e.args[0]!r}", file=str(path),
                              field=e.args[0]) from None


class Checkpoint:
    """An opened checkpoint folder: ``config``, ``tensor_names()``, ``read``/``read_f32`` one tensor."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise CheckpointError("checkpoint_invalid", f"{self.folder}: not a folder; expected a Hugging Face "
                                  "checkpoint folder with config.json, *.safetensors and tokenizer.json",
                                  file=str(self.folder))
        if not (self.folder / "tokenizer.json").is_file():
            raise CheckpointError("checkpoint_invalid", f"{self.folder / 'tokenizer.json'}: missing",
                                  file=str(self.folder / "tokenizer.json"))
        self.config = parse_config(self.folder)
        self.files = self._tensor_files()
        self._open = {f: SafetensorsFile(self.folder / f) for f in sorted(set(self.files.values()))}
        self._check_tensors()

    def _tensor_files(self) -> dict[str, str]:
        index = self.folder / "model.safetensors.index.json"
        if index.is_file():
            weight_map = (_read_json(index) or {}).get("weight_map")
            if not isinstance(weight_map, dict):
                raise CheckpointError("checkpoint_invalid", f"{index}: no weight_map", file=str(index))
            for f in set(weight_map.values()):
                if not (self.folder / f).is_file():
                    raise CheckpointError("checkpoint_invalid", f"{self.folder / f}: listed in {index.name} but missing",
                                          file=str(self.folder / f))
            return dict(weight_map)
        shards = sorted(p.name for p in self.folder.glob("*.safetensors"))
        if not shards:
            raise CheckpointError("checkpoint_invalid", f"{self.folder}: no *.safetensors file",
                                  file=str(self.folder))
        mapping = {}
        for f in shards:
            for name in SafetensorsFile(self.folder / f).names():
                mapping[name] = f
        return mapping

    def _check_tensors(self) -> None:
        for name, shape in self.config.tensor_shapes().items():
            f = self.files.get(name)
            info = self._open[f].tensors.get(name) if f else None
            if info is None:
                raise CheckpointError("tensor_invalid", f"{self.folder}: tensor {name!r} is missing; the config "
                                      f"({self.config.family}, {self.config.num_layers} layers) needs it",
                                      file=str(self.folder / (f or "")), tensor=name)
            if info.shape != shape:
                raise CheckpointError("tensor_invalid", f"{self.folder / f}: tensor {name!r} has shape "
                                      f"{list(info.shape)}, config.json implies {list(shape)}",
                                      file=str(self.folder / f), tensor=name, expected=list(shape),
                                      found=list(info.shape))
            if info.dtype not in SOURCE_DTYPES:
                raise CheckpointError("tensor_invalid", f"{self.folder / f}: tensor {name!r} is {info.dtype}; "
                                      f"expected one of {', '.join(SOURCE_DTYPES)}", file=str(self.folder / f),
                                      tensor=name, found=info.dtype)

    def tensor_names(self) -> list[str]:
        """The model's tensors in a fixed order (ModelConfig.tensor_shapes); extras are ignored."""
        return list(self.config.tensor_shapes())

    def read(self, name: str) -> np.ndarray:
        """Zero-copy view in the source dtype."""
        return self._open[self.files[name]].get(name)

    def read_f32(self, name: str) -> np.ndarray:
        """The tensor as float32; NaN or Inf is an error naming the tensor."""
        out = self.read(name).astype(np.float32)
        if not np.isfinite(out).all():
            bad = int((~np.isfinite(out)).sum())
            raise CheckpointError("tensor_invalid", f"{self.folder / self.files[name]}: tensor {name!r} has {bad} "
                                  "NaN/Inf values; fix or re-export the checkpoint", file=str(self.files[name]),
                                  tensor=name, nonfinite=bad)
        return out

    def source_bytes(self) -> int:
        return sum(self._open[self.files[n]].tensors[n].nbytes for n in self.tensor_names())

    def sha256(self) -> str:
        """Hash over config.json, tokenizer.json and the model's tensor files (names and bytes)."""
        h = hashlib.sha256()
        for f in ["config.json", "tokenizer.json", *sorted(self._open)]:
            h.update(f.encode() + b"\0")
            with open(self.folder / f, "rb") as fh:
                while chunk := fh.read(1 << 24):
                    h.update(chunk)
        return h.hexdigest()

    def release_maps(self) -> None:
        """Unmaps the tensor files (their pages leave the process's RSS); names, shapes and sha256 stay available."""
        for f in self._open.values():
            f.close()

    def weights_f32(self) -> dict[str, np.ndarray]:
        """Every model tensor as float32 (unquantized reference runs and tests)."""
        return {n: self.read_f32(n) for n in self.tensor_names()}


def open_checkpoint(folder: str | Path) -> Checkpoint:
    """Opens and validates a checkpoint folder (config, tensor names, shapes and dtypes)."""
    return Checkpoint(folder)
