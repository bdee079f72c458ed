"""Per-test statuses from test-runner logs: pytest, unittest/django, nose, and tox around any of them.

SetUpAgent (Vergopoulos, Müller, Vechev, "Automated Benchmark Generation for Repository-Level Coding
Tasks", ICML 2025, arXiv 2503.07701) forces per-test verbose output from whatever runner a
repository uses and parses the log into ``{test name: status}``; the runs before and after the fix
then give FAIL_TO_PASS and the other sets (:mod:`.grade`). No code was released.

The statuses are SWE-bench's ``TestStatus`` values (``swebench.harness.constants``, checked in
swebench 5.0.2): ``PASSED``, ``FAILED``, ``SKIPPED``, ``ERROR``, ``XFAIL``. Maps hold the plain
strings, as SWE-bench's parsers return them.

Library checked for an existing implementation: ``swebench`` (5.0.2,
``swebench/harness/log_parsers/python.py``). Its parsers are per repository (django, sympy,
matplotlib, ...), are reached only through ``swebench.harness``, whose ``__init__`` imports docker
(so ``import swebench.harness.log_parsers`` fails without docker-py, and the package's
``javascript`` parsers need ``unidiff``), and have no tox or nose parser. The
parsers here are written for this package; on ordinary logs they give the same maps as swebench's
``parse_log_pytest`` and ``parse_log_django`` (tests/methods/setupagent/test_parsers.py checks this
on the same logs), and the differences below are deliberate:

* pytest: ANSI colour codes are removed first; a test id with spaces (a parametrized id such as
  ``test_p[a b]``) is kept whole instead of being cut at the first space; xdist's
  ``[gw0] [ 50%] PASSED path::test`` lines are read; a log whose summary lists no passes (no
  ``-rA``) is read from its verbose lines (``path::test PASSED [ 50%]``) too, instead of giving
  the failures only.
* unittest/django: ``expected failure`` is XFAIL and ``unexpected success`` is FAILED (unittest's
  own verdicts); swebench's django parser drops both. The ``FAIL: name`` / ``ERROR: name`` headers
  of the failure section mark the full name (``test_x (module.Class)``) and only when the verbose
  line gave it no status; swebench's parser stores their first word (``test_x``) as an extra key.
* tox: tox's own lines (``py311: commands[0]> ...``, ``ERROR: InvocationError ...``, the summary)
  are removed before the inner runner's parser reads the rest; swebench's pytest parser, given a
  tox 3 log, records ``InvocationError`` as a test.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from enum import Enum


class TestStatus(str, Enum):
    """SWE-bench's test statuses (``swebench.harness.constants.TestStatus``)."""

    __test__ = False  # not a pytest test class despite the name

    PASSED = "PASSED"
    FAILED = "FAILED"
    SKIPPED = "SKIPPED"
    ERROR = "ERROR"
    XFAIL = "XFAIL"


PASSED, FAILED, SKIPPED, ERROR, XFAIL = (s.value for s in TestStatus)
STATUSES = frozenset(s.value for s in TestStatus)

_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")


def strip_ansi(text: str) -> str:
    """``text`` without ANSI escape sequences (colour codes)."""
    return _ANSI.sub("", text)


# ----------------------------------------------------------------------------------------- pytest

# NOTE: pytest's XPASS (an xfail-marked test that passed, non-strict) has no SWE-bench status;
# swebench ignores those lines, so the test is missing from the map and grades as failed. The same
# is done here (a strict xfail that passes is reported by pytest as FAILED and parsed as such).
_PYTEST_WORDS = "|".join(sorted(STATUSES))
_PYTEST_SUMMARY = re.compile(rf"^({_PYTEST_WORDS})\s+(\S.*)$")
_PYTEST_VERBOSE = re.compile(
    rf"^(?P<name>\S+::\S.*?)\s+(?P<status>{_PYTEST_WORDS})(?:\s+\(.*\))?(?:\s+\[\s*\d+%\])?\s*$")
_XDIST_PREFIX = re.compile(r"^\[gw\d+\]\s+(?:\[\s*\d+%\]\s+)?")
_SKIP_COUNT = re.compile(r"^\[\d+\]")


def _cut_reason(rest: str) -> str:
    """The test id at the start of a summary line's remainder: up to the first `` - `` that is not
    inside the brackets of a parametrized id (pytest separates the message with `` - ``)."""
    depth = 0
    for i, ch in enumerate(rest):
        if ch == "[":
            depth += 1
        elif ch == "]":
            depth = max(0, depth - 1)
        elif depth == 0 and rest.startswith(" - ", i):
            return rest[:i].strip()
    return rest.strip()


