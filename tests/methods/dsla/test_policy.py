"""SwapPolicy against situations traced by hand from the official ``model_swap_monitor``."""

from __future__ import annotations

import pytest

from lmforge.common.errors import UserError
from lmforge.methods.dsla.policy import Decision, SwapPolicy


def policy_with(n_layers: int, n_converted: int, **kw) -> SwapPolicy:
    """A policy (official defaults, fallback order n-1..0) with ``n_converted`` layers converted and
    the last swap at t=0."""
    p = SwapPolicy(n_layers=n_layers, cooldown_s=0.0, **kw)
    for _ in range(n_converted):
        assert p.step(0.0, [5000]).action == "convert"
    p.cooldown_s = 60.0
    p.last_swap_s = 0.0
    return p


#  (case, n_layers, converted before, now, queued prompt lengths, expected action, expected layer)
# Fallback order n-1..0: with k converted the next convert is layer n-1-k and the next revert n-k.
TABLE = [
    ("cooldown from start-up", 4, 0, 59.999, [5000], None, None),
    ("cooldown edge: exactly 60 s acts", 4, 0, 60.0, [1024], "convert", 3),
    ("prompt 1023 is not high", 4, 0, 60.0, [1023], None, None),
    ("prompt 1024 among short ones", 4, 0, 60.0, [3, 1024, 7], "convert", 3),
    ("50 pending is high", 4, 0, 60.0, [1] * 50, "convert", 3),
    ("49 pending is not", 4, 0, 60.0, [1] * 49, None, None),
    ("low load but nothing converted", 4, 0, 60.0, [], None, None),
    ("empty queue reverts", 4, 2, 60.0, [], "revert", 2),
    ("prompt 819 < 819.2 reverts", 4, 2, 60.0, [819], "revert", 2),
    ("prompt 820 does not", 4, 2, 60.0, [820], None, None),
    ("24 pending reverts", 4, 2, 60.0, [1] * 24, "revert", 2),
    ("25 pending does not", 4, 2, 60.0, [1] * 25, None, None),
    ("both at the revert edge", 4, 1, 60.0, [819] + [1] * 23, "revert", 3),
    ("between the bands: steady", 4, 1, 60.0, [900] * 30, None, None),
    ("revert cooldown", 4, 2, 59.5, [], None, None),
    ("32 layers: 23 converted -> 24th", 32, 23, 60.0, [2048], "convert", 8),
    ("32 layers: cap at 24 (75%)", 32, 24, 60.0, [2048], None, None),
    ("30 layers: 22 converted -> 23rd (76.7%)", 30, 22, 60.0, [1] * 60, "convert", 7),
    ("30 layers: cap at 23", 30, 23, 60.0, [1] * 60, None, None),
    ("4 layers: 2 converted -> 3rd", 4, 2, 60.0, [1024], "convert", 1),
    ("4 layers: cap at 3 (75%)", 4, 3, 60.0, [1024], None, None),
]


@pytest.mark.parametrize("case,n,k,now,queue,action,layer", TABLE, ids=[t[0] for t in TABLE])
def test_hand_traced_table(case, n, k, now, queue, action, layer):
    p = policy_with(n, k)
    before = (list(p.dsla), p.last_swap_s)
    d = p.step(now, queue)
    assert (d.action, d.layer) == (action, layer), d.reason
    if action is None:
        assert (list(p.dsla), p.last_swap_s) == before  # a no-op poll changes nothing, cooldown included
    else:
        assert p.last_swap_s == now
        assert len(p.dsla) == k + (1 if action == "convert" else -1)


def test_cap_counts():
    assert SwapPolicy(n_layers=32).max_converted == 24
    assert SwapPolicy(n_layers=30).max_converted == 23
    assert SwapPolicy(n_layers=4).max_converted == 3
    assert SwapPolicy(n_layers=4, order=[1]).max_converted == 1  # a shorter order runs out first
    # Drive a 30-layer policy to its cap under constant high load.
    p = SwapPolicy(n_layers=30)
    t, n = 0.0, 0
    while t < 60 * 40:
        n += p.step(t, [4096]).action == "convert"
        t += 5.0
    assert n == 23 and len(p.converted) == 23


def test_lifo_and_reverted_layer_is_next_converted():
    p = SwapPolicy(n_layers=6, order=[4, 1, 5, 0, 2, 3])
    high, low = [1500], [10]
    seq = [(60, high), (120, high), (180, high), (240, low), (300, low), (360, high), (420, high)]
    got = [(d.action, d.layer) for d in (p.step(t, q) for t, q in seq)]
    assert got == [("convert", 4), ("convert", 1), ("convert", 5), ("revert", 5), ("revert", 1),
                   ("convert", 1), ("convert", 5)]
    assert p.converted == [4, 1, 5]
    assert p.dsla == [5, 1, 4]  # the official layers_in_dsla: most recent first
    assert p.remaining == [0, 2, 3]


def test_cooldown_runs_from_last_swap_not_from_idle_polls():
    p = SwapPolicy(n_layers=8)
    assert p.step(0.0, [5000]).reason == "cooldown"  # start-up counts as a swap
    assert p.step(60.0, [5000]).action == "convert"
    for t in (65.0, 100.0, 119.999):
        assert p.step(t, [5000]) == Decision(None, None, "cooldown")
    assert p.step(120.0, [10]).action == "revert"
    # cap reached does not reset the cooldown: a later low-load poll reverts at once.
    q = policy_with(4, 3)
    assert q.step(60.0, [5000]).action is None
    assert q.step(65.0, [1]).action == "revert"


def test_reset_and_scaled():
    p = SwapPolicy(n_layers=4, order=[1, 2])
    p.step(60.0, [2000])
    p.reset(100.0)
    assert p.converted == [] and p.remaining == [1, 2] and p.last_swap_s == 100.0
    assert p.step(159.0, [2000]).action is None
    s = p.scaled(0.01)
    assert (s.cooldown_s, s.poll_s) == pytest.approx((0.6, 0.05))
    assert (s.max_prompt_tokens, s.max_pending, s.order) == (1024, 50, [1, 2])
    assert s.last_swap_s == 0.0 and s.converted == []
    assert s.step(0.6, [2000]).action == "convert"


def test_official_defaults():
    p = SwapPolicy(n_layers=32)
    assert (p.max_prompt_tokens, p.max_pending, p.revert_prompt_frac, p.revert_pending_frac,
            p.cooldown_s, p.max_conv_rate, p.poll_s) == (1024, 50, 0.8, 0.5, 60, 0.75, 5)
    assert p.order == list(range(31, -1, -1))


@pytest.mark.parametrize("kw,msg", [
    ({"n_layers": 0}, "n_layers"),
    ({"n_layers": 4, "order": [0, 4]}, "outside"),
    ({"n_layers": 4, "order": [1, 1]}, "more than once"),
    ({"n_layers": 4, "max_conv_rate": 0.0}, "max_conv_rate"),
    ({"n_layers": 4, "poll_s": 0.0}, "poll_s"),
])
def test_bad_config(kw, msg):
    with pytest.raises(UserError, match=msg):
        SwapPolicy(**kw)
