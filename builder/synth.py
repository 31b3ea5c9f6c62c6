"""Synthetic Hugging Face checkpoints: real architecture, scaled random weights, a trained tokenizer.

``synth_checkpoint`` writes config.json, generation_config.json, tokenizer.json,
tokenizer_config.json and safetensors (one file or sharded with an index), tensor by
tensor, deterministic from the seed. Weight scales keep activations O(1) through every
layer: input-side projections ~ N(0, 1/in), output-side ones further divided by
sqrt(2·layers) (residual scaling), embeddings ~ N(0, 4/hidden) so tied-head logits have std ~2.
"""
from __future__ import annotations

import errno
import json
import os
import shutil
import zlib
from dataclasses import dataclass
from pathlib import Path

import ml_dtypes
import numpy as np

from toolcall.builder.synth_tokenizer import END_OF_TURN, SPECIAL_TOKENS, train_tokenizer
from toolcall.common.errors import BuildError
from toolcall.runtime.bundle.file_kind import path_kind
from toolcall.runtime.bundle.families import FAMILY_NAMES, family
from toolcall.runtime.bundle.model_config import ModelConfig, RopeScaling
from toolcall.runtime.bundle.tensor_file import SafetensorsWriter

SHAPES = ("tiny", "qwen3-0.6b")
# a checkpoint's element type, by its Hugging Face config name (torch_dtype) -> (safetensors dtype, numpy dtype)
_DTYPES = {"bfloat16": ("BF16", ml_dtypes.bfloat16), "float16": ("F16", np.float16), "float32": ("F32", np.float32)}
# the rotary scaling of a family's synthetic checkpoints (runtime/bundle/families.py ``rope_scaling``)
LLAMA3_SCALING = RopeScaling(factor=8.0, low_freq_factor=1.0, high_freq_factor=4.0,
                             original_max_position_embeddings=8192)


@dataclass(frozen=True)
class SynthOptions:
    shape: str = "tiny"
    family: str = "qwen3"
    seed: int = 0
    num_kv_heads: int | None = None  # None: the shape's default
    num_layers: int | None = None  # None: the shape's default (a real shape cut to a few layers: the same kernels)
    tie_word_embeddings: bool | None = None
    dtype: str = "bfloat16"  # a key of _DTYPES
    shards: int = 1


