"""Candidate mining on a scripted git repository: which commits become candidates, the patch /
test_patch split (each applies to the parent, and together they rebuild the commit's tree), dates,
base commits, problem statements, and the bad inputs."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from lmforge.common.errors import UserError
from lmforge.methods.setupagent.mine import is_test_path, linked_issues, load_issues, mine

GIT_ENV = {
    # no user or system configuration, and a fixed identity: through the environment only
    "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "Ada", "GIT_AUTHOR_EMAIL": "ada@example.com",
    "GIT_COMMITTER_NAME": "Ada", "GIT_COMMITTER_EMAIL": "ada@example.com",
}


def git(repo: Path, *args: str, date: str = "2023-01-01T00:00:00+00:00", stdin: bytes | None = None) -> str:
    env = {**os.environ, **GIT_ENV, "GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
    proc = subprocess.run(["git", "-C", str(repo), *args], env=env, input=stdin, capture_output=True, check=False)
    assert proc.returncode == 0, proc.stderr.decode()
    return proc.stdout.decode()


def write(repo: Path, files: dict[str, str | bytes]) -> None:
    for rel, content in files.items():
        path = repo / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(content, bytes):
            path.write_bytes(content)
        else:
            path.write_text(content)


def commit(repo: Path, message: str, date: str, files: dict[str, str | bytes]) -> str:
    write(repo, files)
    git(repo, "add", "-A", date=date)
    git(repo, "commit", "-q", "-m", message, date=date)
    return git(repo, "rev-parse", "HEAD").strip()


OPS_V0 = "def div(a, b):\n    return a / b\n\n\ndef mul(a, b):\n    return a * b\n"
OPS_V1 = ("def div(a, b):\n    if b == 0:\n        return 0.0\n    return a / b\n\n\n"
          "def mul(a, b):\n    return a * b\n")
TEST_V0 = "from calc.ops import div\n\n\ndef test_div():\n    assert div(4, 2) == 2\n"
TEST_V1 = TEST_V0 + "\n\ndef test_div_zero():\n    assert div(1, 0) == 0.0\n"


@pytest.fixture(scope="module")
def history(tmp_path_factory):
    """A repository with a linked fix, an unlinked change, a linked docs-only change, a merged
    branch whose commit links an issue, and a linked tests-only change; returns (path, shas)."""
    repo = tmp_path_factory.mktemp("calc")
    git(repo, "init", "-q", "-b", "main")
    c = {}
    c["root"] = commit(repo, "Initial import", "2023-01-01T10:00:00+00:00", {
        "src/calc/__init__.py": "", "src/calc/ops.py": OPS_V0, "tests/test_ops.py": TEST_V0,
        "README.md": "# calc\n", "docs/usage.md": "Use div.\n"})
    c["fix"] = commit(repo, "Handle division by zero\n\nThe divide helper crashed on a zero divisor.\n\nFixes #12",
                      "2023-02-01T09:30:00+02:00", {
                          "src/calc/ops.py": OPS_V1, "tests/test_ops.py": TEST_V1,
                          "tests/data/blob.bin": bytes(range(256)) * 2})
    c["unlinked"] = commit(repo, "Refactor mul", "2023-03-01T10:00:00+00:00", {
        "src/calc/ops.py": OPS_V1.replace("a * b", "b * a"), "tests/test_ops.py": TEST_V1 + "\n# mul\n"})
    c["docs"] = commit(repo, "Document division, closes #3", "2023-04-01T10:00:00+00:00", {
        "README.md": "# calc\n\nDivision by zero gives 0.\n", "docs/usage.md": "Use div; div(1, 0) == 0.\n"})
    git(repo, "checkout", "-q", "-b", "fix-7")
    c["branch"] = commit(repo, "Round results\n\nAlso FIXES #7", "2023-04-15T10:00:00+00:00", {
        "src/calc/ops.py": OPS_V1.replace("a * b", "b * a").replace("return a / b", "return round(a / b, 6)"),
        "tests/test_ops.py": TEST_V1 + "\n# mul\n\n\ndef test_round():\n    assert div(1, 3) == 0.333333\n"})
    git(repo, "checkout", "-q", "main")
    merge_date = "2023-05-01T12:00:00-05:00"
    git(repo, "merge", "-q", "--no-ff", "-m", "Merge branch 'fix-7'", "fix-7", date=merge_date)
    c["merge"] = git(repo, "rev-parse", "HEAD").strip()
    c["tests_only"] = commit(repo, "Add regression test, resolves #20", "2023-06-01T10:00:00+00:00", {
        "tests/test_ops.py": TEST_V1 + "\n# regression\n"})
    return repo, c


def _rebuilds(repo: Path, base: str, commit_sha: str, patch: str, test_patch: str, tmp: Path) -> None:
    """Each diff applies to base on its own, and both together give commit_sha's tree exactly."""
    work = tmp / f"check-{commit_sha[:8]}"
    git(tmp, "clone", "-q", str(repo), str(work))
    git(work, "checkout", "-q", "--detach", base)
    for diff in (patch, test_patch):
        git(work, "apply", "--check", "-", stdin=diff.encode())
    git(work, "apply", "--index", "-", stdin=patch.encode())
    git(work, "apply", "--index", "-", stdin=test_patch.encode())
    git(work, "diff", "--cached", "--exit-code", "--quiet", commit_sha)


