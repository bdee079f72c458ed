"""Tests for lmforge.common.command_sandbox: untrusted commands run confined, and every way a
command can end comes back as a CommandResult.

The kernel-dependent tests skip (with the reason) where this machine is not Linux root, offers no
network namespace or no Landlock. The folders the commands use are made under a fresh 0755 temporary
folder (pytest's ``tmp_path`` lies below a 0700 folder), so that what keeps a command out of a
sibling folder is the sandbox, not a folder it could not traverse anyway.
"""

from __future__ import annotations

import http.server
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from lmforge.common import command_sandbox as cs
from lmforge.common import sandbox as sb
from lmforge.common.command_sandbox import (
    COMMAND_LAYERS,
    CommandLimits,
    CommandResult,
    Service,
    SessionResult,
    namespaces_available,
    run_commands,
)
from lmforge.common.errors import UserError

PY = sys.executable
LIMITS = CommandLimits(wall_seconds=20, cpu_seconds=20, memory_mb=1024, max_output_bytes=200_000)
ECHO_BODY = "hello from the sandbox's own loopback"
ECHO_SERVICE = "tests.common.test_command_sandbox:start_echo_service"

IS_LINUX_ROOT = sys.platform == "linux" and os.geteuid() == 0


NAMESPACES = namespaces_available()
LANDLOCK_ABI = sb._landlock_abi()
needs_root = pytest.mark.skipif(not IS_LINUX_ROOT, reason="the uid drop needs Linux and root")
needs_namespaces = pytest.mark.skipif(
    not NAMESPACES, reason="this machine allows no network/PID namespace (needs root, not refused)"
)
needs_landlock = pytest.mark.skipif(
    LANDLOCK_ABI < 1, reason="this kernel offers no Landlock (older than 5.13, or disabled)"
)


class _EchoService:
    """A trusted test service: serves ``body`` on 127.0.0.1 (port chosen by the OS) in a thread."""

    def __init__(self, body: str) -> None:
        payload = body.encode()

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self) -> None:  # noqa: N802
                self.send_response(200)
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - quiet
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def start_echo_service(body: str = ECHO_BODY) -> _EchoService:
    """The :class:`Service` target of the network tests."""
    return _EchoService(body)


@pytest.fixture
def area():
    """A fresh 0755 folder with an empty ``work`` folder in it; removed afterwards."""
    top = Path(tempfile.mkdtemp(prefix="lmforge-cs-test-"))
    os.chmod(top, 0o755)
    (top / "work").mkdir()
    yield top
    shutil.rmtree(top, ignore_errors=True)


def py(code: str) -> list[str]:
    return [PY, "-c", code]


def run(argvs, workdir, **kw) -> SessionResult:
    kw.setdefault("limits", LIMITS)
    kw.setdefault("require", ())
    return run_commands(argvs, workdir, **kw)


def only(result: SessionResult) -> CommandResult:
    assert result.error is None, result.error
    assert len(result.commands) == 1
    return result.commands[0]


# ------------------------------------------------------------------------------------- commands


def test_output_interleaves_stdout_and_stderr_and_keeps_the_returncode(area):
    code = (
        "import sys\n"
        "print('one', flush=True)\n"
        "print('two', file=sys.stderr, flush=True)\n"
        "print('three', flush=True)\n"
        "sys.exit(3)\n"
    )
    result = run([py(code), py("print('fine')")], area / "work", stop_on_failure=False)
    first, second = result.commands
    assert (first.kind, first.returncode, first.output) == ("failed", 3, "one\ntwo\nthree\n")
    assert first.argv == py(code) and first.seconds >= 0
    assert (second.kind, second.returncode, second.output) == ("ok", 0, "fine\n")
    assert result.ok is False  # one command failed
    assert set(result.layers) <= set(COMMAND_LAYERS) and "rlimits" in result.layers


def test_a_missing_executable_fails_with_127_and_stops_the_session(area):
    missing = "no-such-program-lmforge"
    result = run([py("print(1)"), [missing, "--x"], py("print(2)")], area / "work")
    ok, failed, skipped = result.commands
    assert ok.kind == "ok" and ok.output == "1\n"
    assert (failed.kind, failed.returncode) == ("failed", 127)
    assert missing in failed.output and "not found" in failed.output
    assert (skipped.kind, skipped.returncode, skipped.output) == ("not_run", None, "")
    assert result.error is None and not result.ok


def test_without_stop_on_failure_every_command_runs(area):
    argvs = [py("import sys; sys.exit(1)"), ["no-such-program-lmforge"], py("print('last')")]
    result = run(argvs, area / "work", stop_on_failure=False)
    assert [c.kind for c in result.commands] == ["failed", "failed", "ok"]
    assert result.commands[2].output == "last\n"


