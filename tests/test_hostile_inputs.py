"""Inputs a hostile or careless user sends: each refused with its own typed code (never `internal`,
never a hang, never a partial output), and no command destroys what it did not make.

Classes: safetensors headers, config.json values, other checkpoint files, file kinds (folder,
FIFO, device, symlink loop), bundle files damaged and re-hashed, contract.json text, compile
--out placement and races, synth options and failures."""
from __future__ import annotations

import errno
import json
import os
import shutil
import struct
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from toolcall.builder.checkpoint import open_checkpoint
from toolcall.builder.cli import main as builder_cli
from toolcall.builder.compile import compile_bundle
from toolcall.common.errors import EXIT_CODES, CheckpointError, EngineError, Refusal
from toolcall.runtime.bundle.contract import CONTRACT_FILE, BuildOptions, compute_bundle_id
from toolcall.runtime.bundle.files import GRAMMAR_FILE, TOKENIZER_FILE, WEIGHTS_FILE, file_entry, read_contract
from toolcall.runtime.bundle.machine import MachineFacts
from toolcall.runtime.bundle.tensor_file import SafetensorsFile
from toolcall.runtime.engine import Engine

CATALOG = "builder/data/tools-64.json"
ROOMY_CPU = MachineFacts(free_bytes=1 << 40)
OPTIONS = BuildOptions(precision="fp8_e4m3", target="cpu", max_sequences=2, max_input_tokens=128,
                       max_output_tokens=None, page_size=32, max_tokens_per_step=64, prefill_chunk=64,
                       memory_budget_bytes=None, context_reserve_bytes=None, seed=0)


def safetensors_bytes(header, data: bytes = b"", raw_header: bytes | None = None) -> bytes:
    blob = raw_header if raw_header is not None else json.dumps(header).encode()
    return struct.pack("<Q", len(blob)) + blob + data


GOOD = {"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
        "b": {"dtype": "U8", "shape": [4], "data_offsets": [8, 12]}}


def entry(**kw):
    return {"a": {**GOOD["a"], **kw}, "b": GOOD["b"]}


