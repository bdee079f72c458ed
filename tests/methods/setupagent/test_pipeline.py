"""SetUpAgent's library layer: :func:`lmforge.methods.setupagent.runner.export_tree`,
:func:`lmforge.methods.setupagent.pipeline.setup_repository` and ``check_index``.

What the CLI tests (tests/cli/test_setupagent_cli.py) do not check: a tree that cannot be unpacked
safely, one candidate's error next to a valid one, the date cap read from inside the sandbox (the
``pip freeze`` of the environment the tests ran in), the repair loop driven by the real "pytest: command
not found" of the sandbox, resume and overwrite at the library level, and a ``StopRun`` from the
extractor.

The runs that need the command sandbox (root and a network namespace) are skipped without it. The
generated index (:func:`lmforge.reproduce.setupagent.build_index`) is built once for the module;
three sandboxed setups (about 10 s each) run in all.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any

import pytest

from lmforge.common import sandbox as sb
from lmforge.common.command_sandbox import CommandLimits, namespaces_available
from lmforge.common.errors import UserError
from lmforge.methods.setupagent import StopRun
from lmforge.methods.setupagent.extract import LLMExtractor, ScriptedLLM
from lmforge.methods.setupagent.index import UPLOAD_TIMES_FILE, build_wheel
from lmforge.methods.setupagent.pipeline import SetupReport, check_index, setup_repository
from lmforge.methods.setupagent.runner import RunnerSettings, export_tree
from lmforge.reproduce.setupagent import (
    _core,
    _git,
    _readme,
    _tests_file,
    build_index,
    make_repo,
    planted_tests,
    scripted_model,
)
from lmforge.reproduce.setupagent import test_id as _tid  # renamed: not a test for pytest to collect

IS_LINUX_ROOT = sys.platform == "linux" and os.geteuid() == 0


NAMESPACES = namespaces_available()
LANDLOCK_ABI = sb._landlock_abi()
SANDBOX_REASON = "the command sandbox needs Linux root and a network/PID namespace (not available here)"
needs_sandbox = pytest.mark.skipif(not NAMESPACES, reason=SANDBOX_REASON)
LIMITS = CommandLimits(wall_seconds=120.0, cpu_seconds=120.0, memory_mb=2048)

# ---------------------------------------------------------------------------------------- helpers


def _head(root: Path) -> str:
    return subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                          check=True).stdout.strip()


def _commit(root: Path, message: str, when: str, files: dict[str, str | bytes] | None = None,
            links: dict[str, str] | None = None, remove: tuple[str, ...] = ()) -> str:
    """Write ``files``, make ``links`` (path -> target), delete ``remove``; commit all; the new hash."""
    if not (root / ".git").exists():
        root.mkdir(parents=True, exist_ok=True)
        _git(root, "init", "-q", "-b", "main")
    for rel, data in (files or {}).items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(data, bytes):
            path.write_bytes(data)
        else:
            path.write_text(data, encoding="utf-8")
    for rel, target in (links or {}).items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        os.symlink(target, root / rel)
    for rel in remove:
        (root / rel).unlink()
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", message, when=when)
    return _head(root)


def _freeze_first(prompt: str) -> str:
    """:func:`scripted_model`, with ``pip freeze`` put before its first plan's test command, so that
    the test log shows which toydep the environment got. Its mistakes and repairs are the scripted
    model's own (a repair reply carries the previous plan, ``pip freeze`` included)."""
    reply = scripted_model(prompt)
    if "The commands below failed." in prompt:
        return reply
    plan = json.loads(reply)
    plan["test_commands"] = ["pip freeze", *plan["test_commands"]]
    return json.dumps(plan)


class _Stops:
    """An extractor whose model cannot be made: every call is a StopRun."""

    def __init__(self) -> None:
        self.calls = 0

    def extract(self, root: str | Path) -> Any:
        self.calls += 1
        raise StopRun("the model could not be loaded")

    def repair(self, plan: Any, error: str) -> Any:
        self.calls += 1
        raise StopRun("the model could not be loaded")


