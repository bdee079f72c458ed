"""SetUpAgent / SWEE-Bench: repository setup for code-agent benchmarks (Vergopoulos, Müller, Vechev,
ICML 2025, arXiv 2503.07701; no official code).

Math and rules: ``schema.py`` (the SWE-bench instance record), ``mine.py`` (issue-linked changes
touching tests and code, split into patch / test_patch), ``parsers.py`` (pytest, unittest/django,
nose, tox logs -> per-test statuses), ``grade.py`` (the four test sets and the keep rule),
``stats.py`` (patch complexity), ``extract.py`` (rule-based and LLM command extraction, the
allow-list), ``repair.py`` (the repair loop). Wiring: ``index.py`` (a loopback PEP 691 index with
PEP 700 upload times, re-packed wheels), ``runner.py`` (one instance in
:mod:`lmforge.common.command_sandbox`), ``pipeline.py`` (a repository end to end, resumable),
``reference.py`` (swebench's parsers for agreement checks). CLI: ``lmforge bench setup`` and
``lmforge bench swe-export``; ``lmforge reproduce setupagent``.
"""

from typing import Any

from lmforge.registry import Method, register


def setup_repository(*args: Any, **kwargs: Any) -> Any:
    """:func:`lmforge.methods.setupagent.pipeline.setup_repository` (imported on first call)."""
    from lmforge.methods.setupagent.pipeline import setup_repository as run

    return run(*args, **kwargs)


register(Method(name="setupagent", family="bench",
                paper="SetUpAgent / SWEE-Bench: repository setup for code-agent benchmarks (ICML 2025)",
                entry=setup_repository, status="implemented"))


class StopRun(RuntimeError):
    """Raised by an extractor (e.g. its model cannot be loaded) to stop a whole
    :func:`~lmforge.methods.setupagent.pipeline.setup_repository` run: it is not one candidate's
    failure, so no record is written for it and it reaches the caller. (Defined here, light to
    import, for the CLI.)"""