# name -> (file bytes, error code)
HEADERS = {
    "list header": (safetensors_bytes([1, 2]), "checkpoint_invalid"),
    "null header": (safetensors_bytes(None), "checkpoint_invalid"),
    "string header": (safetensors_bytes("tensors"), "checkpoint_invalid"),
    "number header": (safetensors_bytes(12), "checkpoint_invalid"),
    "not json": (safetensors_bytes(None, raw_header=b"{nope"), "checkpoint_invalid"),
    "not utf-8": (safetensors_bytes(None, raw_header=b'{"\xff": 1}'), "checkpoint_invalid"),
    "deeply nested": (safetensors_bytes(None, raw_header=b"[" * 100_000 + b"]" * 100_000), "checkpoint_invalid"),
    "header longer than file": (struct.pack("<Q", 10**6) + b"{}", "checkpoint_invalid"),
    "truncated length": (b"\x01\x02\x03", "checkpoint_invalid"),
    "metadata a list": (safetensors_bytes({"__metadata__": [1], **GOOD}, bytes(12)), "checkpoint_invalid"),
    "entry a list": (safetensors_bytes({"a": [1, 2]}, bytes(8)), "tensor_invalid"),
    "missing data_offsets": (safetensors_bytes({"a": {"dtype": "F32", "shape": [2]}}, bytes(8)), "tensor_invalid"),
    "extra key": (safetensors_bytes(entry(extra=1), bytes(12)), "tensor_invalid"),
    "unknown dtype": (safetensors_bytes(entry(dtype="F128"), bytes(12)), "tensor_invalid"),
    "dtype a number": (safetensors_bytes(entry(dtype=4), bytes(12)), "tensor_invalid"),
    "fractional shape": (safetensors_bytes(entry(shape=[2.5]), bytes(12)), "tensor_invalid"),
    "integral float shape": (safetensors_bytes(entry(shape=[2.0]), bytes(12)), "tensor_invalid"),
    "string shape": (safetensors_bytes(entry(shape=["2"]), bytes(12)), "tensor_invalid"),
    "negative shape": (safetensors_bytes(entry(shape=[-2]), bytes(12)), "tensor_invalid"),
    "bool shape": (safetensors_bytes(entry(shape=[True, True]), bytes(12)), "tensor_invalid"),
    "shape a dict": (safetensors_bytes(entry(shape={"n": 2}), bytes(12)), "tensor_invalid"),
    "huge shape": (safetensors_bytes(entry(shape=[2**40, 2**40]), bytes(12)), "tensor_invalid"),
    "reversed offsets": (safetensors_bytes(entry(data_offsets=[8, 0]), bytes(12)), "tensor_invalid"),
    "fractional offsets": (safetensors_bytes(entry(data_offsets=[0, 8.0]), bytes(12)), "tensor_invalid"),
    "three offsets": (safetensors_bytes(entry(data_offsets=[0, 4, 8]), bytes(12)), "tensor_invalid"),
    "overlapping offsets": (safetensors_bytes({"a": GOOD["a"], "b": {"dtype": "U8", "shape": [4],
                                                                     "data_offsets": [4, 8]}}, bytes(12)),
                            "tensor_invalid"),
    "hole between tensors": (safetensors_bytes({"a": GOOD["a"], "b": {"dtype": "U8", "shape": [4],
                                                                      "data_offsets": [10, 14]}}, bytes(14)),
                             "tensor_invalid"),
    "hole at the start": (safetensors_bytes({"a": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}},
                                            bytes(12)), "tensor_invalid"),
    "bytes after the last tensor": (safetensors_bytes(GOOD, bytes(20)), "tensor_invalid"),
    "data past the end": (safetensors_bytes(GOOD, bytes(10)), "tensor_invalid"),
    "size disagrees with shape": (safetensors_bytes(entry(shape=[3]), bytes(12)), "tensor_invalid"),
    "duplicate tensor name": (safetensors_bytes(None, raw_header=b'{"a": ' + json.dumps(GOOD["a"]).encode()
                                                + b', "a": ' + json.dumps(GOOD["a"]).encode() + b"}")
                              + bytes(8), "checkpoint_invalid"),
}


@pytest.mark.parametrize("case", sorted(HEADERS))
def test_bad_safetensors_headers_are_typed(tmp_path, case):
    data, code = HEADERS[case]
    path = tmp_path / "model.safetensors"
    path.write_bytes(data)
    with pytest.raises(CheckpointError) as info:
        SafetensorsFile(path)
    assert info.value.code == code, info.value
    assert str(path) in info.value.message
    with pytest.raises(Refusal) as bundle:  # the same file inside a bundle gets the bundle's code
        SafetensorsFile(path, error_code="bundle_invalid")
    assert bundle.value.code == "bundle_invalid"


def test_a_good_header_reads(tmp_path):
    path = tmp_path / "model.safetensors"
    path.write_bytes(safetensors_bytes(GOOD, bytes(12)))
    with SafetensorsFile(path) as st:
        assert st.names() == ["a", "b"] and st.get("a").shape == (2,) and st.data_bytes == 12


# -- file kinds ---------------------------------------------------------------------------------


def make_kind(path: Path, kind: str) -> None:
    if kind == "folder":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        os.symlink("/dev/zero", path)
    elif kind == "symlink loop":
        os.symlink(path.name, path)
    elif kind == "broken symlink":
        os.symlink(path.name + ".gone", path)


