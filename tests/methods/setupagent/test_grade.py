"""FAIL_TO_PASS / PASS_TO_PASS / PASS_TO_FAIL / FAIL_TO_FAIL and the keep rule: hand-worked cases of
SWE-bench's validation rule, and the derived sets graded by swebench's own harness functions."""

from __future__ import annotations

import pytest

from lmforge.methods.setupagent.grade import DEFAULT_PASS_RATE, Grade, grade, keep, pass_rate, with_grade
from lmforge.methods.setupagent.parsers import parse_pytest
from lmforge.methods.setupagent.schema import Instance

BEFORE = {
    "a": "FAILED", "b": "PASSED", "c": "PASSED", "d": "FAILED", "e": "ERROR",
    "s": "SKIPPED", "x": "XFAIL", "gone": "PASSED",
}
AFTER = {
    "a": "PASSED", "b": "PASSED", "c": "FAILED", "d": "FAILED", "e": "PASSED",
    "new": "PASSED",  # only in the after log: missing before counts as failed
    "s": "PASSED",    # SKIPPED before: neither passed nor failed, in no set
    "x": "PASSED",    # XFAIL before: in no set (SWE-bench 1.x test_passed is PASSED only)
    "r": "ERROR",     # ERROR after: in no set
    "k": "SKIPPED",   # SKIPPED after: in no set
}


def test_sets_follow_swebench_validation():
    g = grade(BEFORE, AFTER)
    assert g.FAIL_TO_PASS == ["a", "e", "new"]  # in the after log's order
    assert g.PASS_TO_PASS == ["b"]
    assert g.PASS_TO_FAIL == ["c"]
    assert g.FAIL_TO_FAIL == ["d"]
    # after: passing a b e new s x = 6; failing c d r = 3; k skipped is left out
    assert (g.after_passing, g.after_failing) == (6, 3)
    assert g.pass_rate == pytest.approx(6 / 9)


def test_missing_before_and_empty_before_log():
    # a test file added by test_patch whose module does not even import before the fix
    g = grade({}, {"t1": "PASSED", "t2": "FAILED"})
    assert (g.FAIL_TO_PASS, g.FAIL_TO_FAIL, g.PASS_TO_PASS, g.PASS_TO_FAIL) == (["t1"], ["t2"], [], [])
    # a test missing *after* is in no set
    assert grade({"t": "PASSED"}, {}) == Grade()


def _grade(f2p: int, p2p: int, p2f: int = 0, f2f: int = 0, errors: int = 0) -> Grade:
    before = {f"f{i}": "FAILED" for i in range(f2p)} | {f"p{i}": "PASSED" for i in range(p2p)}
    before |= {f"q{i}": "PASSED" for i in range(p2f)} | {f"g{i}": "FAILED" for i in range(f2f)}
    after = {f"f{i}": "PASSED" for i in range(f2p)} | {f"p{i}": "PASSED" for i in range(p2p)}
    after |= {f"q{i}": "FAILED" for i in range(p2f)} | {f"g{i}": "FAILED" for i in range(f2f)}
    after |= {f"e{i}": "ERROR" for i in range(errors)}
    return grade(before, after)


def test_keep_threshold():
    assert DEFAULT_PASS_RATE == 0.95
    assert keep(_grade(f2p=1, p2p=95, p2f=4))          # 96/100
    assert keep(_grade(f2p=1, p2p=94, p2f=5))          # 95/100: exactly at the threshold
    assert not keep(_grade(f2p=1, p2p=93, p2f=6))      # 94/100
    assert not keep(_grade(f2p=0, p2p=100))            # nothing goes from failing to passing
    assert keep(_grade(f2p=1, p2p=93, p2f=6), threshold=0.9)
    # ERROR after the fix counts against the rate though it is in no set
    g = _grade(f2p=1, p2p=94, errors=5)
    assert g.PASS_TO_FAIL == [] and g.pass_rate == pytest.approx(0.95)
    assert not keep(_grade(f2p=1, p2p=94, errors=6))
    with pytest.raises(ValueError, match="threshold"):
        keep(g, threshold=95)


def _instance(**sets: list[str]) -> Instance:
    return Instance(repo="o/r", instance_id="o__r-1", base_commit="abc", patch="", test_patch="",
                    problem_statement="p", created_at="2023-01-01T00:00:00Z", **sets)


