"""Loaders of per-annotator preference files: label mapping by hand, one-line errors naming the line."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

from lmforge.common.errors import UserError
from lmforge.methods.diverging_prefs.data import load_pairs, save_pairs, simulate_pairs


def _write(path: Path, records: list, gz: bool = False) -> Path:
    text = "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records)
    if gz:
        with gzip.open(path, "wt", encoding="utf-8") as fh:
            fh.write(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def _mp(cid: str, normal: list[str], expert: list[str]) -> dict:
    return {"comparison_id": cid, "prompt_id": "p" + cid, "text": "Q?", "completion_a": "a", "completion_b": "b",
            "source": "s", "category": "c",
            "normal_worker_annotations": [{"overall_pref": v, "evaluator": f"n{i}"} for i, v in enumerate(normal)],
            "expert_worker_annotations": [{"overall_pref": v, "evaluator": f"e{i}"} for i, v in enumerate(expert)]}


def test_multipref_labels_and_annotator_groups(tmp_path):
    f = _write(tmp_path / "mp.jsonl", [
        _mp("1", ["A-is-clearly-better", "Tie"], ["B-is-slightly-better", "B-is-clearly-better"]),
        _mp("2", ["A-is-slightly-better", "A-is-slightly-better"], ["Tie", "A-is-clearly-better"]),
    ])
    pairs = load_pairs(f)
    assert [p.id for p in pairs] == ["1", "2"]
    assert pairs[0].labels == [2, 0, -1, -2] and pairs[1].labels == [1, 1, 0, 2]
    assert pairs[0].prompt == "Q?" and pairs[0].response_a == "a" and pairs[0].meta["category"] == "c"
    assert load_pairs(f, "multipref", annotators="expert")[0].labels == [-1, -2]
    assert load_pairs(f, annotators="normal", limit=1)[0].labels == [2, 0]


def test_helpsteer2_strengths_list_and_literal_string_and_skips(tmp_path):
    rec1 = {"split": "train", "prompt": "P", "response_1": "r1", "response_2": "r2", "preference_strength": -1,
            "all_preferences_unprocessed": [{"strength": -3, "justification": "x"}, {"strength": 1, "justification": "y"},
                                            {"strength": 0, "justification": "z"}, {"strength": -100, "justification": "n"}]}
    rec2 = {"prompt": "P2", "response_1": "s1", "response_2": "s2",
            "all_preferences_unprocessed": "[{'strength': 2, 'justification': 'it is'}, {'strength': -1, 'justification': 'no'}]"}
    f = _write(tmp_path / "hs2.jsonl.gz", [rec1, rec2], gz=True)
    pairs = load_pairs(f)
    # negative strength: response 1 (A) better; |s| >= 2 strong
    assert pairs[0].labels == [2, -1, 0] and pairs[0].meta == {"skipped_labels": 1, "split": "train"}
    assert pairs[1].labels == [-2, 1]
    assert load_pairs(f, strong_at=3)[1].labels == [-1, 1]
    assert pairs[1].id == "line-2"


def test_lmforge_roundtrip(tmp_path):
    pairs = simulate_pairs(5, seed=3)
    back = load_pairs(save_pairs(pairs, tmp_path / "p.jsonl"))
    assert [p.to_json() for p in back] == [p.to_json() for p in pairs]


@pytest.mark.parametrize("records,fmt,needle", [
    (['{"comparison_id": "1"', ], "auto", ":1: not valid JSON"),
    ([_mp("1", ["Tie"], []), _mp("2", ["A-is-much-better"], [])], "auto", ":2: unknown overall_pref 'A-is-much-better'"),
    ([{"prompt": "p", "response_1": "a", "response_2": "b", "all_preferences_unprocessed": [{"strength": 5}]}], "auto",
     ":1: preference strength must be an integer in -3..3"),
    ([{"prompt": "p", "response_1": "a", "response_2": "b", "all_preferences_unprocessed": [{"strength": -100}]}], "auto",
     ":1: no usable annotator strengths"),
    ([{"id": "x", "prompt": "p", "response_a": "a", "response_b": "b", "labels": [1]},
      {"id": "y", "prompt": "p", "response_a": "a", "response_b": 3, "labels": [1]}], "lmforge", ":2: field 'response_b' must be a string"),
    ([{"id": "x", "prompt": "p", "response_a": "a", "response_b": "b", "labels": [1, 7]}], "lmforge", ":1: 'labels' must hold integers in -2..2"),
    ([[1, 2]], "auto", ":1: a record must be a JSON object"),
    ([{"foo": 1}], "auto", ":1: cannot tell the format"),
    ([{"id": "x", "prompt": "p", "response_a": "a", "response_b": "b", "labels": [1], "features_a": [1.0, 2.0],
       "features_b": [0.0, 1.0]},
      {"id": "y", "prompt": "p", "response_a": "a", "response_b": "b", "labels": [1], "features_a": [1.0, 2.0],
       "features_b": [0.0]}], "lmforge", ":2: a feature vector of length 1; earlier lines have 2"),
])
def test_bad_records_are_one_line_errors_naming_the_line(tmp_path, records, fmt, needle):
    f = _write(tmp_path / "bad.jsonl", records)
    with pytest.raises(UserError) as exc:
        load_pairs(f, fmt)
    msg = str(exc.value)
    assert "\n" not in msg and f"{f}{needle}" in msg


def test_missing_file_empty_file_and_unknown_format(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load_pairs(tmp_path / "nope.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(UserError, match="holds no records"):
        load_pairs(tmp_path / "empty.jsonl")
    with pytest.raises(UserError, match="unknown data format"):
        load_pairs(tmp_path / "empty.jsonl", "csv")


def test_simulated_groups_disagree_on_style_only():
    pairs = simulate_pairs(400, seed=0)
    from lmforge.methods.diverging_prefs.core import DIVERGING, pair_kind

    div = [pair_kind(p.labels) == DIVERGING for p in pairs]
    # A pair where neither response has a style cannot split the groups beyond noise.
    no_style = [not any(p.features_a[1:3]) and not any(p.features_b[1:3]) for p in pairs]
    frac_div_no_style = sum(d for d, n in zip(div, no_style) if n) / max(1, sum(no_style))
    frac_div_style = sum(d for d, n in zip(div, no_style) if not n) / max(1, sum(not n for n in no_style))
    assert frac_div_style > 0.5 > frac_div_no_style + 0.2
    assert all(len(p.labels) == 4 and all(1 <= r <= 5 for r in p.ratings_a) for p in pairs)
