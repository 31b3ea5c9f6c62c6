"""``Engine.load(path)``: every check in load order (docs/bundle-format.md, "Load order"), then load, the
canary gate, and requests answered."""
from __future__ import annotations

import time
from pathlib import Path

from tokenizers import Tokenizer

from toolcall.common.errors import CudaError, EngineError, Refusal, RequestError
from toolcall.runtime import console
from toolcall.runtime.backends import CPU_BACKENDS, NATIVE, Backend, LoadOptions, device_for, say_notice, target_kind
from toolcall.runtime.batching.batcher import Request, Result, StepBatcher
from toolcall.runtime.batching.prefix_cache import prefill_prefix
from toolcall.runtime.batching.prompt import PromptEncoder
from toolcall.runtime.batching.request_tools import RequestTools
from toolcall.runtime.batching.sampling import Sampling
from toolcall.runtime.bundle.checks import canary_mismatch, check_consistency
from toolcall.runtime.bundle.contract import Contract
from toolcall.runtime.bundle.files import GRAMMAR_FILE, TOKENIZER_FILE, check_files, read_contract
from toolcall.runtime.bundle.kv_scales import KV_SCALES_FILE, KvScales
from toolcall.runtime.bundle.machine import MachineFacts, check_target
from toolcall.runtime.grammar.tool_text import Tool
from toolcall.runtime.grammar.trie import Grammar


def check_bundle(path: str | Path, facts: MachineFacts | None = None, device: str = NATIVE) -> Contract:
    """Every check that needs no loading, in load order; returns the contract or raises a Refusal. ``device``: where
    the bundle is to run (runtime/cuda/devices.py DEVICES: "native", or "sim" for a GPU bundle on the simulated
    device); ``facts`` in place of the device's own (tests)."""
    contract = read_contract(path)
    chosen = device_for(device, contract)
    check_files(path, contract)
    check_consistency(path, contract)
    check_target(contract, facts if facts is not None else chosen.facts(contract))
    return contract


def read_tokenizer_and_grammar(folder: Path) -> tuple[Tokenizer, Grammar]:
    """The bundle's tokenizer and grammar; Refusal("bundle_invalid") for a file that hashes right but does
    not parse (the builder wrote it wrong)."""
    try:
        return Tokenizer.from_file(str(folder / TOKENIZER_FILE)), Grammar.read(folder / GRAMMAR_FILE)
    except EngineError:
        raise
    except Exception as e:
        raise Refusal("bundle_invalid", f"bundle file failed to load: {type(e).__name__}: {e}",
                      reason=type(e).__name__) from None


