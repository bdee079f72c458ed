"""User-facing errors.

A :class:`UserError` is a mistake the user can fix (bad path, unknown key, existing output). The CLI
prints its message as one line and exits with status 2; it never shows a traceback for it.
"""

from __future__ import annotations


class UserError(Exception):
    """An error caused by user input; its message is shown as one line, exit status 2."""

    exit_code: int = 2