def test_the_executable_is_found_on_path_prepend_and_runs_in_cwd(area):
    work = area / "work"
    tools = work / "tools"
    tools.mkdir()
    script = tools / "hello-lmforge"
    script.write_text(f"#!{PY}\nimport os\nprint('cwd', os.getcwd())\n")
    script.chmod(0o755)
    (work / "sub").mkdir()
    result = run([["hello-lmforge"]], work, path_prepend=["tools"], cwd="sub")
    command = only(result)
    assert command.kind == "ok", command.output
    assert command.output == f"cwd {os.path.realpath(work / 'sub')}\n"
    assert result.ok


@needs_root
def test_commands_run_as_nobody(area):
    result = run([py("import os; print(os.getuid(), os.getgid(), os.getgroups())")], area / "work")
    assert only(result).output == "65534 65534 []\n"
    assert "uid" in result.layers


def test_the_environment_is_scrubbed_and_env_passes(area, monkeypatch):
    monkeypatch.setenv("LMFORGE_FAKE_API_KEY", "sk-not-for-the-sandbox")
    code = "import os, json; print(json.dumps(dict(os.environ)))"
    result = run([py(code)], area / "work", env={"MY_SETTING": "42"}, path_prepend=["venv/bin"])
    seen = json.loads(only(result).output)
    work = os.path.realpath(area / "work")
    assert "LMFORGE_FAKE_API_KEY" not in seen
    assert "sk-not-for-the-sandbox" not in only(result).output
    assert seen["MY_SETTING"] == "42"
    assert seen["PATH"] == f"{work}/venv/bin:/usr/local/bin:/usr/bin:/bin"
    assert seen["HOME"] == f"{work}/.sandbox-home" and seen["TMPDIR"] == f"{work}/.sandbox-tmp"
    assert seen["LANG"] == seen["LC_ALL"] == "C.UTF-8"
    assert os.path.isdir(seen["HOME"]) and os.path.isdir(seen["TMPDIR"])


# ------------------------------------------------------------------------------------------ files


@needs_landlock
def test_writes_outside_the_workdir_fail_and_inside_work(area):
    outside = area / "outside"
    outside.mkdir()
    outside.chmod(0o777)  # anyone may write here: only Landlock can stop the command
    target = outside / "escaped.txt"
    code = (
        "import sys\n"
        "open('inside.txt', 'w').write('kept')\n"
        f"try:\n    open({str(target)!r}, 'w').write('x')\n"
        "except OSError as exc:\n    print('refused', type(exc).__name__)\n"
        "else:\n    print('wrote outside')\n"
    )
    result = run([py(code)], area / "work")
    command = only(result)
    assert command.kind == "ok", command.output
    assert command.output == "refused PermissionError\n"
    assert not target.exists()
    assert (area / "work" / "inside.txt").read_text() == "kept"
    assert "landlock" in result.layers


@needs_landlock
def test_a_world_readable_file_outside_the_workdir_cannot_be_read(area):
    secret = area / "secret.txt"
    secret.write_text("the-secret-text-42")
    secret.chmod(0o644)
    code = (
        f"try:\n    print(open({str(secret)!r}).read())\n"
        "except OSError as exc:\n    print('refused', type(exc).__name__)\n"
    )
    result = run([py(code), ["cat", str(secret)]], area / "work", stop_on_failure=False)
    python, cat = result.commands
    assert python.output == "refused PermissionError\n"
    assert cat.kind == "failed" and "Permission denied" in cat.output
    assert "the-secret-text-42" not in python.output + cat.output


@needs_root
def test_the_workdir_is_handed_to_nobody_without_following_links(area):
    work = area / "work"
    (work / "pkg").mkdir()
    (work / "pkg" / "mod.py").write_text("x = 1\n")
    outside = area / "root-owned.txt"
    outside.write_text("mine")
    (work / "link").symlink_to(outside)
    result = run([py("open('pkg/mod.py', 'a').write('y = 2\\n')")], work)
    assert only(result).kind == "ok", only(result).output
    assert (work / "pkg" / "mod.py").read_text() == "x = 1\ny = 2\n"
    assert os.stat(work / "pkg").st_uid == 65534
    assert os.stat(outside).st_uid == 0  # the symlink's target kept its owner


# ---------------------------------------------------------------------------------------- network