KINDS = ["folder", "fifo", "device", "symlink loop", "broken symlink"]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("file", ["config.json", "tokenizer.json", "model.safetensors"])
def test_a_checkpoint_file_of_another_kind_is_reported_as_such_without_hanging(tmp_path, tiny_checkpoint, file, kind):
    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint, ckpt)
    (ckpt / file).unlink()
    make_kind(ckpt / file, kind)
    start = time.monotonic()
    with pytest.raises(CheckpointError) as info:
        open_checkpoint(ckpt)
    assert time.monotonic() - start < 10
    if file == "model.safetensors" and kind in ("broken symlink", "symlink loop"):
        # glob lists the link; its kind is reported when it is opened
        assert info.value.details.get("kind") in ("broken symlink", "symlink loop", None)
    else:
        assert info.value.details["kind"] == kind, info.value
    assert info.value.code == "checkpoint_invalid"


@pytest.mark.parametrize("kind", ["folder", "fifo", "symlink loop"])
def test_a_bundle_file_of_another_kind_is_reported_as_such(tmp_path, tiny_bundle, kind):
    folder = tmp_path / "bundle"
    shutil.copytree(tiny_bundle, folder)
    (folder / GRAMMAR_FILE).unlink()
    make_kind(folder / GRAMMAR_FILE, kind)
    with pytest.raises(Refusal) as info:
        Engine.load(folder, facts=ROOMY_CPU)
    assert info.value.code == "bundle_invalid" and info.value.details["kind"] == kind
    (folder / CONTRACT_FILE).unlink()
    make_kind(folder / CONTRACT_FILE, kind)
    with pytest.raises(Refusal) as info:
        Engine.load(folder, facts=ROOMY_CPU)
    assert info.value.code == "schema_invalid" and info.value.details["kind"] == kind


# -- config.json ------------------------------------------------------------------------------------


def with_config(tmp_path, tiny_checkpoint, edit, file="config.json") -> Path:
    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint, ckpt)
    path = ckpt / file
    d = json.loads(path.read_text())
    new = edit(d)
    path.write_text(new if isinstance(new, str) else json.dumps(d if new is None else new))
    return ckpt


def setter(key, value):
    return lambda d: d.__setitem__(key, value)


CONFIGS = {
    "eos empty list": setter("eos_token_id", []),
    "eos fractional": setter("eos_token_id", 1.5),
    "eos a string": setter("eos_token_id", "2"),
    "eos outside vocab": setter("eos_token_id", 10**9),
    "eos negative": setter("eos_token_id", -1),
    "tie a string": setter("tie_word_embeddings", "false"),
    "tie a number": setter("tie_word_embeddings", 0),
    "hidden a string": setter("hidden_size", "64"),
    "hidden fractional": setter("hidden_size", 64.5),
    "hidden integral float": setter("hidden_size", 64.0),
    "hidden negative": setter("hidden_size", -64),
    "hidden zero": setter("hidden_size", 0),
    "layers 10^9": setter("num_hidden_layers", 10**9),
    "layers 1000 with huge dims": lambda d: d.update(num_hidden_layers=1000, hidden_size=100_000,
                                                     intermediate_size=100_000),
    "vocab 10^12": setter("vocab_size", 10**12),
    "eps NaN": lambda d: json.dumps(d).replace('"rms_norm_eps": 1e-06', '"rms_norm_eps": NaN'),
    "eps zero": setter("rms_norm_eps", 0),
    "eps negative": setter("rms_norm_eps", -1e-6),
    "theta infinite": lambda d: json.dumps(d).replace('"rope_theta": 10000.0', '"rope_theta": 1e400'),
    "theta a string": setter("rope_theta", "big"),
    "theta 1e-300": setter("rope_theta", 1e-300),
    "heads not a multiple of kv heads": setter("num_key_value_heads", 3),
    "odd head_dim": setter("head_dim", 63),
    "config a list": lambda d: [d],
    "config nested deeply": lambda d: "[" * 100_000 + "]" * 100_000,
    "config not json": lambda d: "{model_type: qwen3",
    "model_type a number": setter("model_type", 5),
    "model_type unknown": setter("model_type", "gpt2"),
    "rope_scaling a string": setter("rope_scaling", "yes"),
    "rope_scaling factor a string": setter("rope_scaling", {"rope_type": "llama3", "factor": "8",
                                                            "low_freq_factor": 1, "high_freq_factor": 4,
                                                            "original_max_position_embeddings": 8192}),
    "rope_scaling unknown type": setter("rope_scaling", {"rope_type": "yarn", "factor": 4}),
    "positions fractional": setter("max_position_embeddings", 2048.5),
    "missing hidden_size": lambda d: d.pop("hidden_size") and None,
    "mlp_bias a string": setter("mlp_bias", "no"),
    "attention_bias a string": setter("attention_bias", "no"),
}