def test_keep_and_rate_of_an_instance_record():
    inst = _instance(FAIL_TO_PASS=["a"], PASS_TO_PASS=[f"p{i}" for i in range(18)], PASS_TO_FAIL=["c"])
    assert pass_rate(inst) == pytest.approx(19 / 20)
    assert keep(inst)
    assert not keep(_instance(PASS_TO_PASS=["b"]))
    assert pass_rate(_instance()) is None and not keep(_instance(FAIL_TO_PASS=[]))


def test_with_grade_fills_the_record():
    inst = with_grade(_instance(), grade(BEFORE, AFTER))
    assert (inst.FAIL_TO_PASS, inst.PASS_TO_PASS, inst.PASS_TO_FAIL, inst.FAIL_TO_FAIL) == \
        (["a", "e", "new"], ["b"], ["c"], ["d"])
    assert pass_rate(inst) == pytest.approx(4 / 6)


# pre-fix and post-fix runs of the same test file (test_patch applied both times)
LOG_BEFORE = """\
=========================== short test summary info ============================
PASSED tests/test_calc.py::test_add
PASSED tests/test_calc.py::test_sub
FAILED tests/test_calc.py::test_div_zero - ZeroDivisionError: division by zero
ERROR tests/test_calc.py::test_div_fixture - ZeroDivisionError
PASSED tests/test_calc.py::test_round
FAILED tests/test_calc.py::test_flaky - assert 0
"""
LOG_AFTER = """\
=========================== short test summary info ============================
PASSED tests/test_calc.py::test_add
PASSED tests/test_calc.py::test_sub
PASSED tests/test_calc.py::test_div_zero
PASSED tests/test_calc.py::test_div_fixture
PASSED tests/test_calc.py::test_div_new
XFAIL tests/test_calc.py::test_known - not yet
FAILED tests/test_calc.py::test_round - assert 1.0 == 1
FAILED tests/test_calc.py::test_flaky - assert 0
"""


def test_parsed_logs_end_to_end():
    g = grade(parse_pytest(LOG_BEFORE), parse_pytest(LOG_AFTER))
    t = "tests/test_calc.py::"
    assert g.FAIL_TO_PASS == [t + "test_div_zero", t + "test_div_fixture", t + "test_div_new"]
    assert g.PASS_TO_PASS == [t + "test_add", t + "test_sub"]
    assert g.PASS_TO_FAIL == [t + "test_round"]
    assert g.FAIL_TO_FAIL == [t + "test_flaky"]
    assert g.pass_rate == pytest.approx(6 / 8)


def test_swebench_harness_accepts_the_derived_sets(swebench_ref):
    sb = swebench_ref
    for before, after in ((BEFORE, AFTER), (parse_pytest(LOG_BEFORE), parse_pytest(LOG_AFTER))):
        g = grade(before, after)
        gold = {"FAIL_TO_PASS": g.FAIL_TO_PASS, "PASS_TO_PASS": g.PASS_TO_PASS,
                "FAIL_TO_FAIL": g.FAIL_TO_FAIL, "PASS_TO_FAIL": g.PASS_TO_FAIL}
        # the gold patch's own run resolves the instance fully ...
        report = sb.get_eval_tests_report(dict(after), gold, calculate_to_fail=True)
        assert report["FAIL_TO_PASS"] == {"success": g.FAIL_TO_PASS, "failure": []}
        assert report["PASS_TO_PASS"] == {"success": g.PASS_TO_PASS, "failure": []}
        assert report["FAIL_TO_FAIL"]["failure"] == g.FAIL_TO_FAIL
        assert sb.get_resolution_status(report) == sb.ResolvedStatus.FULL.value
        # ... and the unfixed code resolves nothing: every FAIL_TO_PASS test fails there
        report = sb.get_eval_tests_report(dict(before), gold)
        assert report["FAIL_TO_PASS"] == {"success": [], "failure": g.FAIL_TO_PASS}
        assert sb.get_resolution_status(report) == sb.ResolvedStatus.NO.value
        # swebench's current helpers agree test by test
        for t in g.FAIL_TO_PASS:
            assert sb.test_failed(t, before) and sb.test_passed(t, after)
        for t in g.PASS_TO_PASS:
            assert sb.test_passed(t, before) and sb.test_passed(t, after)
        for t in g.PASS_TO_FAIL:
            assert sb.test_passed(t, before) and sb.test_failed(t, after)
