"""Recipes: YAML + key=value overrides fill a dataclass; unknown keys are errors."""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest

from lmforge.common.errors import UserError
from lmforge.config import load_config, parse_overrides


@dataclass
class Inner:
    lr: float = 1e-3
    steps: int = 10


@dataclass
class Cfg:
    name: str = "x"
    bits: int = 4
    group_size: int | None = None
    layers: list[int] = field(default_factory=list)
    use_bias: bool = False
    train: Inner = field(default_factory=Inner)

    def __post_init__(self):
        if self.bits not in (2, 3, 4, 8):
            raise ValueError(f"bits must be 2, 3, 4 or 8, got {self.bits}")


def test_yaml_then_overrides(tmp_path):
    recipe = tmp_path / "r.yaml"
    recipe.write_text("bits: 8\ntrain:\n  lr: 0.01\n  steps: 5\nlayers: [1, 2]\n")
    cfg = load_config(Cfg, recipe, ["train.steps=7", "use_bias=true", "group_size=128"])
    assert cfg.bits == 8 and cfg.train.lr == 0.01 and cfg.train.steps == 7
    assert cfg.use_bias is True and cfg.group_size == 128 and cfg.layers == [1, 2]
    assert load_config(Cfg, recipe, ["group_size=null"]).group_size is None


@pytest.mark.parametrize("override,msg", [
    (["nope=1"], "unknown recipe key 'nope'"),
    (["train.nope=1"], "unknown recipe key 'train.nope'"),
    (["bits=four"], "expects int"),
    (["bits=5"], "bits must be 2, 3, 4 or 8"),
    (["use_bias=maybe"], "true/false"),
    (["bits"], "key=value"),
])
def test_bad_overrides_are_user_errors(override, msg):
    with pytest.raises(UserError, match=msg):
        load_config(Cfg, None, override)


def test_missing_or_bad_recipe(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        load_config(Cfg, tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("- a\n- b\n")
    with pytest.raises(UserError, match="mapping"):
        load_config(Cfg, bad)


def test_parse_overrides_nests():
    assert parse_overrides(["a.b.c=1", "a.d=x"]) == {"a": {"b": {"c": 1}, "d": "x"}}


def test_atomic_outputs_get_ordinary_permissions(tmp_path):
    import os
    import stat

    from lmforge.common.io import atomic_dir, atomic_write_json

    mask = os.umask(0o022)
    try:
        with atomic_dir(tmp_path / "out") as tmp:
            atomic_write_json(tmp / "a.json", {"x": 1})
        assert stat.S_IMODE((tmp_path / "out").stat().st_mode) == 0o755
        assert stat.S_IMODE((tmp_path / "out" / "a.json").stat().st_mode) == 0o644
    finally:
        os.umask(mask)
