"""``lmforge reproduce moragent``: the condition against hand-worked cases, the train/eval split's
disjointness, and (slow) the verdict recomputed from the saved runs of a quick run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lmforge.reproduce.moragent import BASE_MARGIN, LORA_MARGIN, _split, conditions


def test_conditions_by_hand() -> None:
    # seed 0 holds (0.30 >= 0.25 and >= 0.05 + 0.20); seed 1 misses the LoRA margin; seed 2 the base margin
    c = conditions([0.30, 0.30, 0.24], [0.25, 0.26, 0.10], 0.05)
    assert c["per_seed"] == [True, False, False] and c["needed"] == 2 and not c["held"]
    c = conditions([0.30, 0.31, 0.24], [0.25, 0.26, 0.10], 0.04)
    assert c["per_seed"] == [True, True, True] and c["held"]
    # exactly at both margins holds (float slack); just under does not
    assert conditions([0.10 + BASE_MARGIN], [0.10 + BASE_MARGIN - LORA_MARGIN], 0.10)["per_seed"] == [True]
    assert conditions([0.10 + BASE_MARGIN - 0.01], [0.0], 0.10)["per_seed"] == [False]
    # one seed run (quick): the majority is that one seed
    assert conditions([0.5], [0.1], 0.0)["needed"] == 1


def test_eval_entries_never_train() -> None:
    pytest.importorskip("bfcl_eval")  # the packaged BFCL data
    evals, pool = _split(0, 12)
    assert len(evals) == 24 and {r.category for r in evals} == {"simple_python", "multiple"}
    assert not {r.id for r in evals} & {r.id for r in pool}
    # disjoint by content too: BFCL repeats questions under other ids (multiple_111 = multiple_198)
    def text(r):
        return " ".join(" ".join(m["content"] for m in r.messages if m["role"] == "user").lower().split())
    assert not {text(r) for r in evals} & {text(r) for r in pool}
    assert len(pool) > 500


@pytest.mark.slow  # SmolLM2: base, MoR and LoRA at 2 steps, 4 entries: about a minute; `make test-slow`
def test_moragent_reproduction_quick(tmp_path: Path, smollm2_dir: Path) -> None:
    from lmforge.reproduce.base import ReproduceOptions, get

    res = get("moragent").fn(ReproduceOptions(out_dir=tmp_path, quick=True, seed=0))
    runs = json.loads((tmp_path / "runs.json").read_text())
    assert [r["arm"] for r in runs] == ["mor", "lora"]
    assert abs(runs[0]["trainable"] - runs[1]["trainable"]) / runs[0]["trainable"] < 0.02
    report = json.loads((tmp_path / "data_report.json").read_text())
    assert report["kept"] + sum(report["dropped_by_reason"].values()) == report["total"]
    assert res.held is False  # --quick never claims a verdict
