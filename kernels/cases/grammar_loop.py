"""The grammar decode loop: grammar_candidates -> head_gather -> grammar_advance, stepped from the host
(cond_handle 0; tests/test_kernels_gpu_loop.py also runs it as the body of a WHILE conditional graph node). The
kernels must write exactly the answers of the numpy references (kernels/reference.py), which follow the grammar
stepper.

The two grammars are frozen as data (grammars.npz, the arrays and sizes the kernels and references read), since
kernels/ may not import the builder; tests/test_kernels_gpu_loop.py checks them against the builder's and
regenerates the file."""
from __future__ import annotations

from importlib import resources
from types import SimpleNamespace

import numpy as np

from toolcall.kernels import reference as ref
from toolcall.kernels.cases import KernelCase
from toolcall.kernels.declarations import Launch
from toolcall.kernels.runner import KernelRunner

# the builder's inputs of each grammar: tool i's token path, the answer format (tests/test_kernels_gpu_loop.py
# builds them with builder.trie.grammar_from_paths, SEP 1000, END 1001)
GRAMMAR_SOURCES = {"prefix": dict(paths=[[5], [5, 6], [7, 8, 9], [7, 10]], max_tools=3),
                   "wide": dict(paths=[[i % 50, 200 + i % 3] for i in range(70)], max_tools=4, allow_empty=True)}
GRAMMAR_ARRAYS = ("node_edge_start", "edge_token", "edge_child", "edge_kind", "edge_tool", "edge_bits")
GRAMMAR_SIZES = ("num_nodes", "num_tools", "max_edges_per_node", "bitset_words", "max_tools", "allow_empty")
GRAMMARS_FILE = "grammars.npz"  # "{name}/{field}" -> array (sizes as 0-d int64)


def load_grammar(name: str) -> SimpleNamespace:
    """The frozen grammar ``name``: GRAMMAR_ARRAYS as arrays, GRAMMAR_SIZES as ints (allow_empty a bool)."""
    with resources.files(__package__).joinpath(GRAMMARS_FILE).open("rb") as f, np.load(f) as data:
        g = {k: data[f"{name}/{k}"] for k in GRAMMAR_ARRAYS}
        g |= {k: int(data[f"{name}/{k}"]) for k in GRAMMAR_SIZES}
    g["allow_empty"] = bool(g["allow_empty"])
    return SimpleNamespace(**g)


class Loop:
    """One grammar decode loop's arrays: S sequence slots, B sample rows, fixed dense logits."""

    def __init__(self, rng, g, max_out=24, vocab=1002):
        self.g, self.max_out, self.vocab = g, max_out, vocab
        self.M, self.W, S = g.max_edges_per_node, g.bitset_words, 6
        self.seq = np.array([0, 2, -1, 3, 5], np.int32)
        self.B = len(self.seq)
        self.state = np.zeros((S, 1 + self.W), np.uint64)  # all at the root, no tool used
        # but sequence 0: a subset of tool 0 alone (every other tool's bit set, as a request's subset starts), so
        # no separator after it, however likely (its row's SEP logit is raised below)
        keep = np.zeros(64 * self.W, bool)
        keep[0] = keep[g.num_tools:] = True  # bits past the catalog stay clear
        self.state[0, 1:] = np.packbits(~keep, bitorder="little").view("<u8")
        self.status = np.zeros(S, np.int32)
        self.status[5] = 1
        # each sequence's own rules: the catalog's, one with at most one tool, one needing a tool
        self.max_tools = np.full(S, g.max_tools, np.int32)
        self.max_tools[2] = 1
        self.allow_empty = np.full(S, g.allow_empty, np.uint8)
        self.allow_empty[3] = 0
        self.out_tokens = np.zeros((S, max_out), np.int32)
        self.out_len = np.zeros(S, np.int32)
        self.token = np.full(self.B, 7, np.int32)
        self.pos = np.arange(10, 10 + self.B, dtype=np.int32)
        self.logits = rng.standard_normal((self.B, vocab)).astype(np.float32)
        self.logits[:, 1000] -= 1.5  # SEP a little less likely, so answers hold 1-2 tools
        self.logits[0, 1000] += 10.0  # but the subset row's: taken wherever it is allowed

    def reference(self):
        """(out_tokens, out_len, status) of the loop run to the end with the references."""
        st, status = self.state.copy(), self.status.copy()
        toks, lens = self.out_tokens.copy(), self.out_len.copy()
        token, pos = self.token.copy(), self.pos.copy()
        for _ in range(10 * self.max_out):
            cand, valid = ref.grammar_candidates(self.seq, st, status, self.g, self.M, self.max_tools,
                                                 self.allow_empty)
            cl = ref.head_gather(self.logits, cand, valid)
            token, pos, cond = ref.grammar_advance(cl, cand, valid, self.seq, token, pos, self.g,
                                                   self.max_out, st, status, toks, lens)
            if not cond:
                return toks, lens, status, st
        raise AssertionError("reference loop did not stop")


