"""A host emulation of the device for the CUDA backend's CPU tests.

``EmulatedGpu`` stands in for toolcall.kernels.launch.Gpu: allocations are numpy byte buffers at fake
addresses, copies move bytes, and each launch runs the kernel's numpy reference
(kernels/reference.py) on views built from the launch's own pointers, strides and sizes,
exactly as the kernel's header comment defines them. So every pointer, offset, stride, fused
layout, padding row and grammar buffer the runtime passes is exercised for real, and the
answers can be compared with the CPU backend. ``graph_builder`` gives DecodeGraph a graph
"instantiation" that runs the launch lists and loops the body while the condition that
grammar_advance set is non-zero. (Kernel arithmetic itself is the GPU parity tests' job.)
"""
from __future__ import annotations

import bisect
from types import SimpleNamespace

import ml_dtypes
import numpy as np

from toolcall.kernels import reference as ref
from toolcall.kernels import reference_attention as ref_attn
from toolcall.kernels import reference_draw as ref_draw
from toolcall.kernels.geometry import MATVECS, RMSNORM, SWIGLU, tile_rows
from toolcall.kernels.launch import DeviceArray
from toolcall.kernels.runner import DryRunGpu
from toolcall.kernels.weight_args import weight_args

BF16, F32, I32, U8, U64 = np.dtype(ml_dtypes.bfloat16), np.dtype(np.float32), np.dtype(np.int32), np.dtype(np.uint8), \
    np.dtype(np.uint64)


