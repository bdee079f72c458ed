"""SetUpAgent's repair loop: run a plan, send the error back to the extractor, run its fix.

SetUpAgent (Vergopoulos, Müller, Vechev, ICML 2025, arXiv 2503.07701) executes the install and
test commands the LLM proposed in a clean environment and, when they fail, gives the error output
back to the LLM for corrected commands, a bounded number of times. :func:`repair_loop` is that
loop as pure logic: running a plan is the caller's ``run(plan) -> RunOutcome`` (the sandboxed
runner; a stub in tests), and the fix is the extractor's ``repair(plan, error) -> SetupPlan | None``
(:class:`.extract.LLMExtractor` or the rule-based :class:`.extract.RuleExtractor`). Every round's
plan, outcome and error tail is recorded for the report.

Library checked: no package implements this loop (``swebench`` has fixed per-version specs and no
feedback; SWE-agent/OpenHands loops are whole agents with tools). Written here.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from lmforge.methods.setupagent.extract import SetupPlan

# NOTE: the paper bounds the number of repair iterations but its value is unconfirmed here; 3
# rounds means the first run plus at most two repairs.
DEFAULT_MAX_ROUNDS = 3
# NOTE: how much of a failing log the paper's LLM sees is not stated; the last 40 non-blank lines
# (where pip's and pytest's errors end up) are sent.
DEFAULT_TAIL_LINES = 40


@dataclass
class RunOutcome:
    """What running a plan gave.

    Attributes:
        ok: the plan counts as set up (installs succeeded and the tests ran; the runner decides,
            e.g. at least one test collected and parsed).
        log: the combined output.
        failed_command: the command that failed, if one did.
        returncode: its exit status, if any.
    """

    ok: bool
    log: str = ""
    failed_command: str | None = None
    returncode: int | None = None


class Repairer(Protocol):
    def repair(self, plan: SetupPlan, error: str) -> SetupPlan | None: ...


@dataclass
class Round:
    """One round: the plan run (None when the repair gave no usable plan), its outcome, the error
    tail sent back, and a one-line note."""

    index: int
    plan: SetupPlan | None
    outcome: RunOutcome | None
    error_tail: str = ""
    note: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {"index": self.index, "plan": self.plan.to_dict() if self.plan else None,
                "ok": bool(self.outcome and self.outcome.ok),
                "failed_command": self.outcome.failed_command if self.outcome else None,
                "returncode": self.outcome.returncode if self.outcome else None,
                "error_tail": self.error_tail, "note": self.note}


@dataclass
class RepairResult:
    """The loop's end: ``ok``, the last plan run (the working one when ``ok``), every round."""

    ok: bool
    plan: SetupPlan | None
    rounds: list[Round] = field(default_factory=list)

    @property
    def repairs(self) -> int:
        """Rounds after the first (each asked the extractor for a fix)."""
        return max(0, len(self.rounds) - 1)

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "plan": self.plan.to_dict() if self.plan else None,
                "rounds": [r.to_dict() for r in self.rounds]}


def error_tail(outcome: RunOutcome, lines: int = DEFAULT_TAIL_LINES) -> str:
    """The last ``lines`` non-blank lines of the log, after a ``failed: COMMAND (exit N)`` line."""
    body = [ln for ln in outcome.log.splitlines() if ln.strip()][-lines:] if lines > 0 else []
    head = []
    if outcome.failed_command:
        code = f" (exit {outcome.returncode})" if outcome.returncode is not None else ""
        head.append(f"failed: {outcome.failed_command}{code}")
    return "\n".join(head + body)


def repair_loop(plan: SetupPlan, run: Callable[[SetupPlan], RunOutcome], repairer: Repairer, *,
                max_rounds: int = DEFAULT_MAX_ROUNDS, tail_lines: int = DEFAULT_TAIL_LINES) -> RepairResult:
    """Run ``plan``; while it fails and rounds are left, ask ``repairer`` for a fix and run that.

    A round is one call of ``run``, or one repair that gave no plan (None: a malformed model
    reply, or a rule extractor with nothing to add); such a round is recorded with no outcome and
    the next one asks again from the last plan that ran and its error.

    NOTE: the paper does not say what happens when the model repeats a plan that already failed;
    here it is not run again (the round is recorded as ``repeated plan``), and the loop asks again.
    """
    if max_rounds < 1:
        raise ValueError(f"max_rounds must be at least 1, not {max_rounds}")
    rounds: list[Round] = []
    current = plan
    last_ran: SetupPlan = plan
    last_tail = ""
    tried: list[SetupPlan] = []
    for index in range(1, max_rounds + 1):
        if current is None:
            rounds.append(Round(index, None, None, last_tail, "repair gave no usable plan"))
        elif any(current.install == t.install and current.test_commands == t.test_commands
                 and current.test_framework == t.test_framework for t in tried):
            rounds.append(Round(index, current, None, last_tail, "repeated plan, not run again"))
        else:
            outcome = run(current)
            tried.append(current)
            last_ran = current
            if outcome.ok:
                rounds.append(Round(index, current, outcome, "", "ok"))
                return RepairResult(True, current, rounds)
            last_tail = error_tail(outcome, tail_lines)
            rounds.append(Round(index, current, outcome, last_tail, "failed"))
        if index < max_rounds:
            current = repairer.repair(last_ran, last_tail)
    return RepairResult(False, last_ran, rounds)
