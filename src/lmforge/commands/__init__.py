"""Command groups that several methods share (``lmforge align``, ``lmforge reward``).

:mod:`lmforge.commands.groups` holds the typer groups; each method adds its commands in its own
module here (``distill.py``, ``selective_dpo.py``, ...), so methods never edit one another's lines.
:func:`load_all` imports them all; ``lmforge.cli`` calls it before it adds the groups to the app.
"""

from __future__ import annotations

import importlib
import pkgutil


def load_all() -> None:
    """Import every command module so that its ``@group.command`` lines run."""
    import lmforge.commands as pkg

    for info in pkgutil.iter_modules(pkg.__path__):
        if info.name != "groups":
            importlib.import_module(f"lmforge.commands.{info.name}")