@pytest.mark.parametrize("case", sorted(CONFIGS))
def test_bad_config_values_are_refused_before_anything_is_built(tmp_path, tiny_checkpoint, case):
    edit = CONFIGS[case]
    if case.startswith("eos"):  # generation_config.json names the EOS ids first
        ckpt = with_config(tmp_path, tiny_checkpoint, edit, "generation_config.json")
    else:
        ckpt = with_config(tmp_path, tiny_checkpoint, edit)
    start = time.monotonic()
    with pytest.raises(CheckpointError) as info:
        open_checkpoint(ckpt)
    assert time.monotonic() - start < 5  # 10^9 layers is refused from the numbers, nothing sized from it
    assert info.value.code in ("checkpoint_invalid", "tensor_invalid"), info.value
    if case not in ("config nested deeply", "config not json", "config a list"):
        assert "expected" in info.value.message or "not supported" in info.value.message \
            or "missing" in info.value.message, info.value.message


OTHER_FILES = {
    "tokenizer garbage": ("tokenizer.json", b"\x00\x01garbage"),
    "tokenizer empty": ("tokenizer.json", b""),
    "tokenizer valid json, not a tokenizer": ("tokenizer.json", b'{"model": 5}'),
    "tokenizer nested deeply": ("tokenizer.json", b"[" * 100_000 + b"]" * 100_000),
    "generation_config a list": ("generation_config.json", b"[1, 2]"),
    "generation_config not json": ("generation_config.json", b"{"),
    "index escaping the folder": ("model.safetensors.index.json",
                                  json.dumps({"weight_map": {"x": "../model.safetensors"}}).encode()),
    "index weight_map a list": ("model.safetensors.index.json", b'{"weight_map": []}'),
    "index a folder-less name": ("model.safetensors.index.json", json.dumps({"weight_map": {"x": ""}}).encode()),
}


@pytest.mark.parametrize("case", sorted(OTHER_FILES))
def test_bad_checkpoint_files_are_typed(tmp_path, tiny_checkpoint, case):
    name, data = OTHER_FILES[case]
    ckpt = tmp_path / "ckpt"
    shutil.copytree(tiny_checkpoint, ckpt)
    (ckpt / name).write_bytes(data)
    with pytest.raises(EngineError) as info:
        open_checkpoint(ckpt).tokenizer()
    assert info.value.code == "checkpoint_invalid", info.value
    result = CliRunner().invoke(builder_cli, ["compile", str(ckpt), "--catalog", CATALOG, "--out",
                                              str(tmp_path / "out"), "--json"])
    assert result.exit_code == EXIT_CODES["checkpoint_invalid"], result.output
    assert not (tmp_path / "out").exists()


def test_the_builder_cli_never_says_internal_for_these_inputs(tmp_path, tiny_checkpoint):
    for i, case in enumerate(["tie a string", "layers 10^9", "eps NaN", "config nested deeply"]):
        ckpt = with_config(tmp_path / str(i), tiny_checkpoint, CONFIGS[case])
        result = CliRunner().invoke(builder_cli, ["compile", str(ckpt), "--catalog", CATALOG, "--out",
                                                  str(tmp_path / f"out{i}"), "--json"])
        err = json.loads(result.stdout)
        assert err["error"] == "checkpoint_invalid" and result.exit_code == 10, result.output


# -- bundle files damaged and re-hashed ---------------------------------------------------------------


