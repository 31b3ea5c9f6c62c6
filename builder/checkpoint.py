"""Hugging Face checkpoint folders: config.json → ModelConfig, safetensors → lazy tensors.

A ``Checkpoint`` memory-maps every safetensors file and hands out one tensor at a time, so
the model is never held in memory twice. Every problem is a CheckpointError naming the
file or tensor, what was expected and what was found.
"""
from __future__ import annotations

import hashlib
import json
import math
from pathlib import Path

import numpy as np

from toolcall.common.errors import CheckpointError
from toolcall.runtime.bundle.file_kind import path_kind, require_file
from toolcall.runtime.bundle.families import FAMILY_NAMES, family as family_named
from toolcall.runtime.bundle.model_config import ModelConfig, RopeScaling
from toolcall.runtime.bundle.tensor_file import SafetensorsFile

SOURCE_DTYPES = ("BF16", "F16", "F32")


# Bounds on config numbers, checked before anything is sized from them: far above any model this
# toolchain targets (Qwen3-0.6B: 28 layers, hidden 1024, vocab 151936), far below what would
# exhaust memory when a tensor list or plan is built from them.
MAX_LAYERS = 1024
MAX_DIM = 1 << 17  # hidden, intermediate, head_dim
MAX_HEADS = 1024
MAX_VOCAB = 1 << 22
MAX_POSITIONS = 1 << 24
MAX_PARAMETERS = 100_000_000_000  # 100 B parameters (200 GB in bf16): refused above


def _error(message: str, **details) -> CheckpointError:
    return CheckpointError("checkpoint_invalid", message, **details)


