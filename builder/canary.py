"""The canary: fixed requests whose exact greedy answers and top logits, on the bundle's own
weights, gate every load.

Candidates are run through the fast CPU backend on the weights just written (memory-mapped,
as the runtime reads them; its tokens equal the reference backend's). A candidate is kept when
- its request fits max_input_tokens once rendered and tokenized (the runtime re-encodes the
  recorded text and must get the recorded ids: another tokenizer or template is refused);
- every step with two or more allowed candidates has a clear margin (no near-tie another
  correct float32 path could order differently);
- its answer is not the grammar's first allowed candidate at every step (such an answer is
  what a model with no information would give, e.g. one whose logits are all equal), unless
  the grammar forces every step (a one-tool catalog), where the logits alone gate;
and the first CANARY_PROMPTS kept ones are recorded: request text, prompt ids, answer ids,
and per step the TOP_K allowed candidates with their logits.

The fixed requests come first; then the bundle's own requests (compile.py passes the probe's, one per sampled
tool, made from its description). A model that reads its catalog rightly answers none to every fixed
request a small catalog cannot serve, and the empty answer is the grammar's first candidate, so such a
catalog's canary rests on its own requests.
"""
from __future__ import annotations

from os import PathLike
from pathlib import Path
from typing import Callable

import numpy as np

from toolcall.common.errors import BuildError, EngineError
from toolcall.runtime.batching.batcher import Request, Result
from toolcall.runtime.bundle.contract import Canary, CanaryPrompt, CanaryStep, Limits
from toolcall.runtime.cpu.backend import cpu_batcher, load_cpu_weights
from toolcall.runtime.grammar.stepper import GrammarStepper
from toolcall.runtime.grammar.trie import Grammar

CANARY_REQUESTS = (
    "What is the weather in Paris tomorrow?",
    "Book a flight from London to Tokyo and reserve a hotel there.",
    "Send an email to Alice about the budget report.",
    "Convert 100 euros to dollars.",
    "Remind me to call Bob on Friday.",
    "Translate this message to Spanish and share it with Carol.",
    "Find a restaurant in Rome for tonight.",
    "Play some music and set a timer for 20 minutes.",
)
CANARY_PROMPTS = 3  # prompts recorded (fewer only when fewer candidates qualify; at least 1)
TOP_K = 4  # candidates (and logits) recorded per step
MIN_CANARY_MARGIN = 1e-3  # logits; far above float32 disagreement (~1e-5) between correct paths
# Tolerance (absolute, logit units) every backend must meet at every recorded candidate.
# It must admit float32 paths that differ only in summation order, layouts and bf16 KV writes
# over the same dequantized weights, and refuse any change of the weights. Measured on the CPU
# (bench/canary_spread.py; tiny synthetic and trained checkpoints):
# - sparse vs dense head of the reference: |dlogit| <= 3e-6;
# - the CUDA backend on the emulated device (each kernel's numpy reference, the GPU's layouts,
#   split-K attention, fused buffers) vs the CPU backend, on tests/test_cuda_backend.py's
#   emulated-device engine test: <= 1.6e-4;
# - the same checkpoint re-quantized (bf16 -> fp8_e4m3, the smallest weight change a build
#   makes): 0.12 (trained) to 0.28 (synthetic); bf16 -> nvfp4: 0.52 to 5.1.
# 0.02 is 100x above the float32 spread and 6x below the smallest quantization change. Real GPU
# kernels add their exp/rsqrt approximations (their parity tests hold 1e-5 to 3e-5 per kernel);
# on-device end-to-end figures are not measured yet (no GPU in this session).
LOGIT_TOLERANCE = 0.02


def _allowed_steps(stepper: GrammarStepper, tokens: list[int]):
    """Per answer step: the allowed candidate token ids (edge order) before that token is taken."""
    state = stepper.initial_state()
    out = []
    for token in tokens:
        cand, _, allowed = stepper.allowed_mask_batch(state[None])
        out.append(cand[0][allowed[0]])
        state = stepper.advance(state, token)
    return out


