"""FIT data builder and the spurious-keyword suite: closed-form checks (no model)."""

from __future__ import annotations

import hashlib
import json
import math
import random

import pytest

from lmforge.common.errors import UserError
from lmforge.data import spurious as sp
from lmforge.methods.fit.data import (
    FOCUS_TYPES,
    SPURIOUS_TYPES,
    FieldSpec,
    build_fit_data,
    completion,
    focus_instruction,
    focus_label,
    render_prompt,
    sft_data,
)

SPEC = FieldSpec(label="label", spurious_label="keyword_label", core_name=sp.CORE_NAME, spurious_name=None,
                 spurious_name_field="family", spurious_name_format="the {}")
TASK = "Is the sentiment positive or negative?"


def test_six_types_and_label_rule():
    # The paper's six instruction types (project page, Figures 2-3); focus(S)-types answer y_S.
    assert set(FOCUS_TYPES) == {"none", "focus_c", "ignore_s", "focus_c_ignore_s", "focus_s", "focus_s_ignore_c"}
    assert SPURIOUS_TYPES == {"focus_s", "focus_s_ignore_c"}
    for kind in FOCUS_TYPES:
        want = "B" if kind in ("focus_s", "focus_s_ignore_c") else "A"
        assert focus_label(kind, "A", "B") == want


def test_label_follows_instruction_on_every_record_and_type():
    recs = sp.make_split(3, 200, 0.5)
    ex = build_fit_data(recs, TASK, SPEC, mode="all")
    assert len(ex) == 6 * len(recs)
    for i, rec in enumerate(recs):
        block = ex[6 * i: 6 * i + 6]
        assert [e["focus_type"] for e in block] == list(FOCUS_TYPES)
        for e in block:
            # y_S recomputed from the keyword table, independently of the record's field.
            y_s = "positive" if rec["keyword"] == sp.FAMILIES[rec["family"]][0] else "negative"
            want = y_s if e["focus_type"] in ("focus_s", "focus_s_ignore_c") else rec["label"]
            assert e["focus_label"] == want
            assert e["completion"] == " " + want
            assert e["prompt"].endswith(f"Text: {rec['text']}\nAnswer:")
            fam = f"the {rec['family']}"
            line = e["prompt"].split("\n")[1]
            expected = {"none": "Text: " + rec["text"], "focus_c": "Focus on the sentiment.",
                        "ignore_s": f"Ignore {fam}.", "focus_c_ignore_s": f"Focus on the sentiment, ignore {fam}.",
                        "focus_s": f"Focus on {fam}.",
                        "focus_s_ignore_c": f"Focus on {fam}, don't focus on the sentiment."}[e["focus_type"]]
            assert line == expected


def test_sampled_types_are_uniform_and_seeded():
    recs = sp.make_split(4, 3000, 0.9)
    a = build_fit_data(recs, TASK, SPEC, seed=1)
    b = build_fit_data(recs, TASK, SPEC, seed=1)
    assert a == b
    counts = {k: sum(e["focus_type"] == k for e in a) for k in FOCUS_TYPES}
    # Each type ~ Binomial(3000, 1/6): within 5 standard deviations.
    sd = math.sqrt(3000 * (1 / 6) * (5 / 6))
    assert all(abs(c - 500) < 5 * sd for c in counts.values()), counts


def test_split_co_occurrence_is_exact():
    for name, rho in sp.SPLIT_RHO.items():
        for fams in (sp.TRAIN_FAMILIES, sp.HELDOUT_FAMILIES):
            recs = sp.make_split(f"t-{name}", 300, rho, fams)
            agree = sum(r["label"] == r["keyword_label"] for r in recs)
            assert agree == round(rho * 300), (name, agree)
            assert {r["family"] for r in recs} <= set(fams)


def test_training_split_co_occurrence_is_binomial():
    recs = sp.suite(0, 4000, 10)["train"]
    agree = sum(r["label"] == r["keyword_label"] for r in recs)
    sd = math.sqrt(4000 * 0.9 * 0.1)
    assert abs(agree - 3600) < 5 * sd
    # Labels balanced: keyword uniform within family, so P(y = positive) = 1/2 whatever rho.
    pos = sum(r["label"] == "positive" for r in recs)
    assert abs(pos - 2000) < 5 * math.sqrt(1000)


