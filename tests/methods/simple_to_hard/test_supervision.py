"""S2H supervision strategies (supervision.py) against hand-derived numbers of the official
scripts/combine_data.py and scripts/train_template.sh (princeton-pli/VLM_S2H).

combine_data.main, for option o and T examples:
  T := T // 2 (o in 2, 3); T // 3 (o in 1, 4); 2 * T // 3 (o == 5)
  per level: T // (#levels used) if the level is used else 0
  per data type: per_level // (#types used at the level) if the type is used
  option 9: its SIMPLE share is taken // 3 and the SIMPLE data repeated 3 times (result += result + result)
train_template.sh: N_EPOCHS 3 (o 1), 2 (o 2), 2 (o 3), 3 (o 4), 1.5 (o 5), otherwise 1.
"""

from __future__ import annotations

import collections

import pytest

from lmforge.common.errors import UserError
from lmforge.methods.simple_to_hard import mini
from lmforge.methods.simple_to_hard import supervision as S

S_IT, S_TS, S_IS, S_ITS = (("SIMPLE", d) for d in ("image2text", "text2answer", "image2answer", "image2answer+text"))
H_TS = ("HARD", "text2answer")

# (counts, epochs, repeat_simple) at total = 600
EXPECTED_600 = {
    1: ({S_ITS: 200}, 3, 1),  # 600 // 3 = 200; SIMPLE only: 200 // 1 = 200 (I->T+S)
    2: ({S_TS: 300}, 2, 1),  # 600 // 2 = 300; 300 // 1 = 300 (T->S)
    3: ({S_IS: 300}, 2, 1),  # 600 // 2 = 300 (I->S)
    4: ({S_IS: 200}, 3, 1),  # 600 // 3 = 200 (I->S)
    5: ({S_TS: 200, S_IS: 200}, 1.5, 1),  # 2 * 600 // 3 = 400; 400 // 2 = 200 each
    6: ({S_TS: 200, S_IS: 200, S_ITS: 200}, 1, 1),  # 600; 600 // 3 = 200 each
    7: ({S_TS: 100, S_IS: 100, S_ITS: 100, H_TS: 300}, 1, 1),  # 600 // 2 = 300 per level; SIMPLE 300 // 3 = 100
    8: ({S_TS: 300, S_ITS: 300}, 1, 1),  # 600; 600 // 2 = 300 each
    9: ({S_ITS: 100, H_TS: 300}, 1, 3),  # 600 // 2 = 300 per level; SIMPLE 300 // 1 // 3 = 100, x3; HARD 300
}
# at total = 601
EXPECTED_601 = {
    1: ({S_ITS: 200}, 3, 1),  # 601 // 3 = 200
    2: ({S_TS: 300}, 2, 1),  # 601 // 2 = 300
    3: ({S_IS: 300}, 2, 1),  # 601 // 2 = 300
    4: ({S_IS: 200}, 3, 1),  # 601 // 3 = 200
    5: ({S_TS: 200, S_IS: 200}, 1.5, 1),  # 2 * 601 // 3 = 1202 // 3 = 400; 400 // 2 = 200
    6: ({S_TS: 200, S_IS: 200, S_ITS: 200}, 1, 1),  # 601 // 3 = 200
    7: ({S_TS: 100, S_IS: 100, S_ITS: 100, H_TS: 300}, 1, 1),  # 601 // 2 = 300; 300 // 3 = 100
    8: ({S_TS: 300, S_ITS: 300}, 1, 1),  # 601 // 2 = 300
    9: ({S_ITS: 100, H_TS: 300}, 1, 3),  # 601 // 2 = 300; 300 // 3 = 100
}
# at total = 1000, where the floors bite differently per option
EXPECTED_1000 = {
    1: ({S_ITS: 333}, 3, 1),  # 1000 // 3 = 333
    5: ({S_TS: 333, S_IS: 333}, 1.5, 1),  # 2000 // 3 = 666; 666 // 2 = 333
    6: ({S_TS: 333, S_IS: 333, S_ITS: 333}, 1, 1),  # 1000 // 3 = 333
    7: ({S_TS: 166, S_IS: 166, S_ITS: 166, H_TS: 500}, 1, 1),  # 1000 // 2 = 500; 500 // 3 = 166
    9: ({S_ITS: 166, H_TS: 500}, 1, 3),  # 500 // 3 = 166
}


@pytest.mark.parametrize("total,expected", [(600, EXPECTED_600), (601, EXPECTED_601), (1000, EXPECTED_1000)])
def test_phase_counts_match_the_official_arithmetic(total, expected):
    for option, (counts, epochs, repeat) in expected.items():
        ph = S.phase_counts(option, total)
        assert ph.option == option
        assert ph.counts == counts, option
        assert ph.epochs == epochs, option
        assert ph.repeat_simple == repeat, option


