"""The catalog probe: does the model pick this catalog's tools at all, on the bundle's own weights?

A bundle can pass every check (hashes, grammar, canary) and still be useless: a checkpoint that
does not know the catalog's tools answers every request alike. After the canary the builder asks
the model, through the bundle's own prompt template and grammar (greedy, one batch on the fast
CPU backend over the weights just written, as the canary does; the template's fixed prefix is
computed once and shared, as the runtime does, so a long {tools} prefix costs once, not per request):
- one request per sampled tool (builder/probe_sample.py: every tool of a catalog of at most 256, else a
  seeded sample of 256, or every tool with ``--probe-all``), made from the tool (``tool_request``: its
  description, or its name with underscores as spaces when it has none);
- NO_TOOL_REQUESTS, small talk that no catalog's tool answers.

It computes (``Probe``, written as the ``probe`` object of build-report.json):
- ``recall``: the share of probed tools whose answer to their own request names them (0-1), over the sample;
- ``catalog_tools``, ``sampled_tools``, ``sample_seed``, ``sample_method``: how the sample was drawn;
- ``distinct_answers``: the number of distinct answers (sets of tools) over every probe request;
- ``same_answer_share``: the share of the tool requests given their most common answer (0-1);
- ``none_rate``: the share of the no-tool requests answered with the empty answer (0-1); 0 when
  the catalog does not allow the empty answer (``empty_allowed`` false), where every answer names
  a tool;
- ``warnings``: one sentence per finding (recall under MIN_RECALL; answers nearly all the same,
  SAME_ANSWER_SHARE), each with its numbers and what to do.
Greedy decoding over a seeded sample of fixed requests: the same bundle gives the same probe, byte for byte.
"""
from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from toolcall.builder.canary import written_weights
from toolcall.builder.probe_sample import ProbeSample
from toolcall.common.errors import BuildError, EngineError
from toolcall.common.formats import KV_BF16
from toolcall.runtime.batching.batcher import Request, Result
from toolcall.runtime.batching.prefix_cache import prefill_prefix
from toolcall.runtime.batching.prompt import PromptEncoder
from toolcall.runtime.bundle.contract import Limits
from toolcall.runtime.bundle.layout import kv_pool_bytes
from toolcall.runtime.cpu.backend import cpu_batcher
from toolcall.runtime.grammar.trie import Grammar

# Requests that need no tool in any catalog: greetings, thanks, opinions, a statement.
NO_TOOL_REQUESTS = (
    "Hello there! How are you today?",
    "Thanks a lot, that is all for now.",
    "What is your favourite colour?",
    "I think autumn is the nicest season of the year.",
)
MIN_RECALL = 0.5  # a warning below this recall
# "Answers nearly all the same": the most common answer covers at least this share of the tool
# requests (one per tool), checked when the catalog has at least two tools (with one tool every
# answer that names a tool is the same). A model that knows the tools gives each request its own
# answer (share 1/tools); with 2 tools the warning needs both answers equal, with 5 tools 4 of 5.
SAME_ANSWER_SHARE = 0.8
# The probe runs up to PROBE_SEQUENCES requests at once (the bundle's limits may allow fewer: 8 by default),
# their KV pages within PROBE_KV_BYTES or the bundle's own pool if larger: a row's answer never depends on its
# batch, so this changes only the probe's time (tests/test_probe.py checks the figures equal).
PROBE_SEQUENCES = 64
PROBE_KV_BYTES = 256 << 20
DESCRIBE_WHAT_TO_DO = ("use a checkpoint trained for these tools, or an instruction-tuned one with the tools listed "
                       "in the prompt ({tools} in the catalog's prompt_template, in the model's chat format)")


@dataclass(frozen=True)
class Probe:
    """The probe's figures (module docstring); ``to_dict`` is build-report.json's ``probe`` object."""

    tools: int  # tool requests run (one per sampled tool whose request fits max_input_tokens)
    skipped_tools: int  # sampled tools whose request does not fit max_input_tokens once rendered: not probed
    no_tool_requests: int
    recall: float  # 0-1 over the probed tools
    distinct_answers: int  # over every probe request (tool and no-tool)
    same_answer_share: float  # 0-1 over the tool requests
    none_rate: float  # 0-1 over the no-tool requests; 0 when empty_allowed is false
    empty_allowed: bool  # the catalog's answer.allow_empty
    warnings: tuple[str, ...]
    sample: ProbeSample  # which tools were probed (to_dict writes its four fields flat)

    def to_dict(self) -> dict:
        d = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "sample"}
        d["warnings"] = list(self.warnings)
        return {**d, **self.sample.to_dict()}


def tool_request(name: str, description: str | None) -> str:
    """The probe's request for one tool: its description, or its name with underscores as spaces."""
    text = (description or "").strip()
    return text if text else name.replace("_", " ").strip() or name


def probe_warnings(tools: int, picked: int, skipped: int, same_share: float, most_common: tuple[str, ...],
                   catalog_tools: int) -> tuple[str, ...]:
    """The warning sentences for these figures (module docstring)."""
    found: list[str] = []
    recall = picked / tools if tools else 0.0
    sampled = "" if tools + skipped >= catalog_tools else f" sampled of the catalog's {catalog_tools}"
    if recall < MIN_RECALL:
        found.append(f"the model picks a tool for its own description for {picked} of {tools} tools{sampled} "
                     f"(recall {recall:.2f}, below {MIN_RECALL}): it may not know these tools; {DESCRIBE_WHAT_TO_DO}")
    if catalog_tools >= 2 and tools and same_share >= SAME_ANSWER_SHARE:
        answer = ", ".join(most_common) if most_common else "the empty answer"
        found.append(f"{round(same_share * tools)} of {tools} tool requests get the same answer ({answer}; share "
                     f"{same_share:.2f}, warned at {SAME_ANSWER_SHARE}): the model answers regardless of the "
                     f"request; {DESCRIBE_WHAT_TO_DO}")
    if skipped:
        found.append(f"{skipped} tools' probe requests (their descriptions) do not fit --max-input-tokens once "
                     "rendered and were not probed; raise --max-input-tokens or shorten those descriptions")
    return tuple(found)


