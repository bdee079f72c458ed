"""Candidate task instances from a local git repository's history.

SetUpAgent (Vergopoulos, Müller, Vechev, ICML 2025, arXiv 2503.07701, §3) starts, as SWE-bench does,
from merged pull requests that resolve an issue and change both tests and code; each change's diff
is split into the gold ``patch`` (code) and the ``test_patch`` (tests). Here the source is a local
clone instead of the GitHub API: every commit of the first-parent history (a merge commit there is
a merged pull request; a plain commit is a change pushed or squash-merged to the main line) is a
candidate when its message links an issue and its diff against its first parent touches both test
and non-test files. No code was released.

Library checked: ``swebench`` (5.0.2, ``swebench/collect``). It reaches pull requests through the
GitHub API (ghapi, requests) and splits their diffs with unidiff; nothing there reads a local
repository. GitPython is not installed here (and swebench's use of it needs a network remote), so
git is run directly with ``subprocess`` and a fixed argument list (never a shell). What is followed
from swebench's collection code (``swebench/collect/utils.py``), re-written here:

* issue links: ``KEYWORD #N`` with SWE-bench's GitHub keywords (close, closes, closed, fix, fixes,
  fixed, resolve, resolves, resolved; any case), HTML comments removed first
  (``extract_resolved_issues``);
* the test-file rule (``extract_patches``), see :func:`is_test_path`;
* the problem statement: ``"{title}\\n{body}\\n"`` of each resolved issue, concatenated
  (``extract_problem_statement_and_hints``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from lmforge.common.errors import UserError
from lmforge.methods.setupagent.schema import Instance

# https://docs.github.com/en/issues/tracking-your-work-with-issues/using-issues/linking-a-pull-request-to-an-issue
ISSUE_KEYWORDS = frozenset({"close", "closes", "closed", "fix", "fixes", "fixed", "resolve", "resolves", "resolved"})
# NOTE: as swebench's pattern, "KEYWORD #N" only: no "KEYWORD: #N", no "owner/repo#N" and no issue
# URL (swebench accepts the URL only when it knows the remote's clone URL, which a local clone
# need not have).
_ISSUE_REF = re.compile(r"(\w+)\s+#(\d+)")
_HTML_COMMENT = re.compile(r"(?s)<!--.*?-->")

# NOTE (confirmed in swebench 5.0.2, swebench/collect/utils.py, extract_patches): SWE-bench puts a
# file in test_patch when any of "test", "tests", "e2e", "testing" is a *substring* of its path
# (case-sensitive), e.g. also src/pytest_plugin.py or src/attestation.py, but not Tests/x.py. The
# rule the brief assumed (a test/tests/testing directory, a test_*.py or *_test.py name) is not
# SWE-bench's; it is offered as ``test_rule="components"`` (plus conftest.py), the default is
# SWE-bench's own.
SWEBENCH_TEST_WORDS = ("test", "tests", "e2e", "testing")
_TEST_DIRS = frozenset({"test", "tests", "testing"})
TEST_RULES = ("swebench", "components")


def is_test_path(path: str, rule: str = "swebench") -> bool:
    """Whether a repository path is a test file.

    Args:
        path: a path as git prints it (``/``-separated, relative to the root).
        rule: ``swebench``: SWE-bench's rule, a substring of the path (see the NOTE above);
            ``components``: a ``test``/``tests``/``testing`` directory component, or a file name
            ``test_*``, ``*_test.py`` or ``conftest.py`` (any case).
    """
    if rule == "swebench":
        return any(word in path for word in SWEBENCH_TEST_WORDS)
    if rule == "components":
        *dirs, name = path.lower().split("/")
        return (any(d in _TEST_DIRS for d in dirs) or name.startswith("test_") or name.endswith("_test.py")
                or name == "conftest.py")
    raise ValueError(f"unknown test rule {rule!r}; known: {', '.join(TEST_RULES)}")


def linked_issues(text: str) -> list[int]:
    """Issue numbers that ``text`` says it resolves (``fixes #12``, ``Closes #3``, ...), in order of
    first mention, without repeats."""
    out: list[int] = []
    for word, number in _ISSUE_REF.findall(_HTML_COMMENT.sub("", text)):
        if word.lower() in ISSUE_KEYWORDS and int(number) not in out:
            out.append(int(number))
    return out


def load_issues(source: str | Path | Mapping[Any, Any]) -> dict[int, dict[str, str]]:
    """An issue map ``{number: {"title": ..., "body": ...}}`` from a dict or an ``issues.json`` file
    (keys may be numbers or digit strings; a missing or null title/body is empty). A bad file or
    entry is a one-line :class:`UserError`."""
    where = "issue map"
    if isinstance(source, (str, Path)):
        where = str(source)
        try:
            source = json.loads(Path(source).read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise UserError(f"issues file '{where}' does not exist") from None
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise UserError(f"issues file '{where}' is not readable JSON: {exc}") from None
    if not isinstance(source, Mapping):
        raise UserError(f"{where}: expected a JSON object {{number: {{title, body}}}}")
    issues: dict[int, dict[str, str]] = {}
    for key, entry in source.items():
        if not str(key).isdigit():
            raise UserError(f"{where}: key {key!r} is not an issue number")
        if not isinstance(entry, Mapping):
            raise UserError(f"{where}: issue {key} must be an object with 'title' and 'body'")
        title, body = entry.get("title") or "", entry.get("body") or ""
        if not isinstance(title, str) or not isinstance(body, str):
            raise UserError(f"{where}: issue {key}: 'title' and 'body' must be strings")
        issues[int(key)] = {"title": title, "body": body}
    return issues


@dataclass
class Candidate:
    """A mined change that may become a task instance.

    Attributes:
        commit: the change's commit (a merge commit for a merged branch).
        issues: the issue numbers its message(s) link.
        code_files: the non-test paths it changes (in ``patch``).
        test_files: the test paths it changes (in ``test_patch``).
        instance: the record, with empty test lists until the runs are graded (:mod:`.grade`).
    """

    commit: str
    issues: list[int]
    code_files: list[str]
    test_files: list[str]
    instance: Instance


@dataclass
class MineResult:
    """Candidates, newest first, and the first-parent commits passed over, with the reason."""

    candidates: list[Candidate] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)


def _git_env() -> dict[str, str]:
    env = dict(os.environ)
    env.update(LC_ALL="C", GIT_TERMINAL_PROMPT="0", GIT_PAGER="cat", GIT_OPTIONAL_LOCKS="0")
    return env


# Settings that would change what git prints, pinned whatever the user's configuration says; and
# the ones that would make git run a command the repository's own configuration names (fsmonitor,
# hooks; external diff and textconv are off per command).
# NOTE: safe.directory=* lets root (the sandbox needs root) read a clone owned by another user, which
# git otherwise refuses as "dubious ownership" (and which surfaced as "not a git repository"); the
# ownership check guards against such configured commands, which these settings switch off.
GIT_SAFETY = ("-c", "safe.directory=*", "-c", "core.fsmonitor=false", "-c", "core.hooksPath=/dev/null")
_GIT_CONFIG = ("-c", "core.quotepath=off", "-c", "log.showSignature=false", "-c", "diff.noprefix=false",
               "-c", "diff.mnemonicPrefix=false", "-c", "diff.relative=false", "-c", "i18n.logOutputEncoding=UTF-8",
               *GIT_SAFETY)


def _git(root: Path, *args: str) -> bytes:
    try:
        proc = subprocess.run(["git", *_GIT_CONFIG, "-C", str(root), *args], capture_output=True,
                              env=_git_env(), check=False)
    except FileNotFoundError:
        raise UserError("git is not installed (needed to mine a repository's history)") from None
    if proc.returncode != 0:
        err = proc.stderr.decode("utf-8", "replace").strip().splitlines()
        raise RuntimeError(f"git {args[0]} failed in '{root}': {err[-1] if err else proc.returncode}")
    return proc.stdout


def repo_root(path: str | Path) -> Path:
    """The top folder of the git work tree at ``path``; a one-line :class:`UserError` when ``path``
    is missing, not a git repository, or has no commits."""
    p = Path(path)
    if not p.is_dir():
        raise UserError(f"'{p}' is not a folder")
    try:
        top = _git(p, "rev-parse", "--show-toplevel").decode("utf-8", "surrogateescape").strip()
    except RuntimeError:
        raise UserError(f"'{p}' is not a git repository") from None
    root = Path(top)
    try:
        _git(root, "rev-parse", "--verify", "--quiet", "HEAD^{commit}")
    except RuntimeError:
        raise UserError(f"git repository '{root}' has no commits") from None
    return root


def _iso_utc(epoch: str) -> str:
    return datetime.fromtimestamp(int(epoch), tz=timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _message_body(message: str) -> str:
    """The commit message without its subject line; the subject when there is no body."""
    subject, _, body = message.strip().partition("\n")
    return body.strip() or subject.strip()


def _diff(root: Path, base: str, commit: str, paths: Sequence[str]) -> str:
    # --no-renames: a rename is a delete plus an add, so every entry has one path to classify;
    # --binary: binary changes as "GIT binary patch" blocks, so `git apply` can replay them.
    # NOTE: SWE-bench's patches come from GitHub's .diff (renames detected, binary content omitted);
    # these are complete instead, which `git apply` needs to rebuild the commit's tree.
    out = _git(root, "diff", "--no-color", "--no-ext-diff", "--no-textconv", "--no-renames", "--binary",
               "-U3", "--src-prefix=a/", "--dst-prefix=b/", base, commit, "--",
               *(f":(literal){p}" for p in paths))
    return out.decode("utf-8")  # strict: a patch that is not UTF-8 cannot go in a JSONL record as is


def mine(path: str | Path, *, repo: str | None = None, issues: str | Path | Mapping[Any, Any] | None = None,
         rev: str = "HEAD", test_rule: str = "swebench", max_commits: int | None = None) -> MineResult:
    """Mine the first-parent history of ``rev`` for candidate instances.

    Args:
        path: a folder inside a git work tree (the history is read, never changed).
        repo: the ``repo`` field (and instance-id prefix); default: the work tree's folder name.
        issues: an issue map or ``issues.json`` path (:func:`load_issues`) for the problem
            statements; None: the commit messages stand in.
        rev: the branch or commit whose first-parent history is read.
        test_rule: :func:`is_test_path`'s rule.
        max_commits: read at most this many first-parent commits (newest first); None: all.

    Returns:
        the candidates (newest first) and the commits passed over, each with its reason: ``root
        commit``, ``no issue link``, ``no test files changed``, ``no code files changed``,
        ``patch is not UTF-8``.
    """
    if test_rule not in TEST_RULES:
        raise UserError(f"unknown test rule '{test_rule}'; known: {', '.join(TEST_RULES)}")
    if rev.startswith("-"):  # would reach git as an option
        raise UserError(f"'{rev}' is not a revision")
    if max_commits is not None and max_commits < 1:
        raise UserError(f"max_commits must be at least 1, got {max_commits}")
    root = repo_root(path)
    name = repo or root.name
    issue_map = load_issues(issues) if issues is not None else None
    try:
        _git(root, "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}")
    except RuntimeError:
        raise UserError(f"'{rev}' is not a commit of '{root}'") from None

    log_args = ["log", "--first-parent", "-z", "--format=%H%x1f%P%x1f%ct%x1f%B"]
    if max_commits is not None:
        log_args.append(f"--max-count={int(max_commits)}")
    records = _git(root, *log_args, rev, "--").decode("utf-8", "replace").split("\0")

    result = MineResult()
    for record in records:
        if not record.strip():
            continue
        sha, parents, epoch, message = record.lstrip("\n").split("\x1f", 3)
        parent_list = parents.split()
        if not parent_list:
            result.skipped.append((sha, "root commit"))
            continue
        base = parent_list[0]
        fallback = _message_body(message)
        text = message
        if len(parent_list) > 1:
            # a merged branch: its commits' messages count too (swebench reads the PR's commits)
            merged = [m.strip() for m in _git(root, "log", "-z", "--no-merges", "--format=%B", sha, f"^{base}", "--")
                      .decode("utf-8", "replace").split("\0") if m.strip()]
            text = "\n\n".join([message, *merged])
            if merged:
                fallback = "\n\n".join(reversed(merged))  # oldest first
        numbers = linked_issues(text)
        if not numbers:
            result.skipped.append((sha, "no issue link"))
            continue
        changed = [p for p in _git(root, "diff", "--name-only", "-z", "--no-renames", base, sha, "--")
                   .decode("utf-8", "surrogateescape").split("\0") if p]
        tests = [p for p in changed if is_test_path(p, test_rule)]
        code = [p for p in changed if not is_test_path(p, test_rule)]
        if not tests:
            result.skipped.append((sha, "no test files changed"))
            continue
        if not code:
            result.skipped.append((sha, "no code files changed"))
            continue
        try:
            patch, test_patch = _diff(root, base, sha, code), _diff(root, base, sha, tests)
        except UnicodeDecodeError:
            result.skipped.append((sha, "patch is not UTF-8"))
            continue
        # NOTE: problem_statement is SWE-bench's "{title}\n{body}\n" per linked issue found in the
        # issue map (in order of first mention; swebench's order is a set's); with no map, or none of
        # the linked issues in it, the commit message body stands in (the subject when the message
        # has no body), and for a merge the merged commits' whole messages, oldest first: a local
        # clone carries no issues.
        statement = ""
        if issue_map is not None:
            statement = "".join(f"{issue_map[n]['title']}\n{issue_map[n]['body']}\n" for n in numbers if n in issue_map)
        if not statement:
            statement = fallback
        # NOTE: SWE-bench's ids end in the pull-request number; a local history has none, and one
        # issue may be fixed by several commits, so the id ends in the commit's first 12 hex digits.
        # created_at is the committer date (for a merge: when it was merged), in UTC.
        instance = Instance(
            repo=name, instance_id=f"{name.replace('/', '__')}-{sha[:12]}", base_commit=base, patch=patch,
            test_patch=test_patch, problem_statement=statement, created_at=_iso_utc(epoch))
        result.candidates.append(Candidate(sha, numbers, code, tests, instance))
    return result