@needs_namespaces
def test_the_hosts_loopback_and_the_outside_are_unreachable(area):
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(1)
    port = server.getsockname()[1]
    code = (
        "import socket, sys, time\n"
        "targets = (('127.0.0.1', int(sys.argv[1])), ('1.1.1.1', 53), ('10.255.255.1', 80))\n"
        "for host, port in targets:\n"
        "    start = time.monotonic()\n"
        "    try:\n"
        "        socket.create_connection((host, port), timeout=2).close()\n"
        "        print(host, 'connected')\n"
        "    except OSError as exc:\n"
        "        print(host, type(exc).__name__, exc.errno, round(time.monotonic() - start, 2))\n"
    )
    try:
        result = run([[PY, "-c", code, str(port)]], area / "work")
    finally:
        server.close()
    lines = only(result).output.splitlines()
    assert "netns" in result.layers
    assert lines[0].startswith("127.0.0.1 ConnectionRefusedError"), lines
    for line in lines[1:]:
        host, error, errno, seconds = line.split()
        assert error == "OSError" and int(errno) == 101, line  # ENETUNREACH: no route at all
        assert float(seconds) < 1.0, line  # refused at once, not a timeout


@needs_namespaces
def test_a_service_in_the_sandbox_is_reachable_through_its_env_variable(area):
    code = (
        "import os, urllib.request\n"
        "print(urllib.request.urlopen(os.environ['ECHO_URL'], timeout=5).read().decode())\n"
    )
    service = Service(ECHO_SERVICE, {"body": ECHO_BODY}, env="ECHO_URL")
    result = run([py(code)], area / "work", services=[service], require=("netns",))
    assert only(result).kind == "ok", only(result).output
    assert only(result).output == ECHO_BODY + "\n"
    assert list(result.services) == ["ECHO_URL"]
    assert result.services["ECHO_URL"].startswith("http://127.0.0.1:")


def test_a_service_that_fails_to_start_is_a_session_error(area):
    service = Service("tests.common.test_command_sandbox:no_such_service")
    result = run([py("print(1)")], area / "work", services=[service])
    assert result.error and "no_such_service" in result.error and "\n" not in result.error
    assert [c.kind for c in result.commands] == ["not_run"]
    assert not result.ok


# ------------------------------------------------------------------------------- time and memory


def test_a_hanging_command_times_out_and_the_session_returns(area):
    limits = CommandLimits(wall_seconds=2, cpu_seconds=20, memory_mb=1024)
    start = time.monotonic()
    result = run([py("print('started', flush=True); import time; time.sleep(60)"), py("print(1)")],
                 area / "work", limits=limits)
    elapsed = time.monotonic() - start
    hung, skipped = result.commands
    assert (hung.kind, hung.returncode) == ("timeout", None)
    assert hung.output.startswith("started\n") and "wall-clock limit of 2s" in hung.output
    assert 1.5 <= hung.seconds < 6
    assert skipped.kind == "not_run"
    assert elapsed < 10


def test_the_cpu_limit_ends_a_busy_command_as_a_timeout(area):
    limits = CommandLimits(wall_seconds=20, cpu_seconds=1, memory_mb=1024)
    result = run([py("while True: pass")], area / "work", limits=limits)
    command = only(result)
    assert (command.kind, command.returncode) == ("timeout", None)
    assert "CPU time limit" in command.output
    assert command.seconds < 10


@needs_namespaces
def test_a_daemonised_grandchild_dies_with_its_command(area):
    marker = area / "work" / "marker.txt"
    grandchild = f"import time; time.sleep(3); open({str(marker)!r}, 'w').write('alive')"
    code = (
        "import subprocess, sys\n"
        f"subprocess.Popen([sys.executable, '-c', {grandchild!r}], start_new_session=True,\n"
        "                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)\n"
        "print('spawned')\n"
    )
    start = time.monotonic()
    result = run([py(code)], area / "work")
    assert only(result).kind == "ok" and only(result).output == "spawned\n"
    assert "pidns" in result.layers
    assert time.monotonic() - start < 3  # it did not wait for the grandchild
    time.sleep(5)
    assert not marker.exists()


def test_allocating_beyond_the_memory_limit_fails(area):
    limits = CommandLimits(wall_seconds=20, cpu_seconds=20, memory_mb=256)
    result = run([py("x = bytearray(1 << 30); print('allocated')")], area / "work", limits=limits)
    command = only(result)
    assert command.kind == "failed" and command.returncode == 1
    assert "MemoryError" in command.output and "allocated" not in command.output


