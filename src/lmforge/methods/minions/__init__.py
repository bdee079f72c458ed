"""Minions: local-remote LM collaboration (Narayan et al., ICML 2025, arXiv:2502.15964).

``clients.py``: chat clients (lmforge's HF engine, OpenAI-compatible servers, scripted) and JSON
replies with bounded retries; ``ledger.py``: the cost ledger; ``jobs.py``: job records and chunkers
(importable in the sandbox child); ``prompts.py``; ``minion.py`` (the chat protocol) and
``minions.py`` (remote-written jobs run by the local model); ``apply.py``: one entry point for the
protocols and the remote-only / local-only baselines.

This package's import stays light (no torch): the sandbox child imports it to reach ``jobs.py``.
"""

from typing import Any

from lmforge.registry import Method, register


def run(*args: Any, **kwargs: Any) -> dict[str, Any]:
    """:func:`lmforge.methods.minions.apply.run_protocol`, imported on first call (see above)."""
    from lmforge.methods.minions.apply import run_protocol

    return run_protocol(*args, **kwargs)


register(Method(name="minions", family="agent", paper="Minions: local-remote LM collaboration (ICML 2025)",
                entry=run, status="implemented"))
