"""The swebench reference, loaded without docker (:func:`lmforge.methods.setupagent.reference.load_swebench`).

Tests that use it are skipped when swebench or unidiff is not installed.
"""

from __future__ import annotations

from typing import Any

import pytest

from lmforge.methods.setupagent.reference import load_swebench


@pytest.fixture(scope="session")
def swebench_ref() -> Any:
    """A namespace with swebench's parsers and grading (see ``load_swebench``)."""
    pytest.importorskip("swebench")
    pytest.importorskip("unidiff")
    ref = load_swebench()
    if ref is None:
        pytest.skip("swebench's grading does not import without its heavy dependencies")
    return ref
