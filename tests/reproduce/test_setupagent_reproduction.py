"""``lmforge reproduce setupagent``: the verdict rule against hand-made rows (each check can flip it),
the parser-agreement rule on tiny hand-written logs (swebench's ``FAIL:``/``ERROR:`` header-word
keys set aside, nothing else), and (slow, needs the command sandbox) the quick run's measurements."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lmforge.methods.setupagent.parsers import parse_log
from lmforge.methods.setupagent.reference import load_swebench
from lmforge.reproduce.setupagent import conditions, parsers_agree

GOOD = {"valid": True, "exact": True}
BAD = {"valid": False, "exact": False}

PYTEST_LOG = """\
============================= test session starts ==============================
collected 3 items

tests/test_core.py ..F                                                   [100%]

=================================== FAILURES ===================================
_______________________________ test_clamp_upper _______________________________

    def test_clamp_upper():
>       assert clamp(50, 0, 10) == 10
E       assert 50 == 10

tests/test_core.py:17: AssertionError
==================================== PASSES ====================================
=========================== short test summary info ============================
PASSED tests/test_core.py::test_grow
PASSED tests/test_core.py::test_mean
FAILED tests/test_core.py::test_clamp_upper - assert 50 == 10
========================= 1 failed, 2 passed in 0.02s ==========================
"""

UNITTEST_LOG = """\
test_clamp_upper (test_core.CoreTests.test_clamp_upper) ... FAIL
test_err (test_core.CoreTests.test_err) ... ERROR
test_mean (test_core.CoreTests.test_mean) ... ok

======================================================================
ERROR: test_err (test_core.CoreTests.test_err)
----------------------------------------------------------------------
Traceback (most recent call last):
  File "/w/repo/tests/test_core.py", line 17, in test_err
    raise KeyError(1)
KeyError: 1

======================================================================
FAIL: test_clamp_upper (test_core.CoreTests.test_clamp_upper)
----------------------------------------------------------------------
Traceback (most recent call last):
  File "/w/repo/tests/test_core.py", line 14, in test_clamp_upper
    assert clamp(50, 0, 10) == 10
AssertionError

----------------------------------------------------------------------
Ran 3 tests in 0.001s

