"""NIAH contexts: the needle sits at the requested depth at a sentence boundary, within the budget."""

from __future__ import annotations

import json

import pytest

from lmforge.common.errors import UserError
from lmforge.eval.niah import NEEDLE, NiahSettings, build_context, depth_grid, haystack_text, load_settings


def test_depth_grid_matches_numpy_linspace_rounding():
    import numpy as np

    for n in (1, 2, 5, 11, 13):
        expected = [0] if n == 1 else [int(x) for x in np.round(np.linspace(0, 100, num=n))]
        assert depth_grid(n) == expected


@pytest.mark.parametrize("depth", [0, 25, 50, 75, 100])
def test_needle_position_and_length(zoo_tokenizer, depth):
    tok = zoo_tokenizer
    hay = haystack_text(NiahSettings(), 20_000)
    text = build_context(tok, hay, 512, depth, NEEDLE)
    n_tokens = len(tok(text, add_special_tokens=False)["input_ids"])
    assert NEEDLE in text
    assert n_tokens <= 512 - 64 + 2  # re-tokenizing the decoded text may merge a token or two
    at = text.index(NEEDLE) / (len(text) - len(NEEDLE))  # share of the haystack before the needle
    assert abs(at - depth / 100) < 0.08
    before = text[: text.index(NEEDLE)].rstrip()
    # At 100% the original appends the needle without backing up to a sentence end.
    assert depth == 0 and before == "" or depth == 100 or before.endswith(".")


def test_settings_file(tmp_path):
    p = tmp_path / "niah.json"
    p.write_text(json.dumps({"context_lengths": [128, 256], "depth_percents": [0, 50, 100]}))
    s = load_settings(p)
    assert s.context_lengths == [128, 256] and s.needle == NEEDLE
    p.write_text(json.dumps({"lengths": [128]}))
    with pytest.raises(UserError, match="unknown NIAH setting"):
        load_settings(p)
    p.write_text("{\n  oops")
    with pytest.raises(UserError, match=":2: not valid JSON"):
        load_settings(p)
