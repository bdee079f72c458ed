"""Atomic output folders."""

from __future__ import annotations

import pytest


def test_atomic_dir_never_replaces_a_folder_that_appeared_meanwhile(tmp_path):
    from lmforge.common.errors import UserError
    from lmforge.common.io import atomic_dir

    out = tmp_path / "out"
    with pytest.raises(UserError, match="appeared while writing"):
        with atomic_dir(out) as tmp:
            (tmp / "result.txt").write_text("new")
            out.mkdir()
            (out / "theirs.txt").write_text("keep me")
    assert sorted(p.name for p in out.iterdir()) == ["theirs.txt"]
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out.tmp")]


def test_check_output_dir_refuses_a_file_in_the_path(tmp_path):
    from lmforge.common.errors import UserError
    from lmforge.common.io import check_output_dir

    (tmp_path / "afile").write_text("x")
    with pytest.raises(UserError, match="is a file, not a folder"):
        check_output_dir(tmp_path / "afile" / "sub" / "out", overwrite=False)
    assert check_output_dir(tmp_path / "new" / "out", overwrite=False) == tmp_path / "new" / "out"


@pytest.mark.parametrize("bad, where", [
    ({"runs": [{"auroc": 0.5}, {"auroc": float("nan")}]}, "$.runs[1].auroc"),
    ({"ppl": float("inf")}, "$.ppl"),
    ([1.0, -float("inf")], "$[1]"),
])
def test_atomic_write_json_refuses_nan_and_infinity_and_names_where(tmp_path, bad, where):
    import json

    from lmforge.common.io import atomic_write_json

    with pytest.raises(ValueError, match=__import__("re").escape(where)):
        atomic_write_json(tmp_path / "results.json", bad)
    assert list(tmp_path.iterdir()) == []  # nothing written, not even a temporary file
    atomic_write_json(tmp_path / "ok.json", {"undefined": None, "x": 0.5})
    assert json.loads((tmp_path / "ok.json").read_text()) == {"undefined": None, "x": 0.5}


def test_atomic_write_json_writes_numpy_and_torch_floats_as_checked_numbers(tmp_path):
    import json

    import numpy as np
    import torch

    from lmforge.common.io import atomic_write_json

    atomic_write_json(tmp_path / "a.json", {"np": np.float32(0.5), "t": torch.tensor(0.25)})
    assert json.loads((tmp_path / "a.json").read_text()) == {"np": 0.5, "t": 0.25}
    for bad in (np.float32("nan"), torch.tensor(float("inf"))):
        with pytest.raises(ValueError, match=r"\$\.x"):
            atomic_write_json(tmp_path / "b.json", {"x": bad})
    assert not (tmp_path / "b.json").exists()