def test_output_beyond_the_cap_keeps_its_head_and_tail(area):
    limits = CommandLimits(wall_seconds=20, cpu_seconds=20, max_output_bytes=100_000)
    code = (
        "import sys\n"
        "sys.stdout.write('HEAD-MARK\\n' + 'a' * 3_000_000 + '\\nTAIL-MARK\\n')\n"
    )
    command = only(run([py(code)], area / "work", limits=limits))
    assert command.kind == "ok"
    total = len("HEAD-MARK\n") + 3_000_000 + len("\nTAIL-MARK\n")
    assert command.output.startswith("HEAD-MARK\naaaa")
    assert command.output.endswith("aaaa\nTAIL-MARK\n")
    assert f"\n[... {total - 100_000} bytes dropped ...]\n" in command.output
    assert 100_000 <= len(command.output) <= 100_100


def test_a_command_that_floods_its_pipe_is_read_while_it_runs(area):
    # 5 MB through the pipe before the command exits: it would block forever if nobody read.
    code = "import sys; [sys.stdout.write('x' * 1000 + '\\n') for _ in range(5000)]; print('end')"
    command = only(run([py(code)], area / "work"))
    assert command.kind == "ok" and command.output.endswith("end\n")


# ----------------------------------------------------------------------------- the use case


def test_a_virtualenv_made_in_the_workdir_runs(area):
    work = area / "work"
    argvs = [
        [PY, "-m", "venv", "--without-pip", "venv"],
        ["venv/bin/python", "-c", "import sys; print(sys.prefix)"],
        ["python", "-c", "import sys; print(sys.executable)"],
    ]
    result = run(argvs, work, path_prepend=[work / "venv" / "bin"])
    made, ran, on_path = result.commands
    assert made.kind == "ok", made.output
    assert ran.kind == "ok", ran.output
    assert ran.output == f"{os.path.realpath(work / 'venv')}\n"
    assert on_path.output == f"{os.path.realpath(work)}/venv/bin/python\n"
    assert result.ok


@needs_root
def test_a_workdir_below_a_private_folder_is_reachable_and_its_siblings_are_not(tmp_path):
    private = tmp_path / "private"
    private.mkdir(mode=0o700)  # nobody cannot traverse it
    (private / "work").mkdir()
    (private / "sibling.txt").write_text("sibling")
    (private / "sibling.txt").chmod(0o644)
    code = (
        "import os\n"
        "open('made.txt', 'w').write('ok')\n"
        f"print(os.path.exists({str(private / 'sibling.txt')!r}))\n"
    )
    result = run([py(code)], private / "work")
    assert only(result).kind == "ok", only(result).output
    assert only(result).output == "False\n"  # only the work folder is put back below `private`
    assert (private / "work" / "made.txt").read_text() == "ok"
    assert (private / "sibling.txt").read_text() == "sibling"
    assert stat_mode(private) == 0o700  # nothing on the host changed


def stat_mode(path: Path) -> int:
    return os.stat(path).st_mode & 0o7777


@needs_namespaces
def test_the_hosts_mounts_and_shared_memory_are_left_alone(area):
    mounts_before = Path("/proc/self/mountinfo").read_text()
    name = f"lmforge-cs-{os.getpid()}"
    code = (
        "import multiprocessing, os\n"
        "lock = multiprocessing.Lock()\n"  # a POSIX semaphore in /dev/shm
        f"open('/dev/shm/{name}', 'w').write('x')\n"
        "pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())\n"
        "print(len(pids) < 5, pids[:1])\n"
    )
    result = run([py(code)], area / "work")
    assert only(result).kind == "ok", only(result).output
    assert only(result).output == "True [1]\n"  # a fresh /proc: this namespace's processes only
    assert not os.path.exists(f"/dev/shm/{name}")
    assert Path("/proc/self/mountinfo").read_text() == mounts_before


# ----------------------------------------------------------------------------------- caller errors


def test_caller_mistakes_raise_user_errors(area):
    work = area / "work"
    with pytest.raises(UserError, match="unknown sandbox layer"):
        run_commands([["true"]], work, require=("netns", "seccomp"))
    with pytest.raises(UserError, match="not a string"):
        run_commands([["true"]], work, require="netns")
    with pytest.raises(UserError, match="must not be empty"):
        run_commands([[]], work)
    with pytest.raises(UserError, match="list of strings"):
        run_commands([["echo", 1]], work)
    with pytest.raises(UserError, match="list of strings"):
        run_commands(["echo hi"], work)
    with pytest.raises(UserError, match="missing or not a folder"):
        run_commands([["true"]], area / "missing")
    (area / "file").write_text("")
    with pytest.raises(UserError, match="missing or not a folder"):
        run_commands([["true"]], area / "file")
    with pytest.raises(UserError, match="outside the sandbox's work folder"):
        run_commands([["true"]], work, cwd="..")
    with pytest.raises(UserError, match="package.module:callable"):
        run_commands([["true"]], work, services=[Service("os.system")])
    with pytest.raises(UserError, match="JSON-serialisable"):
        run_commands([["true"]], work, services=[Service("a.b:c", {"x": object()})])
    with pytest.raises(UserError, match="env"):
        run_commands([["true"]], work, env={"A=B": "1"})
    assert list(work.iterdir()) == []  # nothing was created or run before the check


