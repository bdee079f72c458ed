"""The repair loop with a stubbed runner: a scripted model that fixes a missing dependency on round
2, one that never fixes it (stops at max_rounds), malformed and repeated replies; every round is
recorded."""

from __future__ import annotations

import json

import pytest

from lmforge.methods.setupagent.extract import LLMExtractor, RuleExtractor, ScriptedLLM, SetupPlan
from lmforge.methods.setupagent.repair import DEFAULT_MAX_ROUNDS, RunOutcome, error_tail, repair_loop

FIRST = SetupPlan(["pip install -e ."], ["pytest -rA"], "pytest", ["rules"])
MISSING = "\n".join(["collecting ...", "", "tests/test_a.py:1: in <module>", "    import toydep",
                     "E   ModuleNotFoundError: No module named 'toydep'", "=== 1 error in 0.1s ==="])


class FakeRunner:
    """Fails with a missing toydep until a plan installs it; records the plans it ran."""

    def __init__(self) -> None:
        self.ran: list[SetupPlan] = []

    def __call__(self, plan: SetupPlan) -> RunOutcome:
        self.ran.append(plan)
        if any("toydep" in c for c in plan.install):
            return RunOutcome(True, "1 passed", None, 0)
        return RunOutcome(False, MISSING, "pytest -rA", 2)


def _reply(install: list[str]) -> str:
    return json.dumps({"install": install, "test_commands": ["pytest -rA"], "test_framework": "pytest"})


def test_scripted_llm_fixes_missing_dependency_on_round_2():
    llm = ScriptedLLM([_reply(["pip install toydep", "pip install -e ."])])
    ex = LLMExtractor(llm)
    runner = FakeRunner()
    result = repair_loop(FIRST, runner, ex)
    assert result.ok and result.repairs == 1
    assert [r.note for r in result.rounds] == ["failed", "ok"]
    assert result.plan is not None and result.plan.install == ["pip install toydep", "pip install -e ."]
    assert runner.ran == [FIRST, result.plan]
    first = result.rounds[0]
    assert first.plan == FIRST and first.outcome is not None and not first.outcome.ok
    assert first.error_tail.splitlines()[0] == "failed: pytest -rA (exit 2)"
    assert "No module named 'toydep'" in first.error_tail
    # the model saw that error tail and the previous plan
    assert first.error_tail in llm.prompts[0] and '"install": ["pip install -e ."]' in llm.prompts[0]
    assert result.rounds[1].error_tail == ""
    rec = result.to_dict()
    assert rec["ok"] and [r["ok"] for r in rec["rounds"]] == [False, True]
    assert json.loads(json.dumps(rec)) == rec


def test_never_fixed_stops_at_max_rounds():
    # a model that keeps proposing different plans that never install toydep
    llm = ScriptedLLM([_reply(["pip install -e .", "pip install six"]), _reply(["pip install ."])])
    ex = LLMExtractor(llm)
    runner = FakeRunner()
    result = repair_loop(FIRST, runner, ex)
    assert not result.ok
    assert len(result.rounds) == DEFAULT_MAX_ROUNDS == 3
    assert len(runner.ran) == 3 and len(llm.prompts) == 2  # no repair asked after the last round
    assert all(r.note == "failed" and r.error_tail for r in result.rounds)
    assert result.plan is not None and result.plan.install == ["pip install ."]


def test_max_rounds_one_runs_once():
    runner = FakeRunner()
    result = repair_loop(FIRST, runner, RuleExtractor(), max_rounds=1)
    assert not result.ok and len(result.rounds) == 1 and len(runner.ran) == 1
    with pytest.raises(ValueError):
        repair_loop(FIRST, runner, RuleExtractor(), max_rounds=0)


def test_malformed_reply_uses_a_round_and_the_next_asks_again():
    llm = ScriptedLLM(["no idea", _reply(["pip install toydep", "pip install -e ."])])
    ex = LLMExtractor(llm)
    runner = FakeRunner()
    result = repair_loop(FIRST, runner, ex)
    assert result.ok
    assert [r.note for r in result.rounds] == ["failed", "repair gave no usable plan", "ok"]
    assert result.rounds[1].plan is None and result.rounds[1].outcome is None
    assert len(runner.ran) == 2 and ex.failures == 1
    assert MISSING.splitlines()[-2] in llm.prompts[1]  # the second ask still carries the first error


def test_repeated_plan_is_not_run_again():
    llm = ScriptedLLM([_reply(["pip install -e ."])] * 2)
    runner = FakeRunner()
    result = repair_loop(FIRST, runner, LLMExtractor(llm))
    assert not result.ok
    assert [r.note for r in result.rounds] == ["failed", "repeated plan, not run again", "repeated plan, not run again"]
    assert runner.ran == [FIRST]


def test_rule_extractor_repairs_without_a_model():
    runner = FakeRunner()
    result = repair_loop(FIRST, runner, RuleExtractor())
    assert result.ok and result.plan is not None
    assert result.plan.install == ["pip install toydep", "pip install -e ."]


def test_error_tail_keeps_last_nonblank_lines():
    out = RunOutcome(False, "a\n\nb\nc\n\nd\n", "pip install x", 1)
    assert error_tail(out, 2) == "failed: pip install x (exit 1)\nc\nd"
    assert error_tail(RunOutcome(False, "a\nb"), 5) == "a\nb"
