"""Per-kernel device time of a step's kernels at a model's shapes (default Qwen3-0.6B; T = 1 unless a row names T).

Each kernel runs as a chain of --nodes graph nodes (one after the other, as in the decode graph),
each node reading its own copy of the weights out of a random pool larger than the L2 (--pool-mb),
so no node finds its weights in cache, as no layer does in a real step. The graph is launched
--reps times between two events; the median over launches / nodes is the kernel's time, gaps
between nodes included. A chain of embed_gather (one 2 KiB row) gives the per-node floor.
attention_decode's nodes each attend over their own sequence of a KV pool of --nodes sequences of 2,048
positions (470 MB at Qwen3-0.6B's 8 KV heads of 128: several times the L2), as a step's layers each read
their own cache; one shared sequence would sit in L2 and flatter the kernel.
Weights and activations are random (never zeros); results are not checked here (the kernel
parity tests and bench/gpu_check.py do that).

    python3 bench/gpu_kernel_times.py [--json OUT.json]

Each chain is timed with full edges and with programmatic ones (kernels/common.cuh), and a chain of
--layers decode layers (qkv, attention_decode, o_proj, gate_up, down; each layer its own weights)
gives a layer's time both ways. The linear layers run in each family of --families (kernels/geometry.py
KERNEL_FAMILIES; rows "<fmt> <proj>" for fma, "<fmt> mma <proj>" for mma), at T = 1 and at
T = --prefill-rows (rows "... T=<rows>", with the TFLOP/s of their 2 T in out multiply-adds), and each
family's prefill attention over a chunk of --prefill-rows rows ending at position 2,047. The table
prints last: kernel, launch shape, us per node (full edges, programmatic), weight MB per node, GB/s of
weights at full edges, TFLOP/s where counted.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
import checkout  # noqa: E402  (bench/checkout.py: this checkout as `toolcall`)

checkout.use()

from toolcall.common.errors import CudaError  # noqa: E402
from toolcall.common.formats import WEIGHT_FORMATS  # noqa: E402
from toolcall.kernels.declarations import Launch  # noqa: E402
from toolcall.kernels.geometry import (  # noqa: E402
    FMA,
    KERNEL_FAMILIES,
    MATVEC_FORMATS,
    PLAIN,
    RMSNORM,
    SWIGLU,
    attention_max_splits,
    decode_kernel,
    decode_max_splits,
    matvec_kernel,
    prefill_tiles,
)
from toolcall.kernels.graph_nodes import add_kernel_node  # noqa: E402
from toolcall.kernels.launch import DeviceArray, Gpu, check  # noqa: E402
from toolcall.kernels.reference_attention import rope_table  # noqa: E402
from toolcall.kernels.runner import KernelRunner  # noqa: E402
from toolcall.kernels.weight_args import weight_args  # noqa: E402

Q06 = dict(hidden=1024, inter=3072, heads=16, kv_heads=8, head_dim=128, vocab=151936)
EPS = np.float32(1e-6)


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """uint16 bf16 bit patterns of ``x`` (truncated)."""
    return (x.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


class Pool:
    """One random device buffer handed out in aligned slices, cycling (weights of node i differ from node i+1's)."""

    def __init__(self, gpu, nbytes: int, rng):
        self.base = gpu.upload(rng.integers(0, 255, nbytes, dtype=np.uint8) & 0x77)  # e4m3 codes <= 0x77: finite
        self.nbytes, self.next = nbytes, 0

    def take(self, nbytes: int) -> DeviceArray:
        nbytes = -(-nbytes // 256) * 256
        if self.next + nbytes > self.nbytes:
            self.next = 0
        arr = DeviceArray(self.base.ptr + self.next, nbytes)
        self.next += nbytes
        return arr


def matvec_launch(fmt, prologue: str, pool: Pool, floats, n_in: int, n_out: int, family=FMA,
                  T: int = 1) -> tuple[Launch, int]:
    """(one node of ``family``'s <fmt> linear layer with ``prologue`` over T rows, its weight bytes): weight arguments
    (codes, e4m3 block scales, bf16) from the pool (bytes <= 0x77: finite in every format), float32 per-row scales
    and x/y ([T, n_in], [T, n_out]) from ``floats``."""
    x, x2, y, norm_w, scale = floats
    weights, w_bytes = {}, 0
    for arg in weight_args(fmt):
        if arg.dtype == np.float32:  # a per-row float32 scale [out]
            weights[arg.param] = scale
        else:
            weights[arg.param] = pool.take(arg.nbytes(n_out, n_in))
            w_bytes += arg.nbytes(n_out, n_in)
    head = {PLAIN: dict(x=x), RMSNORM: dict(x=x, norm_w=norm_w, eps=EPS), SWIGLU: dict(gate=x, up=x2)}[prologue]
    return Launch(matvec_kernel(fmt, prologue, family), dict(
        **head, x_stride=n_in, **weights, bias=None, y=y, T=T, n_in=n_in, n_out=n_out,
        accumulate=int(prologue != RMSNORM))), w_bytes


def fmt_us(us: float | None) -> str:
    return "       -" if us is None else f"{us:8.2f}"


def time_chain(runner, nodes: list[Launch], reps: int, programmatic: bool) -> float:
    """Median device microseconds per node of a graph chaining ``nodes``, with programmatic edges
    (kernels/common.cuh) or full ones."""
    from cuda.bindings import driver as drv
    graph = check(drv.cuGraphCreate(0), "cuGraphCreate")
    keep, prev = [], []
    for ln in nodes:
        kernel = runner.kernel(ln.fn)
        params, holders = kernel.pack(ln.args)
        keep.append((params, holders))
        prev = [add_kernel_node(drv, graph, prev, kernel.function, *ln.shape, params.ctypes.data, ln.fn, programmatic)]
    exe = check(drv.cuGraphInstantiate(graph, 0), "cuGraphInstantiate")
    stream = check(drv.cuStreamCreate(0), "cuStreamCreate")
    ev = [check(drv.cuEventCreate(0), "cuEventCreate") for _ in range(2)]
    times = []
    for i in range(reps + 3):  # 3 warm-up launches
        check(drv.cuEventRecord(ev[0], stream), "cuEventRecord")
        check(drv.cuGraphLaunch(exe, stream), "cuGraphLaunch")
        check(drv.cuEventRecord(ev[1], stream), "cuEventRecord")
        check(drv.cuEventSynchronize(ev[1]), "cuEventSynchronize")
        if i >= 3:
            times.append(float(check(drv.cuEventElapsedTime(ev[0], ev[1]), "cuEventElapsedTime")))
    for e in ev:
        check(drv.cuEventDestroy(e), "cuEventDestroy")
    check(drv.cuStreamDestroy(stream), "cuStreamDestroy")
    check(drv.cuGraphExecDestroy(exe), "cuGraphExecDestroy")
    check(drv.cuGraphDestroy(graph), "cuGraphDestroy")
    return 1000.0 * statistics.median(times) / len(nodes)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=56, help="graph nodes per chain (2 per layer of a 28-layer step)")
    ap.add_argument("--reps", type=int, default=20, help="timed graph launches per kernel")
    ap.add_argument("--pool-mb", type=int, default=512, help="random weight pool (several times the 60 MB L2)")
    ap.add_argument("--positions", default="100,511,2047",
                    help="attention_decode: the row's positions (comma-separated, below 2048); the layer chains use "
                         "the last")
    ap.add_argument("--only", help="comma-separated parts of the names to time (e.g. attention,layer); default all")
    ap.add_argument("--formats", default="fp8_e4m3,nvfp4", help="comma-separated weight formats (common/formats.py)")
    ap.add_argument("--layers", type=int, default=28, help="layers of the layer chain (at most --nodes)")
    ap.add_argument("--families", default="fma,mma", help="comma-separated linear-layer families (kernels/geometry.py)")
    ap.add_argument("--prefill-rows", type=int, default=512, help="T of the prefill-sized linear rows (0: none)")
    ap.add_argument("--json", help="also write the rows here")
    args = ap.parse_args()
    s, rng = Q06, np.random.default_rng(0)
    gpu = Gpu()
    runner = KernelRunner(gpu)
    pool = Pool(gpu, args.pool_mb << 20, rng)
    width = max(2 * s["inter"], (s["heads"] + 2 * s["kv_heads"]) * s["head_dim"])
    f32 = lambda n: gpu.upload(rng.standard_normal(n).astype(np.float32))  # noqa: E731
    rows_max = max(1, args.prefill_rows)
    x, x2, y = f32(width * rows_max), f32(width * rows_max), f32(width * rows_max)
    norm_w = gpu.upload(np.full(s["hidden"], 0x3f80, np.uint16))  # bf16 1.0
    scale = gpu.upload(np.abs(rng.standard_normal(width)).astype(np.float32) * 0.01)
    floats = (x, x2, y, norm_w, scale)
    rows = []

    want = lambda name: not args.only or any(part in name for part in args.only.split(","))  # noqa: E731
    refused = []  # why programmatic edges could not be built (then us_pdl is None)

    def timed_programmatic(chain, nodes_per_row: int = 1):
        if refused:
            return None
        try:
            return nodes_per_row * time_chain(runner, chain, args.reps, True)
        except (TypeError, CudaError) as e:  # 12.x bindings take no edge data; a driver may refuse the edges
            refused.append(f"{type(e).__name__}: {e}")
            return None

    def record(name: str, chain: list[Launch], w_bytes: int, flops: float = 0.0) -> None:
        """One kernel's chain (one kernel, each node its own arguments), timed with full and programmatic edges."""
        if not want(name):
            return
        us, us_pdl = time_chain(runner, chain, args.reps, False), timed_programmatic(chain)
        grid, block = chain[0].shape
        rows.append(dict(name=name, kernel=chain[0].fn, grid=list(grid), block=block[0], us=us, us_pdl=us_pdl,
                         weight_mb=w_bytes / 1e6, gbs=w_bytes / us / 1e3,
                         **({"tflops": flops / us / 1e6} if flops else {})))
        print(f"{name:24} {us:8.2f} us, {fmt_us(us_pdl)} us with programmatic edges", flush=True)

    emb = gpu.upload(bf16_bits(rng.standard_normal(64 * s["hidden"])))
    tok = gpu.upload(np.array([3], np.int32))
    record("embed_gather (floor)", [Launch("embed_gather", dict(tokens=tok, table=emb, vocab=64, hidden=s["hidden"],
                                                                 x=y, pos=None, inv_freq=None, rope_pairs=0,
                                                                 rope=None, T=1))] * args.nodes, 0)
    h, i, q_dim = s["hidden"], s["inter"], s["heads"] * s["head_dim"]
    qkv_out = q_dim + 2 * s["kv_heads"] * s["head_dim"]
    layer_mv = {}  # (format, family) -> [the nodes of each projection], for the layer chains below
    families = [KERNEL_FAMILIES[n] for n in args.families.split(",")]
    for fmt in map(WEIGHT_FORMATS.get, args.formats.split(",")):
        if fmt not in MATVEC_FORMATS:
            raise SystemExit(f"--formats: the GPU kernels take {', '.join(f.name for f in MATVEC_FORMATS)}")
        for family in families:
            label = fmt.name if family is FMA else f"{fmt.name} {family.name}"
            for name, prologue, n_in, n_out in (("qkv", RMSNORM, h, qkv_out), ("o_proj", PLAIN, q_dim, h),
                                                ("gate_up", RMSNORM, h, 2 * i), ("down", SWIGLU, i, h)):
                nodes = [matvec_launch(fmt, prologue, pool, floats, n_in, n_out, family) for _ in range(args.nodes)]
                record(f"{label} {name} {n_in}->{n_out}", [ln for ln, _ in nodes], nodes[0][1])
                layer_mv.setdefault((fmt, family), []).append([ln for ln, _ in nodes])
                if args.prefill_rows > 1:  # a prefill chunk's rows through the same projection
                    T = args.prefill_rows
                    wide = [matvec_launch(fmt, prologue, pool, floats, n_in, n_out, family, T)
                            for _ in range(min(8, args.nodes))]
                    record(f"{label} {name} {n_in}->{n_out} T={T}", [ln for ln, _ in wide], wide[0][1],
                           flops=2.0 * T * n_in * n_out)
    # attention_decode: one row at each of --positions; node i attends over sequence i's pages (the pool: --nodes
    # sequences of 2,048 positions, pages shuffled over it); q|k|v raw in x
    nh, nkv, hd, ps = s["heads"], s["kv_heads"], s["head_dim"], 32
    S, S_decode = attention_max_splits(2048), decode_max_splits(2048)  # prefill splits; the decode kernel's
    per_seq = 2048 // ps
    n_pages = args.nodes * per_seq
    bt = gpu.upload(rng.permutation(n_pages).astype(np.int32).reshape(args.nodes, per_seq))
    kc, vc = (gpu.upload(np.full(n_pages * ps * nkv * hd, bits, np.uint16)) for bits in (0x3c00, 0xbc00))  # bf16 +-2^-7
    qkv = f32(qkv_out)
    k_dev, v_dev = DeviceArray(qkv.ptr + q_dim * 4, 0), DeviceArray(qkv.ptr + (q_dim + nkv * hd) * 4, 0)
    seqs = [gpu.upload(np.array([i], np.int32)) for i in range(args.nodes)]
    inv_freq = (1.0 / 1e6 ** (np.arange(0, hd, 2) / hd)).astype(np.float32)
    qw = kw = gpu.upload(np.full(hd, 0x3f80, np.uint16))
    part_o, part_ml = gpu.alloc(nh * S_decode * hd * 4), gpu.alloc(nh * S_decode * 2 * 4)
    counters, out = gpu.zeros(nkv * 4), gpu.alloc(q_dim * 4)
    for position in map(int, args.positions.split(",")):
        pos = gpu.upload(np.array([position], np.int32))
        rope = gpu.upload(rope_table(np.array([position]), inv_freq))  # the row's (cos, sin), as embed_gather
        att = [Launch(decode_kernel(nh, nkv), dict(
            q=qkv, q_stride=qkv_out, k=k_dev, k_stride=qkv_out, v=v_dev, v_stride=qkv_out, seq=seq, pos=pos,
            block_table=bt, max_pages_per_seq=per_seq, page_size=ps, k_cache=kc, v_cache=vc, q_norm_w=qw, k_norm_w=kw,
            rope=rope, eps=EPS, n_heads=nh, n_kv_heads=nkv, head_dim=hd, sm_scale=np.float32(hd ** -0.5),
            max_splits=S_decode, part_o=part_o, part_ml=part_ml, counters=counters, out=out, out_stride=q_dim,
            prefetch=None, prefetch_bytes=0, T=1))
               for seq in seqs]
        record(f"attention_decode pos {position}", att, 0)
    # a prefill chunk's attention: --prefill-rows rows of sequence 0 at the positions ending at 2,047 (keys
    # from the same pool), each kernel family's launches, per chunk (all its launches), a chain of 8 chunks
    if args.prefill_rows > 1 and want("attention prefill"):
        T = min(args.prefill_rows, 2048)
        seq0, ppos = gpu.upload(np.zeros(T, np.int32)), np.arange(2048 - T, 2048, dtype=np.int32)
        pq, pout = f32(T * q_dim), gpu.alloc(T * q_dim * 4)
        ppart_o, ppart_ml = gpu.alloc(T * nh * S * hd * 4), gpu.alloc(T * nh * S * 2 * 4)
        for family in families:
            start, length = prefill_tiles(np.zeros(T, np.int32), ppos, family.rows_per_tile(nh, nkv))
            tiles = dict(q=pq, q_stride=q_dim, seq=seq0, pos=gpu.upload(ppos), tile_start=gpu.upload(start),
                         tile_len=gpu.upload(length), block_table=bt, max_pages_per_seq=per_seq, page_size=ps,
                         k_cache=kc, v_cache=vc, n_heads=nh, n_kv_heads=nkv, head_dim=hd, n_tiles=len(start))
            scale = np.float32(hd ** -0.5)
            launches = {"attention_prefill_mma": Launch("attention_prefill_mma", dict(
                            tiles, sm_scale=scale, out=pout, out_stride=q_dim)),
                        "attention_prefill_partial": Launch("attention_prefill_partial", dict(
                            tiles, sm_scale=scale, max_splits=S, part_o=ppart_o, part_ml=ppart_ml)),
                        "attention_merge": Launch("attention_merge", dict(
                            part_o=ppart_o, part_ml=ppart_ml, seq=seq0, pos=tiles["pos"], n_heads=nh, head_dim=hd,
                            max_splits=S, out=pout, out_stride=q_dim, T=T))}
            chunk = [launches[fn] for fn in family.prefill_attention]
            us, us_pdl = len(chunk) * time_chain(runner, chunk * 8, args.reps, False), timed_programmatic(
                chunk * 8, len(chunk))
            rows.append(dict(name=f"attention prefill {T} rows at {2048 - T}..2047 ({family.name})",
                             kernel="+".join(family.prefill_attention), grid=list(chunk[0].shape[0]),
                             block=chunk[0].shape[1][0], us=us, us_pdl=us_pdl, weight_mb=0.0, gbs=0.0))
            print(f"attention prefill ({family.name}): {us:8.2f} us a chunk, {fmt_us(us_pdl)} us with programmatic "
                  "edges", flush=True)
    # a decode step's layers: qkv, attention, o_proj, gate_up, down, each layer its own weights
    for (fmt, family), (qkv_n, o_n, gu_n, down_n) in layer_mv.items() if want("layer") else ():
        chain = [n for L in range(args.layers)
                 for n in (qkv_n[L], att[L], o_n[L], gu_n[L], down_n[L])]
        us, us_pdl = 5 * time_chain(runner, chain, args.reps, False), timed_programmatic(chain, 5)
        label = fmt.name if family is FMA else f"{fmt.name} {family.name}"
        rows.append(dict(name=f"{label} layer ({args.layers} layers)", kernel="layer", grid=[0], block=0, us=us,
                         us_pdl=us_pdl, weight_mb=0.0, gbs=0.0))
        print(f"{label} layer: {us:8.2f} us, {fmt_us(us_pdl)} us with programmatic edges", flush=True)
    gpu.synchronize()
    gpu.close()
    print(f"\n== per-kernel device time, {gpu.name}, chains of {args.nodes} nodes, median of {args.reps}")
    print(f"{'kernel':36} {'grid':>14} {'us/node':>8} {'us pdl':>8} {'MB':>7} {'GB/s':>7} {'TFLOP/s':>8}")
    for r in rows:
        print(f"{r['name']:36} {'x'.join(map(str, r['grid'])):>14} {r['us']:8.2f} {fmt_us(r['us_pdl'])} "
              f"{r['weight_mb']:7.2f} {r['gbs']:7.0f} {r.get('tflops', 0.0):8.1f}")
    if refused:
        print(f"programmatic edges refused: {refused[0]}")
    if args.json:
        Path(args.json).write_text(json.dumps(dict(device=gpu.name, rows=rows, programmatic_refused=refused[:1]),
                                              indent=1))


if __name__ == "__main__":
    main()