def model_config_for(opts: SynthOptions, tokenizer_vocab: int) -> ModelConfig:
    """The architecture a synthetic checkpoint gets for these options."""
    if opts.shape == "tiny":
        vocab = -(-tokenizer_vocab // 64) * 64
        # head_dim 64: the smallest the GPU attention kernels take, so tiny bundles run there too
        cfg = dict(vocab_size=vocab, hidden_size=64, intermediate_size=128, num_layers=2, num_heads=4,
                   num_kv_heads=2, head_dim=64, max_position_embeddings=2048, rope_theta=10000.0,
                   tie_word_embeddings=True)
    elif opts.shape == "qwen3-0.6b":
        cfg = dict(vocab_size=151936, hidden_size=1024, intermediate_size=3072, num_layers=28, num_heads=16,
                   num_kv_heads=8, head_dim=128, max_position_embeddings=40960, rope_theta=1_000_000.0,
                   tie_word_embeddings=True)
    else:
        raise ValueError(f"unknown shape {opts.shape!r}; expected one of {SHAPES}")
    if opts.num_kv_heads is not None:
        cfg["num_kv_heads"] = opts.num_kv_heads
    if opts.num_layers is not None:
        cfg["num_layers"] = opts.num_layers
    if opts.tie_word_embeddings is not None:
        cfg["tie_word_embeddings"] = opts.tie_word_embeddings
    fam = family(opts.family)
    if fam.head_dim_from_heads:
        cfg["head_dim"] = cfg["hidden_size"] // cfg["num_heads"]
    return ModelConfig(
        family=fam.name, rms_norm_eps=1e-6,
        rope_scaling={None: None, "llama3": LLAMA3_SCALING}[fam.rope_scaling],
        qkv_bias=fam.has_qkv_bias(False), qk_norm=fam.qk_norm,
        eos_token_ids=(SPECIAL_TOKENS.index(END_OF_TURN), 0), **cfg)


def hf_config_json(cfg: ModelConfig, dtype: str) -> dict:
    """config.json as transformers writes it for this family."""
    fam = family(cfg.family)
    d = {
        "architectures": [fam.architecture], "model_type": fam.name, "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size, "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_layers, "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads, "head_dim": cfg.head_dim, "hidden_act": "silu",
        "max_position_embeddings": cfg.max_position_embeddings, "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta, "tie_word_embeddings": cfg.tie_word_embeddings,
        "torch_dtype": dtype, "bos_token_id": 0, "eos_token_id": cfg.eos_token_ids[0],
        "attention_dropout": 0.0, "initializer_range": 0.02, "use_cache": True,
    }
    d.update(fam.hf_keys)
    if cfg.rope_scaling is not None:
        d["rope_scaling"] = {"rope_type": fam.rope_scaling, **vars(cfg.rope_scaling)}
    return d


def _random_tensor(cfg: ModelConfig, seed: int, name: str, shape: tuple[int, ...]) -> np.ndarray:
    rng = np.random.default_rng([seed, zlib.crc32(name.encode())])
    if name.endswith("norm.weight"):
        return (1.0 + 0.1 * rng.standard_normal(shape, dtype=np.float32)).astype(np.float32)
    if name.endswith(".bias"):
        return 0.1 * rng.standard_normal(shape, dtype=np.float32)
    if "embed_tokens" in name or name == "lm_head.weight":
        std = 2.0 / np.sqrt(cfg.hidden_size)
    else:
        std = 1.0 / np.sqrt(shape[1])
        if name.endswith(("o_proj.weight", "down_proj.weight")):
            std /= np.sqrt(2 * cfg.num_layers)
    out = rng.standard_normal(shape, dtype=np.float32)
    out *= np.float32(std)
    return out


def _shard_plan(names: list[str], shards: int) -> list[list[str]]:
    per = -(-len(names) // shards)
    return [names[i * per:(i + 1) * per] for i in range(shards) if names[i * per:(i + 1) * per]]


def check_options(opts: SynthOptions) -> None:
    """BuildError("usage") for options no checkpoint can be made from; runs before anything is written."""
    def bad(option: str, expected: str, found) -> BuildError:
        return BuildError("usage", f"--{option.replace('_', '-')} {found!r}: expected {expected}", option=option,
                          expected=expected, found=repr(found))
    if opts.shape not in SHAPES:
        raise bad("shape", f"one of {', '.join(SHAPES)}", opts.shape)
    if opts.family not in FAMILY_NAMES:
        raise bad("family", f"one of {', '.join(FAMILY_NAMES)}", opts.family)
    if opts.dtype not in _DTYPES:
        raise bad("dtype", f"one of {', '.join(_DTYPES)}", opts.dtype)
    if type(opts.shards) is not int or opts.shards < 1:
        raise bad("shards", "an integer >= 1", opts.shards)
    if type(opts.seed) is not int or opts.seed < 0:
        raise bad("seed", "an integer >= 0", opts.seed)
    if opts.num_kv_heads is not None and (type(opts.num_kv_heads) is not int or opts.num_kv_heads < 1):
        raise bad("num_kv_heads", "an integer >= 1", opts.num_kv_heads)
    if opts.num_layers is not None and (type(opts.num_layers) is not int or opts.num_layers < 1):
        raise bad("layers", "an integer >= 1", opts.num_layers)


def synth_checkpoint(out_dir: str | Path, opts: SynthOptions = SynthOptions(), progress=None,
                     force: bool = False) -> ModelConfig:
    """Writes a synthetic checkpoint folder; returns its ModelConfig. ``progress(name, done, total)``.

    Options are checked first; an existing non-empty ``out_dir`` is refused (output_exists) unless
    ``force``. The folder is written beside ``out_dir`` and renamed into place when complete, so a
    failure (a full disk too: output_unwritable) leaves nothing behind and an old folder intact."""
    check_options(opts)
    out = Path(out_dir)
    kind = path_kind(out)
    if kind not in ("missing", "folder"):
        raise BuildError("output_exists", f"--out {out} is {kind}, not a folder: choose another --out",
                         path=str(out), kind=kind)
    if kind == "folder" and any(out.iterdir()) and not force:
        raise BuildError("output_exists", f"--out {out} exists and is not empty; pass --force to replace it or "
                         "choose another --out", path=str(out))
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        tmp = out.parent / f".{out.name}.partial-{os.getpid()}"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
    except OSError as e:
        raise _unwritable(out, e) from None
    try:
        cfg = _write_checkpoint(tmp, opts, progress)
        old = None
        if path_kind(out) == "folder" and any(out.iterdir()):  # --force: the old folder goes only now
            old = out.parent / f".{out.name}.old-{os.getpid()}"
            out.rename(old)
        tmp.rename(out)  # onto a missing or empty folder: atomic
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)
    except BaseException as e:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(e, OSError):
            raise _unwritable(out, e) from None
        raise
    return cfg


def _unwritable(out: Path, e: OSError) -> BuildError:
    return BuildError("output_unwritable", f"cannot write the checkpoint at {out}: {e.strerror or e} "
                      f"({e.filename or out}); free disk space, fix permissions or choose another --out",
                      path=str(out), errno=e.errno, reason=e.strerror or str(e))


def _write_checkpoint(out: Path, opts: SynthOptions, progress) -> ModelConfig:
    tokenizer = train_tokenizer(seed=opts.seed)
    cfg = model_config_for(opts, tokenizer.get_vocab_size())
    try:
        tokenizer.save(str(out / "tokenizer.json"))
    except Exception as e:  # tokenizers reports a failed write as a plain Exception
        raise OSError(errno.EIO, f"writing tokenizer.json failed: {e}", str(out / "tokenizer.json")) from None
    (out / "tokenizer_config.json").write_text(json.dumps(
        {"eos_token": END_OF_TURN, "bos_token": None, "pad_token": SPECIAL_TOKENS[0],
         "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": cfg.max_position_embeddings},
        indent=2) + "\n")
    (out / "generation_config.json").write_text(json.dumps(
        {"eos_token_id": list(cfg.eos_token_ids), "bos_token_id": 0, "do_sample": False}, indent=2) + "\n")
    (out / "config.json").write_text(json.dumps(hf_config_json(cfg, opts.dtype), indent=2) + "\n")

    st_dtype, np_dtype = _DTYPES[opts.dtype]
    shapes = cfg.tensor_shapes()
    plan = _shard_plan(list(shapes), opts.shards)
    files = ["model.safetensors"] if len(plan) == 1 else \
        [f"model-{i + 1:05d}-of-{len(plan):05d}.safetensors" for i in range(len(plan))]
    done = 0
    weight_map = {}
    for fname, names in zip(files, plan):
        writer = SafetensorsWriter(out / fname, [(n, st_dtype, shapes[n]) for n in names], {"format": "pt"})
        for n in names:
            writer.write(n, _random_tensor(cfg, opts.seed, n, shapes[n]).astype(np_dtype))
            weight_map[n] = fname
            done += 1
            if progress:
                progress(n, done, len(shapes))
        writer.close()
    if len(files) > 1:
        total = sum((out / f).stat().st_size for f in files)
        (out / "model.safetensors.index.json").write_text(json.dumps(
            {"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2) + "\n")
    return cfg
