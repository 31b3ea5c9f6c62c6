"""``Engine.load(path)``: every check in DESIGN order, then load, canary gate, and serve requests."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from tokenizers import Tokenizer

from .bundle_checks import canary_mismatch, check_consistency
from .bundle import GRAMMAR_FILE, TOKENIZER_FILE, WEIGHTS_FILE, check_files, read_contract
from .contract import CPU_TARGET, Contract
from .cpu.model import CpuModel
from .cpu.dequant import load_dequantized
from .cpu import CPU_BACKENDS, available_cpus
from .cpu.fast_model import FastCpuModel, StoredWeights, load_stored
from common.errors import CudaError, EngineError, Refusal, RequestError
from . import progress
from .generator import Generator, Request, Result
from .grammar import Grammar
from .cpu.kv_pool import PagedKVPool
from .prefix_cache import prefill_prefix
from .prompt import PromptEncoder
from .machine import MachineFacts, check_target, facts_for
from .model_config import ModelConfig
from .sampling import Sampling
from .tensor_file import SafetensorsFile


def check_bundle(path: str | Path, facts: MachineFacts | None = None) -> Contract:
    """Every check that needs no loading, in load order; returns the contract or raises a Refusal."""
    contract = read_contract(path)
    check_files(path, contract)
    check_consistency(path, contract)
    check_target(contract, facts if facts is not None else facts_for(contract))
    return contract


def load_cpu_weights(weights_path: str | Path, cfg: ModelConfig, backend: str = "reference") -> dict | StoredWeights:
    """A bundle's weights for a CPU backend: reference, float32 under Hugging Face names
    (dequantized); fast, the stored arrays memory-mapped (StoredWeights)."""
    if backend == "fast":
        return load_stored(weights_path, cfg)
    with SafetensorsFile(weights_path, error_code="bundle_invalid") as st:
        return load_dequantized(st, list(cfg.tensor_shapes()))


def cpu_generator(cfg: ModelConfig, weights: dict | StoredWeights, grammar: Grammar, limits, head: str = "sparse",
                  threads: int | None = None) -> Generator:
    """A Generator on a CPU backend sized exactly as ``limits`` (a contract Limits) says: the fast
    backend for StoredWeights, the reference for a float32 dict."""
    pool = PagedKVPool(cfg, limits.num_pages, limits.page_size, limits.max_sequences,
                       limits.max_input_tokens + limits.max_output_tokens, kv_dtype="bf16")
    if isinstance(weights, StoredWeights):
        model = FastCpuModel(cfg, weights, limits.max_tokens_per_step, limits.max_input_tokens + limits.max_output_tokens,
                             threads if threads is not None else available_cpus())
    else:
        model = CpuModel(cfg, weights)
    return Generator(model, pool, grammar, max_input_tokens=limits.max_input_tokens,
                     max_output_tokens=limits.max_output_tokens, max_tokens_per_step=limits.max_tokens_per_step,
                     prefill_chunk=limits.prefill_chunk, head=head)


class Engine:
    """A loaded, canary-checked bundle bound to this machine."""

    def __init__(self, folder: Path, contract: Contract, generator: Generator, tokenizer: Tokenizer,
                 load_seconds: float):
        self.folder, self.contract, self.generator, self.tokenizer = folder, contract, generator, tokenizer
        self.grammar = generator.grammar
        self.prompt = PromptEncoder.create(tokenizer, self.grammar.prompt_template)
        self.load_seconds = load_seconds
        self.model = generator.model
        self.loop = None  # GPU bundles: the single-request decode graph (runtime/cuda/graph.py)

    @classmethod
    def load(cls, path: str | Path, facts: MachineFacts | None = None, head: str = "sparse",
             prefix_cache: bool = True, backend: str = "fast", threads: int | None = None) -> "Engine":
        """Checks, loads and canary-gates the bundle at ``path``; a Refusal names the first failed check.

        ``prefix_cache``: the template's fixed prefix is prefilled once into pinned KV pages every
        sequence shares, and finished prompts' full pages stay reusable; False computes every
        prompt in full (the cross-check: same answers). ``backend`` (CPU bundles): "fast" (stored
        weights, numba; ``threads`` workers, default the CPUs this process may use) or "reference" (numpy
        float32, the source of truth)."""
        assert backend in CPU_BACKENDS, backend
        start = time.perf_counter()
        folder = Path(path)
        contract = check_bundle(folder, facts)
        if contract.target.name != CPU_TARGET:
            return cls._load_gpu(folder, contract, head, start, prefix_cache)
        progress.stage("loading weights")
        try:
            tokenizer = Tokenizer.from_file(str(folder / TOKENIZER_FILE))
            grammar = Grammar.read(folder / GRAMMAR_FILE)
            weights = load_cpu_weights(folder / WEIGHTS_FILE, contract.model, backend)
        except EngineError:
            raise
        except Exception as e:  # a file that hashes right but does not parse: the builder wrote it wrong
            raise Refusal("bundle_invalid", f"bundle file failed to load: {type(e).__name__}: {e}",
                          reason=type(e).__name__) from None
        try:
            generator = cpu_generator(contract.model, weights, grammar, contract.limits, head, threads)
        except MemoryError:
            raise Refusal("insufficient_memory", f"the KV pool and step buffers of {contract.limits} do not fit "
                          "this machine's memory", needed=contract.memory.total_bytes, available=None) from None
        engine = cls(folder, contract, generator, tokenizer, 0.0)
        if backend == "fast":  # the pool's calloc'd pages made resident: a bound engine holds what the contract states
            for a in engine.generator.kv.k + engine.generator.kv.v:
                a.view(np.uint8).fill(0)
        del weights
        engine.share_prefix(prefix_cache)
        progress.stage("canary")
        engine.check_canary()
        progress.done()
        engine.load_seconds = time.perf_counter() - start
        return engine

    @classmethod
    def _load_gpu(cls, folder: Path, contract: Contract, head: str, start: float,
                  prefix_cache: bool = True) -> "Engine":
        """GPU bundle, after the target check: load the CUDA backend, canary-gate both decode paths."""
        from .cuda.backend import load_cuda_model
        from .cuda.graph import CudaDecodeLoop
        try:
            tokenizer = Tokenizer.from_file(str(folder / TOKENIZER_FILE))
            grammar = Grammar.read(folder / GRAMMAR_FILE)
        except EngineError:
            raise
        except Exception as e:
            raise Refusal("bundle_invalid", f"bundle file failed to load: {type(e).__name__}: {e}",
                          reason=type(e).__name__) from None
        progress.stage("loading the CUDA backend")
        try:
            model = load_cuda_model(folder, contract, grammar)  # frees what it took if it fails
        except EngineError:
            raise
        except Exception as e:  # a binding or driver surprise: typed, never a traceback
            raise CudaError("cuda_error", f"loading the CUDA backend failed: {type(e).__name__}: {e}",
                            reason=type(e).__name__) from None
        try:
            lim = contract.limits
            generator = Generator(model, model.kv, grammar, max_input_tokens=lim.max_input_tokens,
                                  max_output_tokens=lim.max_output_tokens, max_tokens_per_step=lim.max_tokens_per_step,
                                  prefill_chunk=lim.prefill_chunk, head=head)
            engine = cls(folder, contract, generator, tokenizer, 0.0)
            engine.loop = CudaDecodeLoop(model)
            engine.share_prefix(prefix_cache)
            progress.stage("canary")
            engine.check_canary()
            progress.done()
        except CudaError as e:
            if "timeout_s" not in e.details:  # a loop that never ended leaves the device busy: closing would block
                model.close()
            raise
        except BaseException:
            model.close()
            raise
        engine.load_seconds = time.perf_counter() - start
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
            if self.loop is not None and generator is self.generator:
                paths.append(("decode graph", [self.loop.generate(p.prompt_token_ids) for p in canary.prompts]))
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
                    where = f" ({path})" if self.loop is not None or path != "generator" else ""
                    raise Refusal("canary_failed", f"canary prompt {k}{where} differs from the record in its "
                                  f"{bad['what']}: {bad}; this machine or these weights compute another model: "
                                  "do not serve from it", prompt=k, path=path, **bad)

    def close(self) -> None:
        """Frees the device memory of a GPU engine (no-op on the CPU backend)."""
        close = getattr(self.model, "close", None)
        if close is not None:
            close()

    def encode(self, text: str) -> tuple[int, ...]:
        """Prompt ids of a request text (runtime/prompt.py: fixed prefix, the text as plain text,
        suffix); RequestError("request_invalid") for empty, blank or malformed text."""
        return self.prompt.encode(text)

    def request(self, text: str, sampling: Sampling = Sampling(), tools: list[str] | None = None) -> Request:
        """The Request for a text (wrapped in the prompt template); ``tools``, catalog names, restricts
        the answer to those (RequestError("unknown_tool") naming any name outside the catalog)."""
        subset = None
        if tools is not None:
            index = {name: i for i, name in enumerate(self.grammar.tool_names)}
            unknown = [t for t in tools if t not in index]
            if unknown or not tools:
                raise RequestError("unknown_tool", f"tools {unknown[:8]} are not in the bundle's catalog of "
                                   f"{len(index)} tools; name tools from GET /v1/models" if unknown else
                                   "the tools subset is empty; name at least one catalog tool or leave it out",
                                   unknown=unknown[:8], num_tools=len(index))
            subset = tuple(sorted({index[t] for t in tools}))
        return Request(self.encode(text), sampling, tools=subset)

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
