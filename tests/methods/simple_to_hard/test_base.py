"""The base VLM (base.py): two-phase build from a phase-1 checkpoint, and the committed base's limits."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lmforge.common.errors import UserError
from lmforge.methods.simple_to_hard import base as B
from lmforge.methods.simple_to_hard import experiment, mini, vlm


def _tiny_phase1(tmp_path: Path, recipe: dict) -> Path:
    tok = vlm.build_tokenizer()
    shape = vlm.VLMShape(vision_hidden=16, vision_layers=1, vision_heads=2, hidden=32, layers=1, heads=2,
                         intermediate=64)
    out = tmp_path / "phase1"
    vlm.save(vlm.build_model(tok, shape, seed=0), tok, out, {"name": "p1", "recipe": recipe, "train_seconds": 12.5})
    return out


def test_build_base_continues_a_phase1_checkpoint_and_records_both_phases(tmp_path):
    init = _tiny_phase1(tmp_path, {"steps": 3000, "batch_size": 32, "lr": 3e-4, "seed": 0})
    before, _ = vlm.load(init)
    card = B.build_base(tmp_path / "base", spatial_steps=2, init=init, progress=False)
    assert card["recipe"]["phase 2"]["steps"] == 2 and card["phase_seconds"][0] == 12.5
    assert card["train_seconds"] == pytest.approx(12.5 + card["phase_seconds"][1], abs=0.11)
    assert {"read image", "read text", "add", "adjacent", "lit neighbours", "named reads"} == set(card["probe"])
    after, _ = vlm.load(tmp_path / "base")
    assert json.loads((tmp_path / "base" / "vlm.json").read_text()) == card
    # phase 2 trained the phase-1 weights (same shape, different values)
    pairs = list(zip(before.state_dict().values(), after.state_dict().values()))
    assert all(a.shape == b.shape for a, b in pairs) and any((a != b).any() for a, b in pairs)


def test_build_base_refuses_a_checkpoint_of_another_phase1_recipe(tmp_path):
    init = _tiny_phase1(tmp_path, {"steps": 100, "batch_size": 32, "lr": 3e-4, "seed": 0})
    with pytest.raises(UserError, match="phase-1 recipe"):
        B.build_base(tmp_path / "base", spatial_steps=2, init=init, progress=False)
    assert not (tmp_path / "base").exists() and not (tmp_path / "base.tmp").exists()
    # a base that already had phase 2 (the committed one) is not a phase-1 checkpoint either
    with pytest.raises(UserError, match="phase-1 recipe"):
        B.build_base(tmp_path / "base", spatial_steps=2, init=B.packaged_base(), progress=False)
    with pytest.raises(UserError, match="not a base VLM checkpoint"):
        B.build_base(tmp_path / "base", spatial_steps=2, init=tmp_path, progress=False)
    assert not (tmp_path / "base").exists()


def test_committed_base_cannot_do_the_task_before_fine_tuning():
    """Generic pretraining only: the committed base scores 0 on the task's own prompts."""
    model, tok = B.load_base()
    ps = mini.generate("SIMPLE", 12, 30_000)
    hs = mini.generate("HARD", 6, 10_000)
    acc, _ = experiment.evaluate(model, tok, {"simple-image": ps, "simple-text": ps, "hard-image": hs})
    assert acc == {"simple-image": 0.0, "simple-text": 0.0, "hard-image": 0.0}


def test_build_base_refuses_init_inside_out_and_a_broken_card(tmp_path):
    init = _tiny_phase1(tmp_path, {"steps": 3000, "batch_size": 32, "lr": 3e-4, "seed": 0})
    card_before = (init / "vlm.json").read_text()
    # --init equal to --out (or inside it) would replace the checkpoint it reads
    for out in (init, init.parent):
        with pytest.raises(UserError, match="lies in --out"):
            B.build_base(out, spatial_steps=2, init=init, overwrite=True, progress=False)
    assert (init / "vlm.json").read_text() == card_before
    # an --out that is a file is refused before any training
    f = tmp_path / "afile"
    f.write_text("x")
    with pytest.raises(UserError, match="is a file"):
        B.build_base(f, spatial_steps=2, init=init, overwrite=True, progress=False)
    # a card that is not JSON, or whose recipe is not a mapping: one UserError, nothing written
    for text in ("{not json", '{"recipe": [1, 2]}'):
        (init / "vlm.json").write_text(text)
        with pytest.raises(UserError, match="not a base VLM card"):
            B.build_base(tmp_path / "base", spatial_steps=2, init=init, progress=False)
    assert not (tmp_path / "base").exists() and not (tmp_path / "base.tmp").exists()