def canary_prompt(request: str, prompt: tuple[int, ...], result: Result, grammar: Grammar,
                  stepper: GrammarStepper | None = None) -> CanaryPrompt:
    """The record of one run: top-k allowed candidates per step, best first (ties: lower id first). ``stepper``:
    the grammar's, made once by the caller (a 16,384-tool grammar's takes ~0.05 s), or None."""
    steps = []
    for logits, cand, allowed in zip(result.step_logits, result.step_candidates,
                                     _allowed_steps(stepper or GrammarStepper(grammar), result.token_ids)):
        by_token = dict(zip(cand.tolist(), logits.tolist()))
        ranked = sorted(allowed.tolist(), key=lambda t: (-by_token[t], t))[:TOP_K]
        steps.append(CanaryStep(tuple(int(t) for t in ranked), tuple(float(by_token[t]) for t in ranked)))
    margin = result.min_margin if np.isfinite(result.min_margin) else None
    return CanaryPrompt(request, tuple(prompt), tuple(result.token_ids), margin, tuple(steps))


def is_first_candidate_answer(grammar: Grammar, tokens: list[int],
                              stepper: GrammarStepper | None = None) -> tuple[bool, bool]:
    """(every step took the first allowed candidate, every step had exactly one allowed candidate)."""
    steps = _allowed_steps(stepper or GrammarStepper(grammar), tokens)
    first = all(len(a) and int(a[0]) == t for a, t in zip(steps, tokens))
    return first, all(len(a) == 1 for a in steps)


def written_weights(weights, cfg):
    """The bundle's written weights on the fast CPU backend: ``weights`` loaded already (``load_cpu_weights``'
    result, so the canary, the probe and the KV calibration of one build map and check the file once), or
    its path (memory-mapped: the build never holds a float32 copy)."""
    if isinstance(weights, (str, PathLike)):
        return load_cpu_weights(weights, cfg, backend="fast")
    return weights


def record_canary(weights_path: Path, cfg, grammar: Grammar, limits: Limits,
                  encode: Callable[[str], tuple[int, ...]], kv_format=None, kv_scales=None,
                  own_requests: tuple[str, ...] = ()) -> Canary:
    """Runs the candidates in order on the written weights and records the first CANARY_PROMPTS
    that qualify (module docstring). ``weights_path``: the written weights, or them loaded (``written_weights``);
    ``encode(text)``: the runtime's Engine.encode for this
    bundle's tokenizer and template; ``kv_format``/``kv_scales``: the bundle's cache (default bf16);
    ``own_requests``: candidates tried after CANARY_REQUESTS.
    BuildError("build_failed") when none qualifies."""
    generator = cpu_batcher(cfg, written_weights(weights_path, cfg), grammar, limits,
                            kv_format=kv_format, kv_scales=kv_scales)
    stepper = GrammarStepper(grammar)  # once: each candidate's answer is walked through it
    kept: list[CanaryPrompt] = []
    rejected: dict[str, int] = {"too long": 0, "near tie": 0, "first candidate at every step": 0}
    best_margin = 0.0
    candidates = CANARY_REQUESTS + tuple(r for r in dict.fromkeys(own_requests) if r not in CANARY_REQUESTS)
    for request in candidates:  # one at a time: a decode step costs the same for 1 or 8 rows on a CPU
        prompt = tuple(encode(request))
        if len(prompt) > limits.max_input_tokens:
            rejected["too long"] += 1
            continue
        try:
            (result,) = generator.generate([Request(prompt, keep_logits=True)])
        except EngineError as e:
            if e.code != "numerics_invalid":
                raise
            raise BuildError("build_failed", f"the model computes NaN or Inf on the canary request {request!r} "
                             f"({e.details}); check config.json's numbers (rms_norm_eps, rope_theta, rope_scaling) "
                             "and the weights", reason=e.code, **e.details) from None
        if not isinstance(result, Result):
            raise BuildError("build_failed", f"the canary prompt could not run: {result}", reason=str(result))
        first, forced = is_first_candidate_answer(grammar, result.token_ids, stepper)
        if np.isfinite(result.min_margin):
            best_margin = max(best_margin, result.min_margin)
        if result.min_margin < MIN_CANARY_MARGIN:
            rejected["near tie"] += 1
        elif first and not forced:
            rejected["first candidate at every step"] += 1
        else:
            kept.append(canary_prompt(request, prompt, result, grammar, stepper))
            if len(kept) == CANARY_PROMPTS:
                break
    if not kept:
        raise BuildError("build_failed", f"no canary candidate qualifies ({rejected}; best margin {best_margin:.2e}, "
                         f"needed {MIN_CANARY_MARGIN}): the model's answers are too flat to gate loads on, or "
                         "--max-input-tokens is below every rendered request", rejected=rejected,
                         best_margin=best_margin, needed=MIN_CANARY_MARGIN)
    return Canary(logit_tolerance=LOGIT_TOLERANCE, top_k=TOP_K, prompts=tuple(kept))