def probe_limits(limits: Limits, cfg, requests: int, kv_format=None) -> Limits:
    """The bundle's ``limits`` widened for ``requests`` probe requests (PROBE_SEQUENCES above): more sequences,
    the pages they reserve added to the pool (its pinned prefix pages kept), as many rows a step."""
    kv = kv_format or KV_BF16
    per_sequence = kv_pool_bytes(cfg, limits.pages_per_sequence, limits.page_size, kv)
    room = max(PROBE_KV_BYTES, kv_pool_bytes(cfg, limits.num_pages, limits.page_size, kv))
    sequences = max(limits.max_sequences, min(PROBE_SEQUENCES, requests, room // per_sequence))
    return dataclasses.replace(
        limits, max_sequences=sequences, max_tokens_per_step=max(limits.max_tokens_per_step, sequences),
        num_pages=limits.num_pages + (sequences - limits.max_sequences) * limits.pages_per_sequence)


def run_probe(weights_path: Path, cfg, grammar: Grammar, limits: Limits, descriptions: tuple[str | None, ...],
              encoder: PromptEncoder, sample: ProbeSample, kv_format=None, kv_scales=None) -> Probe:
    """Runs the probe requests of the ``sample``'s tools and the no-tool ones (greedy, up to PROBE_SEQUENCES at
    once: ``probe_limits``) on the written weights (their path, or them loaded: canary.written_weights).
    ``descriptions``: the catalog's, in tool order (None where a tool has none); ``encoder``: the runtime's
    prompt encoder for this bundle's tokenizer and template; ``kv_format``/``kv_scales``: the bundle's cache
    (default bf16). BuildError("build_failed") when the model computes NaN or Inf or a request cannot run."""
    all_names = grammar.tool_names
    names = [all_names[t] for t in sample.tool_ids]  # the probed tools; index i below is sample.tool_ids[i]
    texts = [tool_request(all_names[t], descriptions[t]) for t in sample.tool_ids] + list(NO_TOOL_REQUESTS)
    prompts = [tuple(encoder.encode(t)) for t in texts]
    fits = [len(p) <= limits.max_input_tokens for p in prompts]  # the prompt_too_long check, made here
    run = [i for i, ok in enumerate(fits) if ok]
    wide = probe_limits(limits, cfg, len(run), kv_format)
    generator = cpu_batcher(cfg, written_weights(weights_path, cfg), grammar, wide, kv_format=kv_format,
                            kv_scales=kv_scales)
    try:
        # the runtime's shared prefix: num_pages holds its pinned pages (the builder sized the pool for it);
        # the salt only keys this pool's page hashes
        generator.kv.enable_prefix_cache("catalog-probe")
        prefill_prefix(generator.model, generator.kv, encoder.prefix_ids, wide.prefill_chunk)
        results = generator.generate([Request(prompts[i]) for i in run])  # queued: as many at once as the pool holds
    except EngineError as e:
        if e.code != "numerics_invalid":
            raise
        raise BuildError("build_failed", f"the model computes NaN or Inf on a catalog probe request ({e.details}); "
                         "check config.json's numbers (rms_norm_eps, rope_theta, rope_scaling) and the weights",
                         reason=e.code, **e.details) from None
    answers: dict[int, frozenset[str]] = {}
    for i, res in zip(run, results):
        if not isinstance(res, Result):
            raise BuildError("build_failed", f"the catalog probe request {texts[i]!r} could not run: {res}",
                             reason=str(res))
        answers[i] = frozenset(res.tools)
    probed = [i for i in range(len(names)) if i in answers]  # sample positions whose request ran
    none_ids = [i for i in range(len(names), len(texts)) if i in answers]
    picked = sum(names[i] in answers[i] for i in probed)
    counts = Counter(answers[i] for i in probed)
    most_common, top = counts.most_common(1)[0] if counts else (frozenset(), 0)
    same_share = top / len(probed) if probed else 0.0
    none_rate = (sum(not answers[i] for i in none_ids) / len(none_ids)) if none_ids and grammar.allow_empty else 0.0
    return Probe(tools=len(probed), skipped_tools=len(names) - len(probed), no_tool_requests=len(none_ids),
                 recall=picked / len(probed) if probed else 0.0, distinct_answers=len(set(answers.values())),
                 same_answer_share=same_share, none_rate=none_rate, empty_allowed=grammar.allow_empty,
                 warnings=probe_warnings(len(probed), picked, len(names) - len(probed), same_share,
                                         tuple(sorted(most_common)), len(all_names)),
                 sample=sample)


def probe_refusal(probe: Probe, min_recall: float) -> BuildError:
    """BuildError("probe_failed") for a probe whose recall is below ``builder compile --min-probe-recall``."""
    picked = round(probe.recall * probe.tools)
    return BuildError("probe_failed", f"the catalog probe's recall is {probe.recall:.2f} ({picked} of {probe.tools} "
                      f"tools picked for a request made from their own description), below --min-probe-recall "
                      f"{min_recall}: the model does not know these tools and no bundle was written; "
                      f"{DESCRIBE_WHAT_TO_DO}, or lower --min-probe-recall", recall=probe.recall,
                      min_probe_recall=min_recall, tools=probe.tools, picked=picked,
                      distinct_answers=probe.distinct_answers, warnings=list(probe.warnings), **probe.sample.to_dict())