def test_candidates_and_skips(history):
    repo, c = history
    result = mine(repo, repo="acme/calc")
    assert [cand.commit for cand in result.candidates] == [c["merge"], c["fix"]]  # newest first
    assert result.skipped == [(c["tests_only"], "no code files changed"), (c["docs"], "no test files changed"),
                              (c["unlinked"], "no issue link"), (c["root"], "root commit")]


def test_linked_fix(history, tmp_path):
    repo, c = history
    fix = mine(repo, repo="acme/calc").candidates[1]
    inst = fix.instance
    assert fix.issues == [12]
    assert fix.code_files == ["src/calc/ops.py"]
    assert fix.test_files == ["tests/data/blob.bin", "tests/test_ops.py"]
    assert inst.base_commit == c["root"]
    assert inst.created_at == "2023-02-01T07:30:00Z"  # 09:30 at +02:00
    assert inst.repo == "acme/calc" and inst.instance_id == f"acme__calc-{c['fix'][:12]}"
    assert inst.problem_statement == "The divide helper crashed on a zero divisor.\n\nFixes #12"
    assert inst.patch.startswith("diff --git a/src/calc/ops.py b/src/calc/ops.py\n")
    assert inst.patch.count("diff --git") == 1 and "+    if b == 0:" in inst.patch
    assert inst.test_patch.count("diff --git") == 2 and "GIT binary patch" in inst.test_patch
    assert "+def test_div_zero():" in inst.test_patch and "src/calc" not in inst.test_patch
    assert inst.FAIL_TO_PASS == [] and inst.PASS_TO_PASS == []  # filled by grading later
    _rebuilds(repo, c["root"], c["fix"], inst.patch, inst.test_patch, tmp_path)


def test_merged_branch(history, tmp_path):
    repo, c = history
    merged = mine(repo).candidates[0]
    inst = merged.instance
    assert merged.commit == c["merge"] and merged.issues == [7]  # the link is in the branch's commit
    assert inst.base_commit == c["docs"]  # the first parent: main before the merge
    assert inst.created_at == "2023-05-01T17:00:00Z"  # the merge's date, 12:00 at -05:00
    assert inst.repo == repo.name and inst.instance_id == f"{repo.name}-{c['merge'][:12]}"
    assert inst.problem_statement == "Round results\n\nAlso FIXES #7"
    assert (merged.code_files, merged.test_files) == (["src/calc/ops.py"], ["tests/test_ops.py"])
    _rebuilds(repo, c["docs"], c["merge"], inst.patch, inst.test_patch, tmp_path)


