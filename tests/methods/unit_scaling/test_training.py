"""Short training runs: µS in simulated FP8 trains like fp32; SP under the same casts underflows more."""

from __future__ import annotations

import pytest

from lmforge.methods.unit_scaling.experiment import char_corpus, train_run


def _tail(xs: list[float], k: int = 20) -> float:
    return sum(xs[-k:]) / k


@pytest.fixture(scope="module")
def corpus():
    return char_corpus(0, n_paragraphs=600)


def test_mus_fp8_trains_like_fp32(corpus):
    """The mechanism: simulated FP8 (static casts) trains a µS model as fp32 does, and saturates nothing.

    NOTE: this test once asserted the paper's claim itself, a gap of at most 2% after 150 steps, and
    failed on a fresh machine (0.0206). Measured here (width 64, lr 2^-5, 150 steps), the held-out
    gap is 0.0018, 0.0183, 0.0645 and 0.0013 for seeds 0-3, and 0.0103 for seed 0 with ATen's
    non-vectorised kernels (another CPU's rounding): at this size the gap is run-to-run noise of the
    order of the claim. The 2% claim is the unit-scaling reproduction's (``µS FP8 within 2% of
    fp32``, with the fp32 seed-to-seed gap beside it); this test keeps what noise cannot move: both
    runs learn (a broken cast path, e.g. gradients flushed to zero, leaves the loss near log(vocab)
    ~ 3.9 nats, a working one ends near 0.3 of its start), the curves stay within 25% of each other
    (4x the worst gap measured), and no value saturates.
    """
    lr, steps = 2.0 ** -5, 150
    f32 = train_run("mus", 64, corpus, lr, steps, seed=0)
    # with the static gradient scale (the option): the default casts gradients directly, see below
    f8 = train_run("mus", 64, corpus, lr, steps, fp8=True, count=True, seed=0, grad_scale=True)
    # Both learned something (a uniform guess over the characters is log(vocab) ~ 3.9 nats).
    assert _tail(f32.losses) < 0.6 * f32.losses[0]
    assert _tail(f8.losses) < 0.6 * f8.losses[0]
    assert abs(_tail(f8.losses) - _tail(f32.losses)) / _tail(f32.losses) <= 0.25
    assert abs(f8.heldout - f32.heldout) / f32.heldout <= 0.25
    # Unit scaling keeps everything inside the formats' ranges: nothing saturates.
    assert all(v["overflow"] == 0 for v in f8.counters.values())


def test_sp_underflows_more_than_mus_under_the_same_casts(corpus):
    steps = 60
    mus = train_run("mus", 64, corpus, 2.0 ** -5, steps, fp8=True, count=True, seed=0)
    sp = train_run("sp", 64, corpus, 2.0 ** -9, steps, fp8=True, count=True, seed=0)
    # SP's N(0, 0.02^2) weights sit log2(50) ~ 5.6 binades lower than µS's N(0, 1): far more of them
    # fall below the smallest subnormal 2^-9.
    assert sp.counters["weight"]["underflow"] >= 10 * mus.counters["weight"]["underflow"]
    mean = lambda c: sum(v["underflow"] for v in c.values()) / 3  # noqa: E731
    assert mean(sp.counters) > mean(mus.counters)


def test_default_fp8_casts_gradients_directly_and_the_scale_option_rescues_them(corpus):
    """By default (the paper: no scale factors) each hidden linear's incoming gradient is cast to E5M2
    as it is. With a mean-reduced loss those gradients are O(1/(n_tokens·d)), so most of them flush to
    zero at width 64; the static scale option (n_tokens·d) brings them back. The two runs see the same
    activations and weights at the first step, so only the gradient rates differ that much."""
    steps = 20
    plain = train_run("mus", 64, corpus, 2.0 ** -5, steps, fp8=True, count=True, seed=0)
    scaled = train_run("mus", 64, corpus, 2.0 ** -5, steps, fp8=True, count=True, seed=0, grad_scale=True)
    assert plain.counters["gradient"]["underflow"] > 0.3
    assert scaled.counters["gradient"]["underflow"] < 0.1 * plain.counters["gradient"]["underflow"]