def body_launches(lp: Loop, dev_arrays: dict, cond_handle: int) -> list[Launch]:
    """The decode-loop body: candidates -> candidate logits -> advance."""
    a, g = dev_arrays, lp.g
    sizes = dict(n_words=lp.W, n_nodes=g.num_nodes, max_edges=lp.M, B=lp.B)
    grammar = dict(sample_seq=a["seq"], state=a["state"], status=a["status"], node_edge_start=a["nes"],
                   edge_kind=a["ekind"])
    return [
        Launch("grammar_candidates", dict(**grammar, edge_token=a["etok"], edge_bits=a["ebits"], n_tools=g.num_tools,
                                          max_tools=a["max_tools"], allow_empty=a["allow_empty"], **sizes,
                                          cand=a["cand"], valid=a["valid"])),
        Launch("head_gather", dict(logits=a["logits"], cand=a["cand"], valid=a["valid"], vocab=lp.vocab,
                                   n_cand=lp.M, B=lp.B, out=a["cl"])),
        Launch("grammar_advance", dict(**grammar, cand_logits=a["cl"], cand=a["cand"], valid=a["valid"], pick=None,
                                       token_in=a["token"], pos_in=a["pos"], edge_child=a["echild"],
                                       edge_tool=a["etool"], **sizes, max_out=lp.max_out, out_tokens=a["out_tokens"],
                                       out_len=a["out_len"], token_out=a["token"], pos_out=a["pos"],
                                       sync_ws=a["ws"], cond_out=a["cond"], cond_handle=cond_handle)),
    ]


def upload_loop(d: KernelRunner, lp: Loop) -> dict:
    g, up = lp.g, d.gpu.upload
    return dict(seq=up(lp.seq), state=up(lp.state), status=up(lp.status), nes=up(g.node_edge_start),
                max_tools=up(lp.max_tools), allow_empty=up(lp.allow_empty),
                etok=up(g.edge_token), ekind=up(g.edge_kind), ebits=up(g.edge_bits),
                echild=up(g.edge_child), etool=up(g.edge_tool), logits=up(lp.logits),
                cand=up(np.zeros((lp.B, lp.M), np.int32)), valid=up(np.zeros((lp.B, lp.M), np.uint8)),
                cl=up(np.zeros((lp.B, lp.M), np.float32)), token=up(lp.token), pos=up(lp.pos),
                out_tokens=up(lp.out_tokens), out_len=up(lp.out_len), ws=up(np.zeros(2, np.int32)),
                cond=up(np.full(1, 7, np.int32)))


def download_loop(d: KernelRunner, lp: Loop, a: dict):
    get = d.gpu.download
    return (get(a["out_tokens"], lp.out_tokens.shape, np.int32), get(a["out_len"], lp.out_len.shape, np.int32),
            get(a["status"], lp.status.shape, np.int32), get(a["state"], lp.state.shape, np.uint64))


def case_host_loop(d: KernelRunner, rng, grammar: str):
    """Host-driven stepping (cond_handle 0) until grammar_advance clears the condition: the same answers as the
    references."""
    lp = Loop(rng, load_grammar(grammar))
    a = upload_loop(d, lp)
    for _ in range(10 * lp.max_out):
        for ln in body_launches(lp, a, 0):
            d.launch(ln)
        d.gpu.synchronize()
        if d.gpu.download(a["cond"], (1,), np.int32)[0] == 0:
            break
    for got, want, what in zip(download_loop(d, lp, a), lp.reference(), ("tokens", "len", "status", "state")):
        d.same(got, want, f"grammar host loop {what}")


CASES = [KernelCase(name, case_host_loop, (name,), ci=True) for name in GRAMMAR_SOURCES]