class _NoPlan:
    """An extractor that proposes nothing (the candidate ends ``setup_failed`` without a sandbox)."""

    def __init__(self) -> None:
        self.roots: list[Path] = []
        self.tests: list[str] = []  # tests/test_core.py as the extractor saw it

    def extract(self, root: str | Path) -> Any:
        self.roots.append(Path(root))
        path = Path(root) / "tests" / "test_core.py"
        self.tests.append(path.read_text() if path.is_file() else "")
        return None

    def repair(self, plan: Any, error: str) -> Any:
        return None


# --------------------------------------------------------------------------------------- fixtures


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The generated index (built once: it re-packs pytest) and repository 0 (module-level toydep import)."""
    top = tmp_path_factory.mktemp("setupagent_pipeline")
    return {"top": top, "index": build_index(top / "index"), "repo0": make_repo(top / "proj0", 0)}


def _setup(repo: Path, out: Path, index: Path, cap: bool, model: Any = scripted_model,
           records: list[dict[str, Any]] | None = None, **kw: Any) -> SetupReport:
    return setup_repository(repo, out, index=index, cap=cap, extractor=LLMExtractor(ScriptedLLM(model)),
                            settings=RunnerSettings(index=index, limits=LIMITS), progress=False,
                            on_record=records.append if records is not None else None, **kw)


@pytest.fixture(scope="module")
def capped(world: dict[str, Path]) -> dict[str, Any]:
    """Repository 0 set up with the date cap (the fix is from 2023-06-01: toydep 1.1)."""
    if not NAMESPACES:
        pytest.skip(SANDBOX_REASON)
    records: list[dict[str, Any]] = []
    out = world["top"] / "capped"
    report = _setup(world["repo0"], out, world["index"], True, _freeze_first, records)
    return {"out": out, "report": report, "records": records}


@pytest.fixture(scope="module")
def uncapped(world: dict[str, Path]) -> dict[str, Any]:
    """Repository 0 set up without the cap (toydep 2.0, which has no ``scale``)."""
    if not NAMESPACES:
        pytest.skip(SANDBOX_REASON)
    records: list[dict[str, Any]] = []
    out = world["top"] / "uncapped"
    report = _setup(world["repo0"], out, world["index"], False, _freeze_first, records)
    return {"out": out, "report": report, "records": records}


# ------------------------------------------------------------------------------------ export_tree


def test_export_tree_is_byte_identical_to_the_commit(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    files: dict[str, str | bytes] = {
        "README.md": "# r\n",
        "pkg/__init__.py": "",
        "pkg/deep/er/mod.py": "x = 1\r\ny = 2\n",  # CRLF kept as committed (no attributes)
        "pkg/données.txt": "non-ASCII name\n",
        "blob.bin": bytes(range(256)) * 4,
        "run.sh": "#!/bin/sh\necho hi\n",
        "empty.txt": "",
    }
    _commit(repo, "one", "2023-01-01T00:00:00+00:00", files=files, links={"alias.py": "pkg/deep/er/mod.py"})
    os.chmod(repo / "run.sh", 0o755)
    first = _commit(repo, "exec bit", "2023-01-02T00:00:00+00:00")
    # a later commit changes a file: the export is of ``first``, not of HEAD or the work tree
    _commit(repo, "two", "2023-01-03T00:00:00+00:00", files={"README.md": "# changed\n"})

    dest = tmp_path / "out" / "tree"
    export_tree(repo, first, dest)
    listed = subprocess.run(["git", "-C", str(repo), "ls-tree", "-r", "-z", "--name-only", first],
                            capture_output=True, check=True).stdout.decode().split("\0")
    listed = [p for p in listed if p]
    assert sorted(listed) == sorted([*files, "alias.py"])
    on_disk = sorted(p.relative_to(dest).as_posix() for p in dest.rglob("*") if p.is_file() or p.is_symlink())
    assert on_disk == sorted(listed)
    for rel in listed:
        want = subprocess.run(["git", "-C", str(repo), "show", f"{first}:{rel}"], capture_output=True,
                              check=True).stdout
        path = dest / rel
        if path.is_symlink():
            assert os.readlink(path).encode() == want  # git stores a link as its target text
        else:
            assert path.read_bytes() == want, rel
    assert (dest / "alias.py").is_symlink() and (dest / "alias.py").read_bytes() == b"x = 1\r\ny = 2\n"
    assert os.access(dest / "run.sh", os.X_OK) and not os.access(dest / "README.md", os.X_OK)
    assert (dest / "README.md").read_text() == "# r\n"
    assert not (dest / ".git").exists()


@pytest.mark.parametrize("target", ["/etc/hostname", "../../outside"])
def test_export_tree_refuses_a_link_out_of_the_tree(tmp_path: Path, target: str) -> None:
    repo = tmp_path / "repo"
    commit = _commit(repo, "link", "2023-01-01T00:00:00+00:00", files={"a.py": "a = 1\n"},
                     links={"sub/link": target})
    with pytest.raises(UserError, match="cannot be unpacked safely") as err:
        export_tree(repo, commit, tmp_path / "dest")
    assert not isinstance(err.value, tarfile.TarError)
    assert err.value.__cause__ is None and (err.value.__context__ is None or err.value.__suppress_context__)
    assert "link" in str(err.value) and commit[:12] in str(err.value)


def test_export_tree_refuses_options_and_unknown_commits(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    _commit(repo, "one", "2023-01-01T00:00:00+00:00", files={"a.py": "a = 1\n"})
    with pytest.raises(UserError, match="is not a commit"):
        export_tree(repo, "--output=/tmp/x", tmp_path / "d1")
    with pytest.raises(UserError, match="git ls-tree"):
        export_tree(repo, "0" * 40, tmp_path / "d2")
    assert not (tmp_path / "d1").exists() and not (tmp_path / "d2").exists()


def test_export_tree_ignores_archive_attributes(tmp_path: Path) -> None:
    # git archive (the first version) dropped export-ignore'd tests and filled export-subst
    repo = tmp_path / "repo"
    commit = _commit(repo, "attrs", "2023-01-01T00:00:00+00:00",
                     files={".gitattributes": "tests/ export-ignore\nversion.py export-subst\n",
                            "tests/test_a.py": "def test_a():\n    pass\n", "version.py": 'v = "$Format:%H$"\n'})
    dest = tmp_path / "dest"
    export_tree(repo, commit, dest)
    assert (dest / "tests" / "test_a.py").is_file()
    assert (dest / "version.py").read_text() == 'v = "$Format:%H$"\n'


def test_export_tree_refuses_a_link_chain_that_leaves_the_tree(tmp_path: Path) -> None:
    # each link alone looks inside ("here -> ." and "up -> here/.."), together they reach the parent
    repo = tmp_path / "repo"
    commit = _commit(repo, "links", "2023-01-02T00:00:00+00:00", files={"a.py": "x = 1\n"},
                     links={"here": ".", "up": "here/.."})
    with pytest.raises(UserError, match="through other links"):
        export_tree(repo, commit, tmp_path / "dest")


# ------------------------------------------------------------------------------------ check_index


def test_check_index_needs_upload_times_only_with_the_cap(tmp_path: Path) -> None:
    folder = tmp_path / "index"
    timed = build_wheel("toydep", "1.0", {"toydep/__init__.py": ""}, folder)
    untimed = build_wheel("toydep", "1.1", {"toydep/__init__.py": ""}, folder)
    (folder / UPLOAD_TIMES_FILE).write_text(json.dumps({timed.name: "2023-01-01T00:00:00Z"}))
    with pytest.raises(UserError, match="upload time") as err:
        check_index(folder, None, cap=True)
    assert untimed.name in str(err.value) and "1 have none" in str(err.value)
    assert check_index(folder, None, cap=False) is None
    # another map that times every file lifts the refusal
    full = tmp_path / "times.json"
    full.write_text(json.dumps({timed.name: "2023-01-01T00:00:00Z", untimed.name: "2023-02-01T00:00:00Z"}))
    assert check_index(folder, full, cap=True) is None


def test_check_index_refuses_an_empty_or_missing_folder(tmp_path: Path) -> None:
    (tmp_path / "empty").mkdir()
    (tmp_path / "empty" / "notes.txt").write_text("not a wheel")
    for cap in (True, False):
        with pytest.raises(UserError, match="holds no wheel or sdist"):
            check_index(tmp_path / "empty", None, cap=cap)
        with pytest.raises(UserError, match="not found"):
            check_index(tmp_path / "absent", None, cap=cap)


def test_setup_refuses_an_untimed_index_before_writing(world: dict[str, Path], tmp_path: Path) -> None:
    folder = tmp_path / "index"
    build_wheel("toydep", "1.0", {"toydep/__init__.py": ""}, folder)
    out = tmp_path / "out"
    extractor = _NoPlan()
    with pytest.raises(UserError, match="upload time"):
        setup_repository(world["repo0"], out, index=folder, cap=True, extractor=extractor, progress=False)
    assert not out.exists() and extractor.roots == []


# ---------------------------------------------------------------------------------------- StopRun


def test_stoprun_from_the_extractor_propagates_and_writes_no_record(world: dict[str, Path], tmp_path: Path) -> None:
    out = tmp_path / "out"
    stops = _Stops()
    seen: list[dict[str, Any]] = []
    with pytest.raises(StopRun, match="could not be loaded"):
        setup_repository(world["repo0"], out, index=world["index"], cap=True, extractor=stops, progress=False,
                         on_record=seen.append)
    assert stops.calls == 1 and seen == []
    runs = out / "runs"
    assert list(runs.glob("*.json")) == []
    assert [p.name for p in runs.iterdir()] == []  # no scratch tree, no re-packed pip left behind
    assert not (out / "report.json").exists()
    # the candidate was not recorded, so the next run takes it up (and is not a resume)
    again = _NoPlan()
    report = setup_repository(world["repo0"], out, index=world["index"], cap=True, extractor=again, progress=False)
    assert report.resumed == 0 and len(again.roots) == 1
    assert [r["status"] for r in report.records] == ["setup_failed"]
    assert report.records[0]["reason"] == "the extractor proposed no plan"
    # the extractor read the base commit's tree (the fix's added test is not in it yet), since removed
    assert "def test_clamp_lower" in again.tests[0] and "def test_clamp_upper" not in again.tests[0]
    assert not again.roots[0].exists()


# ------------------------------------------------------------------------ runs in the command sandbox


def _record(report: SetupReport) -> dict[str, Any]:
    (rec,) = report.records
    return rec


@needs_sandbox
def test_date_cap_seen_from_inside_the_sandbox(capped: dict[str, Any], uncapped: dict[str, Any]) -> None:
    base, added = planted_tests(0)
    # with the cap: toydep 1.1 installed, the instance valid with exactly the planted sets
    rec = _record(capped["report"])
    assert rec["cap"] is True and rec["status"] == "valid", rec["reason"]
    inst = rec["instance"]
    assert sorted(inst["FAIL_TO_PASS"]) == sorted(_tid(0, n) for n in added)
    assert sorted(inst["PASS_TO_PASS"]) == sorted(_tid(0, n) for n in base)
    assert inst["PASS_TO_FAIL"] == [] and inst["FAIL_TO_FAIL"] == []
    logs = capped["out"] / "logs" / rec["instance_id"]
    for which in ("before", "after"):
        log = (logs / f"{which}.log").read_text()
        assert "toydep==1.1" in log and "toydep==2.0" not in log and "toydep==1.0" not in log
    assert capped["report"].counts()["valid"] == 1
    (line,) = (capped["out"] / "instances.jsonl").read_text().splitlines()
    assert json.loads(line)["instance_id"] == rec["instance_id"]

    # without it: toydep 2.0, whose missing ``scale`` breaks the module import before and after the fix
    rec = _record(uncapped["report"])
    assert rec["cap"] is False and rec["status"] == "invalid" and rec["reason"] == "no FAIL_TO_PASS test"
    assert rec["instance"]["FAIL_TO_PASS"] == []
    assert rec["before"]["statuses"] == rec["after"]["statuses"] == {"tests/test_core.py": "ERROR"}
    logs = uncapped["out"] / "logs" / rec["instance_id"]
    before = (logs / "before.log").read_text()
    assert "toydep==2.0" in before and "toydep==1.1" not in before
    assert "ImportError: cannot import name 'scale' from 'toydep'" in before
    assert (uncapped["out"] / "instances.jsonl").read_text() == ""

    for report in (capped["report"], uncapped["report"]):
        layers = _record(report)["layers"]
        assert "netns" in layers
        if LANDLOCK_ABI >= 1:
            assert "landlock" in layers


@needs_sandbox
def test_repair_loop_is_driven_by_the_sandbox_error(capped: dict[str, Any]) -> None:
    rec = _record(capped["report"])
    rounds = rec["repair"]["rounds"]
    assert rec["repairs"] == 1 and len(rounds) == 2
    first, second = rounds
    assert first["ok"] is False and first["failed_command"].startswith("pytest")
    assert first["returncode"] == 127 and "pytest: command not found" in first["error_tail"]
    assert "pip install pytest" not in first["plan"]["install"]
    # the fix came from that error: pytest added to the installs, nothing else changed
    assert second["ok"] is True and second["failed_command"] is None
    assert second["plan"]["install"] == [*first["plan"]["install"], "pip install pytest"]
    assert second["plan"]["test_commands"] == first["plan"]["test_commands"]
    assert rec["instance"]["install"] == second["plan"]["install"]
    assert json.loads((capped["out"] / "report.json").read_text())["repairs"] == 1


@needs_sandbox
def test_resume_runs_nothing_and_overwrite_runs_again(capped: dict[str, Any], tmp_path: Path,
                                                      world: dict[str, Path]) -> None:
    assert len(capped["records"]) == 1  # the first run reported its one record
    out = tmp_path / "out"
    shutil.copytree(capped["out"], out)
    instances = (out / "instances.jsonl").read_text()
    seen: list[dict[str, Any]] = []
    stops = _Stops()  # anything run would raise
    report = setup_repository(world["repo0"], out, index=world["index"], cap=True, extractor=stops, progress=False,
                              on_record=seen.append)
    assert seen == [] and stops.calls == 0 and report.resumed == 1
    assert report.records == capped["report"].records
    assert (out / "instances.jsonl").read_text() == instances
    assert json.loads((out / "report.json").read_text())["resumed"] == 1

    again = _NoPlan()
    report = setup_repository(world["repo0"], out, index=world["index"], cap=True, extractor=again, progress=False,
                              on_record=seen.append, overwrite=True)
    assert len(seen) == 1 and len(again.roots) == 1 and report.resumed == 0
    assert [r["status"] for r in report.records] == ["setup_failed"]
    assert (out / "instances.jsonl").read_text() == ""
    assert not (out / "logs").exists()  # the earlier logs went with the earlier records


@needs_sandbox
def test_a_bad_candidate_is_recorded_and_the_next_still_runs(world: dict[str, Path], tmp_path: Path) -> None:
    """Two candidates, mined newest first: the newer fix's base tree holds ``link -> /etc/hostname``
    (added by a commit without an issue link), so the candidate that fails comes first; the older
    one (repository 0's clamp fix, :func:`make_repo`) must still set up and validate."""
    base, added = planted_tests(0)
    repo = make_repo(tmp_path / "twofix", 0)
    good_fix = _head(repo)
    bad_base = _commit(repo, "Add a link to the host name", "2023-06-10T12:00:00+00:00",
                       links={"link": "/etc/hostname"})
    half = "\n\ndef half(x):\n    return x / 2\n"
    test_half = "\n\ndef test_half():\n    from proj0.core import half\n\n    assert half(4) == 2\n"
    bad_fix = _commit(repo, "Fix #2: no way to halve", "2023-07-01T12:00:00+00:00",
                      files={"proj0/core.py": _core(0, fixed=True) + half,
                             "tests/test_core.py": _tests_file(0, base + added) + test_half})

    seen: list[dict[str, Any]] = []
    report = _setup(repo, tmp_path / "out", world["index"], True, records=seen)
    assert [r["commit"] for r in seen] == [bad_fix, good_fix]  # the error came first and did not stop the run
    by_commit = {r["commit"]: r for r in report.records}
    bad, good = by_commit[bad_fix], by_commit[good_fix]
    assert bad["status"] == "error" and bad["instance"] is None and bad["repair"] is None
    assert "cannot be unpacked safely" in bad["reason"] and bad_base[:12] in bad["reason"]
    assert "'link'" in bad["reason"] and "absolute" in bad["reason"]
    assert not (tmp_path / "out" / "logs" / bad["instance_id"]).exists()
    assert good["status"] == "valid", good["reason"]
    assert good["instance"]["FAIL_TO_PASS"] == [_tid(0, n) for n in added]
    assert sorted(good["instance"]["PASS_TO_PASS"]) == sorted(_tid(0, n) for n in base)
    assert report.counts() == {"valid": 1, "invalid": 0, "setup_failed": 0, "fix_failed": 0, "error": 1}
    (line,) = (tmp_path / "out" / "instances.jsonl").read_text().splitlines()
    assert json.loads(line)["instance_id"] == good["instance_id"]
    summary = json.loads((tmp_path / "out" / "report.json").read_text())
    assert summary["counts"]["error"] == 1 and summary["candidates"] == 2
    assert list((tmp_path / "out" / "runs").glob(".*")) == []  # no scratch tree left by the failed export


ESCAPE_TESTS = '''\
import os
import socket


def test_reach_the_host():
    # the host's loopback service (another network namespace) and an outside address
    for address in (("127.0.0.1", int(os.environ.get("HOST_PORT", "{port}"))), ("10.255.255.1", 80)):
        try:
            socket.create_connection(address, timeout=2).close()
        except OSError:
            continue
        open("{outside}/connected", "w").close()


def test_write_and_read_outside():
    for attempt in ("{outside}/written", os.path.expanduser("~root/escape")):
        try:
            open(attempt, "w").write("escaped")
        except OSError:
            pass
    try:
        secret = open("{secret}").read()
    except OSError:
        secret = ""
    assert secret == ""
'''


@needs_sandbox
def test_a_repository_whose_tests_try_to_reach_outside(world: dict[str, Path], tmp_path: Path) -> None:
    """The issue's sandbox check at the pipeline level: a repository whose tests try to connect to
    the host, write outside their folder and read a secret leaves no trace, and its tests still run
    (and pass: every attempt failed inside the sandbox)."""
    import shutil
    import socket
    import tempfile
    import threading

    # pytest's tmp_path sits below a 0700 folder, which nobody's permissions alone would guard: these
    # two sit directly in /tmp, world-traversable, so only the sandbox stands in the way
    outside = Path(tempfile.mkdtemp(prefix="lmforge-escape-"))
    outside.chmod(0o777)
    request_cleanup = [outside]
    secret_dir = Path(tempfile.mkdtemp(prefix="lmforge-secret-"))
    secret_dir.chmod(0o755)
    request_cleanup.append(secret_dir)
    secret = secret_dir / "secret.txt"
    secret.write_text("the host's secret")
    secret.chmod(0o644)
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen()
    server.settimeout(0.2)
    accepted: list[object] = []
    stop = threading.Event()

    def serve() -> None:
        while not stop.is_set():
            try:
                conn, _ = server.accept()
            except OSError:
                continue
            accepted.append(conn)
            conn.close()

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    repo = make_repo(tmp_path / "repo", 0)
    escape = ESCAPE_TESTS.format(port=server.getsockname()[1], outside=outside, secret=secret)
    _commit(repo, "Fix #7: clamp keeps ints; tests that poke around", "2023-07-01T12:00:00+00:00",
            files={"proj0/core.py": (repo / "proj0" / "core.py").read_text() + "\n\nVERSION = 2\n",
                   "tests/test_escape.py": escape})
    try:
        report = setup_repository(repo, tmp_path / "out", index=world["index"], cap=True,
                                  extractor=LLMExtractor(ScriptedLLM(scripted_model)), progress=False)
    finally:
        stop.set()
        thread.join(timeout=5)
        server.close()
    try:
        rec = next(r for r in report.records if r["commit"] == _head(repo))
        assert rec["after"] is not None, rec
        escape_ids = {"tests/test_escape.py::test_reach_the_host", "tests/test_escape.py::test_write_and_read_outside"}
        assert {k: v for k, v in rec["after"]["statuses"].items() if k in escape_ids} == \
            dict.fromkeys(escape_ids, "PASSED")
        assert accepted == []
        assert sorted(p.name for p in outside.iterdir()) == []
        assert not Path("/root/escape").exists()
    finally:
        for folder in request_cleanup:
            shutil.rmtree(folder, ignore_errors=True)


def test_resume_refuses_records_made_with_the_other_cap_setting(world: dict[str, Path], capped: dict[str, Any],
                                                                tmp_path: Path) -> None:
    # a record made with the cap must not be resumed (and exported) by a run without it
    out = tmp_path / "out"
    shutil.copytree(capped["out"], out)
    with pytest.raises(UserError, match="made with the date cap"):
        _setup(world["repo0"], out, world["index"], cap=False)


def test_a_repository_name_starting_with_a_dot_is_refused(world: dict[str, Path], tmp_path: Path) -> None:
    with pytest.raises(UserError, match="starts with '.'"):
        setup_repository(world["repo0"], tmp_path / "out", index=world["index"], repo=".hidden", progress=False)
    assert not (tmp_path / "out").exists()


def test_a_sandbox_that_cannot_run_stops_the_run_and_records_nothing(world: dict[str, Path], tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # not a plan's failure: repairing it would be pointless, and a record would be resumed later
    import lmforge.methods.setupagent.runner as runner
    from lmforge.common.command_sandbox import SessionResult
    from lmforge.methods.setupagent.runner import SandboxUnavailable

    why = "the command sandbox needs a network namespace (root or CAP_SYS_ADMIN); this machine refused one"
    calls: list[int] = []

    def refused(argvs: Any, *args: Any, **kwargs: Any) -> SessionResult:
        calls.append(1)
        return SessionResult(commands=[], layers=("rlimits",), services={}, error=why)

    monkeypatch.setattr(runner, "run_commands", refused)
    model = ScriptedLLM(scripted_model)
    with pytest.raises(SandboxUnavailable, match="network namespace"):
        setup_repository(world["repo0"], tmp_path / "out", index=world["index"], extractor=LLMExtractor(model),
                         progress=False)
    assert calls == [1] and len(model.prompts) == 1  # no repair was asked for
    assert not list((tmp_path / "out" / "runs").glob("*.json"))


@pytest.mark.skipif(not IS_LINUX_ROOT, reason="needs root to give the clone to another user")
def test_a_clone_owned_by_another_user_is_mined_and_exported(tmp_path: Path) -> None:
    # as root (the sandbox needs root), git refuses "dubious ownership" unless told otherwise
    from lmforge.methods.setupagent.mine import mine

    repo = make_repo(tmp_path / "repo", 1)
    for dirpath, dirnames, filenames in os.walk(repo):
        for name in dirnames + filenames:
            os.chown(os.path.join(dirpath, name), 65534, 65534, follow_symlinks=False)
    os.chown(repo, 65534, 65534)
    cand = mine(repo).candidates[0]
    export_tree(repo, cand.instance.base_commit, tmp_path / "tree")
    assert (tmp_path / "tree" / "proj1" / "core.py").is_file()
