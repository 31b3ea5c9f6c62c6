"""The single-request greedy decode loop as one CUDA graph, and its host-stepped twin.

Graph of a prompt of n prefill chunks (C = the contract's prefill_chunk rows each but the last, which
launches the fewest rows of ``last_chunk_rows``' buckets that hold the prompt's rest: tile-sized rows
times a power of two, at most C; its padding rows have seq -1, which every kernel skips or zeroes):
    chunk 0 -> ... -> chunk n-1 -> first sample -> WHILE(cond) { one decode step + sample }
Every node's arguments are fixed device pointers: the request's prompt rows, its slot and
its grammar state are copied into preallocated buffers before the launch, and the host
reads nothing until the answer is done. grammar_advance writes the next token and position
into the decode-row buffer the next iteration reads, and sets the WHILE condition
(cudaGraphSetConditional) to "still running". The condition starts at 1 on every launch,
so the body runs at least once (a sequence already finished only recomputes its last row).

``mode="host"`` launches the very same launch lists step by step from the host (condition
handle 0, reading the condition after each step): the cross-check, which must give
identical tokens. Instantiated graphs are cached per prompt shape (chunks, last chunk's rows; a few, LRU).
"""
from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np

from toolcall.common.errors import RequestError
from toolcall.kernels.launch import first_error
from toolcall.runtime.cuda.buffers import graph_chunks, offset
from toolcall.runtime.cuda.graph_build import GraphBuilder
from toolcall.runtime.cuda.launches import StepRows

FINISH = {1: "done", 2: "length", 3: "dead_end"}  # grammar_advance status codes
EXEC_CACHE = 4  # instantiated request graphs kept, by prompt shape
RUN_TIMEOUT_S = 20.0  # a graph still running after this never cleared its condition


@dataclass(frozen=True)
class PromptShape:
    """A prompt's prefill launches: ``chunks`` chunks, the last of them ``last_rows`` rows (padding included)."""

    chunks: int
    last_rows: int


@dataclass
class LoopResult:
    token_ids: list[int]
    finish: str
    device_ms: float  # graph: launch to completion (CUDA events); host: wall time of the stepping