@pytest.mark.parametrize("total", [12, 13, 59, 60, 61, 100, 257, 600, 601, 1000, 3001])
def test_every_option_spends_the_same_compute(total):
    for option in list(range(1, 10)) + ["image+hard-text"]:
        ph = S.phase_counts(option, total)
        seen = sum(k * (ph.repeat_simple if lv == "SIMPLE" else 1) for (lv, _), k in ph.counts.items())
        compute = seen * ph.epochs
        assert total - 4 <= compute <= total, (option, total, compute)


def test_plan_align_mix_plus_is_option_8_then_7():
    p1, p2 = S.plan("align-mix+", 600)
    assert (p1.option, p2.option) == (8, 7)
    # 300 + 300: option 8 at 300 -> 300 // 2 = 150 each; option 7 at 300 -> 150 per level, 150 // 3 = 50
    assert p1.counts == {S_TS: 150, S_ITS: 150}
    assert p2.counts == {S_TS: 50, S_IS: 50, S_ITS: 50, H_TS: 150}
    assert sum(p1.counts.values()) + sum(p2.counts.values()) == 600
    q1, q2 = S.plan("Align-Mix+", 1000, align_phase1_fraction=0.3)
    # 300 + 700: option 8 at 300 -> 150 each; option 7 at 700 -> 350 per level, 350 // 3 = 116
    assert q1.counts == {S_TS: 150, S_ITS: 150}
    assert q2.counts == {S_TS: 116, S_IS: 116, S_ITS: 116, H_TS: 350}
    assert 1000 - 4 <= sum(q1.counts.values()) + sum(q2.counts.values()) <= 1000
    [only] = S.plan("mix+", 600)
    assert only.option == 7 and only.counts == EXPECTED_600[7][0]


def test_plan_rejects_unknown_strategies_and_tiny_budgets():
    with pytest.raises(UserError):
        S.plan("curriculum", 600)
    with pytest.raises(UserError):
        S.plan("mix", 11)
    assert S.plan("mix", 12)[0].counts == {S_TS: 4, S_IS: 4, S_ITS: 4}


def _pools(simple, hard):
    """Every (level, data type) pool holds one record per puzzle of the same puzzle list."""
    return {(lv, dt): [(lv, dt, p.id) for p in ps]
            for lv, ps in (("SIMPLE", simple), ("HARD", hard)) for dt in S.DATA_TYPES}


@pytest.fixture(scope="module")
def pools():
    return _pools(mini.generate("SIMPLE", 40, 0), mini.generate("HARD", 40, 0))


def test_compose_counts_and_same_simple_puzzles_across_types(pools):
    ph = S.phase_counts(7, 60)  # 30 per level; SIMPLE 10 per type, HARD T->S 30
    out = S.compose(ph, pools)
    assert len(out) == 60
    by = collections.Counter((lv, dt) for lv, dt, _ in out)
    assert by == {S_TS: 10, S_IS: 10, S_ITS: 10, H_TS: 30}
    ids = {key: [i for lv, dt, i in out if (lv, dt) == key] for key in by}
    for key, got in ids.items():
        assert len(set(got)) == len(got)  # no record twice
    # the official same-seed shuffle of equally ordered pools takes the same SIMPLE puzzles per type
    assert set(ids[S_TS]) == set(ids[S_IS]) == set(ids[S_ITS])
    assert set(ids[S_TS]) != {f"SIMPLE-0-{i}" for i in range(10)}  # shuffled, not the first 10
    # the union is shuffled: SIMPLE and HARD records interleave
    levels = [lv for lv, _, _ in out]
    assert levels != sorted(levels) and levels != sorted(levels, reverse=True)


def test_compose_is_deterministic_and_seeded(pools):
    ph = S.phase_counts(6, 60)
    a, b = S.compose(ph, pools), S.compose(ph, pools)
    assert a == b
    assert S.compose(ph, pools, seed=7) != a


def test_compose_option_9_repeats_simple_three_times(pools):
    ph = S.phase_counts(9, 60)  # SIMPLE 30 // 3 = 10 (x3), HARD 30
    out = S.compose(ph, pools)
    c = collections.Counter(out)
    simple = {k: v for k, v in c.items() if k[0] == "SIMPLE"}
    hard = {k: v for k, v in c.items() if k[0] == "HARD"}
    assert len(simple) == 10 and set(simple.values()) == {3}
    assert len(hard) == 30 and set(hard.values()) == {1}
    assert len(out) == 60


def test_compose_rejects_a_small_pool():
    small = _pools(mini.generate("SIMPLE", 9, 0), mini.generate("HARD", 40, 0))
    with pytest.raises(UserError):
        S.compose(S.phase_counts(6, 30), small)  # needs 10 per SIMPLE type, has 9
    assert len(S.compose(S.phase_counts(6, 27), small)) == 27  # 9 per type fits
