"""The canary: a fixed prompt whose exact greedy answer, on the bundle's own weights, gates every load.

Candidates are run through the fast CPU backend on the weights just written (read
back as the runtime reads them; its tokens equal the reference backend's, tests/test_cpu_fast.py); the first whose smallest top-1/top-2 margin is clear wins
(else the clearest), so that no step of it is a near-tie another correct float32 path could
order differently.
"""
from __future__ import annotations

from pathlib import Path

from runtime.contract import Canary, Limits
from runtime.engine import cpu_generator, load_cpu_weights
from common.errors import BuildError
from runtime.generator import Request, Result
from runtime.grammar import Grammar

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
MIN_CANARY_MARGIN = 1e-3  # logits; far above float32 disagreement (~1e-5) between correct paths
CLEAR_MARGIN = 0.05  # the first candidate at least this clear is taken without trying the rest


def record_canary(weights_path: Path, cfg, grammar: Grammar, limits: Limits, tokenizer) -> Canary:
    """Runs the candidates in order on the written weights; returns the first clear one (else the clearest)."""
    # the fast backend on the stored weights (memory-mapped): the build never holds a float32 copy
    generator = cpu_generator(cfg, load_cpu_weights(weights_path, cfg, backend="fast"), grammar, limits)
    prompts = [tuple(tokenizer.encode(grammar.render_prompt(r)).ids) for r in CANARY_REQUESTS]
    prompts = [p for p in prompts if len(p) <= limits.max_input_tokens] or [prompts[0][-limits.max_input_tokens:]]
    best: tuple[float, tuple[int, ...], Result] | None = None
    for prompt in prompts:  # one at a time: a decode step costs the same for 1 or 8 rows on a CPU
        (result,) = generator.generate([Request(prompt)])
        if not isinstance(result, Result):
            raise BuildError("build_failed", f"the canary prompt could not run: {result}", reason=str(result))
        if best is None or result.min_margin > best[0]:
            best = (result.min_margin, prompt, result)
        if result.min_margin >= CLEAR_MARGIN:
            break
    margin, prompt, result = best
    if margin < MIN_CANARY_MARGIN:
        raise BuildError("build_failed", f"every canary candidate has a near-tie step (best margin {margin:.2e} < "
                         f"{MIN_CANARY_MARGIN}); the model's answers are too flat to gate loads on",
                         best_margin=margin, needed=MIN_CANARY_MARGIN)
    return Canary(prompt_token_ids=prompt, expected_token_ids=tuple(result.token_ids), min_margin=float(margin))