class EmulatedGpu(DryRunGpu):
    """Device memory and kernels on the host (a DryRunGpu: launches are packed and shape-checked too)."""

    def __init__(self):
        super().__init__()
        self.bases, self.buffers, self.conditions, self.freed = [], {}, {}, 0

    # ---- memory ----
    def alloc(self, nbytes: int) -> DeviceArray:
        ptr = -(-self.next // 256) * 256
        self.next = ptr + int(nbytes) + 4096
        self.buffers[ptr] = np.zeros(max(int(nbytes), 1), np.uint8)
        bisect.insort(self.bases, ptr)
        return DeviceArray(ptr, int(nbytes))

    def free(self, arr: DeviceArray) -> None:
        if self.buffers.pop(arr.ptr, None) is not None:
            self.bases.remove(arr.ptr)
            self.freed += 1

    def _locate(self, ptr: int, nbytes: int) -> tuple[np.ndarray, int]:
        i = bisect.bisect_right(self.bases, ptr) - 1
        assert i >= 0, f"pointer {ptr:#x} below every allocation"
        buf = self.buffers[self.bases[i]]
        off = ptr - self.bases[i]
        assert off + nbytes <= len(buf), f"{nbytes} bytes at {ptr:#x} run past an allocation of {len(buf)}"
        return buf, off

    def copy_in(self, arr: DeviceArray, host) -> None:
        raw = np.ascontiguousarray(host).reshape(-1).view(np.uint8)
        assert raw.nbytes <= arr.nbytes, f"copy of {raw.nbytes} bytes into {arr.nbytes}"
        buf, off = self._locate(arr.ptr, raw.nbytes)
        buf[off:off + raw.nbytes] = raw

    def copy_device(self, dst: DeviceArray, src: DeviceArray, nbytes: int) -> None:
        assert nbytes <= min(dst.nbytes, src.nbytes), f"copy of {nbytes} bytes between {src.nbytes} and {dst.nbytes}"
        sbuf, soff = self._locate(src.ptr, nbytes)
        dbuf, doff = self._locate(dst.ptr, nbytes)
        dbuf[doff:doff + nbytes] = sbuf[soff:soff + nbytes]

    def upload(self, host) -> DeviceArray:
        arr = self.alloc(np.asarray(host).nbytes)
        self.copy_in(arr, host)
        return arr

    def download(self, arr: DeviceArray, shape, dtype) -> np.ndarray:
        return self.view(arr, dtype, shape).copy()

    def view(self, arr, dtype, shape=None, stride: int | None = None) -> np.ndarray:
        """A writable view: ``shape`` (rows, cols) with a row ``stride`` in elements if given;
        ``shape`` None: as many elements as ``arr`` holds; a -1 first dim: as many rows as fit."""
        dtype = np.dtype(dtype)
        ptr, nbytes = (arr.ptr, arr.nbytes) if isinstance(arr, DeviceArray) else (int(arr), 0)
        if shape is None:
            shape = (nbytes // dtype.itemsize,)
        shape = tuple(int(s) for s in shape)
        if shape[0] == -1:
            shape = (nbytes // (dtype.itemsize * int(np.prod(shape[1:]))),) + shape[1:]
        if stride is None:
            n = int(np.prod(shape)) * dtype.itemsize
            buf, off = self._locate(ptr, n)
            return buf[off:off + n].view(dtype).reshape(shape)
        rows, cols = shape
        n = ((rows - 1) * stride + cols) * dtype.itemsize if rows else 0
        buf, off = self._locate(ptr, n)
        return np.ndarray((rows, cols), dtype, buffer=buf, offset=off,
                          strides=(stride * dtype.itemsize, dtype.itemsize))

    # ---- kernels ----
    def launch(self, kernel, grid, block, args, shared_bytes: int = 0, stream=0) -> None:
        super().launch(kernel, grid, block, args)  # packs: every parameter named once
        if kernel.name in MATVECS:
            return self._matvec(kernel.name, args)
        getattr(self, "_" + kernel.name)(args)

    def _matvec(self, name: str, a) -> None:
        """Any linear family's kernel through its reference (kernels/reference.py MATVEC_REFERENCES)."""
        fmt, pro = MATVECS[name]
        T, n_in, n_out, stride = a["T"], a["n_in"], a["n_out"], a["x_stride"]
        w = [self.view(a[arg.param], arg.dtype, arg.shape(n_out, n_in)) for arg in weight_args(fmt)]
        if pro == SWIGLU:
            head = (self.view(a["gate"], F32, (T, n_in), stride), self.view(a["up"], F32, (T, n_in), stride))
        elif pro == RMSNORM:
            head = (self.view(a["x"], F32, (T, n_in), stride).copy(), self.view(a["norm_w"], BF16, (n_in,)), a["eps"])
        else:
            head = (self.view(a["x"], F32, (T, n_in), stride).copy(),)
        bias = None if a["bias"] is None else self.view(a["bias"], F32, (n_out,))
        y = self.view(a["y"], F32, (T, n_out))
        y[:] = ref.MATVEC_REFERENCES[name](*head, *w, bias=bias, y=y.copy(), accumulate=bool(a["accumulate"]))

    def _embed_gather(self, a):
        tokens = self.view(a["tokens"], I32, (a["T"],))
        table = self.view(a["table"], BF16, (a["vocab"], a["hidden"]))
        self.view(a["x"], F32, (a["T"], a["hidden"]))[:] = ref.embed_gather(tokens, table)
        if a["rope"] is not None:
            pairs = a["rope_pairs"]
            self.view(a["rope"], F32, (a["T"], pairs, 2))[:] = ref_attn.rope_table(
                self.view(a["pos"], I32, (a["T"],)), self.view(a["inv_freq"], F32, (pairs,)))

    def _cache(self, a):
        ps, nkv, hd = a["page_size"], a["n_kv_heads"], a["head_dim"]
        bt = self.view(a["block_table"], I32, (-1, a["max_pages_per_seq"]))
        return bt, self.view(a["k_cache"], BF16, (-1, ps, nkv, hd)), self.view(a["v_cache"], BF16, (-1, ps, nkv, hd))

    def _qk_rows(self, a, T: int):
        """(q, k, v) views [T, heads * head_dim] with the launch's strides, seq, pos, norm weights, the rows'
        rotary table."""
        nh, nkv, hd = a["n_heads"], a["n_kv_heads"], a["head_dim"]
        q = self.view(a["q"], F32, (T, nh * hd), a["q_stride"])
        k = self.view(a["k"], F32, (T, nkv * hd), a["k_stride"])
        v = self.view(a["v"], F32, (T, nkv * hd), a["v_stride"])
        norm = lambda p: None if p is None else self.view(p, BF16, (hd,))
        return (q, k, v, self.view(a["seq"], I32, (T,)), self.view(a["pos"], I32, (T,)), norm(a["q_norm_w"]),
                norm(a["k_norm_w"]), self.view(a["rope"], F32, (T, hd // 2, 2)))

    def _qk_norm_rope_kv(self, a):
        T = a["T"]
        q, k, v, seq, pos, qn, kn, rope = self._qk_rows(a, T)
        bt, kc, vc = self._cache(a) if a["k_cache"] is not None else (None, None, None)
        q2, k2 = ref_attn.qk_norm_rope_kv(q, k, v, seq, pos, bt, a["page_size"], qn, kn, rope, a["eps"], a["n_heads"],
                                     a["n_kv_heads"], a["head_dim"], kc, vc)
        q[:], k[:] = q2, k2

    def _attention_decode_wide(self, a):
        self._attention_decode(a)

    def _attention_decode(self, a):
        T, nh, hd = a["T"], a["n_heads"], a["head_dim"]
        q, k, v, seq, pos, qn, kn, rope = self._qk_rows(a, T)
        assert len(set(seq[seq >= 0].tolist())) == int((seq >= 0).sum()), "attention_decode: one row per sequence"
        count = self.view(a["counters"], I32, (T, a["n_kv_heads"]))
        assert not count.any(), "attention_decode: split counters must be zero before the launch"
        live = np.flatnonzero((seq >= 0) & (pos >= 0))
        po, pml = a["part_o"], a["part_ml"]
        if len(live) and isinstance(po, DeviceArray) and isinstance(pml, DeviceArray):
            n = (int(live.max()) + 1) * nh * a["max_splits"] * 4  # the live rows' partial slots, in bytes / width
            assert n * hd <= min(po.nbytes, pml.ptr - po.ptr if pml.ptr > po.ptr else po.nbytes), \
                "attention_decode: part_o too small for its rows' splits"
            assert n * 2 <= pml.nbytes, "attention_decode: part_ml too small for its rows' splits"
        bt, kc, vc = self._cache(a)
        out, k2 = ref_attn.attention_decode(q, k, v, seq, pos, bt, a["page_size"], kc, vc, qn, kn, rope, a["eps"], nh,
                                       a["n_kv_heads"], hd, a["sm_scale"], a["max_splits"])
        k[:] = np.where(((seq >= 0) & (pos >= 0))[:, None], k2, k)  # the writer block rewrites k in place
        self.view(a["out"], F32, (T, nh * hd), a["out_stride"])[:] = out

    def _attention(self, a, rows: np.ndarray):
        n = int(rows.max()) + 1 if len(rows) else 0
        nh, hd, S = a["n_heads"], a["head_dim"], a["max_splits"]
        bt, kc, vc = self._cache(a)
        seq = self.view(a["seq"], I32, (n,)).copy()
        keep = np.zeros(n, bool)
        keep[rows] = True
        seq[~keep] = -1  # rows outside the launch's tiles are not computed
        po, pml = ref_attn.attention_partials(self.view(a["q"], F32, (n, nh * hd), a["q_stride"]), seq,
                                         self.view(a["pos"], I32, (n,)), bt, a["page_size"], kc, vc, nh,
                                         a["n_kv_heads"], hd, a["sm_scale"], S)
        self.view(a["part_o"], F32, (n, nh, S, hd))[rows] = po[rows]
        self.view(a["part_ml"], F32, (n, nh, S, 2))[rows] = pml[rows]

    def _attention_prefill_partial(self, a):
        start = self.view(a["tile_start"], I32, (a["n_tiles"],))
        length = self.view(a["tile_len"], I32, (a["n_tiles"],))
        self._attention(a, tile_rows(start, length))

    def _attention_prefill_mma(self, a):
        start = self.view(a["tile_start"], I32, (a["n_tiles"],))
        length = self.view(a["tile_len"], I32, (a["n_tiles"],))
        n = int((start + length).max()) if a["n_tiles"] else 0
        if n == 0:
            return
        nh, hd = a["n_heads"], a["head_dim"]
        bt, kc, vc = self._cache(a)
        out = self.view(a["out"], F32, (n, nh * hd), a["out_stride"])
        out[:] = ref_attn.attention_prefill_mma(self.view(a["q"], F32, (n, nh * hd), a["q_stride"]),
                                           self.view(a["seq"], I32, (n,)), self.view(a["pos"], I32, (n,)), start,
                                           length, bt, a["page_size"], kc, vc, nh, a["n_kv_heads"], hd,
                                           a["sm_scale"], out)

    def _attention_merge(self, a):
        T, nh, hd, S = a["T"], a["n_heads"], a["head_dim"], a["max_splits"]
        out = ref_attn.attention_merge(self.view(a["part_o"], F32, (T, nh, S, hd)),
                                  self.view(a["part_ml"], F32, (T, nh, S, 2)),
                                  self.view(a["seq"], I32, (T,)), self.view(a["pos"], I32, (T,)), S)
        self.view(a["out"], F32, (T, nh * hd), a["out_stride"])[:] = out

    def _rmsnorm(self, a):
        B, n = a["B"], a["n"]
        rows = None if a["rows"] is None else self.view(a["rows"], I32, (B,))
        x = self.view(a["x"], F32, (-1, a["x_stride"]))[:, :n] if rows is not None else \
            self.view(a["x"], F32, (B, n), a["x_stride"])
        y = ref.rmsnorm(x.copy(), self.view(a["w"], BF16, (n,)), a["eps"], rows)
        self.view(a["y"], F32, (B, n), a["y_stride"])[:] = y

    def _grammar(self, a) -> SimpleNamespace:
        N, W = a["n_nodes"], a["n_words"]
        nes = self.view(a["node_edge_start"], np.uint32, (N + 1,))
        E = int(nes[-1])
        g = SimpleNamespace(node_edge_start=nes, edge_kind=self.view(a["edge_kind"], U8, (E,)))
        for name, dtype, shape in (("edge_token", I32, (E,)), ("edge_bits", U64, (E, W)), ("edge_child", I32, (E,)),
                                   ("edge_tool", I32, (E,))):
            if name in a:
                setattr(g, name, self.view(a[name], dtype, shape))
        g.num_tools = a.get("n_tools")
        return g

    def _grammar_candidates(self, a):
        B, M, W = a["B"], a["max_edges"], a["n_words"]
        status = self.view(a["status"], I32)
        cand, valid = ref.grammar_candidates(self.view(a["sample_seq"], I32, (B,)),
                                             self.view(a["state"], U64, (-1, 1 + W)), status, self._grammar(a), M,
                                             self.view(a["max_tools"], I32, status.shape),
                                             self.view(a["allow_empty"], U8, status.shape))
        self.view(a["cand"], I32, (B, M))[:] = cand
        self.view(a["valid"], U8, (B, M))[:] = valid

    def _head_sparse(self, a):
        B, K, h = a["B"], a["n_cand"], a["hidden"]
        out = ref.head_sparse(self.view(a["xn"], F32, (B, h), a["x_stride"]), self.view(a["cand"], I32, (B, K)),
                              self.view(a["valid"], U8, (B, K)), self.view(a["table"], BF16, (a["vocab"], h)))
        self.view(a["out"], F32, (B, K))[:] = out

    def _sample_draw(self, a):
        B, w, stride = a["B"], a["width"], a["stride"]
        v = lambda key, dt: self.view(a[key], dt, (B,))
        out = ref_draw.sample_draw(self.view(a["logits"], F32, (B, w), stride), self.view(a["valid"], U8, (B, w), stride),
                                   v("inv_temperature", F32), v("top_p", F32), v("seed", U64), v("token", I32))
        v("out", I32)[:] = out

    def _grammar_advance(self, a):
        B, M, W, mo = a["B"], a["max_edges"], a["n_words"], a["max_out"]
        v = lambda key, dt, shape: self.view(a[key], dt, shape)
        token, pos, cond = ref.grammar_advance(
            v("cand_logits", F32, (B, M)), v("cand", I32, (B, M)), v("valid", U8, (B, M)), v("sample_seq", I32, (B,)),
            v("token_in", I32, (B,)).copy(), v("pos_in", I32, (B,)).copy(), self._grammar(a), mo,
            self.view(a["state"], U64, (-1, 1 + W)), self.view(a["status"], I32), v("out_tokens", I32, (-1, mo)),
            self.view(a["out_len"], I32), None if a["pick"] is None else v("pick", I32, (B,)))
        v("token_out", I32, (B,))[:], v("pos_out", I32, (B,))[:] = token, pos
        v("cond_out", I32, (1,))[0] = cond
        if a["cond_handle"]:
            self.conditions[int(a["cond_handle"])] = cond

    # ---- graphs ----
    def graph_builder(self, model):
        return _EmulatedGraphs(model, self)


class _EmulatedGraphs:
    """DecodeGraph's graph builder on the emulated device: an "executable graph" is its launch
    lists; a launch runs them, the body while the condition (default 1 each launch) is set."""

    HANDLE = 0x5EED

    def __init__(self, model, gpu: EmulatedGpu):
        self.m, self.gpu, self.instantiated, self.destroyed = model, gpu, 0, 0

    def instantiate(self, launches, body=None):
        from toolcall.runtime.cuda.program import Program
        self.instantiated += 1
        return Program(self.m, launches), None if body is None else Program(self.m, body(self.HANDLE))

    def launch(self, exe, timeout_s: float) -> float:
        top, body = exe
        top.run()
        self.gpu.conditions[self.HANDLE] = 1
        for _ in range(10_000):
            if body is None or not self.gpu.conditions[self.HANDLE]:
                return 0.0
            body.run()
        raise AssertionError("emulated WHILE loop never ended")

    def destroy(self, exe) -> None:
        self.destroyed += 1

    def close(self) -> None:
        pass