def rehash(folder: Path) -> None:
    path = folder / CONTRACT_FILE
    d = json.loads(path.read_text())
    d["files"] = {n: {"bytes": file_entry(folder / n).bytes, "sha256": file_entry(folder / n).sha256}
                  for n in d["files"]}
    d["engine"]["bundle_id"] = compute_bundle_id(d)
    path.write_text(json.dumps(d))


DAMAGE = {
    "weights header a list": (WEIGHTS_FILE, safetensors_bytes([1])),
    "weights truncated": (WEIGHTS_FILE, b"\x00" * 4),
    "tokenizer garbage": (TOKENIZER_FILE, b"not a tokenizer"),
    "grammar garbage": (GRAMMAR_FILE, b"\xc1\xc1\xc1"),
    "grammar an empty map": (GRAMMAR_FILE, b"\x80"),
}


@pytest.mark.parametrize("case", sorted(DAMAGE))
def test_a_damaged_bundle_file_gets_the_bundles_code(tmp_path, tiny_bundle, case):
    name, data = DAMAGE[case]
    folder = tmp_path / "bundle"
    shutil.copytree(tiny_bundle, folder)
    (folder / name).write_bytes(data)
    rehash(folder)
    with pytest.raises(Refusal) as info:
        Engine.load(folder, facts=ROOMY_CPU)
    assert info.value.code == "bundle_invalid", info.value
    result = CliRunner().invoke(builder_cli, ["verify", str(folder), "--json"])
    assert json.loads(result.stdout)["error"] == "bundle_invalid"


CONTRACT_TEXTS = {
    "nested deeply": "[" * 100_000 + "]" * 100_000,
    "NaN literal": None,  # filled from the real contract below
    "1e400": None,
    "a list": "[]",
    "not utf-8": b"\xff\xfe{}",
    "empty": "",
}


@pytest.mark.parametrize("case", sorted(CONTRACT_TEXTS))
def test_bad_contract_text_is_schema_invalid(tmp_path, tiny_bundle, case):
    folder = tmp_path / "bundle"
    shutil.copytree(tiny_bundle, folder)
    real = (folder / CONTRACT_FILE).read_text()
    text = {"NaN literal": real.replace('"logit_tolerance": 0.02', '"logit_tolerance": NaN'),
            "1e400": real.replace('"logit_tolerance": 0.02', '"logit_tolerance": 1e400')}.get(case) \
        or CONTRACT_TEXTS[case]
    (folder / CONTRACT_FILE).write_bytes(text if isinstance(text, bytes) else text.encode())
    with pytest.raises(Refusal) as info:
        read_contract(folder)
    assert info.value.code == "schema_invalid", info.value


def test_an_old_format_version_is_refused(tmp_path, tiny_bundle):
    folder = tmp_path / "bundle"
    shutil.copytree(tiny_bundle, folder)
    d = json.loads((folder / CONTRACT_FILE).read_text())
    d["format"]["version"] = 1  # bundle_id over the files alone: its contract was not covered
    (folder / CONTRACT_FILE).write_text(json.dumps(d))
    with pytest.raises(Refusal) as info:
        read_contract(folder)
    assert info.value.code == "format_unsupported"


# -- compile --out ------------------------------------------------------------------------------------


def copy_inputs(tmp_path, tiny_checkpoint):
    ckpt = tmp_path / "work" / "ckpt"
    shutil.copytree(tiny_checkpoint, ckpt)
    catalog = tmp_path / "work" / "catalog.json"
    shutil.copyfile(CATALOG, catalog)
    return ckpt, catalog


@pytest.mark.parametrize("where", ["checkpoint", "inside checkpoint", "above checkpoint", "catalog",
                                   "above catalog", "symlink to checkpoint"])
