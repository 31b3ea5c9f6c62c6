"""A no-op engine for measuring the HTTP stack's own ceiling (bench/serve_burst.py).

Same tokenizer, grammar and contract as the bundle, no weights and no model: every request is answered,
empty, at the next step. Served by ``python3 bench/noop_engine.py BUNDLE --port 0``: `runtime serve`'s
server, options and allocator with this engine in place of the bundle's.
"""
from __future__ import annotations

from pathlib import Path

import checkout  # noqa: E402  (bench/checkout.py: this checkout as `toolcall`)
from tokenizers import Tokenizer

checkout.use()

from toolcall.common.errors import RequestError
from toolcall.runtime.batching.batcher import Result
from toolcall.runtime.batching.pages import PageAllocator
from toolcall.runtime.bundle.files import GRAMMAR_FILE, TOKENIZER_FILE, read_contract
from toolcall.runtime.engine import Engine
from toolcall.runtime.grammar.trie import Grammar


class NoopBackend:
    """The Backend interface's serving side (runtime/backends.py), with nothing to run."""

    threads = max_threads = None
    lanes_supported = False

    def bind_thread(self) -> None:
        pass

    def close(self) -> None:
        pass


class NoopGenerator:
    """The step batcher's interface the engine thread drives, answering every request with no tokens."""

    def __init__(self, grammar: Grammar, limits):
        self.grammar, self.model = grammar, NoopBackend()
        self.kv = PageAllocator(limits.num_pages, limits.page_size, limits.max_sequences,
                                limits.max_input_tokens + limits.max_output_tokens)
        self._waiting: dict[int, int] = {}  # handle -> prompt tokens
        self._next = 0

    def check(self, request) -> None:
        if not request.prompt_ids:
            raise RequestError("request_invalid", "the prompt is empty; send at least one token")

    def submit(self, request, queue: bool = True, checked: bool = False) -> int:
        if not checked:
            self.check(request)
        self._next += 1
        self._waiting[self._next] = len(request.prompt_ids)
        return self._next

    @property
    def busy(self) -> bool:
        return bool(self._waiting)

    def counts(self) -> tuple[int, int, int]:
        return len(self._waiting), sum(self._waiting.values()), 0

    def step(self):
        done = [(h, Result([], [], "done", float("inf"), 0.0, 0.0)) for h in self._waiting]
        self._waiting.clear()
        return done

    def abort(self, handle: int) -> bool:
        return self._waiting.pop(handle, None) is not None

    def abort_all(self) -> None:
        self._waiting.clear()


def load_noop(path: str | Path) -> Engine:
    """An Engine over the bundle's contract, tokenizer and grammar with a NoopGenerator (no canary)."""
    folder = Path(path)
    contract = read_contract(folder)
    grammar = Grammar.read(folder / GRAMMAR_FILE)
    return Engine(folder, contract, NoopGenerator(grammar, contract.limits),
                  Tokenizer.from_file(str(folder / TOKENIZER_FILE)), 0.0)


def main() -> None:
    """``python3 bench/noop_engine.py BUNDLE [--host H] [--port P] [--request-timeout S]``: serves the no-op
    engine exactly as `runtime serve` serves a bundle (its ready line on stdout)."""
    import argparse
    import os
    import sys

    from toolcall.runtime.serve.server import main as serve_main
    from toolcall.runtime.serve.state import ServeConfig

    if not os.environ.get("PYTHONMALLOC"):  # the C allocator, as `runtime serve` runs on
        os.environ["PYTHONMALLOC"] = "malloc"
        os.execv(sys.executable, [sys.executable, *sys.orig_argv[1:]])
    parser = argparse.ArgumentParser(description=main.__doc__)
    parser.add_argument("bundle")
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--request-timeout", type=float, default=60.0)
    args = parser.parse_args()
    serve_main(args.bundle, args.host, args.port, ServeConfig(request_timeout_s=args.request_timeout),
               load=lambda: load_noop(args.bundle), label="no-op engine")


if __name__ == "__main__":
    main()
