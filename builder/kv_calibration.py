"""A scaled KV cache for a bundle (``--kv-cache fp8_e4m3``): its per-head scales, calibrated on the bundle's
own weights, and the check that the canary answers the same with it as with a bf16 cache.

Calibration: the canary's candidate requests, one request per sampled tool (its description, as the catalog
probe asks, over the probe's sample: builder/probe_sample.py) and the probe's no-tool requests, each rendered through the bundle's template, run greedily on the
fast CPU backend with a bf16 cache (the shared prompt prefix prefilled once, as the runtime does). Per
(layer, kv head) the largest |K| and |V| the pool then holds, over every position written (prefix, prompts,
answers), sets scale = HEADROOM * amax / 448: values up to HEADROOM times the largest seen are stored
without saturating, and E4M3's 3 mantissa bits keep the same relative precision down to 2^-6 * scale. A
head whose cache held only zeros takes scale 1.

The check: the canary recorded with the scaled cache (the bundle's own numerics, which every load replays)
is run again on a bf16 cache; each prompt must give the same answer tokens, or the build is refused
(``kv_cache_unsafe``). The largest change of a recorded logit is reported in build-report.json.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from toolcall.builder.canary import CANARY_REQUESTS, written_weights
from toolcall.builder.probe import NO_TOOL_REQUESTS, tool_request
from toolcall.common.errors import BuildError, EngineError
from toolcall.common.fp8 import E4M3_MAX
from toolcall.runtime.batching.batcher import Request, Result
from toolcall.runtime.batching.prefix_cache import prefill_prefix
from toolcall.runtime.batching.prompt import PromptEncoder
from toolcall.runtime.bundle.checks import recorded_logits
from toolcall.runtime.bundle.contract import Canary, Limits
from toolcall.runtime.bundle.kv_scales import KvScales
from toolcall.runtime.cpu.backend import cpu_batcher
from toolcall.runtime.grammar.trie import Grammar

HEADROOM = 2.0  # scale = HEADROOM * calibrated amax / 448


@dataclass(frozen=True)
class KvCacheReport:
    """build-report.json's ``kv_cache`` object."""

    format: str
    headroom: float
    calibration_requests: int
    k_scale_range: tuple[float, float]
    v_scale_range: tuple[float, float]
    canary_tokens_equal_bf16: bool
    canary_max_logit_change_vs_bf16: float

    def to_dict(self) -> dict:
        return {"format": self.format, "headroom": self.headroom, "calibration_requests": self.calibration_requests,
                "k_scale_range": list(self.k_scale_range), "v_scale_range": list(self.v_scale_range),
                "canary_tokens_equal_bf16": self.canary_tokens_equal_bf16,
                "canary_max_logit_change_vs_bf16": self.canary_max_logit_change_vs_bf16}


def pool_amax(kv) -> tuple[np.ndarray, np.ndarray]:
    """(K, V) largest magnitudes per (layer, kv head), float32 (layers, kv_heads), of a bf16 pool: on the
    bits, since a bf16's magnitude orders as its low 15 bits do (the pool holds no NaN: steps check)."""
    out = []
    for layers in (kv.k, kv.v):
        bits = np.stack([(a.view(np.uint16) & np.uint16(0x7FFF)).max(axis=(0, 1, 3)) for a in layers])
        out.append((bits.astype(np.uint32) << 16).view(np.float32))
    return out[0], out[1]


def scales_for(amax: np.ndarray) -> np.ndarray:
    """float32 scales (layers, kv_heads) from the calibrated largest magnitudes; 1 where a head held only zeros."""
    scale = (np.float32(HEADROOM) * amax.astype(np.float32)) / np.float32(E4M3_MAX)
    return np.where(scale > 0, scale, np.float32(1.0)).astype(np.float32)


def calibration_texts(grammar: Grammar, descriptions: tuple[str | None, ...], tool_ids: tuple[int, ...]) -> list[str]:
    names = grammar.tool_names
    return (list(CANARY_REQUESTS) + [tool_request(names[t], descriptions[t]) for t in tool_ids]
            + list(NO_TOOL_REQUESTS))


def calibrate_kv_scales(weights_path: Path, cfg, grammar: Grammar, limits: Limits,
                        descriptions: tuple[str | None, ...], encoder: PromptEncoder,
                        tool_ids: tuple[int, ...]) -> tuple[KvScales, int]:
    """(the scales, how many calibration requests ran): module docstring; ``descriptions`` in tool order,
    ``tool_ids`` the tools whose requests run (the probe's sample). BuildError("build_failed") where the
    model computes NaN or Inf."""
    prompts = [p for p in (tuple(encoder.encode(t)) for t in calibration_texts(grammar, descriptions, tool_ids))
               if len(p) <= limits.max_input_tokens]
    generator = cpu_batcher(cfg, written_weights(weights_path, cfg), grammar, limits)
    try:
        generator.kv.enable_prefix_cache("kv-calibration")  # the salt only keys this pool's page hashes
        prefill_prefix(generator.model, generator.kv, encoder.prefix_ids, limits.prefill_chunk)
        results = generator.generate([Request(p) for p in prompts])
    except EngineError as e:
        if e.code != "numerics_invalid":
            raise
        raise BuildError("build_failed", f"the model computes NaN or Inf on a KV calibration request ({e.details}); "
                         "check config.json's numbers and the weights", reason=e.code, **e.details) from None
    ran = sum(isinstance(r, Result) for r in results)
    k_amax, v_amax = pool_amax(generator.kv)
    return KvScales(scales_for(k_amax), scales_for(v_amax)), ran


def check_against_bf16(canary: Canary, weights_path: Path, cfg, grammar: Grammar, limits: Limits) -> float:
    """The largest |logit change| of the canary's recorded candidates when its prompts run on a bf16 cache;
    BuildError("kv_cache_unsafe") naming the prompt whose answer changes."""
    generator = cpu_batcher(cfg, written_weights(weights_path, cfg), grammar, limits)
    results = generator.generate([Request(tuple(p.prompt_token_ids), keep_logits=True) for p in canary.prompts])
    worst = 0.0
    for prompt, res in zip(canary.prompts, results):
        if not isinstance(res, Result):
            raise BuildError("build_failed", f"the canary prompt could not run on a bf16 cache: {res}", reason=str(res))
        if list(res.token_ids) != list(prompt.expected_token_ids):
            raise BuildError("kv_cache_unsafe", f"with the fp8_e4m3 KV cache the canary request {prompt.request!r} "
                             f"is answered {list(prompt.expected_token_ids)}, with a bf16 cache "
                             f"{list(res.token_ids)}: this model's answers depend on the cache's precision; build "
                             "with --kv-cache bf16", request=prompt.request,
                             fp8_tokens=list(prompt.expected_token_ids), bf16_tokens=list(res.token_ids))
        worst = max([worst] + [abs(found - value) for _, _, value, found in
                               recorded_logits(prompt, res.step_logits, res.step_candidates)])
    return worst
