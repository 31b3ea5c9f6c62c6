"""The sampled pick: Philox4x32-10 against its published known answers, and the compiled float32 draw
(runtime/batching/philox.py, sampling.py ``draw_rows``) against the numpy reference of the same algorithm
(kernels/reference_draw.py), which kernels/sample_draw.cu is held to on a GPU (its launches packed on the
CPU)."""
from __future__ import annotations

import numpy as np
import pytest

from toolcall.kernels import reference_draw as ref
from toolcall.kernels.runner import DryRunGpu, KernelRunner, Out
from toolcall.runtime.batching import sampling
from toolcall.runtime.batching.sampling import Sampling, draw_rows, inverse_temperature

# Random123's kat_vectors, "philox4x32 10": counter (4 words), key (2 words), output (4 words)
KNOWN_ANSWERS = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((0xFFFFFFFF,) * 4, (0xFFFFFFFF,) * 2, (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


def reference_picks(logits, allowed, params: list[Sampling], tokens: list[int]) -> np.ndarray:
    """kernels/reference_draw.py's picks for these rows and options."""
    return ref.sample_draw(logits, allowed, np.array([inverse_temperature(q.temperature) for q in params]),
                           np.array([q.top_p for q in params], np.float32),
                           np.array([q.seed for q in params], np.uint64), np.asarray(tokens, np.int32))


def float64_draw(logits, allowed, params: Sampling, u: float) -> int:
    """The textbook draw: float64 softmax, cut to top_p, inverse CDF at u (what the float32 draw approximates)."""
    idx = np.flatnonzero(allowed)
    z = logits[idx].astype(np.float64) / params.temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    order = np.argsort(-p, kind="stable")
    order = order[np.cumsum(p[order]) - p[order] < params.top_p]
    q = p[order] / p[order].sum()
    return int(idx[order[min(np.searchsorted(np.cumsum(q), u, side="right"), len(q) - 1)]])


@pytest.mark.parametrize("counter, key, expected", KNOWN_ANSWERS)
def test_philox_gives_the_published_known_answers(counter, key, expected):
    from numba import njit

    from toolcall.runtime.batching.philox import philox4x32

    @njit
    def run(c, k):
        return philox4x32(c[0], c[1], c[2], c[3], k[0], k[1])

    assert tuple(int(w) for w in run(np.array(counter, np.uint32), np.array(key, np.uint32))) == expected
    assert tuple(ref.philox4x32(np.array([counter], np.uint32), np.array([key], np.uint32))[0]) == expected


def test_uniform_equals_the_numpy_reference():
    from numba import njit

    from toolcall.runtime.batching.philox import uniform

    @njit
    def many(seeds, tokens, out):
        for i in range(len(seeds)):
            out[i] = uniform(seeds[i], 0, tokens[i])

    rng = np.random.default_rng(3)
    seeds = np.concatenate([[0, 1, 2**32 - 1, 2**32, 2**63 - 1], rng.integers(0, 2**63, 2000, dtype=np.uint64)])
    tokens = np.concatenate([[0, 1, 2, 3, 2**31], rng.integers(0, 4096, 2000)])
    out = np.empty(len(seeds), np.float32)
    many(seeds.astype(np.uint64), tokens.astype(np.int64), out)
    assert (out == ref.uniform(seeds, tokens)).all()
    assert out.min() >= 0 and out.max() < 1 and abs(out.mean() - 0.5) < 0.02


DRAW_CASES = [  # (candidates, allowed share, temperature, top_p)
    (4, 1.0, 0.8, 1.0), (4, 1.0, 0.8, 0.95), (4, 1.0, 0.8, 1e-3), (64, 0.5, 1.3, 0.9), (64, 0.1, 0.2, 1.0),
    (40, 1.0, 5.0, 0.5), (7, 0.6, 1e-3, 1.0), (128, 0.3, 100.0, 0.99), (9, 1.0, 1e-300, 1.0),
]


@pytest.mark.parametrize("width, share, temperature, top_p", DRAW_CASES)
def test_draw_rows_picks_what_the_reference_picks(width, share, temperature, top_p):
    """The compiled batch draw against the numpy reference, 200 rows a case; a row alone, in a batch, or
    padded wider (more disallowed columns) picks the same candidate; and the float32 draw picks what the
    float64 textbook draw picks with the same uniform but for rows where the two land on either side of a
    boundary (at most 2 of 200)."""
    rng = np.random.default_rng(width)
    logits = (rng.standard_normal((200, width)) * 3).astype(np.float32)
    logits[:, 1::5] = logits[:, :1]  # some ties
    allowed = rng.random((200, width)) < share
    allowed[np.arange(200), rng.integers(0, width, 200)] = True
    params = [Sampling(temperature, top_p, int(s)) for s in rng.integers(0, 2**63, 200, dtype=np.uint64)]
    tokens = rng.integers(0, 64, 200).tolist()
    batch = sampling.sample_rows(logits, allowed, params, tokens)
    wide = sampling.sample_rows(np.pad(logits, ((0, 0), (0, 9))), np.pad(allowed, ((0, 0), (0, 9))), params, tokens)
    for b in range(0, 200, 13):
        assert sampling.sample_row(logits[b], allowed[b], params[b], tokens[b]) == batch[b]
    assert (wide == batch).all() and allowed[np.arange(200), batch].all()
    assert batch.tolist() == reference_picks(logits, allowed, params, tokens).tolist()
    u = ref.uniform(np.array([q.seed for q in params], np.uint64), np.array(tokens))
    textbook = [float64_draw(logits[b], allowed[b], params[b], float(u[b])) for b in range(200)]
    assert sum(a != b for a, b in zip(batch.tolist(), textbook)) <= 2


def test_a_one_candidate_row_is_that_candidate_and_draws_nothing():
    logits = np.array([[3.0, -1.0, 0.5, 7.0]], np.float32)
    for only in range(4):
        allowed = (np.arange(4) == only)[None]
        out = draw_rows(logits, allowed, np.ones(1, np.float32), np.ones(1, np.float32), np.array([5], np.uint64),
                        np.zeros(1, np.int64))
        assert out.tolist() == [only]


def test_each_answer_token_has_its_own_draw():
    """Over 4,000 answer-token indices of one seed, a fair coin between two equal logits lands both ways about
    evenly; and the same index always draws the same way."""
    logits, allowed = np.zeros((4000, 2), np.float32), np.ones((4000, 2), bool)
    params = [Sampling(1.0, 1.0, 77)] * 4000
    picks = sampling.sample_rows(logits, allowed, params, list(range(4000)))
    assert 1800 < picks.sum() < 2200
    assert (sampling.sample_rows(logits, allowed, params, list(range(4000))) == picks).all()


def exp32_cases() -> np.ndarray:
    return np.concatenate([np.linspace(-100, 100, 20001), [-np.inf, -1e30, 0.0, -0.0, 88.3, 1e30]]).astype(np.float32)


def test_the_reference_exp32_is_the_compiled_one():
    from numba import njit

    from toolcall.runtime.jit.exp32 import exp32

    @njit
    def loop(x, out):
        for i in range(x.size):
            out[i] = exp32(x[i])

    x = exp32_cases()
    out = np.empty_like(x)
    loop(x, out)
    with np.errstate(over="ignore", invalid="ignore"):
        assert np.array_equal(out.view(np.uint32), ref.exp32(x).view(np.uint32))


def draw_case(rng, rows: int, width: int, share: float, temperature: float, top_p: float):
    logits = (rng.standard_normal((rows, width)) * 3).astype(np.float32)
    logits[:, 1::5] = logits[:, :1]  # ties
    valid = (rng.random((rows, width)) < share).astype(np.uint8)
    valid[0] = 0  # a row with nothing allowed
    valid[1] = 0
    valid[1, width // 2] = 1  # a row with one candidate
    return dict(logits=logits, valid=valid, inv_temperature=np.full(rows, inverse_temperature(temperature)),
                top_p=np.full(rows, top_p, np.float32), seed=rng.integers(0, 2**63, rows, dtype=np.uint64),
                token=rng.integers(0, 64, rows).astype(np.int32))


KERNEL_CASES = [(64, 26, 0.6, 1.0, 1.0), (33, 64, 0.3, 0.7, 0.9), (8, 512, 0.9, 2.0, 0.5), (5, 3, 1.0, 1e-3, 1.0)]


def run_kernel(d: KernelRunner, case: dict) -> np.ndarray:
    rows, width = case["logits"].shape
    return d.run("sample_draw", logits=case["logits"], valid=case["valid"], stride=width, width=width,
                 inv_temperature=case["inv_temperature"], top_p=case["top_p"], seed=case["seed"], token=case["token"],
                 B=rows, out=Out(np.full(rows, -7, np.int32)))["out"]


@pytest.mark.parametrize("spec", KERNEL_CASES)
def test_the_cpu_draw_equals_the_kernels_reference(spec):
    case = draw_case(np.random.default_rng(spec[1]), *spec)
    cpu = draw_rows(case["logits"], case["valid"].astype(bool), case["inv_temperature"], case["top_p"], case["seed"],
                    case["token"].astype(np.int64))
    want = ref.sample_draw(**case)
    assert cpu.tolist() == want.tolist() and want[0] == -1 and want[1] == spec[1] // 2


@pytest.mark.parametrize("spec", KERNEL_CASES)
def test_kernel_launches_pack_their_arguments(spec):
    """CPU: the launch names sample_draw's parameters, each once, with the right kinds, on a dry-run device."""
    dry = KernelRunner(DryRunGpu())
    run_kernel(dry, draw_case(np.random.default_rng(0), *spec))
    assert dry.gpu.launches


@pytest.mark.gpu
@pytest.mark.parametrize("spec", KERNEL_CASES)
def test_kernel_draws_what_the_reference_draws(dev, spec):
    case = draw_case(np.random.default_rng(spec[1]), *spec)
    dev.same(run_kernel(dev, case), ref.sample_draw(**case), "sample_draw")


@pytest.mark.parametrize("spec", KERNEL_CASES)
def test_kernel_on_the_executor_draws_what_the_reference_draws(sim, spec):
    case = draw_case(np.random.default_rng(spec[1]), *spec)
    assert run_kernel(sim, case).tolist() == ref.sample_draw(**case).tolist()


# -- the draw at its edges: the CPU draw and the kernel's reference agree bit for bit, and say what they do ---------

def edge_case(name: str, rows: int = 40, width: int = 24) -> dict:
    """A draw_case with one edge (the name): rows 0 and 1 keep draw_case's none / one candidate rows."""
    rng = np.random.default_rng(len(name))
    case = draw_case(rng, rows, width, 0.7, 0.7, 1.0)
    lg, valid = case["logits"], case["valid"]
    if name.startswith("top_p_"):  # tiny ones narrow to float32 0, a subnormal, the smallest normal
        case["top_p"][:] = np.float32({"top_p_1e-300": 1e-300, "top_p_1e-45": 1e-45, "top_p_1e-38": 1e-38,
                                       "top_p_1": 1.0}[name])
    elif name == "all_equal":
        lg[:] = 1.5
    elif name == "one_candidate":
        valid[:] = 0
        valid[np.arange(rows), rng.integers(0, width, rows)] = 1
    elif name in ("nan", "inf", "neg_inf"):
        bad = {"nan": np.nan, "inf": np.inf, "neg_inf": -np.inf}[name]
        valid[2:, 3] = 1
        lg[2::2, 3] = bad  # even rows: an allowed column holds it; odd rows: a column not allowed holds it
        valid[3::2, 3] = 0
        lg[3::2, 3] = bad
    elif name == "inv_temperature_inf":
        case["inv_temperature"][:] = np.float32(np.inf)
    return case


EDGES = ["top_p_1e-300", "top_p_1e-45", "top_p_1e-38", "top_p_1", "all_equal", "one_candidate", "nan", "inf",
         "neg_inf", "inv_temperature_inf"]


def cpu_draw(case: dict) -> np.ndarray:
    return draw_rows(case["logits"], case["valid"].astype(bool), case["inv_temperature"], case["top_p"], case["seed"],
                     case["token"].astype(np.int64))


def greedy_columns(case: dict) -> np.ndarray:
    """The greedy pick of each row (first of the best allowed logits), -1 where nothing is allowed."""
    allowed = case["valid"].astype(bool)
    return np.where(allowed.any(axis=1), sampling.greedy(case["logits"], allowed), -1)


@pytest.mark.parametrize("name", EDGES)
def test_the_draw_at_its_edges_is_the_same_on_both_and_what_it_says(name):
    case = edge_case(name)
    cpu, want = cpu_draw(case), ref.sample_draw(**case)
    assert cpu.tolist() == want.tolist()
    allowed = case["valid"].astype(bool)
    drawn = want >= 0
    assert allowed[np.flatnonzero(drawn), want[drawn]].all()  # a pick is always an allowed column
    if name in ("top_p_1e-300", "top_p_1e-45", "top_p_1e-38"):  # the most likely only: greedy's pick
        assert case["top_p"][0] < 1e-37 and want.tolist() == greedy_columns(case).tolist()
    elif name == "all_equal":  # every allowed candidate as likely: the picks spread over them
        assert len(set(want[2:].tolist())) > 5
    elif name == "one_candidate":
        assert want.tolist() == np.argmax(case["valid"], axis=1).tolist()
    elif name in ("nan", "inf", "neg_inf"):  # refused where an allowed logit is not finite, else drawn as usual
        assert (want[2::2] == -1).all() and (want[3::2] >= 0).all()
        finite = dict(case, logits=np.where(np.isfinite(case["logits"]), case["logits"], np.float32(0)))
        assert want[3::2].tolist() == ref.sample_draw(**finite)[3::2].tolist()
    elif name == "inv_temperature_inf":  # held at the largest float32: a draw among the best logits only
        held = dict(case, inv_temperature=np.full(len(want), sampling.F32_MAX))
        assert want.tolist() == ref.sample_draw(**held).tolist()
        best = np.where(allowed, case["logits"], -np.inf).max(axis=1)
        assert (case["logits"][np.flatnonzero(drawn), want[drawn]] == best[drawn]).all()


def test_a_tiny_top_p_draws_as_greedy_through_sample_rows():
    """1e-300 is 0 in float32: the draw keeps the most likely allowed candidate, the greedy pick."""
    rng = np.random.default_rng(55)
    logits = (rng.standard_normal((300, 30)) * 3).astype(np.float32)
    allowed = rng.random((300, 30)) < 0.5
    allowed[:, 7] = True
    params = [Sampling(0.7, top_p, int(s)) for s, top_p in zip(rng.integers(0, 2**63, 300, dtype=np.uint64),
                                                                 [1e-300, 5e-324, 1e-45, 1e-10] * 75)]
    picks = sampling.sample_rows(logits, allowed, params, list(range(300)))
    assert picks.tolist() == sampling.greedy(logits, allowed).tolist()
    assert sampling.sampling_problem(0.7, 1e-300, 0) is None and sampling.sampling_problem(0.7, 5e-324, 0) is None


@pytest.mark.parametrize("top_p", [0.0, -0.0, -1e-300, -1.0, 1.0000001, 2.0, float("nan"), float("inf"),
                                   float("-inf")])
def test_a_top_p_outside_0_1_is_refused(top_p):
    field, why = sampling.sampling_problem(0.7, top_p, 0)
    assert field == "top_p" and why.startswith("top_p") and "(0, 1]" in why


def test_the_reference_refuses_a_row_wider_than_the_kernel_holds():
    """sample_draw.cu keeps DRAW_MAX_CANDIDATES candidates a row: a wider row is refused (-1) there, and builds,
    loads and launches refuse such widths before it (the CPU draw has no such limit)."""
    from toolcall.kernels.declarations import DRAW_MAX_CANDIDATES

    for width, refused in ((DRAW_MAX_CANDIDATES, False), (DRAW_MAX_CANDIDATES + 1, True)):
        case = draw_case(np.random.default_rng(width), 6, width, 0.9, 1.0, 0.9)
        want, cpu = ref.sample_draw(**case), cpu_draw(case)
        assert (want == -1).all() == refused and (cpu[2:] >= 0).all()
        if not refused:
            assert want.tolist() == cpu.tolist()


@pytest.mark.parametrize("name", EDGES)
def test_kernel_edge_launches_pack_their_arguments(name):
    dry = KernelRunner(DryRunGpu())
    run_kernel(dry, edge_case(name))
    assert dry.gpu.launches


@pytest.mark.gpu
@pytest.mark.parametrize("name", EDGES)
def test_kernel_draws_what_the_reference_draws_at_the_edges(dev, name):
    case = edge_case(name)
    dev.same(run_kernel(dev, case), ref.sample_draw(**case), "sample_draw")


@pytest.mark.parametrize("name", EDGES)
def test_kernel_on_the_executor_draws_what_the_reference_draws_at_the_edges(sim, name):
    """top_p 1e-300 (0 in float32), NaN / inf logits, an infinite inverse temperature: the kernel's PTX on the
    executor gives the reference's picks."""
    case = edge_case(name)
    assert run_kernel(sim, case).tolist() == ref.sample_draw(**case).tolist()
