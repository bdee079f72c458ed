"""Patch statistics: hand-counted diffs (lines that look like file headers inside hunks, new and
deleted files, no final newline, binary patches, plain ``diff -u``), cross-checked with unidiff (the
diff parser swebench uses) when it is installed."""

from __future__ import annotations

import pytest

from lmforge.methods.setupagent.schema import Instance
from lmforge.methods.setupagent.stats import DiffStats, diff_stats, instance_stats

# 3 files, 4 hunks, 6 added, 3 removed. The second hunk removes a line whose text is "-- old
# separator" and adds "++ new separator", shown as "--- ..." / "+++ ...": lines, not file headers.
GIT_DIFF = (
    "diff --git a/src/calc/ops.py b/src/calc/ops.py\n"
    "index 1111111..2222222 100644\n"
    "--- a/src/calc/ops.py\n"
    "+++ b/src/calc/ops.py\n"
    "@@ -1,4 +1,6 @@\n"
    " def div(a, b):\n"
    "-    return a / b\n"
    "+    if b == 0:\n"
    "+        return 0.0\n"
    "+    return a / b\n"
    " \n"
    " def mul(a, b):\n"
    "@@ -10,3 +12,3 @@ def mul(a, b):\n"
    " # header\n"
    "--- old separator\n"
    "+++ new separator\n"
    " # end\n"
    "diff --git a/src/calc/new.py b/src/calc/new.py\n"
    "new file mode 100644\n"
    "index 0000000..3333333\n"
    "--- /dev/null\n"
    "+++ b/src/calc/new.py\n"
    "@@ -0,0 +1,2 @@\n"
    "+X = 1\n"
    "+Y = 2\n"
    "\\ No newline at end of file\n"
    "diff --git a/src/calc/old.py b/src/calc/old.py\n"
    "deleted file mode 100644\n"
    "index 4444444..0000000\n"
    "--- a/src/calc/old.py\n"
    "+++ /dev/null\n"
    "@@ -1 +0,0 @@\n"
    "-gone = True\n"
)

BINARY = (
    "diff --git a/tests/data/blob.bin b/tests/data/blob.bin\n"
    "new file mode 100644\n"
    "index 0000000000000000000000000000000000000000..1d9b5b8f1c2b8d2f3a4e5c6b7a8d9e0f1a2b3c4d\n"
    "GIT binary patch\n"
    "literal 12\n"
    "TcmZQzWMXDvWn<^y<YZ<50AT<C\n"
    "\n"
    "literal 0\n"
    "HcmV?d00001\n"
    "\n"
    "diff --git a/tests/test_ops.py b/tests/test_ops.py\n"
    "--- a/tests/test_ops.py\n"
    "+++ b/tests/test_ops.py\n"
    "@@ -5,0 +6,3 @@ def test_div():\n"
    "+\n"
    "+def test_div_zero():\n"
    "+    assert div(1, 0) == 0.0\n"
)

PLAIN = "--- a.py\t2023-01-01\n+++ b.py\t2023-01-02\n@@ -1 +1 @@\n-x\n+y\n"


def test_git_diff_counts():
    s = diff_stats(GIT_DIFF)
    assert s == DiffStats(files=3, hunks=4, added=6, removed=3)
    assert s.lines == 9


def test_binary_and_plain_and_empty():
    assert diff_stats(BINARY) == DiffStats(files=2, hunks=1, added=3, removed=0)
    assert diff_stats(PLAIN) == DiffStats(files=1, hunks=1, added=1, removed=1)
    assert diff_stats("") == DiffStats()


def test_context_line_without_its_space():
    # a blank context line whose single space was stripped by an editor still counts
    assert diff_stats(GIT_DIFF.replace("\n \n", "\n\n")) == DiffStats(3, 4, 6, 3)


def test_malformed_hunks():
    with pytest.raises(ValueError, match="ends inside a hunk"):
        diff_stats(PLAIN.replace("+y\n", ""))
    with pytest.raises(ValueError, match="not a hunk line"):
        diff_stats(PLAIN.replace("@@ -1 +1 @@", "@@ -1,2 +1,2 @@") + "diff --git a/x b/x\n")


def test_instance_stats():
    inst = Instance(repo="o/r", instance_id="o__r-1", base_commit="c", patch=GIT_DIFF, test_patch=BINARY,
                    problem_statement="p", created_at="2023-01-01T00:00:00Z", FAIL_TO_PASS=["a", "b"],
                    PASS_TO_PASS=["c"], FAIL_TO_FAIL=["d"])
    assert instance_stats(inst) == {
        "instance_id": "o__r-1",
        "patch_files": 3, "patch_hunks": 4, "patch_added": 6, "patch_removed": 3, "patch_lines": 9,
        "test_patch_files": 2, "test_patch_hunks": 1, "test_patch_added": 3, "test_patch_removed": 0,
        "test_patch_lines": 3,
        "fail_to_pass": 2, "pass_to_pass": 1, "pass_to_fail": 0, "fail_to_fail": 1,
    }


@pytest.mark.parametrize("diff", [GIT_DIFF, PLAIN, GIT_DIFF.replace("\n \n", "\n\n")])
def test_agrees_with_unidiff(diff):
    unidiff = pytest.importorskip("unidiff")
    ps = unidiff.PatchSet(diff)
    ref = DiffStats(files=len(ps), hunks=sum(len(f) for f in ps), added=ps.added, removed=ps.removed)
    assert diff_stats(diff) == ref
