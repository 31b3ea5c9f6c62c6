"""The serving step with the grammar and the sampling on the device (CudaModel.step for the sparse head).

One step: the host packs the plan (the forward's rows, as ``CudaModel.forward``, in one copy; each sampled row's
grammar state, answer rules and sampling in another: runtime/cuda/step_io.py); the device runs the forward, the
final norm of the sampled rows, then per grammar (the bundle's, or the tools a request brought, their arrays
uploaded once per list) grammar_candidates -> head_sparse -> sample_draw -> grammar_advance; one copy brings
the record back. The hidden rows stay on the device; each row emits one token a step (the pick: a token the
grammar forces comes as the next step's pick, the same tokens as the host's forced runs, in more steps).
Greedy rows pick as the host picker does (argmax, first of equal logits); sampled rows draw as the CPU does
(kernels/sample_draw.cu), so the answers equal the host path's.
"""
from __future__ import annotations

import time
from collections import OrderedDict

import numpy as np

from toolcall.common.errors import EngineError
from toolcall.kernels.declarations import DRAW_MAX_CANDIDATES, Launch
from toolcall.runtime.batching.sampling import inverse_temperature, margins
from toolcall.runtime.batching.step import PickRows, StepPlan, StepRecord
from toolcall.runtime.cuda.buffers import DeviceArena, offset
from toolcall.runtime.cuda.launches import StepRows
from toolcall.runtime.cuda.step_io import StepIO, bucket
from toolcall.runtime.cuda.weights import GRAMMAR_ARRAYS

REQUEST_GRAMMARS = 64  # request-supplied tool lists whose arrays stay on the device (least recently used out)
DEAD_END = 3  # grammar_advance's status for a row with no allowed candidate


class DeviceGrammars:
    """Device copies of grammar arrays: the bundle's (in the weights arena) and, uploaded on first use, those of
    the tool lists requests bring, by grammar identity (the host caches one Grammar a list). Each upload has its
    own serial number, never reused: packed programs are keyed by it, so none outlives the arrays it points at.
    An evicted list's arrays are freed by ``release`` after the step's sync, never while its kernels may be queued."""

    def __init__(self, model):
        self.m, self.gpu, self.cache = model, model.gpu, OrderedDict()  # the gpu kept: close() drops model.gpu first
        arena = model.weights.arena
        self.bundle = {n: arena["grammar." + n] for n in GRAMMAR_ARRAYS}
        self.serials = 0  # 0: the bundle's grammar
        self.retired: list[DeviceArena] = []  # evicted arrays, freed by release()

    def arrays(self, grammar) -> tuple[int, dict]:
        """(serial, the arrays by name) of ``grammar`` on the device."""
        if grammar is self.m.grammar:
            return 0, self.bundle
        key = id(grammar)
        if key in self.cache:
            self.cache.move_to_end(key)
            _, _, serial, views = self.cache[key]
            return serial, views
        if len(self.cache) >= REQUEST_GRAMMARS:
            _, (_, arena, _, _) = self.cache.popitem(last=False)
            self.retired.append(arena)
        host = {n: np.ascontiguousarray(getattr(grammar, n)) for n in GRAMMAR_ARRAYS}
        arena = DeviceArena({n: a.nbytes for n, a in host.items()}).allocate(self.gpu)
        for n, a in host.items():
            self.gpu.copy_in(arena[n], a)
        views = {n: arena[n] for n in GRAMMAR_ARRAYS}
        self.serials += 1
        self.cache[key] = (grammar, arena, self.serials, views)  # the grammar held: its id stays its own while cached
        return self.serials, views

    def release(self) -> None:
        """Frees the evicted lists' arrays (after a sync: no queued kernel reads them)."""
        while self.retired:
            self.retired.pop().free(self.gpu)

    def free(self) -> None:
        self.release()
        while self.cache:
            _, (_, arena, _, _) = self.cache.popitem()
            arena.free(self.gpu)