def parse_pytest(log: str) -> dict[str, str]:
    """``{test id: status}`` from a pytest log.

    The short test summary (``PASSED path::test``, ``FAILED path::test - message``, ...) is read
    as swebench reads it; a test listed twice keeps its last status (teardown ``ERROR`` after
    ``PASSED``). When the summary lists passes (``-rA``, ``-rp``) it is the whole answer;
    otherwise (pytest's default ``-rfE`` lists only failures and errors) the verbose lines
    (``path::test PASSED [ 50%]``) are read first and the summary overrides them.

    NOTE: with ``-rA`` the verbose lines are not read because they would add what swebench never
    sees: the ids of skipped tests (the summary shows skips only as ``SKIPPED [N] path:line:
    reason``). A skipped test is then missing, as in swebench, and grades the same way.
    """
    summary: dict[str, str] = {}
    verbose: dict[str, str] = {}
    for raw in strip_ansi(log).splitlines():
        line = _XDIST_PREFIX.sub("", raw.rstrip())
        m = _PYTEST_SUMMARY.match(line)
        if m:
            status, rest = m.groups()
            if status == SKIPPED and _SKIP_COUNT.match(rest):
                continue  # "SKIPPED [2] path:line: reason" counts skips, it names no test
            name = _cut_reason(rest)
            if name:
                summary[name] = status
            continue
        m = _PYTEST_VERBOSE.match(line)
        if m:
            verbose[m["name"]] = m["status"]
    if PASSED in summary.values():
        return summary
    verbose.update(summary)
    return verbose


# -------------------------------------------------------------------------------- unittest/django

# unittest's verbose verdicts (TextTestResult), in the order they are tried.
_UNITTEST_WORDS: tuple[tuple[str, str], ...] = (
    ("ok", PASSED), ("FAIL", FAILED), ("ERROR", ERROR),
    ("expected failure", XFAIL), ("unexpected success", FAILED),
)
# Django's runner also writes "... OK" / "...  OK" on the test's own line; a bare "OK" line is
# unittest's closing summary, never a verdict for a pending test.
_SAME_LINE_ONLY = (("OK", PASSED),)
_UNITTEST_END = re.compile(r"^(?:=+|-+|Ran \d+ tests? in .*)$")
_UNITTEST_SKIP = re.compile(r"^skipped\b")
_UNITTEST_HEADER = re.compile(r"^(FAIL|ERROR|UNEXPECTED SUCCESS):\s+(\S.*)$")


def _unittest_verdict(text: str, same_line: bool = False) -> str | None:
    text = text.strip()
    for word, status in _UNITTEST_WORDS + (_SAME_LINE_ONLY if same_line else ()):
        if text == word:
            return status
    if _UNITTEST_SKIP.match(text):
        return SKIPPED
    return None


def parse_unittest(log: str) -> dict[str, str]:
    """``{test name: status}`` from unittest ``-v`` output (also Django's ``runtests.py -v 2`` and
    nose ``-v``, which print the same ``name ... verdict`` lines).

    The name is everything before `` ... ``, e.g. ``test_x (pkg.tests.Case)`` (Python 3.11+ prints
    ``test_x (pkg.tests.Case.test_x)``), or the first docstring line when the test has one, as in
    SWE-bench's Django instances. A verdict on a later line (the test printed something after
    `` ... ``) belongs to the last test still waiting for one.
    """
    statuses: dict[str, str] = {}
    pending: str | None = None
    for raw in strip_ansi(log).splitlines():
        line = raw.strip()
        if not line:
            continue
        if " ... " in line:
            name, _, tail = line.partition(" ... ")
            # NOTE: not stripped on the right: a docstring description can end in a space, and
            # swebench's parser (the harness that grades exported instances) keeps it; found on
            # idna 3.10's IdnaTestV2 tests in the real-world run.
            verdict = _unittest_verdict(tail, same_line=True)
            if verdict is None:
                pending = name  # the verdict follows on a later line
            else:
                statuses[name] = verdict
                pending = None
            continue
        if _UNITTEST_END.match(line):
            pending = None  # the failure details or the closing summary start here
            continue
        if pending is not None:
            verdict = _unittest_verdict(line)
            if verdict is not None:
                statuses[pending] = verdict
                pending = None
                continue
        m = _UNITTEST_HEADER.match(line)
        if m:
            kind, name = m.groups()
            name = name.strip()
            if name not in statuses:  # the verbose line, when there was one, already said it
                statuses[name] = ERROR if kind == "ERROR" else FAILED
    return statuses


def parse_nose(log: str) -> dict[str, str]:
    """``{test name: status}`` from ``nosetests -v`` / ``nose2 -v`` output.

    nose prints unittest's ``name ... verdict`` lines, with ``module.test_function`` (or
    ``module.test_gen(args,)``) names for plain functions; :func:`parse_unittest` reads them.
    """
    return parse_unittest(log)


# ------------------------------------------------------------------------------------------- tox

# tox 3: "py311 run-test: commands[0] | pytest -rA"; tox 4: "py311: commands[0]> pytest -rA" (with a
# changed directory, "py311: commands[0] tests> pytest").
_TOX_COMMAND = re.compile(
    r"^\s*(?P<env>[\w.\-]+)(?: run-test)?:\s+commands\[\d+\](?:\s+\S+)?(?:>| \|)\s*(?P<cmd>.*)$")