def test_out_overlapping_an_input_is_refused_even_with_force(tmp_path, tiny_checkpoint, where):
    ckpt, catalog = copy_inputs(tmp_path, tiny_checkpoint)
    before = sorted(p.name for p in ckpt.iterdir())
    link = tmp_path / "link"
    link.symlink_to(ckpt)
    out = {"checkpoint": ckpt, "inside checkpoint": ckpt / "bundle", "above checkpoint": tmp_path / "work",
           "catalog": catalog, "above catalog": catalog.parent, "symlink to checkpoint": link}[where]
    result = CliRunner().invoke(builder_cli, ["compile", str(ckpt), "--catalog", str(catalog), "--out", str(out),
                                              "--force", "--json"])
    code = "usage" if where == "catalog" else "output_unsafe"  # click: --out must not be a file
    assert result.exit_code == EXIT_CODES[code], result.output
    assert json.loads(result.stdout)["error"] == code
    with pytest.raises(EngineError) as info:
        compile_bundle(ckpt, catalog, OPTIONS, out, force=True)
    assert info.value.code == "output_unsafe"
    assert sorted(p.name for p in ckpt.iterdir()) == before and catalog.is_file()


def test_a_second_build_racing_for_the_same_out_refuses(tmp_path, tiny_checkpoint, monkeypatch):
    import toolcall.builder.compile
    out = tmp_path / "bundle"
    real = toolcall.builder.compile.record_canary
    second = {}

    def canary_while_another_build_starts(*a, **kw):
        try:
            compile_bundle(tiny_checkpoint, CATALOG, OPTIONS, out)
        except EngineError as e:
            second["error"] = e
        return real(*a, **kw)

    monkeypatch.setattr(toolcall.builder.compile, "record_canary", canary_while_another_build_starts)
    compile_bundle(tiny_checkpoint, CATALOG, OPTIONS, out)
    assert second["error"].code == "output_exists"  # the first build's claim was seen
    Engine.load(out, facts=ROOMY_CPU)  # and the first build's bundle is whole


def test_a_full_disk_leaves_nothing_behind(tmp_path, tiny_checkpoint, monkeypatch):
    import toolcall.runtime.grammar.trie

    def full(self, path):
        raise OSError(errno.ENOSPC, "No space left on device", str(path))

    monkeypatch.setattr(toolcall.runtime.grammar.trie.Grammar, "write", full)
    with pytest.raises(EngineError) as info:
        compile_bundle(tiny_checkpoint, CATALOG, OPTIONS, tmp_path / "bundle")
    assert info.value.code == "output_unwritable" and info.value.details["errno"] == errno.ENOSPC
    assert list(tmp_path.iterdir()) == []


def test_an_unwritable_out_is_typed(tmp_path, tiny_checkpoint):
    result = CliRunner().invoke(builder_cli, ["compile", str(tiny_checkpoint), "--catalog", CATALOG, "--out",
                                              "/proc/i14-cannot-write/bundle", "--json"])
    assert result.exit_code == EXIT_CODES["output_unwritable"], result.output


# -- synth ------------------------------------------------------------------------------------------


def synth(*args):
    return CliRunner().invoke(builder_cli, ["synth", *map(str, args), "--json"])


@pytest.mark.parametrize("args", [("--shards", "0"), ("--shards", "-2"), ("--seed", "-1")])
def test_synth_validates_options_before_writing(tmp_path, args):
    result = synth("--out", tmp_path / "ckpt", *args)
    assert result.exit_code == EXIT_CODES["usage"], result.output
    assert json.loads(result.stdout)["error"] == "usage" and list(tmp_path.iterdir()) == []


