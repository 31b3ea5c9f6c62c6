"""The single-request greedy decode loop as one CUDA graph, and its host-stepped twin.

Graph of a prompt of n prefill chunks (C = the contract's prefill_chunk rows each, the last
padded with rows of seq -1 that every kernel skips or zeroes):
    chunk 0 -> ... -> chunk n-1 -> first sample -> WHILE(cond) { one decode step + sample }
Every node's arguments are fixed device pointers: the request's prompt rows, its slot and
its grammar state are copied into preallocated buffers before the launch, and the host
reads nothing until the answer is done. grammar_advance writes the next token and position
into the decode-row buffer the next iteration reads, and sets the WHILE condition
(cudaGraphSetConditional) to "still running". The condition starts at 1 on every launch,
so the body runs at least once (a sequence already finished only recomputes its last row).

``mode="host"`` launches the very same launch lists step by step from the host (condition
handle 0, reading the condition after each step): the cross-check, which must give
identical tokens. Instantiated graphs are cached per chunk count (a few, LRU).
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
EXEC_CACHE = 4  # instantiated request graphs kept, by chunk count
RUN_TIMEOUT_S = 20.0  # a graph still running after this never cleared its condition


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
        rpt = m.family.rows_per_tile(m.cfg.num_heads, m.cfg.num_kv_heads)
        start = np.arange(0, self.C, rpt, dtype=np.int32)
        tiles = np.zeros((2, self.C), np.int32)  # one full chunk's fixed tiles: (start, len)
        tiles[0, :len(start)], tiles[1, :len(start)] = start, np.minimum(rpt, self.C - start)
        m.gpu.copy_in(m.ws["graph_tiles"], tiles)
        self.n_tiles = len(start)
        d = m.ws["decode_rows"]  # int32 [4]: token, pos, seq, row
        self.d = {k: offset(d, 4 * i) for i, k in enumerate(("token", "pos", "seq", "row"))}
        self.execs: dict = {}
        factory = getattr(m.gpu, "graph_builder", None)  # a host emulation of the device may bring its own
        self.builder = factory(m) if factory is not None else None if m.dry else GraphBuilder(m)
        m.closers.append(self.close)

    # ---- launch lists ----
    def chunk(self, i: int):
        """Prefill chunk i: rows i*C .. i*C+C-1 of the prompt-row buffers."""
        p, C, R = self.m.ws["prompt_rows"], self.C, self.R
        rows = StepRows(C, offset(p, 4 * i * C), offset(p, 4 * (R + i * C)), offset(p, 4 * (2 * R + i * C)),
                        (self.m.ws["graph_tiles"], offset(self.m.ws["graph_tiles"], 4 * C), self.n_tiles))
        return self.m.steps.forward(rows)

    def first_sample(self):
        return self.m.steps.sample(self.d, self.d["row"], 0)

    def body(self, cond_handle: int):
        """One decode step of the sequence in the decode rows, then its sample (sets the condition)."""
        rows = StepRows(1, self.d["token"], self.d["seq"], self.d["pos"], None)
        return self.m.steps.forward(rows) + self.m.steps.sample(self.d, None, cond_handle)

    def plan(self, n: int) -> list:
        """The launches before the WHILE node for a prompt of ``n`` chunks."""
        return [ln for i in range(n) for ln in self.chunk(i)] + self.first_sample()

    # ---- one request ----
    def prepare(self, prompt_ids) -> tuple[int, int]:
        """Admits the prompt and copies its rows, slot and fresh grammar state in; (slot, chunks)."""
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
            n = -(-P // self.C)
            rows = np.full((3, self.R), -1, np.int32)  # tokens, seq, pos; padding: -1 (skipped / zeros)
            rows[0, :P], rows[1, :P], rows[2, :P] = ids, slot, np.arange(P)
            m.gpu.copy_in(m.ws["prompt_rows"], rows)
            self.place_row(0, P - 1, slot, P - 1 - (n - 1) * self.C)
            self.reset_answer(slot)
        except BaseException:
            m.kv.release(slot)
            raise
        return slot, n

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
        slot, n = self.prepare(prompt_ids)
        try:
            if mode == "graph":
                ms = self.launch(self.exec_for(n))
            else:
                ms = self.step_host(n)
            tokens, finish = self.collect(slot)
        except BaseException:
            self.m.reset_split_counters()  # a loop that stopped part-way may leave counts mid-merge
            raise
        finally:
            self.m.kv.release(slot)
        return LoopResult(tokens, finish, ms)

    def step_host(self, n: int) -> float:
        m, start = self.m, time.perf_counter()
        for i in range(n):
            m.program(("chunk", i), lambda i=i: self.chunk(i)).run()
        m.program(("first",), self.first_sample).run()
        for _ in range(m.limits.max_output_tokens + 1):
            m.program(("body",), lambda: self.body(0)).run()
            m.sync()
            if m.gpu.download(m.ws["cond"], (1,), np.int32)[0] == 0:  # a dry run reads 0
                break
        return 1e3 * (time.perf_counter() - start)

    # ---- graphs ----
    def exec_for(self, n: int):
        """The instantiated graph for ``n`` chunks (built on first use, kept LRU)."""
        if n in self.execs:
            self.execs[n] = self.execs.pop(n)  # most recent last
            return self.execs[n]
        if len(self.execs) >= EXEC_CACHE:
            self.builder.destroy(self.execs.pop(next(iter(self.execs))))
        self.execs[n] = self.builder.instantiate(self.plan(n), self.body)
        return self.execs[n]

    def launch(self, exe, timeout_s: float = RUN_TIMEOUT_S) -> float:
        """Launches an instantiated graph and waits (bounded) for it; device milliseconds."""
        return self.builder.launch(exe, timeout_s)

    def close(self) -> None:
        """Destroys the cached graphs and the builder; best effort, the first error raised last."""
        execs, self.execs = list(self.execs.values()), {}
        builder, self.builder = self.builder, None
        if builder is not None:
            first_error([lambda e=exe: builder.destroy(e) for exe in execs] + [builder.close])
