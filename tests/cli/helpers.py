"""Shared by the CLI tests: run the real entry point in-process."""

from __future__ import annotations

import sys


def call(monkeypatch, capsys, *args: str) -> tuple[int, str, str]:
    """Run ``lmforge ARGS`` through ``lmforge.cli.main`` (exit status, stdout, stderr)."""
    from lmforge.cli import main

    monkeypatch.setattr(sys, "argv", ["lmforge", *args])
    monkeypatch.setenv("LMFORGE_NO_PROGRESS", "1")
    try:
        main()
        code = 0
    except SystemExit as exc:
        code = int(exc.code or 0)
    out, err = capsys.readouterr()
    return code, out, err


def one_error_line(stderr: str) -> str:
    """The single ``error: ...`` line a user mistake prints (asserts there is nothing else)."""
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), stderr
    return lines[0]
