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
