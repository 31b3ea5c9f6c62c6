"""The number-format registries (common/formats.py): one entry a format, every stage asks them.

Outside the registries' module no code compares a format's name (``==``, ``!=``, ``in``) or keys a dict
by one: adding a format means adding an entry, and each per-format table (``per_format``) then says
at import what it lacks.
"""
from __future__ import annotations

import ast
from pathlib import Path

import numpy as np
import pytest

from toolcall.common.formats import BF16, FP8_E4M3, KV_FORMATS, NVFP4, WEIGHT_FORMATS, format_of_linear, per_format

ROOT = Path(__file__).resolve().parents[1]
SCANNED = ("common", "kernels", "runtime", "builder", "models")
NAMES = {n for registry in (WEIGHT_FORMATS, KV_FORMATS) for f in registry for n in (f.name, *f.aliases)}


def name_uses(path: Path) -> list[str]:
    """Comparisons with a format name, and dicts keyed by one, in a source file."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Compare) and any(isinstance(op, (ast.Eq, ast.NotEq, ast.In, ast.NotIn))
                                                 for op in node.ops):
            operands = [node.left, *node.comparators]
            consts = [c for o in operands for c in ([o] if isinstance(o, ast.Constant) else
                                                     o.elts if isinstance(o, (ast.Tuple, ast.List, ast.Set)) else [])]
            if any(isinstance(c, ast.Constant) and c.value in NAMES for c in consts):
                found.append(f"{path.relative_to(ROOT)}:{node.lineno} compares a format name")
        elif isinstance(node, ast.Dict) and any(isinstance(k, ast.Constant) and k.value in NAMES for k in node.keys):
            found.append(f"{path.relative_to(ROOT)}:{node.lineno} keys a dict by format names")
    return found


PTX_TYPES = ROOT / "kernels" / "sim"  # the PTX executor: PTX's own type suffixes (.bf16, .f16) are not formats


def test_no_format_name_is_compared_outside_the_registry():
    registry = ROOT / "common" / "formats.py"
    bad = [use for package in SCANNED for f in sorted((ROOT / package).rglob("*.py"))
           if f != registry and PTX_TYPES not in f.parents for use in name_uses(f)]
    assert not bad, "\n".join(bad)


def test_the_scan_finds_a_comparison(tmp_path, monkeypatch):
    fake = ROOT / "runtime" / "fake.py"
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: 'if fmt == "nvfp4":\n    x = {"bf16": 2}\n')
    assert len(name_uses(fake)) == 2


def test_one_name_each_and_old_spellings_read():
    assert WEIGHT_FORMATS.bundle_names == ("fp8_e4m3", "nvfp4", "bf16")
    assert WEIGHT_FORMATS.get("fp8") is FP8_E4M3 and WEIGHT_FORMATS.is_alias("fp8")
    assert not WEIGHT_FORMATS.is_alias("fp8_e4m3") and WEIGHT_FORMATS.get("int4") is None
    assert KV_FORMATS.bundle_names == ("bf16", "fp8_e4m3") and KV_FORMATS.get("fp8").name == "fp8_e4m3"
    assert len({f.name for f in WEIGHT_FORMATS}) == len(WEIGHT_FORMATS.entries)


def test_a_table_missing_a_format_is_refused():
    with pytest.raises(NotImplementedError, match="nvfp4"):
        per_format({FP8_E4M3: 1, BF16: 2}, "a test's kernels", bundles_only=True)
    assert per_format({FP8_E4M3: 1, BF16: 2, NVFP4: 3}, "a test's kernels", bundles_only=True)[NVFP4] == 3


@pytest.mark.parametrize("fmt", [f for f in WEIGHT_FORMATS if f.quantized], ids=lambda f: f.name)
def test_stored_layout_quantize_and_dequantize_agree(fmt):
    rng = np.random.default_rng(0)
    w = rng.standard_normal((8, 64)).astype(np.float32)
    tensors = fmt.quantize(w, "m.weight")
    assert [(n, a.shape) for n, a in tensors.items()] == [(n, s) for n, _, s in fmt.stored("m.weight", (8, 64))]
    assert format_of_linear(lambda n: n in tensors, "m.weight") is fmt
    back = fmt.dequantize(tensors.get, "m.weight")
    assert back.shape == w.shape and np.abs(back - w).max() < 0.5 * np.abs(w).max()
    assert fmt.bits_per_weight * w.size / 8 <= sum(a.nbytes for a in tensors.values()) + 4


def test_the_schema_names_the_kv_formats_bundles_may_record():
    import json
    schema = json.loads((ROOT / "schemas" / "contract.schema.json").read_text())
    precision = schema["properties"]["precision"]["properties"]["kv_cache"]["enum"]
    options = schema["properties"]["engine"]["properties"]["build_options"]["properties"]["kv_cache"]["enum"]
    assert tuple(precision) == tuple(options) == KV_FORMATS.bundle_names


@pytest.mark.parametrize("fmt", [f for f in KV_FORMATS], ids=lambda f: f.name)
def test_kv_formats_encode_and_decode(fmt):
    """bf16/fp32: a cast; fp8_e4m3: codes of value / scale per kv head (its 3 mantissa bits: within 1/16
    relative above 2^-6 * scale), saturated at 448 * scale."""
    rng = np.random.default_rng(1)
    x = (rng.standard_normal((5, 3, 16)) * 4).astype(np.float32)
    scale = np.array([0.01, 0.02, 0.5], np.float32)
    stored = fmt.encode(x, (np.float32(1) / scale).astype(np.float32))
    assert stored.dtype == fmt.dtype and stored.shape == x.shape
    back = fmt.decode(stored, scale)
    assert back.dtype == np.float32
    if not fmt.scaled:
        assert np.array_equal(back, x.astype(fmt.dtype).astype(np.float32))
        return
    limit = 448 * scale[:, None]
    inside = np.abs(x) <= limit
    assert np.all(np.abs(back - x)[inside] <= np.abs(x)[inside] / 16 + 2.0 ** -10 * np.broadcast_to(scale[:, None],
                                                                                                    x.shape)[inside])
    assert np.array_equal(back[~inside], np.sign(x[~inside]) * np.broadcast_to(limit, x.shape)[~inside])
