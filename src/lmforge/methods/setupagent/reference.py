"""swebench's log parsers, loaded without docker (for agreement checks in reproductions and tests).

``swebench.harness/__init__.py`` imports ``docker_utils`` (docker-py) and the other harness modules,
so ``import swebench.harness.log_parsers`` fails without docker although the parsers, ``grading`` and
``constants`` need only the standard library and ``unidiff``. :func:`load_swebench` registers an empty
package object for ``swebench.harness`` (its ``__path__`` pointing at the real folder) when the real
one is not imported yet, imports those modules, and removes every ``swebench.harness`` module it added.
swebench is an optional reference (``make test`` installs it with ``--no-deps``), never a dependency.
"""

from __future__ import annotations

import importlib
import sys
import types
from pathlib import Path
from typing import Any

__all__ = ["load_swebench"]


def load_swebench() -> Any | None:
    """A namespace with swebench's ``parse_log_pytest(log)``, ``parse_log_django(log)``,
    ``TestStatus``, ``ResolvedStatus``, ``get_eval_tests_report``, ``get_resolution_status``,
    ``test_passed``, ``test_failed`` and ``__version__``; None when swebench or unidiff is not
    installed, or its grading modules need more than they do in 5.0.2."""
    try:
        swebench = importlib.import_module("swebench")
        importlib.import_module("unidiff")
    except ImportError:
        return None
    before = set(sys.modules)
    if "swebench.harness" not in sys.modules:
        pkg = types.ModuleType("swebench.harness")
        pkg.__path__ = [str(Path(swebench.__file__).parent / "harness")]
        sys.modules["swebench.harness"] = pkg
    try:
        python_parsers = importlib.import_module("swebench.harness.log_parsers.python")
        grading = importlib.import_module("swebench.harness.grading")
        constants = importlib.import_module("swebench.harness.constants")
    except ImportError:
        return None
    finally:
        for name in set(sys.modules) - before:
            if name.startswith("swebench.harness"):
                del sys.modules[name]
    return types.SimpleNamespace(
        __version__=swebench.__version__,
        parse_log_pytest=lambda log: python_parsers.parse_log_pytest(log, None),
        parse_log_django=lambda log: python_parsers.parse_log_django(log, None),
        TestStatus=constants.TestStatus, ResolvedStatus=constants.ResolvedStatus,
        get_eval_tests_report=grading.get_eval_tests_report,
        get_resolution_status=grading.get_resolution_status,
        test_passed=grading.test_passed, test_failed=grading.test_failed,
    )
