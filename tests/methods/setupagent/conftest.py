"""The swebench reference, loaded without docker.

``swebench.harness/__init__.py`` imports ``docker_utils`` (docker-py) and the other harness modules,
so ``import swebench.harness.grading`` fails without docker even though ``grading``,
``constants``, ``log_parsers`` and ``types`` need only the standard library and ``unidiff``. The
fixture registers an empty package object for ``swebench.harness`` (its ``__path__`` pointing at the
real folder), imports the modules it needs, and removes everything it added afterwards. Tests that
use it are skipped when swebench or unidiff is not installed.
"""

from __future__ import annotations

import importlib
import sys
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest


@pytest.fixture(scope="session")
def swebench_ref() -> Iterator[Any]:
    """A namespace with swebench's ``parse_log_pytest``, ``parse_log_django``, ``TestStatus``,
    ``get_eval_tests_report``, ``get_resolution_status``, ``ResolvedStatus``, ``test_passed``,
    ``test_failed`` and ``__version__``."""
    swebench = pytest.importorskip("swebench")
    pytest.importorskip("unidiff")
    before = set(sys.modules)
    stub = "swebench.harness" not in sys.modules
    if stub:
        pkg = types.ModuleType("swebench.harness")
        pkg.__path__ = [str(Path(swebench.__file__).parent / "harness")]
        sys.modules["swebench.harness"] = pkg
    try:
        python_parsers = importlib.import_module("swebench.harness.log_parsers.python")
        grading = importlib.import_module("swebench.harness.grading")
        constants = importlib.import_module("swebench.harness.constants")
    except ImportError as exc:  # a swebench release that needs more to import these
        pytest.skip(f"swebench's grading does not import without its heavy dependencies: {exc}")
    ref = types.SimpleNamespace(
        __version__=swebench.__version__,
        parse_log_pytest=lambda log: python_parsers.parse_log_pytest(log, None),
        parse_log_django=lambda log: python_parsers.parse_log_django(log, None),
        TestStatus=constants.TestStatus, ResolvedStatus=constants.ResolvedStatus,
        get_eval_tests_report=grading.get_eval_tests_report,
        get_resolution_status=grading.get_resolution_status,
        test_passed=grading.test_passed, test_failed=grading.test_failed,
    )
    yield ref
    for name in set(sys.modules) - before:
        if name.startswith("swebench.harness"):
            del sys.modules[name]