def test_record_is_consistent_with_its_text():
    rng = random.Random(0)
    for _ in range(500):
        r = sp.example(rng, 0.7, tuple(sp.FAMILIES), negation=0.5)
        words = r["text"].split()
        assert words.count(r["keyword"]) == 1
        assert r["keyword"] in sp.FAMILIES[r["family"]]
        # Core label from the text alone: the sentiment word's polarity, flipped by a preceding "not".
        idx = [i for i, w in enumerate(words) if w in sp.POSITIVE_WORDS + sp.NEGATIVE_WORDS]
        assert len(idx) == 1
        pol = "positive" if words[idx[0]] in sp.POSITIVE_WORDS else "negative"
        neg = idx[0] > 0 and words[idx[0] - 1] == "not"
        assert neg == r["negated"]
        assert r["label"] == (sp.other(pol) if neg else pol)


def test_ambiguous_texts_contradict_their_label_and_leave_the_rest_alone():
    rng = random.Random(1)
    recs = [sp.example(rng, 0.9, negation=0.5, ambiguity=0.25) for _ in range(4000)]
    share = sum(r["ambiguous"] for r in recs) / len(recs)
    assert abs(share - 0.25) < 5 * math.sqrt(0.25 * 0.75 / 4000)
    for r in recs:
        words = r["text"].split()
        idx = [i for i, w in enumerate(words) if w in sp.POSITIVE_WORDS + sp.NEGATIVE_WORDS]
        pol = "positive" if words[idx[0]] in sp.POSITIVE_WORDS else "negative"
        read = sp.other(pol) if r["negated"] else pol  # the label the text's phrase expresses
        assert (read != r["label"]) == r["ambiguous"]
    # Ambiguity 0 (the default) gives the records the generator gave before the option existed: the
    # digest was computed with the generator at commit 430dbe1.
    a = sp.suite(3, 300, 40, n_val=20)
    blob = json.dumps([[r["text"], r["label"], r["keyword"]] for k in sorted(a) for r in a[k]])
    assert hashlib.sha256(blob.encode()).hexdigest() == (
        "b648081be581db8e68255abbaadc975e4f8d9e5cc118f3d1d5c33cb73e8e547e")
    assert not any(r["ambiguous"] for recs in a.values() for r in recs)
    # Ambiguity touches the training and validation sets only, and there only the ambiguous records'
    # sentiment word: the other records, and every test split, are the same as at ambiguity 0.
    c = sp.suite(3, 300, 40, n_val=20, ambiguity=0.3)
    assert all(c[k] == a[k] for k in a if k not in ("train", "val"))
    for k in ("train", "val"):
        assert any(r["ambiguous"] for r in c[k])
        for r0, r1 in zip(a[k], c[k]):
            assert (r0 == {**r1, "ambiguous": False, "text": r0["text"], "sentiment": r0["sentiment"]})
            assert (r0["text"] == r1["text"]) == (not r1["ambiguous"])
    with pytest.raises(ValueError):
        sp.example(rng, 0.5, ambiguity=1.5)


def test_heldout_family_never_in_training():
    s = sp.suite(0, 2000, 50)
    train_words = {w for r in s["train"] for w in r["text"].split()}
    for fam in sp.HELDOUT_FAMILIES:
        assert not set(sp.FAMILIES[fam]) & train_words
        assert all(r["family"] == fam for r in s["heldout-flipped"])


def test_sft_data_has_no_focus_line_and_answers_y():
    recs = sp.make_split(5, 50, 0.0)
    for rec, e in zip(recs, sft_data(recs, TASK, SPEC)):
        assert e["prompt"] == render_prompt(TASK, "", rec["text"]) == f"{TASK}\nText: {rec['text']}\nAnswer:"
        assert e["completion"] == completion(rec["label"])


def test_spurious_map_and_errors():
    spec = FieldSpec(label="y", spurious_label=None, spurious_field="kw", spurious_map={"a": "p", "b": "n"},
                     core_name="c", spurious_name="the keyword")
    ex = build_fit_data([{"text": "t", "y": "n", "kw": "a"}], "T", spec, mode="all")
    assert [e["focus_label"] for e in ex] == ["n", "n", "n", "n", "p", "p"]
    with pytest.raises(UserError, match="no tied label"):
        build_fit_data([{"text": "t", "y": "n", "kw": "z"}], "T", spec)
    with pytest.raises(UserError, match="no field 'text'"):
        build_fit_data([{"y": "n", "kw": "a"}], "T", spec)
    with pytest.raises(UserError, match="unknown focus type"):
        focus_instruction("focus_x", "c", "s")
    with pytest.raises(UserError):
        build_fit_data([], "T", spec, types=["bogus"])