class DeviceStep:
    """Steps of a CudaModel with the picks on the device (module docstring)."""

    def __init__(self, model):
        m = self.m = model
        self.rows = min(m.limits.max_tokens_per_step, m.limits.max_sequences)
        self.words = 1 + m.state_words  # grammar state words a row may need (1 + the widest bitset)
        self.io = StepIO(m.gpu, m.ws["step_io"], self.rows, m.columns, self.words)
        self.grammars = DeviceGrammars(m)

    def free(self) -> None:
        self.grammars.free()

    def step(self, plan: StepPlan, picker) -> StepRecord:
        """The record of ``plan``'s sampled rows (StepRecord, in ``plan.picks`` order)."""
        m, rows = self.m, plan.picks
        T = len(plan.tokens)
        groups = rows.groups(picker.stepper) if len(rows) else []
        layout = self._pack(plan, rows, groups)
        # every group's grammar on the device before the first launch (an upload is a copy, an eviction retires)
        arrays = [self.grammars.arrays(stepper.grammar) for stepper, _, _, _ in layout]
        n_tiles, launched, decode = self._forward_rows(plan)
        self.io.upload()
        if n_tiles is None:  # decode rows only: the decode kernel, the rows padded to their bucket
            m.program(("decode", launched), lambda: self._decode_launches(launched)).run()
        else:  # prefill chunks, after the step's leading decode rows (the decode kernel) where it has some
            m.program(("forward", launched, n_tiles, decode),
                      lambda: self._mixed_launches(launched, n_tiles, decode)).run()
        total = sum(n for _, _, _, n in layout)
        if total:
            m.program(("step_norm", total), lambda: [m.steps.final_norm(total, self.io.device("out_row"))]).run()
            for (stepper, index, g0, n), (serial, views) in zip(layout, arrays):
                m.program(("step_sample", serial, g0, n),
                          lambda s=stepper, a=g0, b=n, g=views: self._sample_launches(s.grammar, g, a, b)).run()
        m.sync()
        self.grammars.release()
        self.io.download()
        return self._record(rows, groups, layout, time.perf_counter())

    # ---- the plan ----
    def _forward_rows(self, plan: StepPlan) -> tuple[int | None, int, int]:
        """The forward's rows into ws["rows"] (as CudaModel.forward): (prefill tiles, rows launched, leading decode
        rows). The leading answer rows (the batcher lays them first) that are alone in their sequence take the
        decode kernel; every prompt row takes the prefill tiles, counted from the first of them, even a prompt's
        only row of the step (the end of a prompt the KV pool had cached, a chunk cut by the step's budget): a
        prompt row's bits then never depend on its company, since the prefill attention gives a row the same bits
        whatever tile holds it, and the decode kernel other bits (bench/bit_gates.py). A step of answer rows only
        takes the decode kernel alone: no tiles (None). Either way the rows are padded to their bucket (token, seq
        and pos -1: the kernels skip them), and a mixed step's tiles too (tile_len 0: the attention kernels skip
        them), so the programs come from a few shapes."""
        m, T = self.m, len(plan.tokens)
        _, first, counts = np.unique(np.asarray(plan.slots), return_index=True, return_counts=True)
        alone = np.zeros(T + 1, bool)  # the sentinel ends the leading run
        alone[first[counts == 1]] = True
        alone[plan.answer_rows:] = False
        decode = int(np.argmin(alone))  # the leading answer rows alone in their sequence
        launched = bucket(T, m.limits.max_tokens_per_step)
        if decode == T:
            m.write_rows(plan.tokens, plan.slots, plan.positions, tiles_from=None, launched=launched)
            return None, launched, launched
        n_tiles = m.write_rows(plan.tokens, plan.slots, plan.positions, tiles_from=decode, launched=launched)
        return bucket(n_tiles, m.limits.max_tokens_per_step), launched, decode

    def _decode_launches(self, T: int) -> list[Launch]:
        return self.m.steps.forward(StepRows(T, *self.m.row_views()[:3], None))

    def _mixed_launches(self, T: int, n_tiles: int, decode: int) -> list[Launch]:
        tokens, seq, pos, start, length = self.m.row_views()
        return self.m.steps.forward(StepRows(T, tokens, seq, pos, (start, length, n_tiles), decode))

    def _pack(self, plan: StepPlan, rows: PickRows, groups) -> list[tuple[object, np.ndarray, int, int]]:
        """Fills the plan fields, group by group; [(stepper, the group's row indices, first buffer row, launched
        rows)] (launched rows: the group's rows padded to its bucket)."""
        io, W = self.io, self.words
        io.clear()
        io["out_row"][:] = -1
        io["seq"][:] = -1
        layout, g0 = [], 0
        later = len(rows)  # sampled rows of this group and the ones after it: padding leaves them room
        for stepper, index, states in groups:
            n = len(index)
            later -= n
            assert n <= self.rows - g0 - later, f"{len(rows)} sampled rows; the step buffers hold {self.rows}"
            launched = bucket(n, self.rows - g0 - later)
            span = slice(g0, g0 + n)
            out = np.asarray(plan.outputs)[index]
            io["out_row"][span] = out
            io["seq"][span] = np.arange(n)
            io["token"][span] = np.asarray(plan.tokens)[out]
            io["pos"][span] = np.asarray(plan.positions)[out]
            io["answer"][span] = [rows.answer_index[b] for b in index]
            io["max_tools"][span] = rows.max_tools[index]
            io["allow_empty"][span] = rows.allow_empty[index]
            for j, b in enumerate(index):
                s = rows.sampling[b]
                io["inv_temperature"][g0 + j] = inverse_temperature(s.temperature) if s.temperature > 0 else 0.0
                io["top_p"][g0 + j], io["seed"][g0 + j] = s.top_p, s.seed
            words = 1 + stepper.grammar.bitset_words
            assert words <= W, f"a grammar of {words} state words; the step buffers hold {W}"
            io["state"][g0 * W:g0 * W + n * words] = np.ascontiguousarray(states).view(np.uint64).reshape(-1)
            layout.append((stepper, index, g0, launched))
            g0 += launched
        return layout

    def _sample_launches(self, grammar, ga: dict, g0: int, n: int) -> list[Launch]:
        """One group's rows (buffer rows g0 .. g0 + n - 1) under ``grammar`` (its device arrays ``ga``): candidates,
        head, draw, advance."""
        m, io, cfg = self.m, self.io, self.m.cfg
        M, words = grammar.max_edges_per_node, 1 + grammar.bitset_words
        if M > DRAW_MAX_CANDIDATES:  # the load refuses such a bundle (CudaModel); never a launch the kernel refuses
            raise EngineError("internal", f"a grammar of {M} candidates a step reached the CUDA draw, which takes at "
                              f"most {DRAW_MAX_CANDIDATES}", max_edges_per_node=M, limit=DRAW_MAX_CANDIDATES)
        wide = m.columns  # the buffers' columns: a group's rows are M wide from its first row on
        cand, valid = io.device("cand", g0, 4 * wide), io.device("valid", g0, wide)
        logits, pick = io.device("logits", g0, 4 * wide), io.device("pick", g0)
        seq, state, status = io.device("seq", g0), io.device("state", g0, 8 * self.words), io.device("status", g0)
        sizes = dict(n_words=words - 1, n_nodes=grammar.num_nodes, max_edges=M, B=n)
        normed = offset(m.ws["normed"], 4 * cfg.hidden_size * g0)
        return [
            Launch("grammar_candidates", dict(
                sample_seq=seq, state=state, status=status, node_edge_start=ga["node_edge_start"],
                edge_token=ga["edge_token"], edge_kind=ga["edge_kind"], edge_bits=ga["edge_bits"],
                n_tools=grammar.num_tools, max_tools=io.device("max_tools", g0),
                allow_empty=io.device("allow_empty", g0),
                **sizes, cand=cand, valid=valid)),
            Launch("head_sparse", dict(xn=normed, x_stride=cfg.hidden_size, cand=cand, valid=valid,
                                       table=m.weights.arena[m.weights.head], hidden=cfg.hidden_size,
                                       vocab=cfg.vocab_size, n_cand=M, B=n, out=logits)),
            Launch("sample_draw", dict(logits=logits, valid=valid, stride=M, width=M,
                                       inv_temperature=io.device("inv_temperature", g0), top_p=io.device("top_p", g0),
                                       seed=io.device("seed", g0), token=io.device("answer", g0), B=n, out=pick)),
            Launch("grammar_advance", dict(
                cand_logits=logits, cand=cand, valid=valid, pick=pick, sample_seq=seq, token_in=io.device("token", g0),
                pos_in=io.device("pos", g0), node_edge_start=ga["node_edge_start"], edge_child=ga["edge_child"],
                edge_kind=ga["edge_kind"], edge_tool=ga["edge_tool"], **sizes, max_out=1, state=state, status=status,
                out_tokens=io.device("out_tokens", g0), out_len=io.device("out_len", g0),
                token_out=io.device("token_out", g0), pos_out=io.device("pos_out", g0), sync_ws=m.ws["sync_ws"],
                cond_out=m.ws["cond"], cond_handle=0)),
        ]

    # ---- the record ----
    def _packed(self, name: str, g0: int, n: int, M: int) -> np.ndarray:
        """A group's (n, M) rows of a candidate field: the kernels write them packed at the group's own width M
        from buffer row g0 on, not at the buffer's row stride (its columns, the widest grammar's)."""
        flat = self.io[name].reshape(-1)
        start = g0 * self.io[name].shape[1]
        return flat[start:start + n * M].reshape(n, M)

    def _record(self, rows: PickRows, groups, layout, now: float) -> StepRecord:
        io, W = self.io, self.words
        B = len(rows)
        states, done, tokens, closed = [None] * B, [False] * B, [[] for _ in range(B)], [[] for _ in range(B)]
        gaps, kept_logits, kept_cand = [np.inf] * B, [None] * B, [None] * B
        for (stepper, index, g0, _), (_, _, before) in zip(layout, groups):
            n, M, words = len(index), stepper.grammar.max_edges_per_node, 1 + stepper.grammar.bitset_words
            span = slice(g0, g0 + n)
            if (io["status"][span] == DEAD_END).any():
                raise EngineError("internal", "a sampled row had no allowed candidate on the device",
                                  rows=[int(index[j]) for j in np.flatnonzero(io["status"][span] == DEAD_END)])
            logits, valid, cand = (self._packed(name, g0, n, M) for name in ("logits", "valid", "cand"))
            valid = valid.astype(bool)
            if not np.isfinite(logits[valid]).all():  # never a silent pick
                raise EngineError("numerics_invalid", "NaN or Inf in the logits of this step; the weights or the "
                                  "backend are broken: do not serve from this engine",
                                  nonfinite_logits=int((~np.isfinite(logits[valid])).sum()))
            new = io["state"][g0 * W:g0 * W + n * words].copy().view(stepper.dtype)  # (n,) records
            finished = stepper.done_batch(new)
            fresh = new["used"] & ~np.ascontiguousarray(before)["used"]  # the tool each row closed, if any
            row_gaps = margins(logits, valid)
            for j, b in enumerate(index.tolist()):
                states[b], done[b] = new[j], bool(finished[j])
                tokens[b] = [int(io["token_out"][g0 + j])]
                closed[b] = [w * 64 + bit for w, word in enumerate(fresh[j].tolist()) for bit in range(64)
                             if word >> bit & 1]
                gaps[b] = float(row_gaps[j])
                if rows.keep_logits[b]:
                    kept_logits[b], kept_cand[b] = logits[j].copy(), cand[j].copy()
        if rows.steppers is None and B:  # one group, every row in order: its array is the states
            states = np.concatenate([s[None] for s in states]).astype(groups[0][0].dtype, copy=False)
        return StepRecord(states, done, tokens, closed, gaps, kept_logits, kept_cand, now)

