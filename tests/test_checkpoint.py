"""The checkpoint reader: config parsing per family and a typed error for each kind of bad input."""
from __future__ import annotations

import json
import shutil

import ml_dtypes
import numpy as np
import pytest

from toolcall.builder.checkpoint import open_checkpoint
from toolcall.common.errors import CheckpointError
from toolcall.runtime.bundle.tensor_file import SafetensorsFile, write_tensors


@pytest.fixture
def ckpt(tmp_path, tiny_checkpoint):
    folder = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint, folder)
    return folder


def edit_config(folder, **changes):
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(changes)
    (folder / "config.json").write_text(json.dumps(cfg))


def rewrite_tensors(folder, edit):
    with SafetensorsFile(folder / "model.safetensors") as st:
        tensors = {n: np.array(st.get(n)) for n in st.names()}
    edit(tensors)
    write_tensors(folder / "model.safetensors", tensors, {"format": "pt"})


def test_families_parse(make_checkpoint):
    for family, bias, qk in [("qwen3", False, True), ("qwen2", True, False), ("llama", False, False)]:
        cfg = open_checkpoint(make_checkpoint(family=family)).config
        assert (cfg.family, cfg.qkv_bias, cfg.qk_norm) == (family, bias, qk)
        assert cfg.eos_token_ids == (2, 0)
    assert open_checkpoint(make_checkpoint(family="llama")).config.rope_scaling.factor == 8.0


def break_missing_file(folder):
    (folder / "model.safetensors").unlink()


def break_missing_tokenizer(folder):
    (folder / "tokenizer.json").unlink()


def break_missing_tensor(folder):
    rewrite_tensors(folder, lambda t: t.pop("model.layers.1.mlp.up_proj.weight"))


def break_shape(folder):
    edit_config(folder, intermediate_size=96)


def break_model_type(folder):
    edit_config(folder, model_type="mamba")


def break_nan(folder):
    def edit(t):
        w = t["model.layers.0.self_attn.k_proj.weight"].astype(np.float32)
        w[3, 5] = np.nan
        t["model.layers.0.self_attn.k_proj.weight"] = w.astype(ml_dtypes.bfloat16)
    rewrite_tensors(folder, edit)


def break_truncated(folder):
    path = folder / "model.safetensors"
    path.write_bytes(path.read_bytes()[:-1000])


def break_bad_json(folder):
    (folder / "config.json").write_text("{not json")


def break_dtype(folder):
    rewrite_tensors(folder, lambda t: t.update({"model.norm.weight": np.ones(64, np.int32)}))


# breaker, the word the message must contain, the detail that names the culprit
BAD_INPUTS = [
    (break_missing_file, "no *.safetensors", None),
    (break_missing_tokenizer, "tokenizer.json", None),
    (break_missing_tensor, "model.layers.1.mlp.up_proj.weight", "tensor"),
    (break_shape, "[96, 64]", "tensor"),
    (break_model_type, "mamba", "found"),
    (break_nan, "NaN", "tensor"),
    (break_truncated, "truncated", "tensor"),
    (break_bad_json, "not valid JSON", "file"),
    (break_dtype, "I32", "tensor"),
]


@pytest.mark.parametrize("breaker,needle,detail", BAD_INPUTS, ids=[b[0].__name__ for b in BAD_INPUTS])
def test_bad_input_is_a_typed_error(ckpt, breaker, needle, detail):
    breaker(ckpt)
    with pytest.raises(CheckpointError) as info:
        open_checkpoint(ckpt).weights_f32()
    assert needle in info.value.message
    assert info.value.code in ("checkpoint_invalid", "tensor_invalid")
    if detail:
        assert detail in info.value.details
