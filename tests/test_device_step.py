"""The CUDA serving step with the grammar and the sampling on the device (runtime/cuda/device_step.py), on the
emulated device (each launch runs its kernel's numpy reference: the plan/record protocol, launch plans and
host bookkeeping are checked here, kernel arithmetic on a GPU): the project's own tool model answers a mixed
batch (greedy and sampled rows, tool subsets, "at least one", "at most one", a request's own tool list)
exactly as the CPU backend does, through decode-only, mixed (decode rows by the decode kernel beside prefill
chunks) and prefill-only steps; a step copies one plan in and one record out, never the hidden rows; the
sample launches come from a few row buckets; every page and slot comes back; failed loads free what they
took."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from emulated_gpu import EmulatedGpu
from tokenizers import Tokenizer

from toolcall.builder.catalog import load_catalog
from toolcall.builder.checkpoint import open_checkpoint
from toolcall.builder.quantize import quantize_checkpoint
from toolcall.builder.trie import build_grammar
from toolcall.common.errors import Refusal
from toolcall.kernels.declarations import declarations
from toolcall.runtime.batching.batcher import Request, StepBatcher
from toolcall.runtime.batching.sampling import Sampling
from toolcall.runtime.bundle.contract import Limits
from toolcall.runtime.bundle.tensor_file import SafetensorsFile
from toolcall.runtime.cpu.backend import cpu_batcher, load_cpu_weights
from toolcall.runtime.cuda.backend import CudaModel
from toolcall.runtime.cuda.step_io import StepLayout, bucket
from toolcall.runtime.grammar.stepper import GrammarStepper

MODEL = Path(__file__).parents[1] / "models" / "toolcall-qwen3-tiny"
CUBINS = {d.file: b"" for d in declarations().values()}  # the emulator runs references, not cubins
REQUESTS = ["Book a flight to Paris and a hotel there", "What's the weather in Oslo tomorrow?",
            "Send an email to Bob about the budget", "Convert 100 euros to dollars", "hello, how are you?",
            "Remind me to call Alice on Friday and add it to my calendar", "Play some jazz",
            "Translate this note to French and share it with Carol"]


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    ckpt = open_checkpoint(MODEL)
    cfg = ckpt.config
    tok = Tokenizer.from_file(str(MODEL / "tokenizer.json"))
    catalog = load_catalog("builder/data/tools-64.json")
    grammar = build_grammar(catalog, tok, cfg.eos_token_ids[0])
    names = [t.name for t in catalog.tools]
    own = build_grammar(dataclasses.replace(catalog, tools=catalog.tools[:6]), tok, cfg.eos_token_ids[0])  # 6 tools
    limits = Limits(page_size=16, num_pages=8 * 8, max_sequences=8, max_tokens_per_step=64, prefill_chunk=32,
                    max_input_tokens=96, max_output_tokens=grammar.max_answer_tokens)
    weights = tmp_path_factory.mktemp("device-step") / "w.safetensors"
    quantize_checkpoint(ckpt, cfg, "fp8_e4m3", weights)
    prompts = [tuple(tok.encode(grammar.render_prompt(r)).ids) for r in REQUESTS]
    return dict(cfg=cfg, grammar=grammar, own=GrammarStepper(own), limits=limits, weights=weights, prompts=prompts,
                names=names)


def requests(parts) -> list[Request]:
    """Greedy and sampled rows under every answer control, one with its own tool list."""
    p, names = parts["prompts"], parts["names"]
    flight, hotel = names.index("book_flight"), names.index("book_hotel")
    return [Request(p[0]), Request(p[1], Sampling(1.2, 0.9, 7)), Request(p[2], tools=(flight, hotel)),
            Request(p[3], max_tools=1), Request(p[4], require_tool=True), Request(p[5], Sampling(0.8, 1.0, 3)),
            Request(p[6], grammar=parts["own"]), Request(p[7], Sampling(2.0, 0.95, 11), max_tools=1),
            Request(p[0], Sampling(1.5, 0.8, 5), keep_logits=True), Request(p[2], max_output_tokens=3)]


def device_model(parts, gpu=None, columns: int | None = None) -> tuple[CudaModel, EmulatedGpu]:
    gpu = gpu or EmulatedGpu()
    with SafetensorsFile(parts["weights"]) as st:
        model = CudaModel(parts["cfg"], parts["limits"], parts["grammar"], "fp8_e4m3", st, CUBINS, gpu,
                          candidate_columns=columns)
    return model, gpu


def batcher(model, parts, head: str = "sparse") -> StepBatcher:
    return StepBatcher.for_limits(model, model.kv, parts["grammar"], parts["limits"], head)


def answers(results) -> list[tuple]:
    return [(tuple(r.token_ids), tuple(r.tools), r.finish) for r in results]


@pytest.fixture(scope="module")
def cpu_answers(parts):
    gen = cpu_batcher(parts["cfg"], load_cpu_weights(parts["weights"], parts["cfg"]), parts["grammar"],
                      parts["limits"])
    return gen.generate(requests(parts))


def test_the_device_step_answers_as_the_cpu_does(parts, cpu_answers):
    model, gpu = device_model(parts)
    launched, copied_out = [], []
    launch, download = gpu.launch, gpu.download
    gpu.launch = lambda kernel, *a, **k: (launched.append(kernel.name), launch(kernel, *a, **k))[1]
    gpu.download = lambda arr, shape, dtype: (copied_out.append(arr.nbytes), download(arr, shape, dtype))[1]
    got = batcher(model, parts).generate(requests(parts))
    assert answers(got) == answers(cpu_answers)
    assert any(r.tools for r in got) and got[3].tools and len(got[3].tools) <= 1 and got[4].tools
    assert set(got[2].tools) <= {"book_flight", "book_hotel"} and set(got[6].tools) <= set(parts["names"][:6])
    kept, want = got[8], cpu_answers[8]  # keep_logits: the candidates and their logits, step by step
    assert all(np.array_equal(a, b) for a, b in zip(kept.step_candidates, want.step_candidates))
    assert max(np.max(np.abs(np.where(c >= 0, a - b, 0))) for a, b, c in
               zip(kept.step_logits, want.step_logits, kept.step_candidates)) < 1e-3
    assert {"sample_draw", "grammar_candidates", "head_sparse", "grammar_advance"} <= set(launched)
    forward = [k for k in model._programs if k[0] == "forward"]  # ("forward", rows, prefill tiles, decode rows)
    assert any(k[3] > 0 for k in forward) and any(k[3] == 0 for k in forward)  # mixed steps and prefill-only ones
    assert any(k[0] == "decode" for k in model._programs)
    io_bytes = model.device_step.io.layout.nbytes
    assert copied_out and set(copied_out) == {io_bytes}  # one record a step; no hidden rows, no logits apart
    lim = parts["limits"]
    assert model.kv.free_slots == lim.max_sequences and model.kv.free_pages == lim.num_pages
    model.close()
    assert not gpu.buffers


def test_rows_after_the_first_of_a_group_keep_their_own_logits_in_wider_buffers(parts, cpu_answers):
    """Request tools may make the step buffers wider than a group's grammar (Contract.candidate_columns): the
    kernels write a group's rows packed at the grammar's width, and the record must read them so (the kept
    logits, candidates and margins of every row after the first of a group)."""
    model, _ = device_model(parts, columns=parts["grammar"].max_edges_per_node + 5)
    reqs = requests(parts)
    got = batcher(model, parts).generate([reqs[0], reqs[3], reqs[8]])  # the kept row third in its group
    kept, want = got[2], cpu_answers[8]
    assert answers([kept]) == answers([want])
    assert all(np.array_equal(a, b) for a, b in zip(kept.step_candidates, want.step_candidates))
    assert max(np.max(np.abs(np.where(c >= 0, a - b, 0))) for a, b, c in
               zip(kept.step_logits, want.step_logits, kept.step_candidates)) < 1e-3
    model.close()


def test_the_host_picking_modes_still_answer_the_same(parts, cpu_answers):
    """The check head (sparse picks against the dense head) goes through the host picker: the same answers."""
    model, _ = device_model(parts)
    assert answers(batcher(model, parts, "check").generate(requests(parts))) == answers(cpu_answers)
    model.close()


def test_sample_launches_come_from_a_few_row_buckets(parts):
    """Steps of 1..8 sampled rows launch the sample chain with 1, 2, 4 or 8 rows, and steps of decode rows the
    forward with as many (padding rows skipped), so the packed programs (and the graphs a GPU would capture
    per bucket) are few."""
    assert [bucket(n, 8) for n in range(1, 9)] == [1, 2, 4, 4, 8, 8, 8, 8]
    assert bucket(5, 6) == 6 and bucket(3, 3) == 3
    model, _ = device_model(parts)
    gen = batcher(model, parts)
    for n in range(1, 9):
        gen.generate([Request(p) for p in parts["prompts"][:n]])
    keys = [k for k in model._programs if k[0] == "step_sample"]
    assert {k[3] for k in keys} <= {1, 2, 4, 8} and len(keys) <= 4 and {k[1] for k in keys} == {0}
    decode = {k[1] for k in model._programs if k[0] == "decode"}  # decode-row steps: the decode kernel, padded
    assert decode and decode <= {1, 2, 4, 8}
    model.close()


def test_the_plan_and_record_layout_is_aligned_and_sized():
    layout = StepLayout(rows=8, columns=26, words=2)
    assert all(off % 16 == 0 for off in layout.offsets.values())
    ends = sorted((off, name) for name, off in layout.offsets.items())
    for (off, name), (nxt, _) in zip(ends, ends[1:] + [(layout.nbytes, None)]):
        dtype, shape = layout.specs[name]
        assert off + int(np.prod(shape)) * dtype.itemsize <= nxt, name


def test_failed_loads_free_what_they_took(parts):
    """Failed loads in a row (a missing tensor, a missing cubin, then the device refusing each of a load's
    allocations in turn) leave no device allocation behind."""
    gpu = EmulatedGpu()
    with SafetensorsFile(parts["weights"]) as st:
        tensors = {n: st.get(n) for n in st.names()}
    args = (parts["cfg"], parts["limits"], parts["grammar"], "fp8_e4m3")
    with pytest.raises(Refusal, match="model.norm.weight"):
        CudaModel(*args, {n: a for n, a in tensors.items() if n != "model.norm.weight"}, CUBINS, gpu)
    with pytest.raises(Refusal, match="cubin is missing"):
        CudaModel(*args, tensors, {k: v for k, v in CUBINS.items() if k != "sample_draw"}, gpu)
    alloc, count = gpu.alloc, [0]

    def counting(nbytes):
        count[0] += 1
        return alloc(nbytes)
    gpu.alloc = counting
    CudaModel(*args, tensors, CUBINS, gpu).close()
    allocations = count[0]
    assert allocations >= 3 and not gpu.buffers
    for refused in range(1, allocations + 1):
        count[0] = 0

        def refusing(nbytes, refused=refused):
            count[0] += 1
            if count[0] == refused:
                raise MemoryError(f"emulated: allocation {refused} refused")
            return alloc(nbytes)
        gpu.alloc = refusing
        with pytest.raises(MemoryError):
            CudaModel(*args, tensors, CUBINS, gpu)
        assert not gpu.buffers, f"a load refused its allocation {refused} left device memory behind"


def test_the_fixed_position_step_replays_the_same_work(parts):
    """bench/gpu_check_timings.py's step_ms_p<P> on the emulated device: before every replay the row is back at P
    with its grammar at the root, so each replay picks the same first token at the same position; positions
    past the bundle's span are skipped; the timing slot is given back."""
    import sys
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
    import gpu_check_timings

    from toolcall.runtime.cuda.buffers import offset
    from toolcall.runtime.cuda.graph import DecodeGraph
    model, gpu = device_model(parts)
    loop = DecodeGraph(model)
    seen, launch = [], loop.launch

    def recording(exe, *a):
        ms = launch(exe, *a)
        slot = int(gpu.download(offset(model.ws["decode_rows"], 8), (1,), np.int32)[0])
        first = gpu.download(offset(model.ws["out_tokens"], 4 * slot * model.limits.max_output_tokens), (1,), np.int32)
        seen.append((int(gpu.download(model.ws["decode_rows"], (2,), np.int32)[1]), int(first[0])))
        return ms
    loop.launch = recording
    res = gpu_check_timings.fixed_position_steps(model, loop, parts["prompts"][0])
    span = parts["limits"].max_input_tokens + parts["limits"].max_output_tokens
    assert set(res) == {f"step_ms_p{p}" for p in gpu_check_timings.STEP_POSITIONS if p < span} == {"step_ms_p100"}
    assert len(seen) == gpu_check_timings.FIXED_REPLAYS + 3 and len(set(seen)) == 1 and seen[0][0] == 101
    assert model.kv.free_slots == parts["limits"].max_sequences
    model.close()


def test_a_failed_step_leaves_the_split_counters_zero(parts):
    """attention_decode's split counters are zero between launches (each launch's last block resets them): a step
    that fails part-way (here a launch refused after the counters were left mid-count) must not leave counts that
    every later merge of those rows would trust."""
    model, gpu = device_model(parts)
    counters = model.ws["attn_count"]
    gpu.copy_in(counters, np.arange(counters.nbytes // 4, dtype=np.int32) + 1)  # an interrupted launch's counts
    launch = gpu.launch

    def refuse_the_sampling(kernel, *a, **k):
        if kernel.name == "sample_draw":
            raise RuntimeError("launch refused")
        return launch(kernel, *a, **k)

    gpu.launch = refuse_the_sampling
    with pytest.raises(RuntimeError, match="launch refused"):
        batcher(model, parts).generate([requests(parts)[1]])
    assert not gpu.download(counters, (counters.nbytes // 4,), np.int32).any()
    model.close()
