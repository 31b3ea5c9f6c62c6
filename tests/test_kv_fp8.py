"""The fp8_e4m3 KV cache (common/formats.py KV_FP8_E4M3, builder/kv_calibration.py, runtime/bundle/kv_scales.py):
a build with ``--kv-cache fp8_e4m3`` records it in a format-3 contract with its calibrated scales, its pool
takes half the bytes, both CPU backends load it through the canary and answer as with a bf16 cache on the
hand-written requests; the builder refuses it where the canary's answers change (kv_cache_unsafe) and on GPU
targets; the runtime refuses a scales file that does not fit the model."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from toolcall.builder import kv_calibration
from toolcall.builder.cli import main as builder_cli
from toolcall.common.errors import EXIT_CODES, Refusal
from toolcall.common.formats import KV_BF16, KV_FP8_E4M3
from toolcall.runtime.bundle.contract import FORMAT_VERSION
from toolcall.runtime.bundle.files import REPORT_FILE, read_contract
from toolcall.runtime.bundle.kv_scales import KV_SCALES_FILE, KvScales
from toolcall.runtime.bundle.layout import kv_bytes_per_token, kv_scales_bytes
from toolcall.runtime.bundle.tensor_file import SafetensorsWriter
from toolcall.runtime.cpu.kv_pool import PagedKVPool
from toolcall.runtime.engine import Engine

FAST = ["--max-input-tokens", "128", "--max-tokens-per-step", "128", "--prefill-chunk", "64"]  # as test_probe's
SHIPPED = "models/toolcall-qwen3-tiny"
CATALOG = "builder/data/tools-64.json"


def cli(*args):
    return CliRunner().invoke(builder_cli, [str(a) for a in args])


def handwritten_requests(limit: int | None = None) -> list[str]:
    lines = Path("models/recipe/handwritten.tsv").read_text().splitlines()
    rows = [line.split("\t")[0] for line in lines if line.strip() and not line.startswith("#")]
    return [r for r in rows[1:] if r.strip()][:limit]


@pytest.fixture(scope="module")
def fp8_kv_bundle(tmp_path_factory):
    out = tmp_path_factory.mktemp("kv") / "shipped-fp8kv"
    result = cli("compile", SHIPPED, "--catalog", CATALOG, "--out", out, *FAST, "--kv-cache", "fp8_e4m3", "--json")
    assert result.exit_code == 0, result.output
    return out


def test_the_contract_records_the_cache_and_its_scales(fp8_kv_bundle, shipped_bundle):
    c, plain = read_contract(fp8_kv_bundle), read_contract(shipped_bundle)
    assert c.format.version == FORMAT_VERSION == 3 and c.precision.kv_cache == "fp8_e4m3"
    assert c.engine.build_options.kv_cache == "fp8_e4m3" and plain.engine.build_options.kv_cache is None
    assert KV_SCALES_FILE in c.files and KV_SCALES_FILE not in plain.files
    assert c.limits == plain.limits
    per_token = kv_bytes_per_token(c.model, KV_FP8_E4M3)
    assert per_token * 2 == kv_bytes_per_token(c.model, KV_BF16)
    assert c.memory.kv_pool_bytes == c.limits.num_pages * c.limits.page_size * per_token + kv_scales_bytes(c.model,
                                                                                                          KV_FP8_E4M3)
    assert c.memory.kv_pool_bytes - kv_scales_bytes(c.model, KV_FP8_E4M3) == plain.memory.kv_pool_bytes // 2
    scales = KvScales.read(fp8_kv_bundle / KV_SCALES_FILE, c.model)
    assert scales.k.shape == (c.model.num_layers, c.model.num_kv_heads) and (scales.k > 0).all()
    report = json.loads((fp8_kv_bundle / REPORT_FILE).read_text())["kv_cache"]
    assert report["format"] == "fp8_e4m3" and report["canary_tokens_equal_bf16"] is True
    assert report["calibration_requests"] >= 64 and report["k_scale_range"] == [float(scales.k.min()),
                                                                                float(scales.k.max())]
    assert cli("verify", fp8_kv_bundle).exit_code == 0
    assert "kv cache fp8_e4m3" in cli("inspect", fp8_kv_bundle).stdout


def test_both_backends_load_it_and_answer_as_a_bf16_cache_does(fp8_kv_bundle, shipped_bundle):
    """The hand-written requests: the fast and reference backends give the same tokens on the fp8 cache; the
    fp8 cache gives the bf16 cache's tokens on at least 97 % of them (its rounding may flip a near tie)."""
    requests = handwritten_requests()
    answers, pools = {}, {}
    for name, path, backend in (("fp8", fp8_kv_bundle, "fast"), ("fp8_reference", fp8_kv_bundle, "reference"),
                                ("bf16", shipped_bundle, "fast")):
        engine = Engine.load(path, backend=backend)
        try:
            answers[name] = [tuple(r.token_ids) for r in engine.run(requests)]
            pools[name] = engine.generator.kv
        finally:
            engine.close()
    assert answers["fp8"] == answers["fp8_reference"]
    same = sum(a == b for a, b in zip(answers["fp8"], answers["bf16"]))
    assert same >= 0.97 * len(requests), (same, len(requests))
    assert pools["fp8"].nbytes * 2 == pools["bf16"].nbytes and pools["fp8"].format is KV_FP8_E4M3


