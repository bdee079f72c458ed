"""Every compression recipe fills its method's config, and runs end to end on agent-nano."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest

from lmforge.compression import METHOD_NAMES, get_method, make_config
from lmforge.registry import load_all

ROOT = Path(__file__).resolve().parents[2]


def test_every_compression_method_is_registered_with_a_recipe():
    reg = load_all()
    for name in METHOD_NAMES:
        assert reg[name].status != "planned" and reg[name].config_cls is get_method(name).config_cls
        assert (ROOT / "recipes" / name / "tiny.yaml").is_file()


@pytest.mark.parametrize("name", METHOD_NAMES)
def test_recipe_runs(name, nano):
    from lmforge.data.calibration import builtin_texts, token_windows

    cfg = make_config(name, recipe=ROOT / "recipes" / name / "tiny.yaml")
    assert isinstance(cfg, get_method(name).config_cls)
    model, tok = nano
    model = copy.deepcopy(model)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    calib = token_windows(tok, builtin_texts(0, 40), 2, 64, 0)
    if name == "ganq":
        cfg.iters = 1
    res = get_method(name).apply(model, calib, cfg, progress=False)
    changed = [n for n, p in model.named_parameters() if not bool((p.detach() == before[n]).all())]
    # Every decoder linear changed (AWQ also rescales the norms); embeddings and head untouched.
    assert len(res.layers) == sum(1 for n in before if ".layers." in n and n.endswith("proj.weight"))
    assert all(f"{r.name}.weight" in changed for r in res.layers)
    assert not any("embed" in n or "lm_head" in n for n in changed)
