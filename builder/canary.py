"""The canary: a fixed prompt whose exact greedy answer, on the bundle's own weights, gates every load.

Candidates are run through the CPU reference backend on the weights just written (read
back as the runtime reads them); the one whose smallest top-1/top-2 margin is largest wins,
so that no step of it is a near-tie another correct float32 path could order differently.
"""
from __future__ import annotations

from pathlib import Path

from runtime.contract import Canary, Limits
from runtime.engine import cpu_generator, load_cpu_weights
from runtime.errors import BuildError
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


def record_canary(weights_path: Path, cfg, grammar: Grammar, limits: Limits, tokenizer) -> Canary:
    """Runs the candidates on the written weights and returns the clearest one's prompt and answer."""
    generator = cpu_generator(cfg, load_cpu_weights(weights_path, cfg), grammar, limits)
    prompts = [tuple(tokenizer.encode(grammar.render_prompt(r)).ids) for r in CANARY_REQUESTS]
    prompts = [p for p in prompts if len(p) <= limits.max_input_tokens] or [prompts[0][-limits.max_input_tokens:]]
    results = generator.generate([Request(p) for p in prompts])
    scored = [(r.min_margin, -i) for i, r in enumerate(results) if isinstance(r, Result)]
    if not scored:
        raise BuildError("build_failed", f"no canary candidate could run: {results[0]}", reason=str(results[0]))
    margin, neg_index = max(scored)
    if margin < MIN_CANARY_MARGIN:
        raise BuildError("build_failed", f"every canary candidate has a near-tie step (best margin {margin:.2e} < "
                         f"{MIN_CANARY_MARGIN}); the model's answers are too flat to gate loads on",
                         best_margin=margin, needed=MIN_CANARY_MARGIN)
    best = results[-neg_index]
    return Canary(prompt_token_ids=prompts[-neg_index], expected_token_ids=tuple(best.token_ids),
                  min_margin=float(margin))
