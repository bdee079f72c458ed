"""``lmforge bench setup`` and ``lmforge bench swe-export`` (SetUpAgent).

End to end (needs lmforge's command sandbox with a network namespace; skipped without): a generated
repository with one issue-linked fix set up against the generated, date-capped local index, the
planted FAIL_TO_PASS / PASS_TO_PASS sets checked (also with swebench's own log parser when it is
installed), the rerun resumed without running anything, the export read back; and a repository
whose new test hangs, killed at ``--timeout`` and reported in one error line.

Without the sandbox: the resume path (a recorded candidate is not run again, and an LLM extractor
is then never loaded), the single error line when no instance is valid, a model that cannot be
made, a foreign output folder; ``swe-export`` on hand-written run records (selection, ``--all``,
duplicates, bad records, ``--stats`` means against a hand count).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from lmforge.methods.setupagent.schema import read_jsonl
from tests.cli.helpers import call, one_error_line

# The brief's list of what swebench's harness reads of an instance (its SWEbenchInstance has more).
HARNESS_KEYS = ("instance_id", "repo", "base_commit", "patch", "test_patch", "FAIL_TO_PASS", "PASS_TO_PASS",
                "created_at", "problem_statement")


def _git(root: Path, *args: str, when: str) -> None:
    from lmforge.reproduce.setupagent import _git as git

    git(root, *args, when=when)


# ------------------------------------------------------------------------------------ shared world


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """The generated index, repository 0 (one issue-linked fix) and its candidate's instance_id."""
    from lmforge.methods.setupagent.mine import mine
    from lmforge.reproduce.setupagent import build_index, make_repo

    top = tmp_path_factory.mktemp("setupagent_world")
    index = build_index(top / "index")
    repo = make_repo(top / "proj0", 0)
    (cand,) = mine(repo).candidates
    return {"top": top, "index": index, "repo": repo, "id": cand.instance.instance_id, "candidate": cand}


@pytest.fixture(scope="module")
def sandbox() -> None:
    """Skip unless the command sandbox runs here with a network namespace (root or CAP_SYS_ADMIN)."""
    cs = pytest.importorskip("lmforge.common.command_sandbox")
    import tempfile

    with tempfile.TemporaryDirectory() as work:
        os.chmod(work, 0o755)
        result = cs.run_commands([["true"]], work, require=("netns",),
                                 limits=cs.CommandLimits(wall_seconds=30, cpu_seconds=30))
    if result.error or not result.ok:
        pytest.skip(f"the command sandbox does not run here: {result.error}")


def _setup(monkeypatch, capsys, repo: Path, out: Path, index: Path, *extra: str) -> tuple[int, str, str]:
    return call(monkeypatch, capsys, "bench", "setup", str(repo), "--out", str(out), "--index", str(index), *extra)


# ------------------------------------------------------------------------------------- end to end


def test_setup_end_to_end_resume_and_export(world, sandbox, tmp_path, monkeypatch, capsys):
    from lmforge.methods.setupagent.reference import load_swebench
    from lmforge.reproduce.setupagent import planted_tests, test_id

    out = tmp_path / "out"
    code, stdout, stderr = _setup(monkeypatch, capsys, world["repo"], out, world["index"], "--extractor", "rules",
                                  "--timeout", "120")
    assert code == 0, stdout + stderr
    lines = stdout.strip().splitlines()
    assert lines[0] == f"{world['id']}: valid (1 FAIL_TO_PASS, 3 PASS_TO_PASS)", stdout
    assert lines[-1] == f"1 candidate: 1 valid -> {out / 'instances.jsonl'}"

    base, added = planted_tests(0)
    (inst,) = read_jsonl(out / "instances.jsonl")
    assert inst.instance_id == world["id"]
    assert inst.FAIL_TO_PASS == [test_id(0, "test_clamp_upper")] == [test_id(0, n) for n in added]
    assert sorted(inst.PASS_TO_PASS) == sorted(test_id(0, n) for n in base)
    assert inst.PASS_TO_FAIL == [] and inst.FAIL_TO_FAIL == []
    assert inst.created_at == "2023-06-01T12:00:00Z"  # the fix's commit time, the date cap
    record_path = out / "runs" / f"{world['id']}.json"
    record = json.loads(record_path.read_text())
    assert record["status"] == "valid" and record["cap"] is True
    assert "netns" in record["layers"]

    # swebench's own parser reads the logs the same way: F2P fails before the fix, passes after
    ref = load_swebench()
    if ref is not None:
        logs = out / "logs" / world["id"]
        before = ref.parse_log_pytest((logs / "before.log").read_text())
        after = ref.parse_log_pytest((logs / "after.log").read_text())
        for test in inst.FAIL_TO_PASS:
            assert before.get(test) == "FAILED" and after.get(test) == "PASSED"
        for test in inst.PASS_TO_PASS:
            assert before.get(test) == "PASSED" and after.get(test) == "PASSED"

    # the same command again: resumed, nothing run (the record is untouched), same result
    mtime = record_path.stat().st_mtime_ns
    code, stdout, stderr = _setup(monkeypatch, capsys, world["repo"], out, world["index"], "--extractor", "rules",
                                  "--timeout", "120")
    assert code == 0, stdout + stderr
    assert record_path.stat().st_mtime_ns == mtime
    assert "resumed: 1 candidate(s) already recorded" in stdout and "skipped" in stdout
    assert f"{world['id']}: valid" not in stdout  # no per-instance line: nothing new ran
    assert [i.instance_id for i in read_jsonl(out / "instances.jsonl")] == [world["id"]]

    # export it and read it back
    jsonl = tmp_path / "swe.jsonl"
    code, stdout, stderr = call(monkeypatch, capsys, "bench", "swe-export", str(out), "--out", str(jsonl))
    assert code == 0, stdout + stderr
    (exported,) = read_jsonl(jsonl)
    assert exported == inst
    raw = json.loads(jsonl.read_text().splitlines()[0])
    if ref is not None:
        import swebench.types

        assert isinstance(raw["FAIL_TO_PASS"], list)
        missing = [k for k in (*HARNESS_KEYS, *swebench.types.SWEbenchInstance.__annotations__) if k not in raw]
        assert not missing, missing


