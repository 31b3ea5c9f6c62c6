"""A no-op engine for measuring the HTTP stack's own ceiling (bench/serve_burst.py).

Same tokenizer, grammar and contract as the bundle, no weights and no model: every
request is answered, empty, at the next step. Served with `runtime serve --noop-engine`;
never a product path.
"""
from __future__ import annotations

from pathlib import Path

from tokenizers import Tokenizer

from common.errors import RequestError
from ..bundle import GRAMMAR_FILE, TOKENIZER_FILE, read_contract
from ..engine import Engine
from ..generator import Result
from ..grammar import Grammar
from ..page_allocator import PageAllocator


class NoopGenerator:
    """The generator interface the engine loop drives, answering every request with no tokens."""

    def __init__(self, grammar: Grammar, limits):
        self.grammar, self.model = grammar, None
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
