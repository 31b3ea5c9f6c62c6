"""The grammar decode loop on the GPU: grammar_candidates -> head_gather -> grammar_advance,
stepped from the host (cond_handle 0; the cases: toolcall.kernels.cases.grammar_loop) and as the
body of a WHILE conditional graph node whose condition grammar_advance clears through
cudaGraphSetConditional. Both must write exactly the answers of the numpy references
(kernels/reference.py), which follow the grammar stepper.

The cases' grammars are frozen in kernels/cases/grammars.npz (kernels/ may not import the builder);
``test_frozen_grammars_are_the_builders`` holds them to the builder's. After a builder change that
moves them, regenerate the file:

    TOOLCALL_FREEZE_GRAMMARS=1 python3 -m pytest -q tests/test_kernels_gpu_loop.py -k frozen
"""
from __future__ import annotations

import os
from importlib import resources

import numpy as np
import pytest
from test_kernels_gpu import params

from toolcall.builder.catalog import AnswerFormat, Catalog, TokenizedCatalog, Tool
from toolcall.builder.trie import grammar_from_paths
from toolcall.kernels.cases import case_rng, grammar_loop, run_case
from toolcall.kernels.cases.grammar_loop import (GRAMMAR_ARRAYS, GRAMMAR_SIZES, GRAMMAR_SOURCES, GRAMMARS_FILE, Loop,
                                                 body_launches, download_loop, load_grammar, upload_loop)
from toolcall.kernels.runner import DryRunGpu, KernelRunner, run_while_graph


def make_grammar(paths, max_tools, allow_empty=False):
    catalog = Catalog(tools=tuple(Tool(f"tool{i}") for i in range(len(paths))),
                      answer=AnswerFormat(max_tools=max_tools, allow_empty=allow_empty))
    return grammar_from_paths(TokenizedCatalog(catalog, tuple(map(tuple, paths)), 1000, 1001))


def frozen_fields(name: str) -> dict[str, np.ndarray]:
    """The builder's grammar ``name`` as grammars.npz holds it: "{name}/{field}" -> array (sizes 0-d int64)."""
    g = make_grammar(**GRAMMAR_SOURCES[name])
    return ({f"{name}/{k}": np.asarray(getattr(g, k)) for k in GRAMMAR_ARRAYS}
            | {f"{name}/{k}": np.array(int(getattr(g, k)), np.int64) for k in GRAMMAR_SIZES})


def freeze_grammars() -> None:
    """Writes kernels/cases/grammars.npz from the builder (run by the test below under TOOLCALL_FREEZE_GRAMMARS=1)."""
    fields = {k: a for name in GRAMMAR_SOURCES for k, a in frozen_fields(name).items()}
    with resources.as_file(resources.files(grammar_loop.__package__).joinpath(GRAMMARS_FILE)) as path:
        np.savez_compressed(path, **fields)


@pytest.mark.parametrize("name", GRAMMAR_SOURCES)
def test_frozen_grammars_are_the_builders(name):
    """grammars.npz holds exactly the builder's grammars (each array's dtype, shape and values; each size), so the
    cases' data cannot drift from the builder."""
    if os.environ.get("TOOLCALL_FREEZE_GRAMMARS") == "1":
        freeze_grammars()
    g = load_grammar(name)
    for key, want in frozen_fields(name).items():
        got = np.asarray(getattr(g, key.split("/")[1]))
        assert got.dtype == want.dtype or want.ndim == 0, key
        assert got.shape == want.shape and np.array_equal(got, want), key


LOOPS = params(grammar_loop.CASES)  # ids "prefix", "wide"


@pytest.mark.gpu
@pytest.mark.parametrize("case", LOOPS)
def test_host_stepped_loop_matches_the_references(dev, case):
    run_case(dev, case)


@pytest.mark.parametrize("case", LOOPS)
def test_loop_launches_pack_their_arguments(case):
    """CPU: the loop body's launches name the kernels' parameters, with the right kinds."""
    dry = KernelRunner(DryRunGpu())
    run_case(dry, case)
    assert dry.gpu.launches == ["grammar_candidates", "head_gather", "grammar_advance"]


@pytest.mark.gpu
@pytest.mark.parametrize("case", LOOPS)
def test_while_graph_loop_stops_on_the_device(dev, case):
    """cudaGraphSetConditional resolves at module load and ends the WHILE loop; the device
    loop writes the same answers as host-driven stepping / the references."""
    lp = Loop(case_rng(case.spec), load_grammar(*case.spec))
    a = upload_loop(dev, lp)
    run_while_graph(dev, lambda handle: body_launches(lp, a, handle))
    for got, want, what in zip(download_loop(dev, lp, a), lp.reference(), ("tokens", "len", "status", "state")):
        dev.same(got, want, f"WHILE graph {what}")
    assert dev.gpu.download(a["cond"], (1,), np.int32)[0] == 0
    dev.same(dev.gpu.download(a["ws"], (2,), np.int32), np.zeros(2, np.int32), "sync_ws left zeroed")


@pytest.mark.parametrize("case", LOOPS)
def test_while_graph_loop_stops_on_the_simulated_device(sim, case):
    """The same WHILE graph on the simulated device (its own graphs: toolcall.kernels.sim.device.SimGraphs)."""
    test_while_graph_loop_stops_on_the_device(sim, case)
