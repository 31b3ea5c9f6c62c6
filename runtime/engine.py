"""``Engine.load(path)``: every check in DESIGN order, then load, canary gate, and serve requests."""
from __future__ import annotations

import time
from pathlib import Path

import numpy as np

from tokenizers import Tokenizer

from .bundle import GRAMMAR_FILE, TOKENIZER_FILE, WEIGHTS_FILE, check_files, read_contract
from .contract import CPU_TARGET, Contract
from .cpu.model import CpuModel
from .cpu.dequant import load_dequantized
from .cpu.fast_model import FastCpuModel, StoredWeights, load_stored
from common.errors import CudaError, EngineError, Refusal
from .generator import Generator, Request, Result
from .grammar import Grammar
from .cpu.kv_pool import PagedKVPool
from .machine import MachineFacts, check_target, facts_for
from .model_config import ModelConfig
from .sampling import Sampling
from .tensor_file import SafetensorsFile


def check_bundle(path: str | Path, facts: MachineFacts | None = None) -> Contract:
    """Every check that needs no loading, in load order; returns the contract or raises a Refusal."""
    contract = read_contract(path)
    check_files(path, contract)
    check_target(contract, facts if facts is not None else facts_for(contract))
    return contract


CPU_BACKENDS = ("fast", "reference")  # fast: numba on the stored weights; reference: numpy float32


def load_cpu_weights(weights_path: str | Path, cfg: ModelConfig, backend: str = "reference") -> dict | StoredWeights:
    """A bundle's weights for a CPU backend: reference, float32 under Hugging Face names
    (dequantized); fast, the stored arrays memory-mapped (StoredWeights)."""
    if backend == "fast":
        return load_stored(weights_path, cfg)
    with SafetensorsFile(weights_path) as st:
        return load_dequantized(st, list(cfg.tensor_shapes()))


def cpu_generator(cfg: ModelConfig, weights: dict | StoredWeights, grammar: Grammar, limits, head: str = "sparse",
                  threads: int | None = None) -> Generator:
    """A Generator on a CPU backend sized exactly as ``limits`` (a contract Limits) says: the fast
    backend for StoredWeights, the reference for a float32 dict."""
    pool = PagedKVPool(cfg, limits.num_pages, limits.page_size, limits.max_sequences,
                       limits.max_input_tokens + limits.max_output_tokens, kv_dtype="bf16")
    if isinstance(weights, StoredWeights):
        model = FastCpuModel(cfg, weights, limits.max_tokens_per_step,
                             limits.max_input_tokens + limits.max_output_tokens, threads)
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
        self.load_seconds = load_seconds
        self.model = generator.model
        self.loop = None  # GPU bundles: the single-request decode graph (runtime/cuda/graph.py)

    @classmethod
    def load(cls, path: str | Path, facts: MachineFacts | None = None, head: str = "sparse",
             backend: str = "fast", threads: int | None = None) -> "Engine":
        """Checks, loads and canary-gates the bundle at ``path``; a Refusal names the first failed check.

        ``backend`` (CPU bundles): "fast" (stored weights, numba; ``threads`` workers, default the
        machine's cores) or "reference" (numpy float32, the source of truth)."""
        assert backend in CPU_BACKENDS, backend
        start = time.perf_counter()
        folder = Path(path)
        contract = check_bundle(folder, facts)
        if contract.target.name != CPU_TARGET:
            return cls._load_gpu(folder, contract, head, start)
        try:
            tokenizer = Tokenizer.from_file(str(folder / TOKENIZER_FILE))
            grammar = Grammar.read(folder / GRAMMAR_FILE)
            weights = load_cpu_weights(folder / WEIGHTS_FILE, contract.model, backend)
        except EngineError:
            raise
        except Exception as e:  # a file that hashes right but does not parse: the builder wrote it wrong
            raise Refusal("bundle_invalid", f"bundle file failed to load: {type(e).__name__}: {e}",
                          reason=type(e).__name__) from None
        engine = cls(folder, contract, cpu_generator(contract.model, weights, grammar, contract.limits, head,
                                                     threads), tokenizer, 0.0)
        if backend == "fast":  # the pool's calloc'd pages made resident: a bound engine holds what the contract states
            for a in engine.generator.kv.k + engine.generator.kv.v:
                a.view(np.uint8).fill(0)
        del weights
        engine.check_canary()
        engine.load_seconds = time.perf_counter() - start
        return engine

    @classmethod
    def _load_gpu(cls, folder: Path, contract: Contract, head: str, start: float) -> "Engine":
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
            engine.check_canary()
        except CudaError as e:
            if "timeout_s" not in e.details:  # a loop that never ended leaves the device busy: closing would block
                model.close()
            raise
        except BaseException:
            model.close()
            raise
        engine.load_seconds = time.perf_counter() - start
        return engine

    def check_canary(self) -> None:
        """Refusal("canary_failed") unless the canary prompt gives exactly the recorded ids (on a
        GPU: through host-driven stepping and through the decode graph, each)."""
        canary = self.contract.canary
        expected = list(canary.expected_token_ids)
        (result,) = self.generator.generate([Request(tuple(canary.prompt_token_ids))])
        paths = [("generator", result.token_ids if isinstance(result, Result) else [])]
        if self.loop is not None:
            paths.append(("decode graph", self.loop.generate(canary.prompt_token_ids).token_ids))
        for path, got in paths:
            if got != expected:
                where = f" ({path})" if self.loop is not None else ""
                raise Refusal("canary_failed", f"canary output {got}{where} differs from the recorded "
                              f"{expected}; this machine computes the model differently: do not serve from it",
                              expected=expected, got=got, path=path)

    def close(self) -> None:
        """Frees the device memory of a GPU engine (no-op on the CPU backend)."""
        close = getattr(self.model, "close", None)
        if close is not None:
            close()

    def encode(self, text: str) -> tuple[int, ...]:
        return tuple(self.tokenizer.encode(self.grammar.render_prompt(text)).ids)

    def run(self, texts: list[str], sampling: Sampling = Sampling()) -> list[Result | EngineError]:
        """Each request text wrapped in the catalog's prompt template, answered (or refused)."""
        return self.generator.generate([Request(self.encode(t), sampling) for t in texts])
