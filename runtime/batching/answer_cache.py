"""Finished answers' K/V rows, kept with their prompt's last page so a repeated request copies them.

A sequence's answer rows depend only on its prompt and its answer tokens up to each row (the same
bits whatever shares the step: runtime/batching/batcher.py). When a sequence that owns its prompt's cached
last page (the page ``PageAllocator`` registered under the prompt's tail key, or a full last page)
finishes, that page and the pages after it that hold answer rows stay cached, idle, as one
transcript: the prompt length, the answer tokens whose rows were written, and those pages in order.

A later request with the same prompt finds the transcript through the page it copies its prompt rows
from. At each step that feeds it a chunk of answer rows (the last pick and the tokens the grammar
forced after it), the chunk's rows whose tokens, and every answer token before them, equal the
transcript's are copied (``copy_rows``) instead of computed; the chunk's last row, whose logits pick
the next token, is always computed. So a repeated greedy request computes one row per decision, not
one per answer token, and its answer, logits and K/V are those it gets alone. Answers that part ways
(another tools subset, sampling) stop copying at the first token that differs.

Transcript pages are evicted like any idle cached page (deepest first: the answer's end goes before
its start); evicting one cuts the transcript there, evicting its first page ends it.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass


@dataclass(eq=False)
class Transcript:
    prompt_len: int
    answer: tuple[int, ...]  # answer tokens whose rows were written (the fed ones)
    first_page: int  # page index, in the sequence, of pages[0]: the page of the last prompt token
    pages: list[int]  # pool pages holding positions first_page * page_size ... in order
    rows: int  # answer rows still held: answer[:rows] (eviction cuts it)


def answer_page_key(prompt_key: bytes, index: int) -> bytes:
    """The cache key of a transcript's ``index``-th page past its first (its own domain: never a prompt's)."""
    return hashlib.sha256(b"answer\0" + prompt_key + index.to_bytes(4, "little")).digest()


class AnswerCache:
    """Transcripts by their first page, and each transcript page's (transcript, index)."""

    def __init__(self, page_size: int):
        self.page_size = page_size
        self.by_first: dict[int, Transcript] = {}
        self.page_of: dict[int, tuple[Transcript, int]] = {}
        self.copied_rows = 0  # answer rows copied instead of computed, in all

    def keep(self, prompt_len: int, answer: tuple[int, ...], first_page: int, pages: list[int]) -> None:
        """Records the transcript of a finished sequence whose rows in ``pages`` are final."""
        assert pages[0] not in self.by_first and not any(p in self.page_of for p in pages)
        t = Transcript(prompt_len, answer, first_page, pages, len(answer))
        self.by_first[pages[0]] = t
        for i, page in enumerate(pages):
            self.page_of[page] = (t, i)

    def evicted(self, page: int) -> None:
        """``page`` leaves the cache: its transcript ends before it (all of it, for its first page)."""
        held = self.page_of.get(page)
        if held is None:
            return
        t, index = held
        for p in t.pages[index:]:
            del self.page_of[p]
        del t.pages[index:]
        t.rows = max(0, min(t.rows, (t.first_page + index) * self.page_size - t.prompt_len))
        if index == 0:
            del self.by_first[page]

    def rows_to_copy(self, t: Transcript, output: list[int], fed: int, n: int) -> int:
        """Of a chunk of ``n`` answer rows starting at answer token ``fed``, how many leading ones the
        transcript holds with the same tokens up to them (never the chunk's last row)."""
        have = min(fed + n - 1, t.rows)
        if have <= fed or list(t.answer[:have]) != output[:have]:
            return 0
        return have - fed

    def spans(self, t: Transcript, start: int, rows: int) -> list[tuple[int, int, int, int]]:
        """(page index in the sequence, transcript page, first row in the page, rows) covering positions
        start .. start + rows - 1 (positions line up: the same page index and row in both sequences)."""
        ps, out = self.page_size, []
        position, stop = start, start + rows
        while position < stop:
            index = position // ps
            first = position - index * ps
            count = min(stop, (index + 1) * ps) - position
            out.append((index, t.pages[index - t.first_page], first, count))
            position += count
        return out