def test_issue_map_gives_the_problem_statement(history, tmp_path):
    repo, c = history
    path = tmp_path / "issues.json"
    path.write_text('{"12": {"title": "ZeroDivisionError in div", "body": "div(1, 0) crashes"}, "99": {}}')
    merged, fix = mine(repo, issues=path).candidates
    assert fix.instance.problem_statement == "ZeroDivisionError in div\ndiv(1, 0) crashes\n"
    assert merged.instance.problem_statement == "Round results\n\nAlso FIXES #7"  # #7 not in the map
    both = mine(repo, issues={7: {"title": "Round", "body": None}, 12: {"title": "Zero", "body": "b"}})
    assert [x.instance.problem_statement for x in both.candidates] == ["Round\n\n", "Zero\nb\n"]


def test_max_commits_and_rev(history):
    repo, c = history
    assert [x.commit for x in mine(repo, max_commits=2).candidates] == [c["merge"]]
    assert [x.commit for x in mine(repo, rev=c["unlinked"]).candidates] == [c["fix"]]


def test_components_rule_changes_the_split(history):
    repo, c = history
    fix = mine(repo, test_rule="components").candidates[1]
    assert fix.test_files == ["tests/data/blob.bin", "tests/test_ops.py"]
    assert is_test_path("src/pytest_plugin.py") and not is_test_path("src/pytest_plugin.py", "components")


@pytest.mark.parametrize(("path", "swebench", "components"), [
    ("tests/test_ops.py", True, True),
    ("src/pkg/testing/helpers.py", True, True),
    ("pkg/test/data.json", True, True),
    ("src/test_utils.py", True, True),
    ("src/pkg/ops_test.py", True, True),
    ("conftest.py", True, True),
    ("src/attestation.py", True, False),   # SWE-bench's substring rule catches "test" anywhere
    ("e2e/run.js", True, False),
    ("Tests/Run.py", False, True),         # ... but case-sensitively
    ("src/pkg/ops.py", False, False),
    ("docs/index.md", False, False),
])
def test_is_test_path(path, swebench, components):
    assert is_test_path(path) is swebench
    assert is_test_path(path, "components") is components


def test_linked_issues():
    text = ("Fixes #12, closes #3 and RESOLVES #7; fixed #12 again.\nprefixes #5 refs #6 fix#8 Close  #9\n"
            "<!-- fixes #100 -->")
    assert linked_issues(text) == [12, 3, 7, 9]
    assert linked_issues("See #4") == []


def test_bad_inputs(tmp_path, history):
    repo, _ = history
    with pytest.raises(UserError, match="is not a folder"):
        mine(tmp_path / "missing")
    plain = tmp_path / "plain"
    plain.mkdir()
    with pytest.raises(UserError, match="is not a git repository"):
        mine(plain)
    empty = tmp_path / "empty"
    empty.mkdir()
    git(empty, "init", "-q")
    with pytest.raises(UserError, match="has no commits"):
        mine(empty)
    with pytest.raises(UserError, match="'nope' is not a commit"):
        mine(repo, rev="nope")
    with pytest.raises(UserError, match="'--output=x' is not a revision"):
        mine(repo, rev="--output=x")
    with pytest.raises(UserError, match="max_commits must be at least 1"):
        mine(repo, max_commits=0)
    with pytest.raises(UserError, match="unknown test rule 'loose'"):
        mine(repo, test_rule="loose")
    with pytest.raises(UserError, match="issues file .* does not exist"):
        mine(repo, issues=tmp_path / "issues.json")
    with pytest.raises(UserError, match="key 'x' is not an issue number"):
        load_issues({"x": {"title": "t"}})
    with pytest.raises(UserError, match="issue 3: 'title' and 'body' must be strings"):
        load_issues({"3": {"title": 5}})


def test_stats_of_mined_patches(history):
    from lmforge.methods.setupagent.stats import DiffStats, diff_stats

    repo, _ = history
    merged, fix = mine(repo).candidates
    # the fix adds the two-line zero check, and two blank lines plus a two-line test beside a binary file
    assert diff_stats(fix.instance.patch) == DiffStats(files=1, hunks=1, added=2, removed=0)
    assert diff_stats(fix.instance.test_patch) == DiffStats(files=2, hunks=1, added=4, removed=0)
    # the merge: "return a / b" -> "return round(a / b, 6)" ("a * b" -> "b * a" was already on main)
    assert diff_stats(merged.instance.patch) == DiffStats(files=1, hunks=1, added=1, removed=1)
