"""``lmforge reproduce selective-dpo`` in quick mode: difficulty diagnostics recomputed with scipy and
scikit-learn from the saved scores, and a verdict that follows from the saved sweep."""

from __future__ import annotations

import itertools
import json
import statistics
from pathlib import Path

import numpy as np
import pytest
import torch
from scipy.stats import spearmanr
from sklearn.metrics import roc_auc_score

from lmforge.data.preferences import _runner_up, max_digit_pairs
from lmforge.methods.selective_dpo.core import n_selected
from lmforge.reproduce.base import ReproduceOptions, get
from lmforge.reproduce.selective_dpo import HELD_TAU, MARGIN, VERDICT_ROW, near_miss, verdict


@pytest.fixture(scope="module")
def quick(tmp_path_factory):
    out = tmp_path_factory.mktemp("selective-dpo")
    prev = torch.get_num_threads()
    try:
        res = get("selective-dpo").fn(ReproduceOptions(out_dir=out, quick=True, seed=0))
    finally:
        torch.set_num_threads(prev)
    return res, json.loads((out / "selective-dpo-runs.json").read_text())


def test_difficulty_agrees_across_seeds(quick):
    res, runs = quick
    per_seed = np.array(runs["per_seed"])
    assert per_seed.shape == (3, runs["setting"]["n_train"])
    rhos = [spearmanr(per_seed[i], per_seed[j])[0] for i, j in itertools.combinations(range(3), 2)]
    assert sorted(rhos) == pytest.approx(sorted(runs["spearman"].values()))
    assert min(rhos) > 0.7
    assert res.measured["difficulty Spearman between seeds (min)"] == pytest.approx(min(rhos), abs=1e-4)
    # The difficulty is the mean over the seeds (each seed: the mean over its checkpoints).
    assert np.allclose(np.array(runs["scores"]), per_seed.mean(0))


def test_planted_pairs_rank_near_the_top(quick):
    res, runs = quick
    kinds, scores = runs["kinds"], np.array(runs["scores"])
    hard = [k != "clean" for k in kinds]
    auroc = roc_auc_score(hard, scores)
    assert auroc == pytest.approx(runs["auroc"]) and auroc > 0.7
    flipped = [k == "flipped" for k in kinds if k != "arbitrary"]
    assert roc_auc_score(flipped, [s for s, k in zip(scores, kinds) if k != "arbitrary"]) > 0.8
    # Selection by difficulty keeps fewer planted pairs than the data holds (20%), recounted by hand.
    k = n_selected(len(kinds), HELD_TAU)
    kept = [kinds[i] for i in np.argsort(scores, kind="stable")[:k]]
    share = sum(x != "clean" for x in kept) / k
    assert share == pytest.approx(runs["kept_hard"][f"selective tau={HELD_TAU}"])
    assert share < sum(hard) / len(hard)


def test_verdict_is_the_condition_recomputed_from_the_sweep(quick):
    res, runs = quick
    sweep = runs["sweep"]
    easiest = statistics.mean(sweep[VERDICT_ROW])
    sel = statistics.mean(sweep[f"selective tau={HELD_TAU}"])
    full = statistics.mean(sweep["DPO all (shuffled)"])
    assert res.held == (easiest > full + MARGIN) == verdict(sweep)["held"] == res.measured["condition met"]
    m = res.measured
    assert m["clean held-out preference accuracy, DPO on the easiest 50% (shuffled)"] == pytest.approx(easiest, abs=1e-4)
    assert m["clean held-out preference accuracy, DPO on all pairs"] == pytest.approx(full, abs=1e-4)
    assert m["gain (absolute accuracy)"] == pytest.approx(easiest - full, abs=2e-4)
    assert m["clean held-out preference accuracy, Selective DPO tau=0.5 (easy to hard)"] == pytest.approx(sel, abs=1e-4)
    assert m["gain of Selective DPO tau=0.5 (easy to hard)"] == pytest.approx(sel - full, abs=2e-4)
    # The verdict row trains on the very pairs Selective DPO keeps at HELD_TAU (the same planted and
    # near-miss shares), and those are the easiest half by the saved scores (recounted by hand).
    assert runs["kept_hard"][VERDICT_ROW] == runs["kept_hard"][f"selective tau={HELD_TAU}"]
    assert runs["kept_near_miss"][VERDICT_ROW] == runs["kept_near_miss"][f"selective tau={HELD_TAU}"]
    k = n_selected(len(runs["kinds"]), HELD_TAU)
    kept = [runs["kinds"][i] for i in np.argsort(np.array(runs["scores"]), kind="stable")[:k]]
    assert runs["kept_hard"][VERDICT_ROW] == pytest.approx(sum(x != "clean" for x in kept) / k)
    # Every sweep row of the table is the saved per-seed accuracies' mean; accuracies are shares of 400 pairs.
    table = next(t for t in res.tables if t.title.startswith("tau sweep"))
    for row in table.rows[:-1]:
        assert row[5] == pytest.approx(statistics.mean(sweep[row[0]]), abs=1e-4)
        assert all(abs(a * 400 - round(a * 400)) < 1e-3 for a in sweep[row[0]])
    assert table.rows[-1][5] == pytest.approx(runs["ref_accuracy"], abs=1e-4)


def test_near_miss_flags_match_the_generator(quick):
    _, runs = quick
    st = runs["setting"]
    train = max_digit_pairs(st["n_train"], runs["seed"] + 1, hard_fraction=st["hard_fraction"],
                            rules=tuple(st["rules"]), flipped_share=st["flipped_share"], flip=st["flip"])

    def digits(prompt: str) -> list[int]:
        return [int(x) for x in prompt.split(":")[1][:-3].split()]

    # Oracle: the generator's own runner-up rule, applied to the prompt digits.
    expect = [r["kind"] == "clean" and r["rejected"] == f" {_runner_up(r['rule'], digits(r['prompt']))}"
              for r in train]
    assert runs["near_miss"] == expect == [near_miss(r) for r in train]
    # Among clean pairs about a quarter (1 of 4 wrong prompt digits) have the near-miss negative.
    clean = [e for e, r in zip(expect, train) if r["kind"] == "clean"]
    assert 0.15 < sum(clean) / len(clean) < 0.35
    # The kept share recounted by hand from the saved scores.
    k = n_selected(len(train), HELD_TAU)
    kept = np.argsort(np.array(runs["scores"]), kind="stable")[:k]
    assert runs["kept_near_miss"][f"selective tau={HELD_TAU}"] == pytest.approx(sum(expect[i] for i in kept) / k)


def test_figures_are_written(quick):
    res, _ = quick
    assert len(res.figures) == 2
    for fig in res.figures:
        p = Path(fig.path)
        assert p.exists() and p.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
