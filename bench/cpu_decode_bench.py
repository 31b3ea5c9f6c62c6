"""CPU decode-step benchmark: sparse head vs dense head vs Hugging Face transformers, side by side.

    python bench/cpu_decode_bench.py BUNDLE [--steps 16] [--prompt-tokens 32] [--json OUT]

All three run in one process on the same dequantized float32 weights: the reference
backend with the grammar-bounded sparse head (root node candidates), the same with the dense
head (every vocab row), and transformers' forward with its KV cache. Prints one summary line.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundle")
    ap.add_argument("--steps", type=int, default=16)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1, help="BLAS threads for ours, torch threads for transformers")
    ap.add_argument("--json", dest="json_out", default=None)
    args = ap.parse_args()

    import torch
    import transformers

    from toolcall.builder.synth import hf_config_json
    from toolcall.common.formats import KV_BF16
    from toolcall.runtime.bundle.files import GRAMMAR_FILE, WEIGHTS_FILE, read_contract
    from toolcall.runtime.cpu.backend import load_cpu_weights
    from toolcall.runtime.cpu.kv_pool import PagedKVPool
    from toolcall.runtime.cpu.model import CpuModel
    from toolcall.runtime.grammar.stepper import GrammarStepper
    from toolcall.runtime.grammar.trie import Grammar

    folder = Path(args.bundle)
    contract = read_contract(folder)
    cfg = contract.model
    weights = load_cpu_weights(folder / WEIGHTS_FILE, cfg)
    model = CpuModel(cfg, weights, blas_threads=args.threads)
    torch.set_num_threads(args.threads)
    stepper = GrammarStepper(Grammar.read(folder / GRAMMAR_FILE))
    cand, _, allowed = stepper.allowed_mask_batch(stepper.initial_states(1))
    cand = np.maximum(cand, 0)
    prompt = np.random.default_rng(0).integers(3, 3000, args.prompt_tokens)
    total = args.prompt_tokens + 2 * args.steps + 4

    def ours(head: str):
        pool = PagedKVPool(cfg, -(-total // 32), 32, 1, total, KV_BF16)
        slot = pool.admit(total, tuple(int(t) for t in prompt))  # the prompt: decode rows are answer rows
        model.forward(prompt, np.full(len(prompt), slot), np.arange(len(prompt)), pool)

        def step(i):
            h = model.forward(np.array([5 + i]), np.array([slot]), np.array([len(prompt) + i]), pool)
            model.sparse_logits(h, cand) if head == "sparse" else model.dense_logits(h)
        return step

    hf_cfg = transformers.AutoConfig.for_model(**hf_config_json(cfg, "fp32"))
    hf = transformers.AutoModelForCausalLM.from_config(hf_cfg, dtype=torch.float32).eval()
    state = {k: torch.from_numpy(v) for k, v in weights.items()}
    if cfg.tie_word_embeddings:
        state["lm_head.weight"] = state["model.embed_tokens.weight"]
    hf.load_state_dict(state, strict=False)
    torch.set_grad_enabled(False)
    cache = {"past": hf(torch.tensor(prompt)[None], use_cache=True).past_key_values}

    def hf_step(i):
        cache["past"] = hf(torch.tensor([[5 + i]]), past_key_values=cache["past"], use_cache=True).past_key_values

    # Interleaved: step i of each contender back to back, so load drift on a shared machine
    # hits all three alike; the first step of each is a warm-up.
    contenders = {"sparse": ours("sparse"), "dense": ours("dense"), "hf": hf_step}
    times = {k: [] for k in contenders}
    for i in range(args.steps + 1):
        for name, fn in contenders.items():
            start = time.perf_counter()
            fn(i)
            if i:
                times[name].append(time.perf_counter() - start)
    sparse_ms, dense_ms, hf_ms = (1e3 * statistics.median(times[k]) for k in ("sparse", "dense", "hf"))

    result = {"bundle": str(folder), "precision": contract.precision.weights, "layers": cfg.num_layers,
              "hidden": cfg.hidden_size, "vocab": cfg.vocab_size, "sparse_ms": sparse_ms, "dense_ms": dense_ms,
              "hf_ms": hf_ms, "sparse_speedup_vs_dense": dense_ms / sparse_ms, "vs_hf": hf_ms / sparse_ms,
              "torch_threads": torch.get_num_threads(), "load_avg": os.getloadavg()[0],
              "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                          "python": platform.python_version(), "numpy": np.__version__, "torch": torch.__version__}}
    if args.json_out:
        Path(args.json_out).write_text(json.dumps(result, indent=2) + "\n")
    print(f"decode step: sparse {sparse_ms:.1f} ms, dense {dense_ms:.1f} ms ({dense_ms / sparse_ms:.2f}x), "
          f"transformers {hf_ms:.1f} ms (ours {hf_ms / sparse_ms:.2f}x faster) [{contract.precision.weights}, "
          f"{cfg.num_layers} layers, vocab {cfg.vocab_size}]")


if __name__ == "__main__":
    main()