@pytest.mark.parametrize(
    "field, value",
    [("wall_seconds", 0), ("cpu_seconds", float("nan")), ("memory_mb", -1), ("file_mb", "1"),
     ("processes", True), ("max_output_bytes", float("inf"))],
)  # fmt: skip
def test_bad_limits_raise_user_errors(field, value):
    with pytest.raises(UserError, match=f"CommandLimits.{field}"):
        CommandLimits(**{field: value})


def test_session_ok_needs_no_error_and_every_command_ok():
    ok = CommandResult(["a"], "ok", 0, "", 0.1)
    failed = CommandResult(["b"], "failed", 1, "", 0.1)
    assert SessionResult([ok], ("rlimits",), {}).ok
    assert SessionResult([], (), {}).ok
    assert not SessionResult([ok, failed], ("rlimits",), {}).ok
    assert not SessionResult([CommandResult(["c"], "not_run", None, "", 0.0)], (), {}, None).ok
    assert not SessionResult([], (), {}, error="no network namespace").ok


def _without_sys_admin() -> None:
    """preexec_fn: drop CAP_SYS_ADMIN from the bounding set, so the exec'd root process lacks it."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(24, 21, 0, 0, 0) != 0:  # PR_CAPBSET_DROP, CAP_SYS_ADMIN
        raise OSError(ctypes.get_errno(), "PR_CAPBSET_DROP")


@needs_root
def test_a_missing_required_layer_runs_nothing(area):
    # A root caller without CAP_SYS_ADMIN gets no namespace: with require=("netns",) nothing runs.
    marker = area / "work" / "ran"
    script = (
        "import json, sys\n"
        "from lmforge.common.command_sandbox import run_commands\n"
        "r = run_commands([['touch', sys.argv[1]], ['true']], sys.argv[2], require=('netns',))\n"
        "print(json.dumps({'error': r.error, 'layers': r.layers, 'ok': r.ok,\n"
        "                  'kinds': [c.kind for c in r.commands]}))\n"
    )
    env = {"PATH": os.defpath, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run(
        [PY, "-c", script, str(marker), str(area / "work")], capture_output=True, text=True,
        timeout=60, preexec_fn=_without_sys_admin, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert result["error"] == (
        "the command sandbox needs a network namespace (root or CAP_SYS_ADMIN); "
        "this machine refused it"
    )
    assert result["kinds"] == ["not_run", "not_run"] and result["ok"] is False
    assert "netns" not in result["layers"] and "pidns" not in result["layers"]
    assert not marker.exists()


@needs_namespaces
def test_every_layer_is_up_as_root_with_landlock(area):
    result = run([["true"]], area / "work", require=COMMAND_LAYERS if LANDLOCK_ABI else ("netns",))
    expected = {"rlimits", "pidns", "netns", "uid"} | ({"landlock"} if LANDLOCK_ABI else set())
    assert set(result.layers) == expected and result.ok


def test_namespaces_available_agrees_with_a_session(tmp_path):
    # the probe callers use to skip must say what a real session then reports
    result = run_commands([[PY, "-c", "pass"]], tmp_path, require=())
    assert namespaces_available() == {"pidns", "netns"}.issubset(result.layers)


@needs_root
@needs_namespaces
def test_a_link_planted_at_the_working_folder_is_not_followed(tmp_path):
    # command 1 swaps a parent of the working folder for a link to /usr; command 2 must not start
    # in /usr/bin (Popen's own chdir would have followed it as root; the child now enters the
    # folder as nobody and checks it is still beneath the work folder)
    (tmp_path / "a" / "bin").mkdir(parents=True)
    swap = (f"import os; w = {str(tmp_path)!r}; os.rename(os.path.join(w, 'a'), os.path.join(w, 'a_old')); "
            "os.symlink('/usr', os.path.join(w, 'a'))")
    result = run_commands([[PY, "-c", swap], [PY, "-c", "import os; print('cwd=' + os.getcwd())"]],
                          tmp_path, cwd="a/bin", stop_on_failure=False)
    assert result.commands[0].kind == "ok", result.commands[0].output
    second = result.commands[1]
    assert second.kind == "failed" and second.returncode == 126, second
    assert "cwd=" not in second.output
