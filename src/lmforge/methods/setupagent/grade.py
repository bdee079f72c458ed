"""FAIL_TO_PASS, PASS_TO_PASS, PASS_TO_FAIL, FAIL_TO_FAIL from the test statuses before and after the
fix, and the keep rule for a candidate instance.

SetUpAgent (Vergopoulos, Müller, Vechev, ICML 2025, arXiv 2503.07701, §3) runs the tests twice with
the instance's ``test_patch`` applied: on ``base_commit`` ("before") and with the gold ``patch`` on
top ("after"). The status maps of the two runs (:mod:`.parsers`) give the four sets; an instance is
kept when at least one test goes from failing to passing and the run after the fix is healthy.
No code was released.

Library checked for an existing implementation: ``swebench``. The derivation of the four sets is
SWE-bench's validation step, ``convert_log_to_ground_truth`` in ``swebench/metrics/conversion.py``
with ``test_passed`` / ``test_failed`` from ``swebench/metrics/getters.py`` (princeton-nlp/SWE-bench,
the swebench 1.x package; read there, the module is gone from swebench 2.x and later, and 5.0.2 has
no function that derives the sets). It is followed exactly, and written here:

* only tests in the *after* map are classified, in its order;
* after ``PASSED``: ``PASS_TO_PASS`` if the test was ``PASSED`` before, ``FAIL_TO_PASS`` if it was
  ``FAILED`` or ``ERROR`` before **or missing from the before log**;
* after ``FAILED``: ``PASS_TO_FAIL`` / ``FAIL_TO_FAIL`` by the same rule;
* any other after status (``ERROR``, ``SKIPPED``, ``XFAIL``), and a before status of ``SKIPPED`` or
  ``XFAIL``, puts the test in no set.

swebench 5.0.2's grading (``swebench.harness.grading``: ``test_passed`` counts ``PASSED`` and
``XFAIL``, ``test_failed`` counts a missing test, ``FAILED``, ``ERROR`` and, for FAIL_TO_PASS,
``SKIPPED``) then accepts the sets: graded against the after map they resolve fully, against the
before map every FAIL_TO_PASS test fails (tests/methods/setupagent/test_grade.py checks both with
swebench's own functions).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING

from lmforge.methods.setupagent.parsers import ERROR, FAILED, PASSED, XFAIL

if TYPE_CHECKING:
    from lmforge.methods.setupagent.schema import Instance

# NOTE: the notes put the paper's pass-rate threshold at "about 95%" [verify]; the paper text could
# not be reached here (only its abstract was found through the search corpora), so 0.95 is an
# unconfirmed default and a parameter. "Clears" is read as ``rate >= threshold``.
DEFAULT_PASS_RATE = 0.95


def _passed(test: str, statuses: Mapping[str, str]) -> bool:
    # SWE-bench 1.x getters.test_passed: present and PASSED (XFAIL is not a pass here)
    return statuses.get(test) == PASSED


def _failed(test: str, statuses: Mapping[str, str]) -> bool:
    # SWE-bench 1.x getters.test_failed: missing from the log, FAILED or ERROR.
    # NOTE (confirmed in that code): a test missing from the before log counts as failed, so a test
    # file added by test_patch whose tests only exist after the fix still yields FAIL_TO_PASS.
    return test not in statuses or statuses[test] in (FAILED, ERROR)


@dataclass(frozen=True)
class Grade:
    """The four sets, and the after-fix counts behind the pass rate.

    Attributes:
        FAIL_TO_PASS, PASS_TO_PASS, PASS_TO_FAIL, FAIL_TO_FAIL: test names, in the after log's order.
        after_passing: tests of the after log that passed (``PASSED`` or ``XFAIL``).
        after_failing: tests of the after log that failed (``FAILED`` or ``ERROR``).
    """

    FAIL_TO_PASS: list[str] = field(default_factory=list)
    PASS_TO_PASS: list[str] = field(default_factory=list)
    PASS_TO_FAIL: list[str] = field(default_factory=list)
    FAIL_TO_FAIL: list[str] = field(default_factory=list)
    after_passing: int = 0
    after_failing: int = 0

    @property
    def pass_rate(self) -> float | None:
        """Passing over passing + failing tests after the fix; None when no test ran.

        NOTE: the paper leaves the denominator open; skipped tests are left out (they did not run)
        and ERROR counts as failing, so a run whose collection broke cannot look healthy.
        """
        ran = self.after_passing + self.after_failing
        return self.after_passing / ran if ran else None


def grade(before: Mapping[str, str], after: Mapping[str, str]) -> Grade:
    """The four sets from the status maps of the runs before and after the fix (both with the
    test_patch applied), as SWE-bench's validation derives them (module docstring)."""
    sets: dict[str, list[str]] = {"F2P": [], "P2P": [], "P2F": [], "F2F": []}
    for test, status in after.items():
        if status == PASSED:
            if _passed(test, before):
                sets["P2P"].append(test)
            elif _failed(test, before):
                sets["F2P"].append(test)
        elif status == FAILED:
            if _passed(test, before):
                sets["P2F"].append(test)
            elif _failed(test, before):
                sets["F2F"].append(test)
    passing = sum(s in (PASSED, XFAIL) for s in after.values())
    failing = sum(s in (FAILED, ERROR) for s in after.values())
    return Grade(sets["F2P"], sets["P2P"], sets["P2F"], sets["F2F"], passing, failing)


def pass_rate(result: Grade | Instance) -> float | None:
    """The after-fix pass rate of a :class:`Grade` (its counts), or of an instance record from its
    four sets: ``(|F2P| + |P2P|) / (|F2P| + |P2P| + |P2F| + |F2F|)``. The two agree unless the
    after run had tests that ended in ERROR or XFAIL, which a record's sets do not hold."""
    if isinstance(result, Grade):
        return result.pass_rate
    good = len(result.FAIL_TO_PASS) + len(result.PASS_TO_PASS)
    ran = good + len(result.PASS_TO_FAIL) + len(result.FAIL_TO_FAIL)
    return good / ran if ran else None


def keep(result: Grade | Instance, threshold: float = DEFAULT_PASS_RATE) -> bool:
    """Whether a candidate becomes an instance: FAIL_TO_PASS is not empty and the after-fix pass
    rate (:func:`pass_rate`) is at least ``threshold``."""
    if not 0.0 <= threshold <= 1.0:
        raise ValueError(f"threshold must be in [0, 1], got {threshold}")
    if not result.FAIL_TO_PASS:
        return False
    rate = pass_rate(result)
    return rate is not None and rate >= threshold


def with_grade(instance: Instance, result: Grade) -> Instance:
    """``instance`` with its four sets replaced by ``result``'s."""
    return replace(instance, FAIL_TO_PASS=list(result.FAIL_TO_PASS), PASS_TO_PASS=list(result.PASS_TO_PASS),
                   PASS_TO_FAIL=list(result.PASS_TO_FAIL), FAIL_TO_FAIL=list(result.FAIL_TO_FAIL))