FAILED (failures=1, errors=1)
"""


# ------------------------------------------------------------------------------------- conditions


def test_conditions_hold_only_when_every_check_does() -> None:
    ok = conditions([GOOD] * 3, [BAD] * 3, 2, [True] * 6)
    assert ok["held"] and all(ok["checks"].values()) and ok["swebench_available"]
    assert len(ok["checks"]) == 4
    flips = {
        "capped: all valid with the planted sets": conditions([GOOD, {"valid": True, "exact": False}, GOOD],
                                                             [BAD] * 3, 2, [True] * 6),
        "uncapped: at most half valid": conditions([GOOD] * 3, [GOOD, GOOD, BAD], 2, [True] * 6),
        "the model repaired at least one error": conditions([GOOD] * 3, [BAD] * 3, 0, [True] * 6),
        "parsers agree with swebench on every log": conditions([GOOD] * 3, [BAD] * 3, 2, [True] * 5 + [False]),
    }
    for name, verdict in flips.items():
        assert not verdict["held"], name
        assert [k for k, v in verdict["checks"].items() if not v] == [name]  # that check alone flipped
    # a capped repository that is not valid fails the first check too (exact implies valid there)
    assert not conditions([GOOD, BAD, GOOD], [BAD] * 3, 2, [True])["held"]


def test_conditions_boundaries_and_missing_swebench() -> None:
    # "at most half" is n // 2: 1 of 3 holds, 2 of 4 holds, 2 of 3 does not
    assert conditions([GOOD] * 3, [GOOD, BAD, BAD], 1, [True])["held"]
    assert conditions([GOOD] * 4, [GOOD, GOOD, BAD, BAD], 1, [True])["held"]
    assert not conditions([GOOD] * 3, [GOOD, GOOD, BAD], 1, [True])["held"]
    # no swebench: the agreement check cannot hold, and the verdict says why
    absent = conditions([GOOD] * 3, [BAD] * 3, 2, None)
    assert not absent["held"] and absent["swebench_available"] is False
    assert absent["checks"]["parsers agree with swebench on every log"] is False
    # swebench present but no log compared: not held either
    none = conditions([GOOD] * 3, [BAD] * 3, 2, [])
    assert not none["held"] and none["swebench_available"] is True


# ---------------------------------------------------------------------------------- parsers_agree


@pytest.fixture(scope="module")
def ref():
    loaded = load_swebench()
    if loaded is None:
        pytest.skip("swebench (with unidiff) is not installed: no reference parser")
    return loaded


def test_parsers_agree_on_a_pytest_log(ref) -> None:
    ours = parse_log(PYTEST_LOG, "pytest")
    assert ours == {"tests/test_core.py::test_grow": "PASSED", "tests/test_core.py::test_mean": "PASSED",
                    "tests/test_core.py::test_clamp_upper": "FAILED"}
    assert parsers_agree(PYTEST_LOG, "pytest", ours, ref)
    assert not parsers_agree(PYTEST_LOG, "pytest", {**ours, "tests/test_core.py::test_mean": "FAILED"}, ref)
    assert not parsers_agree(PYTEST_LOG, "pytest", {k: v for k, v in ours.items() if "grow" not in k}, ref)


def test_parsers_agree_on_a_unittest_log_despite_the_header_words(ref) -> None:
    ours = parse_log(UNITTEST_LOG, "unittest")
    assert ours == {"test_clamp_upper (test_core.CoreTests.test_clamp_upper)": "FAILED",
                    "test_err (test_core.CoreTests.test_err)": "ERROR",
                    "test_mean (test_core.CoreTests.test_mean)": "PASSED"}
    # swebench's django parser adds a key for the first word of each FAIL:/ERROR: header line ...
    theirs = ref.parse_log_django(UNITTEST_LOG)
    assert set(theirs) - set(ours) == {"test_err", "test_clamp_upper"}
    # ... which the rule sets aside, and only those
    assert parsers_agree(UNITTEST_LOG, "unittest", ours, ref)
    assert not parsers_agree(UNITTEST_LOG, "unittest", {**ours, "test_err": "ERROR"}, ref)
    wrong = {**ours, "test_err (test_core.CoreTests.test_err)": "FAILED"}
    assert not parsers_agree(UNITTEST_LOG, "unittest", wrong, ref)
    missing = {k: v for k, v in ours.items() if not k.startswith("test_mean")}
    assert not parsers_agree(UNITTEST_LOG, "unittest", missing, ref)
    # the pytest rule on the same log would not set the header words aside
    assert not parsers_agree(UNITTEST_LOG, "pytest", ours, ref)


# ------------------------------------------------------------------------------------ quick run


@pytest.mark.slow  # 3 repositories, each set up twice in the command sandbox: about a minute; `make test-slow`
def test_setupagent_reproduction_quick(tmp_path: Path) -> None:
    from lmforge.common.command_sandbox import namespaces_available

    if not namespaces_available():
        pytest.skip("the command sandbox needs Linux root and a network/PID namespace")
    from lmforge.reproduce.base import ReproduceOptions, get

    res = get("setupagent").fn(ReproduceOptions(out_dir=tmp_path, quick=True, seed=0))
    m = res.measured
    assert m["capped: valid with the planted sets"] == "3/3"
    assert m["capped: valid"] == "3/3"
    assert m["uncapped: valid"] == "0/3"
    # every repository's first plan is wrong in both conditions, and one repair fixes it
    assert m["setups whose working plan came from a repair"] == 6
    assert "netns" in m["sandbox layers"]
    assert any("quick run: 3 repositories" in n for n in res.notes)
    details = json.loads((tmp_path / "details.json").read_text())
    assert [d["status"] for d in details["capped"]] == ["valid"] * 3
    assert [d["status"] for d in details["uncapped"]] == ["invalid"] * 3
    assert [d["framework"] for d in details["capped"]] == ["pytest", "pytest", "unittest"]
    # uncapped, the repository that imports toydep inside a function collects, but test_grow fails
    # before and after the fix: invalid on the pass rate, not for want of a FAIL_TO_PASS test
    lazy = details["uncapped"][1]
    assert lazy["eager_import"] is False and lazy["F2F"] == 1 and lazy["reason"].startswith("after-fix pass rate")
    if load_swebench() is not None:
        assert res.held is True
        agree, total = m["logs where lmforge's parser agrees with swebench's"].split("/")
        assert agree == total and int(total) == 12  # before and after, 3 repositories, both conditions
    else:
        assert res.held is False


def test_repaired_counts_only_a_repair_that_worked():
    from lmforge.reproduce.setupagent import repaired

    assert repaired({"repair": {"ok": True, "rounds": [{}, {}]}})
    assert not repaired({"repair": {"ok": True, "rounds": [{}]}})          # the first plan worked
    assert not repaired({"repair": {"ok": False, "rounds": [{}, {}, {}]}})  # repairs that never worked
    assert not repaired({"repair": None})