def test_the_pool_stores_the_formats_codes(tiny_checkpoint):
    """PagedKVPool.write/gather == the format's encode/decode with the layer's per-head scales."""
    from toolcall.builder.checkpoint import open_checkpoint
    cfg = open_checkpoint(tiny_checkpoint).config
    rng = np.random.default_rng(2)
    scales = KvScales(*(rng.uniform(0.01, 0.1, (cfg.num_layers, cfg.num_kv_heads)).astype(np.float32)
                        for _ in range(2)))
    pool = PagedKVPool(cfg, num_pages=8, page_size=16, max_seqs=2, max_tokens_per_seq=64, kv_format=KV_FP8_E4M3,
                       scales=scales)
    slot = pool.admit(40, ())
    positions = np.arange(40)
    k, v = (rng.standard_normal((40, cfg.num_kv_heads, cfg.head_dim)).astype(np.float32) for _ in range(2))
    layer = cfg.num_layers - 1
    pool.write(layer, np.full(40, slot), positions, k, v)
    gk, gv = pool.gather(layer, slot, 40)
    assert np.array_equal(gk, KV_FP8_E4M3.decode(KV_FP8_E4M3.encode(k, scales.inv_k[layer]), scales.k[layer]))
    assert np.array_equal(gv, KV_FP8_E4M3.decode(KV_FP8_E4M3.encode(v, scales.inv_v[layer]), scales.v[layer]))
    assert pool.k[layer].dtype == np.int8 and pool.nbytes == 2 * cfg.num_layers * 8 * 16 * cfg.num_kv_heads * cfg.head_dim


def test_a_cache_that_changes_the_canarys_answers_is_refused(tmp_path, monkeypatch):
    """Scales a thousand times too small saturate every cached element: the canary's answers change, so the
    build is refused with kv_cache_unsafe (exit 19) and writes nothing."""
    monkeypatch.setattr(kv_calibration, "HEADROOM", 2e-3)
    out = tmp_path / "builds" / "unsafe"
    result = cli("compile", SHIPPED, "--catalog", CATALOG, "--out", out, *FAST, "--kv-cache", "fp8_e4m3", "--json")
    assert result.exit_code == EXIT_CODES["kv_cache_unsafe"] == 19, result.output
    err = json.loads(result.stdout)
    assert err["error"] == "kv_cache_unsafe" and err["details"]["fp8_tokens"] != err["details"]["bf16_tokens"]
    assert "--kv-cache bf16" in err["message"]
    assert not out.exists() and list(out.parent.iterdir()) == []


def test_gpu_targets_refuse_it_before_any_work(tmp_path):
    out = tmp_path / "gpu"
    result = cli("compile", SHIPPED, "--catalog", CATALOG, "--out", out, "--target", "h200", "--kv-cache",
                 "fp8_e4m3", "--json")
    assert result.exit_code == EXIT_CODES["usage"], result.output
    err = json.loads(result.stdout)
    assert err["details"]["option"] == "kv_cache" and "CPU target only" in err["message"] and not out.exists()


@pytest.mark.parametrize("tensors, what", [
    ({"k_scale": np.ones((6, 1), np.float32)}, "tensors"),
    ({"k_scale": np.ones((6, 2), np.float32), "v_scale": np.ones((6, 2), np.float32)}, "expected float32"),
    ({"k_scale": np.ones((6, 1), np.float32), "v_scale": np.zeros((6, 1), np.float32)}, "finite positive"),
    ({"k_scale": np.full((6, 1), np.inf, np.float32), "v_scale": np.ones((6, 1), np.float32)}, "finite positive"),
])
def test_a_scales_file_that_does_not_fit_the_model_is_refused(tmp_path, tensors, what):
    from types import SimpleNamespace
    cfg = SimpleNamespace(num_layers=6, num_kv_heads=1)
    path = tmp_path / KV_SCALES_FILE
    writer = SafetensorsWriter(path, [(n, "F32", a.shape) for n, a in tensors.items()])
    for n, a in tensors.items():
        writer.write(n, a)
    writer.close()
    with pytest.raises(Refusal) as e:
        KvScales.read(path, cfg)
    assert e.value.code == "bundle_invalid" and what in e.value.message and KV_SCALES_FILE in e.value.message
