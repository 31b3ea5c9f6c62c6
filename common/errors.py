"""Typed errors for every edge of the toolchain (files, CLI, requests, loads).

Each error has a stable ``code`` (a short snake_case string other programs may match on),
a human message that says what was expected, what was found and what to do, and
``details``: the numbers behind the message, for ``--json`` output.
"""
from __future__ import annotations

# code -> CLI exit code. Codes are part of the public interface: never renumber, only add.
EXIT_CODES: dict[str, int] = {
    # generic
    "usage": 2,
    "internal": 70,
    # builder inputs
    "checkpoint_invalid": 10,
    "tensor_invalid": 11,
    "quantize_invalid": 12,
    "catalog_invalid": 13,
    "build_failed": 14,
    "kernel_compile_failed": 15,
    "budget_too_small": 16,
    "output_exists": 17,
    "probe_failed": 18,  # builder compile --min-probe-recall: the model rarely picks a tool for its own description
    "kv_cache_unsafe": 19,  # builder compile --kv-cache fp8_e4m3: the canary's answers change with the scaled cache
    # runtime load refusals, in load order
    "missing_contract": 20,
    "schema_invalid": 21,
    "format_unsupported": 22,
    "file_missing": 23,
    "hash_mismatch": 24,
    "target_mismatch": 25,
    "no_gpu": 26,
    "driver_too_old": 27,
    "insufficient_memory": 28,
    "canary_failed": 29,
    "bundle_invalid": 30,
    # requests
    "prompt_too_long": 40,
    "kv_pages": 41,
    "too_many_sequences": 42,
    "request_invalid": 43,
    "grammar_violation": 44,
    # cuda
    "cuda_error": 50,
    "graph_stuck": 51,  # a WHILE graph never cleared its condition: the context is unusable
    "device_check_setup": 52,  # bench/gpu_check.py: what the device machine needs is missing
    "sim_unsupported": 53,  # the PTX executor met an instruction or directive it does not run
    "sim_fault": 54,  # the PTX executor's sanitizers: out of bounds, race, sync, uninitialized, misaligned, hang
    # numerics and outputs (issue 14)
    "numerics_invalid": 60,  # NaN/Inf in hidden states or logits: never a silent argmax
    "output_unsafe": 61,  # --out equal to, inside or containing an input (checkpoint, catalog)
    "output_unwritable": 62,  # --out cannot be written: permissions, read-only or full disk
    # prompt templates and the shared prefix (90-94)
    "template_invalid": 90,  # a catalog's prompt_template or tool_format is malformed
    "prompt_mismatch": 91,  # the bundle's tokenizer and template do not give the contract's prefix ids
    # serving (runtime serve): HTTP-side refusals
    "queue_full": 80,  # 429: the waiting queue is at its request or prompt-token bound
    "deadline_exceeded": 81,  # 504: the request's timeout_s passed before it finished
    "request_aborted": 82,  # the client went away; its sequence was dropped
    "draining": 83,  # 503: the server is loading or shutting down and admits nothing
    "unknown_tool": 84,  # 400: a tool outside the catalog, and the bundle takes no tools of a request
    "body_too_large": 85,  # 413: the request body is over the server's byte limit
    "not_found": 86,  # 404/405: no such endpoint or method
    "device_failed": 87,  # 503: the replica's device faulted (a lost context): it serves nothing more and exits
    "request_tools_too_large": 88,  # 400: more tools, or a longer description, than the contract's request_tools
    # placement (builder manifest)
    "unplaceable": 100,
}


class EngineError(Exception):
    """Base of all typed errors: ``code``, ``message`` and ``details`` (JSON-safe numbers)."""

    def __init__(self, code: str, message: str, **details):
        assert code in EXIT_CODES, f"unregistered error code {code!r}"
        super().__init__(message)
        self.code = code
        self.message = message
        self.details = details

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.code]

    def to_json(self) -> dict:
        return {"error": self.code, "message": self.message, "details": self.details}

    def __str__(self) -> str:
        return f"[{self.code}] {self.message}"


class CheckpointError(EngineError):
    """A checkpoint folder or tensor file is missing, malformed or disagrees with its config."""


class QuantizeError(EngineError):
    """A tensor cannot be quantized as asked (NaN/Inf, bad shape)."""


class CatalogError(EngineError):
    """A tool catalog is invalid; names the tool's index and name where one is at fault."""


class BuildError(EngineError):
    """The builder cannot produce a bundle from these inputs and options."""


class Refusal(EngineError):
    """The runtime refuses a bundle: this machine cannot honour its contract."""


class RequestError(EngineError):
    """A request is refused or invalid; other sequences are unaffected."""


class CudaError(EngineError):
    """A cuda-python call failed; the message names the call."""