def _read_json(path: Path, required: bool = True) -> dict | None:
    """A JSON object file of the checkpoint; None when optional and absent. Everything else typed."""
    if not required and path_kind(path) in ("missing", "broken symlink"):
        return None
    require_file(path, _error, "a JSON file of the checkpoint")
    try:
        doc = json.loads(path.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise _error(f"{path}: not valid JSON ({e})", file=str(path)) from None
    except RecursionError:
        raise _error(f"{path}: JSON nested too deeply", file=str(path)) from None
    except OSError as e:
        raise _error(f"{path}: cannot read ({e.strerror})", file=str(path)) from None
    if not isinstance(doc, dict):
        raise _error(f"{path}: a JSON {type(doc).__name__}, expected an object", file=str(path),
                     found=type(doc).__name__)
    return doc


_MISSING = object()


class _Fields:
    """Typed reads of one JSON object's fields: a wrong type or range is a CheckpointError naming
    the file, the field, what was expected and what was found (never int() of a string or float)."""

    def __init__(self, doc: dict, path: Path, prefix: str = ""):
        self.doc, self.path, self.prefix = doc, path, prefix

    def _bad(self, key: str, expected: str, value) -> CheckpointError:
        return _error(f"{self.path}: {self.prefix}{key} = {json.dumps(value)[:80]}; expected {expected}",
                      file=str(self.path), field=self.prefix + key, expected=expected, found=repr(value)[:80])

    def get(self, key: str, default=_MISSING):
        value = self.doc.get(key, default)
        if value is _MISSING:
            raise _error(f"{self.path}: missing field {self.prefix + key!r}", file=str(self.path),
                         field=self.prefix + key)
        return value

    def int(self, key: str, lo: int, hi: int, default=_MISSING):
        value = self.get(key, default)
        if type(value) is not int or not lo <= value <= hi:
            raise self._bad(key, f"an integer in [{lo}, {hi}]", value)
        return value

    def float(self, key: str, default=_MISSING, positive: bool = True):
        value = self.get(key, default)
        if type(value) not in (int, float) or not math.isfinite(value) or (positive and value <= 0):
            raise self._bad(key, "a finite number" + (" > 0" if positive else ""), value)
        return float(value)

    def bool(self, key: str, default=_MISSING):
        value = self.get(key, default)
        if type(value) is not bool:
            raise self._bad(key, "true or false", value)
        return value


def parameter_count(vocab: int, hidden: int, intermediate: int, layers: int, q_dim: int, kv_dim: int,
                    tied: bool) -> int:
    """Parameters of the model, by arithmetic alone (no tensor list: layers may be absurd)."""
    per_layer = 2 * hidden + hidden * q_dim + 2 * hidden * kv_dim + q_dim * hidden + 3 * hidden * intermediate
    return vocab * hidden * (1 if tied else 2) + layers * per_layer + hidden


def _eos_ids(folder: Path, cfg_json: dict, vocab: int) -> tuple[int, ...]:
    gen = _read_json(folder / "generation_config.json", required=False) or {}
    source, eos = ("generation_config.json", gen["eos_token_id"]) if gen.get("eos_token_id") is not None else \
        ("config.json", cfg_json.get("eos_token_id"))
    if eos is None:  # fall back to the tokenizer's eos_token, looked up in the tokenizer
        tok_cfg = _read_json(folder / "tokenizer_config.json", required=False) or {}
        name = tok_cfg.get("eos_token")
        name = name.get("content") if isinstance(name, dict) else name
        if isinstance(name, str) and name:
            source, eos = "tokenizer_config.json", load_tokenizer(folder / "tokenizer.json").token_to_id(name)
    if eos is None:
        raise _error(f"{folder}: no EOS token id in generation_config.json, config.json or tokenizer_config.json; "
                     "add eos_token_id", file=str(folder))
    ids = eos if isinstance(eos, list) else [eos]
    if not ids or not all(type(e) is int and 0 <= e < vocab for e in ids):
        raise _error(f"{folder / source}: eos_token_id = {json.dumps(eos)[:80]}; expected a token id or a non-empty "
                     f"list of token ids in [0, {vocab})", file=str(folder / source), field="eos_token_id",
                     found=repr(eos)[:80])
    return tuple(ids)


def load_tokenizer(path: Path):
    """The checkpoint's tokenizers.Tokenizer; a missing, odd or unparsable file is checkpoint_invalid."""
    from tokenizers import Tokenizer

    require_file(path, _error, "the checkpoint's tokenizer.json")
    try:
        return Tokenizer.from_str(path.read_bytes().decode("utf-8"))
    except Exception as e:  # tokenizers raises plain Exception subclasses for any malformed file
        raise _error(f"{path}: not a tokenizer file the tokenizers library reads ({type(e).__name__}: "
                     f"{str(e)[:200]}); copy the checkpoint's tokenizer.json again", file=str(path),
                     reason=type(e).__name__) from None


def parse_config(folder: Path) -> ModelConfig:
    """The ModelConfig of a checkpoint folder (config.json plus EOS from the generation config).

    Every field is type- and range-checked (module bounds), and the parameter count is bounded
    before anything is sized from it."""
    path = folder / "config.json"
    c = _read_json(path)
    f = _Fields(c, path)
    model_type = c.get("model_type")
    if not isinstance(model_type, str) or model_type not in FAMILY_NAMES:
        raise _error(f"{path}: model_type {model_type!r} is not supported; expected one of {', '.join(FAMILY_NAMES)}",
                     file=str(path), found=repr(model_type)[:80])
    fam = family_named(model_type)
    if f.bool("mlp_bias", False):
        raise _error(f"{path}: mlp_bias=true is not supported", file=str(path))
    rope = c.get("rope_parameters") or {}
    if not isinstance(rope, dict):
        raise f._bad("rope_parameters", "an object", rope)
    scaling = c.get("rope_scaling") or (rope if rope.get("rope_type", "default") != "default" else None)
    rope_scaling = None
    if scaling:
        if not isinstance(scaling, dict):
            raise f._bad("rope_scaling", "an object or null", scaling)
        kind = scaling.get("rope_type", scaling.get("type"))
        if kind != "llama3":
            raise _error(f"{path}: rope_scaling type {kind!r} is not supported; expected llama3 or none",
                         file=str(path), found=repr(kind)[:80])
        s = _Fields(scaling, path, "rope_scaling.")
        rope_scaling = RopeScaling(s.float("factor"), s.float("low_freq_factor"), s.float("high_freq_factor"),
                                   s.int("original_max_position_embeddings", 1, MAX_POSITIONS))
    hidden = f.int("hidden_size", 1, MAX_DIM)
    heads = f.int("num_attention_heads", 1, MAX_HEADS)
    kv_heads = f.int("num_key_value_heads", 1, MAX_HEADS, heads)
    if heads % kv_heads:
        raise _error(f"{path}: num_attention_heads {heads} is not a multiple of num_key_value_heads {kv_heads}; "
                     "expected whole groups of query heads per KV head",
                     file=str(path), found=[heads, kv_heads])
    head_dim = c.get("head_dim")
    if head_dim is None:
        if hidden % heads:
            raise _error(f"{path}: no head_dim and hidden_size {hidden} is not a multiple of num_attention_heads "
                         f"{heads}; expected head_dim or divisible sizes", file=str(path), found=[hidden, heads])
        head_dim = hidden // heads
    else:
        head_dim = f.int("head_dim", 2, MAX_DIM)
    if head_dim % 2:
        raise f._bad("head_dim", "an even number (rotary embeddings rotate pairs)", head_dim)
    vocab = f.int("vocab_size", 2, MAX_VOCAB)
    intermediate = f.int("intermediate_size", 1, MAX_DIM)
    layers = f.int("num_hidden_layers", 1, MAX_LAYERS)
    tied = f.bool("tie_word_embeddings", fam.default_tied)
    params = parameter_count(vocab, hidden, intermediate, layers, heads * head_dim, kv_heads * head_dim, tied)
    if params > MAX_PARAMETERS:
        raise _error(f"{path}: the config describes {params:,} parameters; expected at most {MAX_PARAMETERS:,} "
                     "(refused before anything is sized from it): check the sizes", file=str(path), found=params,
                     limit=MAX_PARAMETERS)
    theta_default = rope.get("rope_theta", fam.default_rope_theta)
    theta = f.float("rope_theta", theta_default)
    if theta < 1.0:  # frequencies theta^(-2i/d) above 1 overflow float32 long before theta reaches 0
        raise f._bad("rope_theta", "a number >= 1 (rotary frequencies theta^(-2i/head_dim) must stay finite)",
                     theta)
    return ModelConfig(
        family=fam.name, vocab_size=vocab, hidden_size=hidden, intermediate_size=intermediate, num_layers=layers,
        num_heads=heads, num_kv_heads=kv_heads, head_dim=head_dim,
        rms_norm_eps=f.float("rms_norm_eps", 1e-6), rope_theta=theta,
        rope_scaling=rope_scaling, max_position_embeddings=f.int("max_position_embeddings", 1, MAX_POSITIONS, 32768),
        tie_word_embeddings=tied,
        qkv_bias=fam.has_qkv_bias(f.bool("attention_bias", False)),
        qk_norm=fam.qk_norm, eos_token_ids=_eos_ids(folder, c, vocab))


class Checkpoint:
    """An opened checkpoint folder: ``config``, ``tensor_names()``, ``read``/``read_f32`` one tensor."""

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        if not self.folder.is_dir():
            raise CheckpointError("checkpoint_invalid", f"{self.folder}: not a folder; expected a Hugging Face "
                                  "checkpoint folder with config.json, *.safetensors and tokenizer.json",
                                  file=str(self.folder))
        require_file(self.folder / "tokenizer.json", _error, "the checkpoint's tokenizer.json")
        self.config = parse_config(self.folder)
        self.files = self._tensor_files()
        self._open = {f: SafetensorsFile(self.folder / f) for f in sorted(set(self.files.values()))}
        self._check_tensors()

    def _tensor_files(self) -> dict[str, str]:
        index = self.folder / "model.safetensors.index.json"
        if path_kind(index) not in ("missing", "broken symlink"):
            weight_map = (_read_json(index) or {}).get("weight_map")
            if not isinstance(weight_map, dict):
                raise CheckpointError("checkpoint_invalid", f"{index}: no weight_map", file=str(index))
            if not all(isinstance(k, str) and isinstance(f, str) and "/" not in f and f not in ("", ".", "..")
                       for k, f in weight_map.items()):
                raise CheckpointError("checkpoint_invalid", f"{index}: weight_map must map tensor names to file "
                                      "names in the checkpoint folder", file=str(index))
            for f in sorted(set(weight_map.values())):
                require_file(self.folder / f, _error, f"a tensor file listed in {index.name}")
            return dict(weight_map)
        shards = sorted(p.name for p in self.folder.glob("*.safetensors"))
        if not shards:
            raise CheckpointError("checkpoint_invalid", f"{self.folder}: no *.safetensors file",
                                  file=str(self.folder))
        mapping = {}
        for f in shards:
            with SafetensorsFile(self.folder / f) as st:
                for name in st.names():
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

    def tokenizer(self):
        """The checkpoint's tokenizer; its vocabulary must fit the model's (checkpoint_invalid if not)."""
        tok = load_tokenizer(self.folder / "tokenizer.json")
        n = tok.get_vocab_size(with_added_tokens=True)
        if n > self.config.vocab_size:
            raise _error(f"{self.folder / 'tokenizer.json'}: {n} tokens, more than the model's vocab_size "
                         f"{self.config.vocab_size}: the tokenizer belongs to another model",
                         file=str(self.folder / "tokenizer.json"), expected=self.config.vocab_size, found=n)
        return tok

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
