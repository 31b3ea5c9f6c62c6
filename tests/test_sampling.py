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