@pytest.fixture
def served_model(monkeypatch):
    """An OpenAI-compatible chat endpoint on loopback that answers with the reproduction's scripted
    model (its first plan forgets to install pytest; it repairs that from the error text)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from lmforge.reproduce.setupagent import scripted_model

    prompts: list[str] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            prompts.append(body["messages"][-1]["content"])
            reply = json.dumps({"choices": [{"message": {"role": "assistant", "content": scripted_model(prompts[-1])},
                                             "finish_reason": "stop"}],
                                "usage": {"prompt_tokens": 10, "completion_tokens": 10}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(reply)))
            self.end_headers()
            self.wfile.write(reply)

        def log_message(self, *args: Any) -> None:
            pass

    for name in ("OPENAI_API_KEY", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy",
                 "all_proxy"):
        monkeypatch.delenv(name, raising=False)
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/v1", prompts
    finally:
        server.shutdown()
        server.server_close()


def test_setup_with_a_served_llm_extractor_repairs_its_plan(world, sandbox, served_model, tmp_path, monkeypatch,
                                                             capsys):
    from lmforge.reproduce.setupagent import test_id

    url, prompts = served_model
    out = tmp_path / "out"
    code, stdout, stderr = _setup(monkeypatch, capsys, world["repo"], out, world["index"], "--extractor", "toy-model",
                                  "--base-url", url, "--timeout", "120")
    assert code == 0, stdout + stderr
    (inst,) = read_jsonl(out / "instances.jsonl")
    assert inst.FAIL_TO_PASS == [test_id(0, "test_clamp_upper")]
    assert inst.install == ["pip install -r requirements.txt", "pip install pytest"]  # added by the repair
    record = json.loads((out / "runs" / f"{world['id']}.json").read_text())
    assert record["repairs"] == 1 and record["repair"]["rounds"][0]["ok"] is False
    assert len(prompts) == 2 and "The commands below failed." in prompts[1]  # no API key was needed on loopback


def _hanging_repo(root: Path) -> Path:
    """Repository 0 plus a newer issue-linked fix whose added test sleeps for an hour."""
    from lmforge.reproduce.setupagent import make_repo

    make_repo(root, 0)
    core = root / "proj0" / "core.py"
    core.write_text(core.read_text() + "\n\ndef half(x):\n    return x / 2\n")
    tests = root / "tests" / "test_core.py"
    tests.write_text(tests.read_text() + "\n\ndef test_half():\n    import time\n\n    time.sleep(3600)\n"
                     "    from proj0.core import half\n\n    assert half(4) == 2\n")
    _git(root, "add", "-A", when="2023-07-01T12:00:00+00:00")
    _git(root, "commit", "-q", "-m", "Fix #7: add half", when="2023-07-01T12:00:00+00:00")
    return root


def test_a_hanging_test_is_killed_at_the_timeout_and_reported(world, sandbox, tmp_path, monkeypatch, capsys):
    from lmforge.methods.setupagent.mine import mine

    repo = _hanging_repo(tmp_path / "hang")
    (cand,) = mine(repo, max_commits=1).candidates
    out = tmp_path / "out"
    start = time.monotonic()
    code, stdout, stderr = _setup(monkeypatch, capsys, repo, out, world["index"], "--timeout", "5",
                                  "--max-commits", "1")
    seconds = time.monotonic() - start
    assert code == 2, stdout + stderr
    assert stdout == ""
    line = one_error_line(stderr)
    assert line.startswith(f"error: no valid instance in {repo}: 1 candidate: 0 valid, 1 setup_failed")
    assert f"{cand.instance.instance_id}: setup_failed" in line
    assert "killed at the limit after 5 s: pytest -rA" in line
    assert seconds < 60
    record = json.loads((out / "runs" / f"{cand.instance.instance_id}.json").read_text())
    assert record["status"] == "setup_failed" and record["instance"] is None
    tails = "\n".join(r["error_tail"] for r in record["repair"]["rounds"])
    assert "killed at the limit" in tails
    assert read_jsonl(out / "instances.jsonl") == []

    # rerun: resumed from the record, the same one line, nothing run again
    mtime = (out / "runs" / f"{cand.instance.instance_id}.json").stat().st_mtime_ns
    code, stdout, stderr = _setup(monkeypatch, capsys, repo, out, world["index"], "--timeout", "5",
                                  "--max-commits", "1")
    assert code == 2 and one_error_line(stderr) == line
    assert (out / "runs" / f"{cand.instance.instance_id}.json").stat().st_mtime_ns == mtime


# ------------------------------------------------------------------ bench setup without the sandbox


def _record(instance_id: str, status: str, *, reason: str = "", patch: str = "", test_patch: str = "",
            f2p: tuple[str, ...] = ("t.py::a",), p2p: tuple[str, ...] = (), graded: bool = True,
            created_at: str = "2023-06-01T12:00:00Z") -> dict[str, Any]:
    inst = {"repo": "proj", "instance_id": instance_id, "base_commit": "0" * 40, "patch": patch,
            "test_patch": test_patch, "problem_statement": "a bug", "created_at": created_at,
            "FAIL_TO_PASS": list(f2p), "PASS_TO_PASS": list(p2p)}
    return {"instance_id": instance_id, "status": status, "reason": reason, "instance": inst if graded else None}


def _write_runs(folder: Path, records: list[dict[str, Any]]) -> Path:
    (folder / "runs").mkdir(parents=True, exist_ok=True)
    for r in records:
        (folder / "runs" / f"{r['instance_id']}.json").write_text(json.dumps(r))
    return folder


def _no_model(monkeypatch) -> None:
    import lmforge.methods.setupagent.extract as extract

    def loaded(*args, **kwargs):
        raise AssertionError("the extractor model was made")

    monkeypatch.setattr(extract, "make_llm", loaded)


def test_resumed_run_skips_recorded_candidates_and_loads_no_model(world, tmp_path, monkeypatch, capsys):
    inst = world["candidate"].instance.to_dict()
    inst.update(FAIL_TO_PASS=["tests/test_core.py::test_clamp_upper"], PASS_TO_PASS=["tests/test_core.py::test_mean"])
    out = _write_runs(tmp_path / "out", [{"instance_id": world["id"], "status": "valid", "reason": "",
                                          "instance": inst}])
    _no_model(monkeypatch)
    code, stdout, stderr = _setup(monkeypatch, capsys, world["repo"], out, world["index"],
                                  "--extractor", "zoo:agent-nano")
    assert code == 0, stdout + stderr
    assert stdout.splitlines() == [f"resumed: 1 candidate(s) already recorded in {out / 'runs'}, skipped",
                                   f"1 candidate: 1 valid -> {out / 'instances.jsonl'}"]
    (got,) = read_jsonl(out / "instances.jsonl")
    assert got.instance_id == world["id"] and got.PASS_TO_PASS == ["tests/test_core.py::test_mean"]
    assert json.loads((out / "report.json").read_text())["resumed"] == 1


def test_no_valid_instance_is_one_error_line_with_the_reasons_truncated(world, tmp_path, monkeypatch, capsys):
    long_reason = "no plan ran after 3 round(s): " + "pip install -r requirements.txt " * 20
    out = _write_runs(tmp_path / "out", [_record(world["id"], "setup_failed", reason=long_reason, graded=False)])
    code, stdout, stderr = _setup(monkeypatch, capsys, world["repo"], out, world["index"])
    assert code == 2 and stdout == ""
    line = one_error_line(stderr)
    head = (f"error: no valid instance in {world['repo']}: 1 candidate: 0 valid, 1 setup_failed "
            f"(records in {out / 'runs'}; rerun to resume): {world['id']}: setup_failed (no plan ran")
    assert line.startswith(head), line
    assert line.endswith("...") and len(line) <= len(head) + 300
    assert not (out / "instances.jsonl").read_text()  # rebuilt from the records: empty


def test_a_model_that_cannot_be_made_stops_the_run_and_records_nothing(world, tmp_path, monkeypatch, capsys):
    out = tmp_path / "out"
    code, stdout, stderr = _setup(monkeypatch, capsys, world["repo"], out, world["index"],
                                  "--extractor", "zoo:no-such-model")
    assert code == 2, stdout + stderr
    line = one_error_line(stderr)
    assert "cannot make the extractor model 'zoo:no-such-model'" in line and "unknown zoo model" in line
    assert not list((out / "runs").glob("*.json"))


def test_an_output_folder_of_another_repository_is_refused(world, tmp_path, monkeypatch, capsys):
    out = _write_runs(tmp_path / "out", [])
    (out / "report.json").write_text(json.dumps({"repository": str(tmp_path / "elsewhere")}))
    before = sorted(p.name for p in out.rglob("*"))
    code, stdout, stderr = _setup(monkeypatch, capsys, world["repo"], out, world["index"])
    assert code == 2
    assert "holds the setup of another repository" in one_error_line(stderr)
    assert sorted(p.name for p in out.rglob("*")) == before


# ------------------------------------------------------------------------------------- swe-export

# patch A: one file, one hunk, 2 added, 1 removed; test patch A: one file, one hunk, 1 added
PATCH_A = ("diff --git a/m.py b/m.py\n--- a/m.py\n+++ b/m.py\n@@ -1,2 +1,3 @@\n x = 1\n-y = 2\n+y = 3\n+z = 4\n")
TEST_A = ("diff --git a/tests/t.py b/tests/t.py\n--- a/tests/t.py\n+++ b/tests/t.py\n@@ -1 +1,2 @@\n"
          " import m\n+assert m.z == 4\n")
# patch B: two files, three hunks, 1 added, 3 removed; test patch B: a new file, one hunk, 2 added
PATCH_B = ("diff --git a/a.py b/a.py\n--- a/a.py\n+++ b/a.py\n@@ -1,2 +1,1 @@\n-a = 1\n b = 2\n"
           "@@ -10,2 +9,2 @@\n-c = 3\n+c = 4\n d = 5\n"
           "diff --git a/b.py b/b.py\n--- a/b.py\n+++ b/b.py\n@@ -1 +0,0 @@\n-gone = 1\n")
TEST_B = ("diff --git a/tests/n.py b/tests/n.py\nnew file mode 100644\n--- /dev/null\n+++ b/tests/n.py\n"
          "@@ -0,0 +1,2 @@\n+import a\n+assert a.c == 4\n")


@pytest.fixture
def runs(tmp_path: Path) -> Path:
    """A setup folder with one record of each kind: valid, graded invalid, setup_failed."""
    return _write_runs(tmp_path / "setup", [
        _record("proj-aaa", "valid", patch=PATCH_A, test_patch=TEST_A, f2p=("t::x",), p2p=("t::y", "t::z")),
        _record("proj-bbb", "invalid", reason="no FAIL_TO_PASS test", patch=PATCH_B, test_patch=TEST_B, f2p=()),
        _record("proj-ccc", "setup_failed", reason="no plan ran", graded=False),
    ])


def test_swe_export_takes_the_valid_instances_and_all_graded_with_all(runs, tmp_path, monkeypatch, capsys):
    out = tmp_path / "swe.jsonl"
    code, stdout, stderr = call(monkeypatch, capsys, "bench", "swe-export", str(runs), "--out", str(out))
    assert code == 0, stdout + stderr
    assert [i.instance_id for i in read_jsonl(out)] == ["proj-aaa"]
    assert stdout.strip() == f"exported 1 instance(s) (1 valid) from 1 folder(s) -> {out}"

    # an existing file is kept without --overwrite, replaced with it
    code, _, stderr = call(monkeypatch, capsys, "bench", "swe-export", str(runs), "--out", str(out), "--all")
    assert code == 2 and "--overwrite" in one_error_line(stderr)
    assert [i.instance_id for i in read_jsonl(out)] == ["proj-aaa"]
    code, stdout, stderr = call(monkeypatch, capsys, "bench", "swe-export", str(runs), "--out", str(out), "--all",
                                "--overwrite")
    assert code == 0, stdout + stderr
    got = read_jsonl(out)
    assert [i.instance_id for i in got] == ["proj-aaa", "proj-bbb"]  # never the ungraded setup_failed one
    assert got[0].PASS_TO_PASS == ["t::y", "t::z"] and got[1].FAIL_TO_PASS == []
    assert "(1 valid)" in stdout


def test_swe_export_merges_folders_and_refuses_a_duplicate_id(runs, tmp_path, monkeypatch, capsys):
    other = _write_runs(tmp_path / "other", [_record("proj-ddd", "valid")])
    out = tmp_path / "swe.jsonl"
    code, stdout, stderr = call(monkeypatch, capsys, "bench", "swe-export", str(runs), str(other), "--out", str(out))
    assert code == 0, stdout + stderr
    assert [i.instance_id for i in read_jsonl(out)] == ["proj-aaa", "proj-ddd"]

    dup = _write_runs(tmp_path / "dup", [_record("proj-aaa", "valid")])
    out2 = tmp_path / "swe2.jsonl"
    code, stdout, stderr = call(monkeypatch, capsys, "bench", "swe-export", str(runs), str(dup), "--out", str(out2))
    assert code == 2
    line = one_error_line(stderr)
    assert "'proj-aaa'" in line and str(runs / "runs") in line and str(dup / "runs") in line
    assert not out2.exists()


def test_swe_export_refuses_a_record_whose_instance_breaks_the_schema(tmp_path, monkeypatch, capsys):
    bad = _write_runs(tmp_path / "bad", [_record("proj-eee", "valid", created_at="2023-06-01 12:00:00")])
    out = tmp_path / "swe.jsonl"
    code, _, stderr = call(monkeypatch, capsys, "bench", "swe-export", str(bad), "--out", str(out))
    assert code == 2
    line = one_error_line(stderr)
    assert "proj-eee.json" in line and "created_at" in line and "time zone" in line
    assert not out.exists()
    (bad / "runs" / "proj-eee.json").write_text("{not json")
    code, _, stderr = call(monkeypatch, capsys, "bench", "swe-export", str(bad), "--out", str(out))
    assert code == 2 and "cannot read the run record" in one_error_line(stderr)


def test_swe_export_stats_means_match_a_hand_count(runs, tmp_path, monkeypatch, capsys):
    out, stats = tmp_path / "swe.jsonl", tmp_path / "stats.json"
    code, stdout, stderr = call(monkeypatch, capsys, "bench", "swe-export", str(runs), "--out", str(out), "--all",
                                "--stats", str(stats))
    assert code == 0, stdout + stderr
    data = json.loads(stats.read_text())
    a, b = data["per_instance"]
    assert a == {"instance_id": "proj-aaa", "patch_files": 1, "patch_hunks": 1, "patch_added": 2, "patch_removed": 1,
                 "patch_lines": 3, "test_patch_files": 1, "test_patch_hunks": 1, "test_patch_added": 1,
                 "test_patch_removed": 0, "test_patch_lines": 1, "fail_to_pass": 1, "pass_to_pass": 2,
                 "pass_to_fail": 0, "fail_to_fail": 0}
    assert (b["patch_files"], b["patch_hunks"], b["patch_added"], b["patch_removed"]) == (2, 3, 1, 3)
    assert (b["test_patch_files"], b["test_patch_added"], b["fail_to_pass"]) == (1, 2, 0)
    assert data["instances"] == 2
    assert data["means"] == {
        "patch_files": 1.5, "patch_hunks": 2.0, "patch_added": 1.5, "patch_removed": 2.0, "patch_lines": 3.5,
        "test_patch_files": 1.0, "test_patch_hunks": 1.0, "test_patch_added": 1.5, "test_patch_removed": 0.0,
        "test_patch_lines": 1.5, "fail_to_pass": 0.5, "pass_to_pass": 1.0, "pass_to_fail": 0.0, "fail_to_fail": 0.0}

    # --stats onto an existing file needs --overwrite too, checked before anything is written
    out.unlink()
    code, _, stderr = call(monkeypatch, capsys, "bench", "swe-export", str(runs), "--out", str(out),
                           "--stats", str(stats))
    assert code == 2 and "--overwrite" in one_error_line(stderr) and not out.exists()


def test_a_served_model_off_loopback_needs_its_key_before_anything_is_written(world, tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    out = tmp_path / "out"
    code, _, stderr = _setup(monkeypatch, capsys, world["repo"], out, world["index"], "--extractor", "gpt-4o",
                             "--base-url", "https://api.example.invalid/v1")
    assert code == 2
    line = one_error_line(stderr)
    assert "--base-url https://api.example.invalid/v1" in line and "OPENAI_API_KEY" in line
    assert not out.exists()
