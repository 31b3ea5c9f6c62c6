"""Grammar figures: trie size and build time for the 64-tool example catalog and a generated
4,096-tool catalog, with the project's synthetic byte-level BPE tokenizer.

Usage: python bench/grammar_figures.py [--out PATH]
Prints one summary line and writes JSON (figures + machine) to PATH.
"""
from __future__ import annotations

import argparse
import itertools
import json
import os
import platform
import time
from pathlib import Path

from toolcall.builder.catalog import load_catalog
from toolcall.builder.synth_tokenizer import END_OF_TURN, train_tokenizer
from toolcall.builder.trie import build_grammar
from toolcall.runtime.grammar.stepper import GrammarStepper
from toolcall.runtime.grammar.trie import Grammar

VERBS = ("get set list create update delete search find send book cancel check track convert "
         "schedule share upload download").split()
NOUNS = ("weather forecast flight hotel email event calendar invoice payment order package note "
         "task reminder contact file folder document stock playlist").split()
QUALIFIERS = ("", "_by_id", "_by_name", "_in_bulk", "_for_team", "_history", "_status", "_summary",
              "_v2", "_async", "_preview", "_draft")


def generated_catalog(count: int) -> dict:
    names = ("".join(parts) for parts in itertools.product(VERBS, ["_"], NOUNS, QUALIFIERS))
    tools = [{"name": n} for n in itertools.islice(names, count)]
    assert len(tools) == count, "word lists too short for the requested catalog"
    return {"tools": tools}


def figures(catalog_source, tokenizer, end_id: int, repeats: int = 3) -> dict:
    catalog = load_catalog(catalog_source)
    seconds = []
    for _ in range(repeats):
        start = time.perf_counter()
        grammar = build_grammar(catalog, tokenizer, end_id)
        seconds.append(time.perf_counter() - start)
    data = grammar.to_msgpack()
    start = time.perf_counter()
    Grammar.from_msgpack(data)
    read_s = time.perf_counter() - start
    stepper = GrammarStepper(grammar)
    states = stepper.initial_states(256)
    start = time.perf_counter()
    stepper.allowed_mask_batch(states)  # root: the widest node, the worst case per step
    mask_s = time.perf_counter() - start
    return {**grammar.summary(), "build_s_best": min(seconds), "msgpack_bytes": len(data),
            "read_s": read_s, "allowed_mask_batch256_root_s": mask_s,
            "state_bytes": states.itemsize}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="artifacts/bench/grammar_figures.json")
    args = parser.parse_args()
    tokenizer = train_tokenizer(seed=0)
    end_id = tokenizer.token_to_id(END_OF_TURN)
    example = str(Path(__file__).resolve().parents[1] / "builder" / "data" / "tools-64.json")
    result = {
        "benchmark": "grammar_figures",
        "machine": {"platform": platform.platform(), "processor": platform.processor(),
                    "cpus": os.cpu_count(), "python": platform.python_version()},
        "tokenizer": {"kind": "synth byte-level BPE", "seed": 0,
                      "vocab_size": tokenizer.get_vocab_size()},
        "tools_64": figures(example, tokenizer, end_id),
        "tools_4096": figures(generated_catalog(4096), tokenizer, end_id),
    }
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    with open(args.out, "w") as fh:
        json.dump(result, fh, indent=2)
    small, large = result["tools_64"], result["tools_4096"]
    print(f"grammar: 64 tools -> {small['num_nodes']} nodes {small['num_edges']} edges "
          f"max {small['max_edges_per_node']} edges/node {small['build_s_best'] * 1e3:.1f} ms "
          f"{small['msgpack_bytes']} B | 4096 tools -> {large['num_nodes']} nodes "
          f"{large['num_edges']} edges max {large['max_edges_per_node']} edges/node "
          f"{large['build_s_best'] * 1e3:.1f} ms {large['msgpack_bytes'] / 2**20:.2f} MiB "
          f"(json: {args.out})")


if __name__ == "__main__":
    main()
