"""Kernel launches of one decode step of a GPU bundle, counted without a GPU.

    python bench/launch_count.py BUNDLE [--json]

Loads the bundle's CudaModel onto a host stand-in device (fake addresses; weights are read and
"copied" but nothing runs), builds the decode graph's loop body the way the runtime does
(runtime/cuda/graph.py DecodeGraph.body: runtime/cuda/launches.py's forward over one decode
row, then the sampling step) and counts its launches by kernel, plus one prefill chunk's for
comparison. Every launch is argument-packed against its kernel's parameter list, so a count
comes from a launch list the runtime could really run. The last line is
``launches per decode step: N (M per layer)``.
"""
from __future__ import annotations

import argparse
import collections
import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
import checkout  # noqa: E402  (bench/checkout.py: this checkout as `toolcall`)
checkout.use()

from toolcall.kernels.launch import DeviceArray  # noqa: E402
from toolcall.kernels.runner import DryRunGpu  # noqa: E402


class CountingGpu(DryRunGpu):
    """DryRunGpu plus the allocation calls a CudaModel load makes (no memory behind them)."""

    def alloc(self, nbytes: int) -> DeviceArray:
        ptr = -(-self.next // 256) * 256
        self.next = ptr + int(nbytes) + 256
        return DeviceArray(ptr, int(nbytes))

    def copy_in(self, arr: DeviceArray, host) -> None:
        pass


def count(bundle: Path) -> dict:
    """Launch counts of one decode step (the WHILE body) and one prefill chunk of ``bundle``."""
    from toolcall.runtime.bundle.files import read_contract
    from toolcall.runtime.cuda.backend import load_cuda_model
    from toolcall.runtime.cuda.graph import DecodeGraph
    from toolcall.runtime.grammar.trie import Grammar
    c = read_contract(bundle)
    if c.target.sm_arch is None:
        raise SystemExit(f"{bundle}: a {c.target.name} bundle has no kernels; build one for a GPU target")
    model = load_cuda_model(bundle, c, Grammar.read(bundle / "grammar.msgpack"), gpu=CountingGpu())
    try:
        loop = DecodeGraph(model)
        body, chunk = loop.body(0), loop.chunk(0)
        layers = c.model.num_layers
        sample = loop.first_sample()
        per_layer = (len(body) - len(sample) - 1) / layers  # minus sampling and embed_gather
        chunk_per_layer = (len(chunk) - 1) / layers
        for ln in body + chunk:  # pack and shape-check every launch as a Program would
            model.gpu.launch(model.kernel(ln.fn), *ln.shape, ln.args)
        return {"bundle": str(bundle), "precision": c.precision.weights, "layers": layers,
                "decode_step": len(body), "decode_per_layer": per_layer, "sampling": len(sample),
                "decode_kernels": dict(collections.Counter(ln.fn for ln in body)),
                "prefill_chunk": len(chunk), "prefill_per_layer": chunk_per_layer}
    finally:
        model.close()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("bundle", type=Path)
    ap.add_argument("--json", action="store_true", help="print the counts as JSON before the summary line")
    args = ap.parse_args()
    r = count(args.bundle)
    if args.json:
        print(json.dumps(r, indent=1))
    else:
        print(f"{r['bundle']}: {r['precision']}, {r['layers']} layers")
        for fn, n in sorted(r["decode_kernels"].items(), key=lambda kv: -kv[1]):
            print(f"  {n:5d}  {fn}")
        print(f"prefill chunk: {r['prefill_chunk']} launches ({r['prefill_per_layer']:g} per layer)")
    print(f"launches per decode step: {r['decode_step']} ({r['decode_per_layer']:g} per layer)")


if __name__ == "__main__":
    main()