_TOX_LINES = (
    # tox 4 step echoes: "py311: install_deps> ...", ".pkg: build_wheel> ...", "py311: freeze> ..."
    re.compile(r"^\s*[\w.\-]+:\s+[\w\-]+(?:\[\d+\])?(?:\s+\S+)?>\s"),
    # tox 4 exit and result lines: "py311: exit 1 (0.5 seconds) ...", "  py311: OK (1.2 seconds)"
    re.compile(r"^\s*[\w.\-]+:\s+(?:OK|FAIL|SKIP|exit -?\d+)\b"),
    # tox 3 steps: "py311 create: ...", "py311 installdeps: ...", "py311 installed: a==1,b==2"
    re.compile(r"^\s*[\w.\-]+ (?:create|recreate|installdeps|installed|inst|inst-nodeps|develop-inst|"
               r"develop-inst-nodeps|sdist-make|run-test-pre|run-test|finish|start|reusing):\s"),
    # tox's error and summary lines
    re.compile(r"^\s*(?:ERROR|WARNING):\s+(?:InvocationError|invocation failed|"
               r"[\w.\-]+: (?:commands failed|InterpreterNotFound))"),
    re.compile(r"^\s*(?:congratulations :\)|evaluation failed :\(|_+ summary _+\s*$)"),
    re.compile(r"^\s*[\w.\-]+: (?:commands succeeded|commands failed)\s*$"),
)


def _is_tox_line(line: str) -> bool:
    # a unittest/nose verbose line ("name ... ok") is never tox's, whatever its name looks like
    return " ... " not in line and any(p.match(line) for p in _TOX_LINES)


def runner_of(command: str) -> str | None:
    """The framework a tox command runs, from its command line; None if it does not say."""
    cmd = command.lower()
    if re.search(r"\b(py\.test|pytest)\b", cmd):
        return "pytest"
    if re.search(r"\b(nosetests|nose2|nose)\b", cmd):
        return "nose"
    if re.search(r"\bunittest\b|manage\.py\s+test\b|runtests\.py\b|\bdjango-admin\s+test\b", cmd):
        return "unittest"
    return None


_PYTEST_SESSION = re.compile(r"^=+ test session starts", re.MULTILINE)


def _guess_runner(text: str) -> str:
    """pytest when the text shows a pytest session or pytest test ids (``path::name``), else
    unittest (whose ``FAILED (failures=1)`` line alone must not pass for pytest output)."""
    if _PYTEST_SESSION.search(text) or any("::" in name for name in parse_pytest(text)):
        return "pytest"
    return "unittest"


# NOTE: tox may run one suite in several environments (py310, py311, ...). The paper does not
# say how such a log is graded; here each environment's block is parsed on its own and a test's
# statuses are merged worst-first (FAILED > ERROR > PASSED > XFAIL > SKIPPED), so a test that
# fails in any environment counts as failed there.
_MERGE_RANK = {SKIPPED: 0, XFAIL: 1, PASSED: 2, ERROR: 3, FAILED: 4}


def parse_tox(log: str, inner: str | None = None) -> dict[str, str]:
    """``{test name: status}`` from a tox log: tox's own lines dropped, the rest read by the inner
    runner's parser.

    Args:
        log: the tox output.
        inner: ``pytest``, ``unittest``, ``django`` or ``nose``; None: read from each block's
            ``commands[N]`` line, else guessed from the output (pytest result lines or not).
    """
    blocks: list[tuple[str | None, list[str]]] = [(None, [])]
    for raw in strip_ansi(log).splitlines():
        m = _TOX_COMMAND.match(raw)
        if m:
            blocks.append((runner_of(m["cmd"]), []))
            continue
        if _is_tox_line(raw):
            continue
        blocks[-1][1].append(raw)
    merged: dict[str, str] = {}
    for runner, lines in blocks:
        text = "\n".join(lines)
        if not text.strip():
            continue
        name = inner or runner or _guess_runner(text)
        for test, status in PARSERS[name](text).items():
            old = merged.get(test)
            if old is None or _MERGE_RANK[status] > _MERGE_RANK[old]:
                merged[test] = status
    return merged


PARSERS: dict[str, Callable[[str], dict[str, str]]] = {
    "pytest": parse_pytest,
    "unittest": parse_unittest,
    "django": parse_unittest,
    "nose": parse_nose,
    "tox": parse_tox,
}


def parse_log(log: str, framework: str) -> dict[str, str]:
    """``{test name: status}`` from ``log`` with the parser of ``framework`` (a key of
    :data:`PARSERS`); an unknown framework is a ValueError naming the known ones."""
    try:
        parser = PARSERS[framework]
    except KeyError:
        raise ValueError(f"unknown test framework {framework!r}; known: {', '.join(PARSERS)}") from None
    return parser(log)