class Engine:
    """A loaded, canary-checked bundle bound to this machine. ``model``: its backend (runtime/backends.py);
    ``generator``: the StepBatcher that answers requests on it; ``decode_graph``: GPU bundles' single-request
    decode graph (runtime/cuda/graph.py), else None."""

    def __init__(self, folder: Path, contract: Contract, generator: StepBatcher, tokenizer: Tokenizer,
                 load_seconds: float):
        self.folder, self.contract, self.generator, self.tokenizer = folder, contract, generator, tokenizer
        self.grammar = generator.grammar
        self.prompt = PromptEncoder.create(tokenizer, self.grammar.prompt_template)
        self.request_tools = RequestTools(contract.request_tools, self.grammar, self.prompt)
        self._catalog_index = {name: i for i, name in enumerate(self.grammar.tool_names)}
        self.load_seconds = load_seconds
        self.model: Backend = generator.model
        self.decode_graph = None
        self.device = NATIVE  # where it runs (runtime/cuda/devices.py DEVICES); Engine.load sets it

    @classmethod
    def load(cls, path: str | Path, facts: MachineFacts | None = None, head: str = "sparse",
             prefix_cache: bool = True, backend: str = "fast", threads: int | None = None,
             gpu_kernels: str = LoadOptions.gpu_kernels, device: str = NATIVE) -> "Engine":
        """Checks, loads and canary-gates the bundle at ``path``; a Refusal names the first failed check.

        ``prefix_cache``: the template's fixed prefix is prefilled once into pinned KV pages every
        sequence shares, and finished prompts' full pages stay reusable; False computes every
        prompt in full (the cross-check: same answers). ``backend`` (CPU bundles): "fast" (stored
        weights, numba; ``threads`` workers, default the CPUs this process may use) or "reference" (numpy
        float32, the source of truth). ``gpu_kernels`` (GPU bundles): the kernel family of the linear layers and
        prefill attention, "fma" (CUDA cores) or "mma" (tensor cores). ``device``: "native", or "sim" to run a GPU
        bundle on the simulated device (runtime/cuda/devices.py), which says so once on stderr."""
        assert backend in CPU_BACKENDS, backend
        start = time.perf_counter()
        folder = Path(path)
        contract = check_bundle(folder, facts, device)
        kind = target_kind(contract)
        say_notice(device_for(device, contract), contract)
        console.stage("loading weights")
        tokenizer, grammar = read_tokenizer_and_grammar(folder)
        options = LoadOptions(backend, threads, gpu_kernels, device)
        model = kind.load(folder, contract, grammar, options)  # frees what it took if it fails
        try:
            try:
                kv_format = contract.precision.kv_format
                scales = KvScales.read(folder / KV_SCALES_FILE, contract.model) if kv_format.scaled else None
                kv = model.new_kv_pool(contract.limits, kv_format, scales)
            except MemoryError:
                raise Refusal("insufficient_memory", f"the KV pool of {contract.limits} does not fit this "
                              "machine's memory", needed=contract.memory.total_bytes, available=None) from None
            engine = cls(folder, contract, StepBatcher.for_limits(model, kv, grammar, contract.limits, head),
                         tokenizer, 0.0)
            if kind.decode_graph is not None:
                engine.decode_graph = kind.decode_graph(model)
            engine.share_prefix(prefix_cache)
            note = kind.first_use_note()
            console.stage(f"canary ({note})" if note else "canary")
            engine.check_canary()
            console.done()
        except CudaError as e:
            if "timeout_s" not in e.details:  # a loop that never ended leaves the device busy: closing would block
                model.close()
            raise
        except BaseException:
            model.close()
            raise
        engine.load_seconds = time.perf_counter() - start
        engine.device = device
        return engine

    def share_prefix(self, enabled: bool) -> None:
        """Checks the tokenizer gives the contract's prefix ids; if ``enabled``, turns on the KV pool's
        prefix cache and prefills the fixed prefix into its pinned pages (before the canary, which
        then runs through them)."""
        recorded = self.contract.prompt
        if self.prompt.prefix_ids != tuple(recorded.prefix_token_ids) or \
                self.prompt.suffix_ids != tuple(recorded.suffix_token_ids):
            raise Refusal("prompt_mismatch", f"the bundle's tokenizer and template give a prompt prefix of "
                          f"{len(self.prompt.prefix_ids)} and suffix of {len(self.prompt.suffix_ids)} tokens, not the "
                          f"contract's {recorded.prefix_tokens} and {len(recorded.suffix_token_ids)} (or other ids); "
                          "the bundle was altered: rebuild it", expected_prefix_tokens=recorded.prefix_tokens,
                          found_prefix_tokens=len(self.prompt.prefix_ids))
        if enabled:
            kv = self.generator.kv
            kv.enable_prefix_cache(self.contract.engine.bundle_id)
            try:
                prefill_prefix(self.model, kv, self.prompt.prefix_ids, self.contract.limits.prefill_chunk)
            except RequestError as e:  # the builder sized the pool and the limits for it: the contract was edited
                raise Refusal("bundle_invalid", f"the prompt prefix of {len(self.prompt.prefix_ids)} tokens does not "
                              f"fit the contract's KV pool or limits ({e.message}); rebuild the bundle",
                              prefix_tokens=len(self.prompt.prefix_ids), reason=e.code) from None

    def check_canary(self, generator=None) -> None:
        """Refusal("canary_failed") unless each canary request encodes to its recorded prompt ids
        (the tokenizer and template are the bundle's own) and answers with exactly the recorded
        ids, every recorded candidate's logit within the contract's tolerance (on a GPU the
        decode graph must give the same ids too). NaN/Inf on the way is a refusal as well.
        ``generator``: another one over this engine's model to check the same way (the server's
        lanes, whose fused layer loop this also compiles before the port reports ready)."""
        canary = self.contract.canary
        generator = self.generator if generator is None else generator
        for k, p in enumerate(canary.prompts):
            try:
                ids = tuple(self.encode(p.request))
            except EngineError as e:
                ids = e.code
            if ids != tuple(p.prompt_token_ids):
                raise Refusal("canary_failed", f"canary request {k} {p.request!r} encodes to {ids} with this "
                              f"bundle's tokenizer and prompt template, not the recorded {list(p.prompt_token_ids)}: "
                              "the tokenizer or template was replaced: do not serve from it", prompt=k,
                              expected=list(p.prompt_token_ids), found=ids if isinstance(ids, str) else list(ids))
        try:
            results = generator.generate([Request(tuple(p.prompt_token_ids), keep_logits=True)
                                          for p in canary.prompts])
            paths = [("generator" if generator is self.generator else type(generator).__name__.lower(), results)]
            if self.decode_graph is not None and generator is self.generator:
                paths.append(("decode graph", [self.decode_graph.generate(p.prompt_token_ids) for p in canary.prompts]))
        except EngineError as e:
            if e.code not in ("numerics_invalid", "request_invalid", "prompt_too_long", "kv_pages"):
                raise
            raise Refusal("canary_failed", f"the canary could not run: {e}; do not serve from this bundle",
                          reason=e.code, **e.details) from None
        for path, runs in paths:
            for k, (p, r) in enumerate(zip(canary.prompts, runs)):
                if isinstance(r, EngineError):
                    raise Refusal("canary_failed", f"canary prompt {k} was refused ({r}); do not serve from it",
                                  prompt=k, reason=r.code, path=path)
                if getattr(r, "step_logits", None) is not None:
                    bad = canary_mismatch(p, r.token_ids, r.step_logits, r.step_candidates, canary.logit_tolerance)
                else:  # the decode graph returns tokens only
                    bad = canary_mismatch(p, r.token_ids, [], [], 0.0) if r.token_ids != list(
                        p.expected_token_ids) else None
                if bad is not None:
                    where = f" ({path})" if self.decode_graph is not None or path != "generator" else ""
                    raise Refusal("canary_failed", f"canary prompt {k}{where} differs from the record in its "
                                  f"{bad['what']}: {bad}; this machine or these weights compute another model: "
                                  "do not serve from it", prompt=k, path=path, **bad)

    def close(self) -> None:
        """Frees what the backend holds (device memory of a GPU engine)."""
        self.model.close()

    def encode(self, text: str) -> tuple[int, ...]:
        """Prompt ids of a request text (runtime/batching/prompt.py: fixed prefix, the text as plain text,
        suffix); RequestError("request_invalid") for empty, blank or malformed text."""
        return self.prompt.encode(text)

    def request(self, text: str, sampling: Sampling = Sampling(), tools: list[str | Tool] | None = None, *,
                only: list[str] | None = None, max_tools: int | None = None, require_tool: bool = False,
                max_output_tokens: int | None = None) -> Request:
        """The Request for a text (wrapped in the prompt template).

        ``tools`` (names, or ``Tool`` with descriptions): all catalog names restrict the answer to those; any
        name outside the catalog makes them the request's own tools (runtime/batching/request_tools.py: the
        prompt rendered with them, a grammar built for them; RequestError where the bundle takes none or a
        limit is passed). ``only``: names among those tools (or the catalog's) the answer may name.
        ``max_tools``, ``require_tool`` and ``max_output_tokens`` as runtime/batching/scheduler.py Request."""
        tools = None if tools is None else [t if isinstance(t, Tool) else Tool(t) for t in tools]
        catalog = self._catalog_index
        if tools is not None and self.request_tools.takes_tools and any(t.name not in catalog for t in tools):
            own = self.request_tools.tool_set(tools)
            subset = None if only is None else self._subset(only, {n: i for i, n in enumerate(own.names)},
                                                            "request's")
            return Request(own.prompt.encode(text), sampling, tools=subset, max_tools=max_tools,
                           require_tool=require_tool, max_output_tokens=max_output_tokens, grammar=own.stepper)
        names = None if tools is None else [t.name for t in tools]
        if only is not None:
            names = [n for n in only if names is None or n in names] if only else []
            if not names:
                raise RequestError("request_invalid", f"the answer may name only {only[:8]}, none of which is among "
                                   "the request's tools; name one of them", field="tool_choice", only=only[:8])
        note = "" if self.request_tools.takes_tools else (
            " (its prompt template has no {tools}: it takes no tools of a request)")
        subset = None if names is None else self._subset(names, catalog, "bundle's catalog of", note,
                                                         takes_request_tools=self.request_tools.takes_tools)
        return Request(self.encode(text), sampling, tools=subset, max_tools=max_tools, require_tool=require_tool,
                       max_output_tokens=max_output_tokens)

    @staticmethod
    def _subset(names: list[str], index: dict[str, int], where: str, note: str = "", **details) -> tuple[int, ...]:
        """The tool indices of ``names`` (RequestError("unknown_tool") naming any outside ``index``)."""
        unknown = [n for n in names if n not in index]
        if unknown or not names:
            raise RequestError("unknown_tool", f"tools {unknown[:8]} are not in the {where} {len(index)} "
                               f"tools{note}; name tools from GET /v1/models" if unknown else
                               "the tools subset is empty; name at least one tool or leave it out",
                               unknown=unknown[:8], num_tools=len(index), **details)
        return tuple(sorted({index[n] for n in names}))

    def submit(self, text: str, sampling: Sampling = Sampling(), tools: list[str] | None = None) -> int:
        """Enqueues one request text on the generator (the caller owns the step loop); its handle."""
        return self.generator.submit(self.request(text, sampling, tools))

    def run(self, texts: list[str], sampling: Sampling = Sampling()) -> list[Result | EngineError]:
        """Each request text wrapped in the catalog's prompt template, answered (or refused: a bad
        text refuses that request only)."""
        results: list[Result | EngineError | None] = [None] * len(texts)
        requests, where = [], []
        for i, text in enumerate(texts):
            try:
                requests.append(Request(self.encode(text), sampling))
                where.append(i)
            except RequestError as e:
                results[i] = e
        for i, res in zip(where, self.generator.generate(requests)):
            results[i] = res
        return results  # type: ignore[return-value]