class DecodeGraph:
    """Greedy grammar-bounded generation of one request at a time on a CudaModel."""

    def __init__(self, model):
        m = self.m = model
        lim = m.limits
        self.C, self.chunks = lim.prefill_chunk, graph_chunks(lim)
        self.R = self.chunks * self.C  # prompt rows the buffers hold
        rpt = self.tile_rows = m.family.rows_per_tile(m.cfg.num_heads, m.cfg.num_kv_heads)
        start = np.arange(0, self.C, rpt, dtype=np.int32)
        tiles = np.zeros((2, self.C), np.int32)  # one full chunk's fixed tiles: (start, len)
        tiles[0, :len(start)], tiles[1, :len(start)] = start, np.minimum(rpt, self.C - start)
        m.gpu.copy_in(m.ws["graph_tiles"], tiles)
        d = m.ws["decode_rows"]  # int32 [4]: token, pos, seq, row
        self.d = {k: offset(d, 4 * i) for i, k in enumerate(("token", "pos", "seq", "row"))}
        self.execs: dict = {}
        factory = getattr(m.gpu, "graph_builder", None)  # a host emulation of the device may bring its own
        self.builder = factory(m) if factory is not None else None if m.dry else GraphBuilder(m)
        m.closers.append(self.close)

    # ---- launch lists ----
    def shape(self, prompt_tokens: int) -> PromptShape:
        """The launches of a prompt of ``prompt_tokens`` (1 .. max_input_tokens)."""
        chunks = -(-prompt_tokens // self.C)
        return PromptShape(chunks, self.last_chunk_rows(prompt_tokens - (chunks - 1) * self.C))

    def last_chunk_rows(self, rows: int) -> int:
        """Rows launched for a last chunk of ``rows`` prompt rows: tile_rows x 2^k >= rows, at most C. A power of
        two keeps few graphs (log2 of C / tile_rows shapes a chunk count); whole tiles keep the full chunk's tile
        table valid for its first rows."""
        launched = self.tile_rows
        while launched < rows:
            launched *= 2
        return min(launched, self.C)

    def chunk(self, i: int, rows: int | None = None):
        """Prefill chunk i: ``rows`` (default C) rows from row i*C of the prompt-row buffers."""
        p, C, R = self.m.ws["prompt_rows"], self.C, self.R
        rows = C if rows is None else rows
        assert 0 < rows <= C, (rows, C)
        tiles = self.m.ws["graph_tiles"]
        steps = StepRows(rows, offset(p, 4 * i * C), offset(p, 4 * (R + i * C)), offset(p, 4 * (2 * R + i * C)),
                         (tiles, offset(tiles, 4 * C), -(-rows // self.tile_rows)))
        return self.m.steps.forward(steps)

    def first_sample(self):
        return self.m.steps.sample(self.d, self.d["row"], 0)

    def body(self, cond_handle: int):
        """One decode step of the sequence in the decode rows, then its sample (sets the condition)."""
        rows = StepRows(1, self.d["token"], self.d["seq"], self.d["pos"], None)
        return self.m.steps.forward(rows) + self.m.steps.sample(self.d, None, cond_handle)

    def plan(self, shape: PromptShape) -> list:
        """The launches before the WHILE node for a prompt of ``shape``."""
        n = shape.chunks
        return [ln for i in range(n) for ln in self.chunk(i, shape.last_rows if i == n - 1 else None)] + \
            self.first_sample()

    # ---- one request ----
    def prepare(self, prompt_ids) -> tuple[int, PromptShape]:
        """Admits the prompt and copies its rows, slot and fresh grammar state in; (slot, its launches' shape)."""
        m, P, lim = self.m, len(prompt_ids), self.m.limits
        if not 0 < P <= lim.max_input_tokens:
            raise RequestError("prompt_too_long" if P else "request_invalid",
                               f"the prompt has {P} tokens; this loop takes 1..{lim.max_input_tokens}",
                               limit=lim.max_input_tokens, got=P)
        ids = np.asarray(prompt_ids, np.int64)
        if ids.min() < 0 or ids.max() >= m.cfg.vocab_size:
            raise RequestError("request_invalid", f"prompt token ids outside the vocabulary [0, {m.cfg.vocab_size})",
                               vocab_size=m.cfg.vocab_size)
        slot = m.kv.admit(P + lim.max_output_tokens)
        try:
            m.kv.sync()
            shape = self.shape(P)
            rows = np.full((3, self.R), -1, np.int32)  # tokens, seq, pos; padding: -1 (skipped / zeros)
            rows[0, :P], rows[1, :P], rows[2, :P] = ids, slot, np.arange(P)
            m.gpu.copy_in(m.ws["prompt_rows"], rows)
            self.place_row(0, P - 1, slot, P - 1 - (shape.chunks - 1) * self.C)
            self.reset_answer(slot)
        except BaseException:
            m.kv.release(slot)
            raise
        return slot, shape

    def place_row(self, token: int, position: int, slot: int, row: int = 0) -> None:
        """The decode row: ``token`` at ``position`` of ``slot``'s sequence (``row``: the prompt row the first
        sample reads)."""
        self.m.gpu.copy_in(self.m.ws["decode_rows"], np.array([token, position, slot, row], np.int32))

    def reset_answer(self, slot: int) -> None:
        """``slot``'s grammar at the root with no tool used, its answer empty, the catalog's rules."""
        m, words = self.m, 1 + self.m.grammar.bitset_words
        m.gpu.copy_in(offset(m.ws["gram_state"], 8 * words * slot), np.zeros(words, np.uint64))
        for name in ("gram_status", "out_len"):
            m.gpu.copy_in(offset(m.ws[name], 4 * slot), np.zeros(1, np.int32))
        m.gpu.copy_in(offset(m.ws["gram_max_tools"], 4 * slot), np.array([m.grammar.max_tools], np.int32))
        m.gpu.copy_in(offset(m.ws["gram_allow_empty"], slot), np.array([m.grammar.allow_empty], np.uint8))

    def collect(self, slot: int) -> tuple[list[int], str]:
        m = self.m
        n = int(m.gpu.download(offset(m.ws["out_len"], 4 * slot), (1,), np.int32)[0])
        status = int(m.gpu.download(offset(m.ws["gram_status"], 4 * slot), (1,), np.int32)[0])
        row = offset(m.ws["out_tokens"], 4 * slot * m.limits.max_output_tokens)
        return m.gpu.download(row, (n,), np.int32).tolist(), FINISH.get(status, f"status {status}")

    def generate(self, prompt_ids, mode: str = "graph") -> LoopResult:
        """Greedy answer of one prompt: ``graph`` (one launch) or ``host`` (stepped, same kernels)."""
        assert mode in ("graph", "host")
        slot, shape = self.prepare(prompt_ids)
        try:
            if mode == "graph":
                ms = self.launch(self.exec_for(shape))
            else:
                ms = self.step_host(shape)
            tokens, finish = self.collect(slot)
        except BaseException:
            self.m.reset_split_counters()  # a loop that stopped part-way may leave counts mid-merge
            raise
        finally:
            self.m.kv.release(slot)
        return LoopResult(tokens, finish, ms)

    def step_host(self, shape: PromptShape) -> float:
        m, start, n = self.m, time.perf_counter(), shape.chunks
        for i in range(n):
            rows = shape.last_rows if i == n - 1 else self.C
            m.program(("chunk", i, rows), lambda i=i, rows=rows: self.chunk(i, rows)).run()
        m.program(("first",), self.first_sample).run()
        for _ in range(m.limits.max_output_tokens + 1):
            m.program(("body",), lambda: self.body(0)).run()
            m.sync()
            if m.gpu.download(m.ws["cond"], (1,), np.int32)[0] == 0:  # a dry run reads 0
                break
        return 1e3 * (time.perf_counter() - start)

    # ---- graphs ----
    def exec_for(self, shape: PromptShape):
        """The instantiated graph for a prompt of ``shape`` (built on first use, kept LRU)."""
        if shape in self.execs:
            self.execs[shape] = self.execs.pop(shape)  # most recent last
            return self.execs[shape]
        if len(self.execs) >= EXEC_CACHE:
            self.builder.destroy(self.execs.pop(next(iter(self.execs))))
        self.execs[shape] = self.builder.instantiate(self.plan(shape), self.body)
        return self.execs[shape]

    def launch(self, exe, timeout_s: float = RUN_TIMEOUT_S) -> float:
        """Launches an instantiated graph and waits (bounded) for it; device milliseconds."""
        return self.builder.launch(exe, timeout_s)

    def close(self) -> None:
        """Destroys the cached graphs and the builder; best effort, the first error raised last."""
        execs, self.execs = list(self.execs.values()), {}
        builder, self.builder = self.builder, None
        if builder is not None:
            first_error([lambda e=exe: builder.destroy(e) for exe in execs] + [builder.close])