def test_synth_refuses_a_non_empty_out_without_force(tmp_path):
    out = tmp_path / "ckpt"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    result = synth("--out", out)
    assert result.exit_code == EXIT_CODES["output_exists"] and (out / "keep.txt").read_text() == "mine"
    assert synth("--out", out, "--force").exit_code == 0
    assert not (out / "keep.txt").exists() and (out / "config.json").is_file()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_synth_on_a_full_disk_leaves_nothing_behind(tmp_path, monkeypatch):
    import toolcall.builder.synth

    class FullWriter(toolcall.builder.synth.SafetensorsWriter):
        def write(self, name, array):
            raise OSError(errno.ENOSPC, "No space left on device", str(self.path))

    monkeypatch.setattr(toolcall.builder.synth, "SafetensorsWriter", FullWriter)
    result = synth("--out", tmp_path / "ckpt")
    assert result.exit_code == EXIT_CODES["output_unwritable"], result.output
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("kind", ["fifo", "folder", "device", "symlink loop"])
def test_a_catalog_of_another_kind_is_reported_without_hanging(tmp_path, tiny_checkpoint, kind):
    catalog = tmp_path / "catalog.json"
    make_kind(catalog, kind)
    with pytest.raises(EngineError) as info:
        compile_bundle(tiny_checkpoint, catalog, OPTIONS, tmp_path / "bundle")
    assert info.value.code == "catalog_invalid" and info.value.details["kind"] == kind
    assert not (tmp_path / "bundle").exists()


# -- runtime run options and --json -------------------------------------------------------------------


@pytest.mark.parametrize("option,value", [("--temperature", "nan"), ("--temperature", "inf"),
                                          ("--temperature", "-0.5"), ("--temperature", "1e-320"),
                                          ("--top-p", "nan"), ("--top-p", "0"), ("--top-p", "1.5"),
                                          ("--top-p", "-1e-300"), ("--seed", "-1")])
def test_bad_sampling_options_are_usage_errors_before_loading(tmp_path, option, value):
    from toolcall.runtime.cli import main as runtime_cli
    missing = tmp_path / "no-bundle"  # never read: the options are refused first
    result = CliRunner().invoke(runtime_cli, ["run", str(missing), "Book a flight", f"{option}={value}", "--json"])
    assert result.exit_code == EXIT_CODES["usage"], result.output
    assert json.loads(result.stdout)["error"] == "usage"


def test_json_output_never_holds_nan(tmp_path, tiny_checkpoint):
    from toolcall.runtime.cli import main as runtime_cli
    catalog = tmp_path / "one.json"
    full = json.loads(Path(CATALOG).read_text())
    catalog.write_text(json.dumps({**full, "tools": full["tools"][:1], "answer": {**full["answer"], "allow_empty": False}}))
    built = CliRunner().invoke(builder_cli, ["compile", str(tiny_checkpoint), "--catalog", str(catalog), "--out",
                                             str(tmp_path / "b"), "--json"])
    assert built.exit_code == 0, built.output
    assert json.loads(built.stdout, parse_constant=lambda c: pytest.fail(f"{c} in --json"))["canary_min_margin"] is None
    ran = CliRunner().invoke(runtime_cli, ["run", str(tmp_path / "b"), "Book a flight", "--json"])
    assert ran.exit_code == 0, ran.output
    out = json.loads(ran.stdout, parse_constant=lambda c: pytest.fail(f"{c} in --json"))
    assert out["results"][0]["min_margin"] is None  # every step forced: infinite margin -> null


def test_a_deeply_nested_catalog_is_typed(tmp_path, tiny_checkpoint):
    catalog = tmp_path / "deep.json"
    catalog.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(EngineError) as info:
        compile_bundle(tiny_checkpoint, catalog, OPTIONS, tmp_path / "bundle")
    assert info.value.code == "catalog_invalid"


def test_a_model_that_computes_nan_is_a_build_failure(tmp_path, tiny_checkpoint, monkeypatch):
    from toolcall.runtime.cpu.fast_model import FastCpuModel  # the builder's canary backend
    real = FastCpuModel.forward

    def nan_forward(self, *a, **kw):
        out = real(self, *a, **kw)
        out[:] = float("nan")
        return out

    monkeypatch.setattr(FastCpuModel, "forward", nan_forward)
    with pytest.raises(EngineError) as info:
        compile_bundle(tiny_checkpoint, CATALOG, OPTIONS, tmp_path / "bundle")
    assert info.value.code == "build_failed" and info.value.details["reason"] == "numerics_invalid"
    assert list(tmp_path.iterdir()) == []
