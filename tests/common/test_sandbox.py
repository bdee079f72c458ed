"""Tests for lmforge.common.sandbox: every misbehaviour ends in a SandboxResult, the caller goes on.

Several tests reach the real ``os`` module through object introspection (``ESCAPE``), the classic
way out of a restricted namespace, to show that the layers below the namespace (audit hook, kernel)
still hold when the namespace layer is bypassed.
"""

from __future__ import annotations

import dis
import json
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
import uuid
from dataclasses import dataclass
from concurrent.futures import ThreadPoolExecutor
from textwrap import dedent

import pytest

import lmforge
from lmforge.common import sandbox as sb
from lmforge.common.errors import UserError
from lmforge.common.sandbox import (
    DEFAULT_ALLOWED_IMPORTS,
    KINDS,
    SandboxLimits,
    SandboxResult,
    run_sandboxed,
)

LIMITS = SandboxLimits(cpu_seconds=2, wall_seconds=5, memory_mb=128, max_output_bytes=10_000)
PRELUDE = "tests.common.sandbox_prelude_fixture"
SRC = os.path.dirname(os.path.dirname(os.path.abspath(lmforge.__file__)))

# Finds the real os module's globals from inside the sandbox without importing anything.
ESCAPE = """\
def real_os():
    for cls in ().__class__.__base__.__subclasses__():
        if cls.__name__ == "_wrap_close":
            return cls.__init__.__globals__
"""

IS_LINUX_ROOT = sys.platform == "linux" and os.geteuid() == 0
KERNEL_LAYERS = IS_LINUX_ROOT and os.uname().machine in ("x86_64", "aarch64")
needs_kernel_layers = pytest.mark.skipif(
    not KERNEL_LAYERS, reason="kernel layers need Linux (x86_64/aarch64) and root"
)


def _netns_allowed() -> bool:
    """Whether this machine lets root create a network namespace (some containers forbid it)."""
    if not IS_LINUX_ROOT:
        return False
    probe = "import ctypes, sys; sys.exit(ctypes.CDLL(None, use_errno=True).unshare(0x40000000) != 0)"
    return subprocess.run([sys.executable, "-I", "-c", probe], timeout=30).returncode == 0


NETNS = _netns_allowed()
# The kernel's Landlock ABI (0: none): the "landlock" layer is expected exactly when it is >= 1.
LANDLOCK_ABI = sb._landlock_abi()
needs_landlock = pytest.mark.skipif(
    LANDLOCK_ABI < 1, reason="this kernel offers no Landlock (older than 5.13, or disabled)"
)


def run(code: str, entry: str = "main", args: dict | None = None, **kw) -> SandboxResult:
    kw.setdefault("limits", LIMITS)
    return run_sandboxed(dedent(code), entry, args or {}, **kw)


def escaping(code: str) -> str:
    """``code`` with the ``real_os()`` helper prepended."""
    return ESCAPE + dedent(code)


def line_of(code: str, snippet: str) -> str:
    """``"(line N)"`` for the first line of ``code`` that contains ``snippet``."""
    lines = dedent(code).splitlines()
    return next(f"(line {i})" for i, text in enumerate(lines, 1) if snippet in text)


def assert_failed(result: SandboxResult, kind: str, *needles: str) -> None:
    """Not ok, no value, the expected kind, a one-line error that mentions every needle."""
    assert result.kind == kind, result
    assert result.ok is False and result.value is None
    assert result.error and "\n" not in result.error
    for needle in needles:
        assert needle in result.error, result.error


def run_python(script: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-I", "-c", dedent(script)], capture_output=True, text=True, timeout=30
    )


# ---------------------------------------------------------------------------------------------- ok


def test_normal_path_returns_the_json_value_and_stdout():
    code = """
        import json, re
        def main(a, b):
            print('sum is', a + b)
            return {'sum': a + b, 'words': re.findall(r'\\w+', json.dumps([a, b]))}
    """
    result = run(code, args={"a": 2, "b": 3})
    value = {"sum": 5, "words": ["2", "3"]}
    assert result == SandboxResult(True, value, None, "sum is 5\n", "ok", result.layers)
    assert result.kind in KINDS


def test_dataclasses_and_typing_work_in_the_sandbox():
    code = """
        from dataclasses import dataclass, asdict
        from typing import List
        @dataclass
        class Item:
            name: str
            n: int = 1
        def main(names: List[str]):
            return [asdict(Item(x)) for x in names]
    """
    assert run(code, args={"names": ["a", "b"]}).value == [{"name": "a", "n": 1}, {"name": "b", "n": 1}]


def test_writing_inside_the_sandbox_folder_works_and_the_folder_is_removed():
    code = escaping("""
        def main():
            with open('notes.txt', 'w') as f:
                f.write('kept')
            with open('notes.txt') as f:
                return [f.read(), real_os()['getcwd']()]
    """)
    result = run(code)
    assert result.ok, result
    text, folder = result.value
    assert text == "kept"
    assert os.path.realpath(folder).startswith(os.path.realpath(tempfile.gettempdir()))
    assert not os.path.exists(folder)  # removed after the run


def test_prelude_names_and_hooks():
    code = """
        def main(p, k):
            print(type(p).__name__)
            return scale(p, k)
    """
    result = run(code, args={"p": {"x": 1.0, "y": 2.0}, "k": 3}, prelude=PRELUDE)
    assert result.ok, result
    assert result.stdout == "Point\n"  # sandbox_decode built the Point
    assert result.value == {"x": 3.0, "y": 6.0, "encoded_by": "main"}  # sandbox_encode ran


def test_only_the_prelude_whitelisted_names_are_in_scope():
    result = run("def main():\n    return NOT_EXPORTED", prelude=PRELUDE)
    assert_failed(result, "error", "NameError", "NOT_EXPORTED")


def test_parent_environment_is_not_visible(monkeypatch):
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-secret")
    result = run(escaping("def main():\n    return dict(real_os()['environ'])"))
    assert result.ok, result
    assert "OPENAI_API_KEY" not in result.value
    assert "sk-test-secret" not in json.dumps(result.value)
    assert set(result.value) <= {"PATH", "LANG", "LC_ALL", "HOME", "TMPDIR"}


def test_concurrent_runs_do_not_interfere():
    def square(i: int) -> SandboxResult:
        return run("def main(i):\n    return i * i", args={"i": i})

    with ThreadPoolExecutor(3) as pool:
        results = list(pool.map(square, range(3)))
    assert [r.value for r in results] == [0, 1, 4]


@needs_kernel_layers
def test_all_layers_are_active_here():
    result = run("def main():\n    return 1")
    assert result.ok
    expected = {"rlimits", "uid", "seccomp", "audit"} | ({"netns"} if NETNS else set())
    expected |= {"landlock"} if LANDLOCK_ABI >= 1 else set()
    assert set(result.layers) == expected


@needs_landlock
def test_landlock_is_listed_in_the_layers_here():
    result = run("def main():\n    return 1")
    assert result.ok, result
    assert "landlock" in result.layers
    # the kernel layers close in this order, Landlock before seccomp, the audit hook last
    assert result.layers[-1] == "audit"
    if "seccomp" in result.layers:
        assert result.layers.index("landlock") < result.layers.index("seccomp")


# ------------------------------------------------------------------------------- errors in the code


def test_exception_becomes_one_line_with_the_line_number():
    result = run("def main():\n    x = 1\n    return x / 0\n")
    assert_failed(result, "error", "ZeroDivisionError: division by zero", "(line 3)")


def test_multi_line_exception_message_is_one_line():
    code = "class E(Exception):\n    pass\ndef main():\n    raise E('first\\nsecond')"
    assert_failed(run(code), "error", "E: first / second", "(line 4)")


def test_syntax_error_and_missing_entry_are_results_not_exceptions():
    assert_failed(run("def main(:\n    pass"), "error", "SyntaxError", "(line 1)")
    assert_failed(run("def other():\n    return 1"), "error", "NameError", "'main'")
    assert_failed(run("main = 3"), "error", "not callable")


def test_non_json_return_value_is_an_error():
    assert_failed(run("def main():\n    return {1, 2}"), "error", "JSON", "set")


def test_child_stderr_becomes_a_one_line_error():
    # The prelude's crash() writes a traceback to stderr and exits without a report.
    result = run("def main():\n    crash()", prelude=PRELUDE)
    assert_failed(result, "killed", "RuntimeError: prelude crashed on purpose")


def test_exit_without_a_result_is_reported():
    result = run(escaping("def main():\n    real_os()['_exit'](0)"))
    assert_failed(result, "killed", "without a result")


# ------------------------------------------------------------------------------------ runaway code


def test_infinite_loop_is_stopped_by_the_cpu_limit_and_nothing_is_left():
    code = escaping("""
        def main():
            print(real_os()['getpid'](), flush=True)
            while True:
                pass
    """)
    start = time.monotonic()
    result = run(code, limits=SandboxLimits(cpu_seconds=1, wall_seconds=10))
    assert time.monotonic() - start < 6
    assert_failed(result, "timeout", "CPU time limit of 1s")
    assert line_of(code, "while True") in result.error or line_of(code, "pass") in result.error
    pid = int(result.stdout.split()[0])  # output printed before the loop is kept
    assert not os.path.exists(f"/proc/{pid}")


def test_blocking_code_is_stopped_by_the_wall_clock():
    start = time.monotonic()
    result = run(
        "import time\ndef main():\n    time.sleep(60)",
        allowed_imports=DEFAULT_ALLOWED_IMPORTS | {"time"},
        limits=SandboxLimits(cpu_seconds=5, wall_seconds=1),
    )
    assert time.monotonic() - start < 4
    assert_failed(result, "timeout", "wall-clock limit of 1s")


def test_memory_bomb_is_stopped():
    grow = "def main():\n    hoard = []\n    while True:\n        hoard.append(bytearray(10**7))\n"
    assert_failed(run(grow, limits=SandboxLimits(memory_mb=64)), "memory", "64 MB", "(line 4)")
    assert_failed(run("def main():\n    return len(bytearray(10**11))"), "memory", "MemoryError")


def test_huge_print_output_is_capped():
    code = "def main():\n    for _ in range(3000):\n        print('x' * 1000)\n    return 'done'"
    result = run(code)
    assert result.ok and result.value == "done"
    assert result.stdout.startswith("x" * 1000)
    assert len(result.stdout) < 10_000 + 100
    assert result.stdout.endswith("[sandbox: output truncated at 10000 bytes]")


def test_output_written_around_print_is_capped_by_the_parent():
    code = escaping("""
        def main():
            for _ in range(3000):
                real_os()['write'](1, b'y' * 1000)
            return 1
    """)
    result = run(code)
    assert result.ok
    assert len(result.stdout) < 10_000 + 100 and "truncated" in result.stdout


def test_oversized_result_is_an_error():
    result = run("def main():\n    return 'x' * 5000", limits=SandboxLimits(max_result_bytes=1000))
    assert_failed(result, "error", "larger than 1000 bytes")


# ---------------------------------------------------------------------------------------- forbidden


@pytest.mark.parametrize(
    "module", ["os", "sys", "subprocess", "socket", "ctypes", "importlib", "builtins"]
)
def test_import_outside_the_whitelist_is_refused(module):
    result = run(f"import {module}\ndef main():\n    return 1")
    assert_failed(result, "forbidden", f"import of '{module}' is not allowed", "(line 1)")


def test_refused_import_can_be_caught_for_a_fallback():
    code = """
        def main():
            try:
                import numpy
            except ImportError:
                return 'fallback'
    """
    assert run(code).value == "fallback"


def test_module_smuggled_through_an_allowed_one_is_refused():
    assert_failed(run("from typing import sys\ndef main():\n    return 1"), "forbidden", "'sys'")


@pytest.mark.parametrize(
    "call",
    [
        "eval('1 + 1')",
        "exec('x = 1')",
        "compile('1', 'f', 'eval')",
        "__import__('os')",
        "open('/etc/passwd')",
        "open('../outside.txt', 'w')",
    ],
)
def test_dangerous_builtins_are_restricted(call):
    assert_failed(run(f"def main():\n    return {call}"), "forbidden", "(line 2)")


def test_reading_a_file_outside_is_stopped_even_through_the_real_os_module():
    code = escaping("""
        def main():
            g = real_os()
            fd = g['open']('/etc/passwd', 0)
            return g['read'](fd, 100).decode()
    """)
    assert_failed(run(code), "forbidden", "/etc/passwd", line_of(code, "g['open']"))


def test_symlink_out_of_the_folder_is_refused():
    code = escaping("""
        def main():
            real_os()['symlink']('/etc/passwd', 'link')
            return open('link').read()
    """)
    assert_failed(run(code), "forbidden", "os.symlink")


def test_socket_is_refused_even_when_the_prelude_leaks_the_module():
    code = "def main():\n    s = socket_module.socket()\n    s.connect(('127.0.0.1', 80))"
    assert_failed(run(code, prelude=PRELUDE), "forbidden", "socket", "(line 2)")


def test_fork_bomb_is_refused_and_leaves_no_process():
    code = escaping("""
        def main():
            g = real_os()
            print(g['getpid'](), flush=True)
            while True:
                g['fork']()
    """)
    result = run(code)
    assert_failed(result, "forbidden", "os.fork", line_of(code, "g['fork']"))
    assert not os.path.exists(f"/proc/{int(result.stdout)}")


def test_refusal_cannot_be_caught_by_the_code():
    code = escaping("""
        def main():
            try:
                real_os()['system']('echo hi')
            except BaseException:
                pass
            return 'carried on'
    """)
    assert_failed(run(code), "forbidden", "os.system")


def test_rebinding_builtins_does_not_blind_the_audit_hook():
    code = escaping("""
        def main():
            g = real_os()
            b = g['sys'].modules['builtins']
            b.type = lambda x: int
            b.OSError = KeyError
            g['sys'].modules['json'].dumps = lambda *a, **k: '{"kind": "ok", "value": 1}'
            return g['read'](g['open']('/etc/passwd', 0), 100).decode()
    """)
    assert_failed(run(code), "forbidden", "/etc/passwd")


@needs_kernel_layers
def test_kernel_layers_hold_without_the_audit_hook():
    """The uid drop and the seccomp filter alone stop sockets, fork, exec and reads of /root."""
    own = tempfile.mkstemp(prefix="lmforge-chmod-")[1]
    os.chown(own, 65534, 65534)  # nobody's own file: permissions would allow the chmod
    try:
        _kernel_layers_without_the_hook(own)
    finally:
        os.unlink(own)


def _kernel_layers_without_the_hook(own: str) -> None:
    proc = run_python(f"""
        import sys, os, json, socket, threading, ctypes, signal
        sys.path.insert(0, {SRC!r})
        from lmforge.common import sandbox as sb
        out = {{'layers': [sb._drop_privileges(), sb._install_seccomp()]}}
        def attempt(name, fn):
            try:
                fn()
                out[name] = 'ok'
            except OSError as e:
                out[name] = e.errno
        attempt('socket', socket.socket)
        attempt('fork', os.fork)
        attempt('exec', lambda: os.execv(sys.executable, [sys.executable, '-c', 'pass']))
        attempt('read_root', lambda: os.listdir('/root'))
        attempt('thread', threading.Thread(target=lambda: None).start)
        # No signal handler, no timer, no queued signal; nothing done to another process.
        attempt('handler', lambda: signal.signal(signal.SIGUSR1, lambda *a: None))
        attempt('itimer', lambda: signal.setitimer(signal.ITIMER_REAL, 10))
        nr = {{'x86_64': 129, 'aarch64': 138}}[os.uname().machine]  # rt_sigqueueinfo
        libc = ctypes.CDLL(None, use_errno=True)
        def sigqueue():
            if libc.syscall(nr, NO_PID, 10, None) != 0:
                raise OSError(ctypes.get_errno(), 'rt_sigqueueinfo')
        NO_PID = 4194303  # beyond any pid here: without the filter the answer would be ESRCH
        attempt('sigqueue', sigqueue)
        attempt('kill_other', lambda: os.kill(NO_PID, 0))
        attempt('nice_other', lambda: os.setpriority(os.PRIO_PROCESS, NO_PID, 5))
        attempt('nice_self', lambda: os.setpriority(os.PRIO_PROCESS, 0, 5))
        attempt('affinity_other', lambda: os.sched_setaffinity(NO_PID, {{0}}))
        attempt('affinity_self', lambda: os.sched_setaffinity(0, os.sched_getaffinity(0)))
        attempt('chmod_own_file', lambda: os.chmod({own!r}, 0o600))
        print(json.dumps(out))
    """)
    out = json.loads(proc.stdout)
    assert out["layers"] == [True, True], proc.stderr
    eperm, eacces = 1, 13
    assert (out["socket"], out["fork"], out["exec"]) == (eperm, eperm, eperm)
    assert out["read_root"] == eacces
    assert out["thread"] == "ok"  # threads (clone with CLONE_THREAD) stay allowed by the filter
    assert (out["handler"], out["itimer"], out["sigqueue"]) == (eperm, eperm, eperm)
    assert (out["kill_other"], out["nice_other"], out["affinity_other"]) == (eperm, eperm, eperm)
    assert (out["nice_self"], out["affinity_self"]) == ("ok", "ok")
    assert out["chmod_own_file"] == eperm  # a file nobody owns: only the filter refuses


@pytest.mark.skipif(not NETNS, reason="this machine allows no network namespace")
def test_network_namespace_alone_has_no_route():
    proc = run_python(f"""
        import sys, socket
        sys.path.insert(0, {SRC!r})
        from lmforge.common import sandbox as sb
        assert sb._unshare_network()
        try:
            socket.create_connection(('127.0.0.1', 22), timeout=2)
            print('connected')
        except OSError as e:
            print(e.errno)
    """)
    assert proc.stdout.strip() == "101", proc.stderr  # ENETUNREACH: only a down loopback inside


# ---------------------------------------------------------------------------------- forged results
#
# The result pipe is open in the child while the code runs (its descriptor was once even in
# sys.argv), so code that reaches the real os module can write a report of its own, then stall or
# die so that the wrapper never writes the real one. A timeout or a death must be reported as such
# whatever the pipe holds, and the layers always come from the wrapper's line written before the
# code ran.

FORGE = ESCAPE + """
FORGED = '{"kind": "ok", "value": "forged", "error": null, "layers": ["rlimits", "forged"]}'
def forge():
    o = real_os()
    for fd in range(1, 64):  # the result pipe, whichever descriptor it is
        try:
            o["write"](fd, ("\\n" + FORGED + "\\n").encode())
        except OSError:
            pass
    return o
"""


def forging(body: str) -> str:
    return FORGE + dedent(body)


def test_forged_ok_then_sleep_is_reported_as_the_wall_clock_timeout():
    code = forging("""
        import time
        def main():
            forge()
            time.sleep(60)
    """)
    result = run(code, allowed_imports=DEFAULT_ALLOWED_IMPORTS | {"time"},
                 limits=SandboxLimits(cpu_seconds=5, wall_seconds=1))
    assert_failed(result, "timeout", "wall-clock limit of 1s")
    assert "forged" not in result.layers


def test_forged_ok_then_sigxcpu_blocked_is_reported_as_the_cpu_timeout():
    # With SIGXCPU masked the wrapper's handler never runs: the hard limit's SIGKILL ends it.
    code = forging("""
        def main():
            o = forge()
            sig = o["sys"].modules["signal"]
            sig.pthread_sigmask(sig.SIG_BLOCK, {sig.SIGXCPU})
            while True:
                pass
    """)
    result = run(code, limits=SandboxLimits(cpu_seconds=1, wall_seconds=10))
    assert_failed(result, "timeout", "CPU time limit of 1s")


def test_forged_ok_then_a_failing_exit_is_reported_as_killed():
    result = run(forging("def main():\n    forge()['_exit'](3)"))
    assert_failed(result, "killed")  # its error is the last stderr line: the forger wrote it there too
    assert "forged" not in result.layers


def test_forged_layers_are_never_reported():
    # Ending with status 0 after writing a report is the same as returning that value (the code
    # chooses its value either way), but the layers are the wrapper's, measured before it ran.
    genuine = run("def main():\n    return 1").layers
    assert genuine and "audit" in genuine
    result = run(forging("def main():\n    forge()['_exit'](0)"))
    assert result.layers == genuine, result
    result = run(forging("def main():\n    forge()\n    return 'real'"))
    assert (result.kind, result.value, result.layers) == ("ok", "real", genuine)


# ------------------------------------------------------------------ escapes found in a security review
#
# Each route below once let code disable the audit hook or slip past its path check, and read or
# write files outside the sandbox. Each runs three ways: all layers; the audit hook without Landlock
# (through a test prelude that switches Landlock off before the sandbox closes); Landlock without
# the audit hook. A file the test owns outside the sandbox, readable and writable by anyone (so the
# uid drop alone does not protect it), must stay unread and untouched.

SECRET = "lmforge-secret-" + uuid.uuid4().hex

# Helpers that run in the sandbox: the reviewer's attacks on the hook, then the looting.
ATTACK = ESCAPE + '''
def tamper(frame, out, tmp, walk=True):
    """What worked on the old hook: flip a report-once flag, poison closure cells or defaults."""
    while frame is not None:
        if frame.f_code.co_name in ("hook", "check", "refuse", "realpath", "as_path", "inside"):
            for name, value in list(frame.f_locals.items()):
                if type(value) is list and len(value) == 1 and type(value[0]) is bool:
                    value[0] = True
                    out["flag"] = True
                for cell in getattr(value, "__closure__", None) or ():
                    target = getattr(cell.cell_contents, "__name__", "")
                    if target == "realpath":
                        cell.cell_contents = lambda *a: tmp + "/x"
                        out["cell"] = True
                    elif target == "inside":
                        cell.cell_contents = lambda *a: True
                        out["cell"] = True
                if name == "as_path" and getattr(value, "__defaults__", None):
                    value.__defaults__ = (lambda *a: tmp + "/x",) + value.__defaults__[1:]
                    out["defaults"] = True
        frame = frame.f_back if walk else None


def loot(o, secret, marker, out):
    print(repr(out), flush=True)  # what was found so far leaves even if the next step is refused
    try:
        fd = o["open"](secret, o["O_RDONLY"])
        out["secret"] = o["read"](fd, 200).decode()
    except OSError as e:
        out["secret"] = e.errno
    try:
        fd = o["open"](marker, o["O_WRONLY"] | o["O_TRUNC"])
        o["write"](fd, b"overwritten")
        out["marker"] = "written"
    except OSError as e:
        out["marker"] = e.errno
    try:
        o["close"](o["open"](marker + ".new", o["O_WRONLY"] | o["O_CREAT"], 0o666))
        out["created"] = True
    except OSError as e:
        out["created"] = e.errno
    return repr(out)
'''

ESCAPES = {
    # (a) an exception escaping the hook (its cwd removed) left the hook's frames in a traceback
    "a_exception_from_a_removed_cwd": '''
def main(secret, marker):
    o, out = real_os(), {}
    tmp = o["getcwd"]()
    o["mkdir"]("d"); o["chdir"]("d"); o["rmdir"]("../d")
    try:
        o["open"]("x", 0)
    except BaseException as e:
        out["escaped"] = True
        tb = e.__traceback__
        while tb is not None:
            tamper(tb.tb_frame, out, tmp, walk=False)
            tb = tb.tb_next
    o["chdir"](tmp)
    return loot(o, secret, marker, out)
''',
    # (a) the same with a RecursionError raised inside the hook
    "a_recursion_error_inside_the_hook": '''
def main(secret, marker):
    o, out = real_os(), {}
    tmp, op = o["getcwd"](), o["open"]
    def deep(n):
        try:
            return deep(n + 1)
        except RecursionError:
            try:
                op("zz", 0)
            except RecursionError as e:
                tb = e.__traceback__
                while tb is not None:
                    tamper(tb.tb_frame, out, tmp, walk=False)
                    tb = tb.tb_next
            except OSError:
                pass
            return 0
    deep(0)
    return loot(o, secret, marker, out)
''',
    # (b) a SIGALRM handler runs inside the hook's frames
    "b_signal_handler_inside_the_hook": '''
def main(secret, marker):
    o, out = real_os(), {}
    tmp, sig = o["getcwd"](), o["sys"].modules["signal"]
    try:
        sig.signal(sig.SIGALRM, lambda signum, frame: tamper(frame, out, tmp))
        out["handler"] = "installed"
    except OSError as e:
        out["handler"] = e.errno
    try:
        sig.setitimer(sig.ITIMER_REAL, 0.0001, 0.0001)
        out["timer"] = "armed"
    except OSError as e:
        out["timer"] = e.errno
    print(out["handler"], out["timer"], flush=True)
    for _ in range(3000):
        o["close"](o["open"]("inside.txt", o["O_CREAT"] | o["O_WRONLY"]))
    return loot(o, secret, marker, out)
''',
    # (c) a gc finalizer runs inside the hook's frames
    "c_gc_finalizer_inside_the_hook": '''
def main(secret, marker):
    o, out = real_os(), {}
    tmp, getframe = o["getcwd"](), o["sys"]._getframe
    gc = o["sys"].modules["builtins"].__import__("gc")
    class Bomb:
        def __del__(self):
            tamper(getframe(1), out, tmp)
    gc.set_threshold(1, 1000, 1000)
    for _ in range(300):
        for _ in range(20):
            a = Bomb()
            a.self = a  # cyclic garbage: freed by the collector, wherever it happens to run
        del a
        o["close"](o["open"]("inside.txt", o["O_CREAT"] | o["O_WRONLY"]))
    return loot(o, secret, marker, out)
''',
    # (d) paths the hook resolved differently from the kernel: relative to a directory fd (the
    # "open" event has no dir_fd), a relative symlink target (from the cwd, not the link's
    # folder), and a folder renamed (by a signal handler) between the hook's check and the open
    "d_toctou_dir_fd_symlink_and_rename": '''
def main(secret, marker):
    o, out = real_os(), {}
    tmp = o["getcwd"]()
    up = tmp.count("/") + 1
    o["makedirs"]("a/" * up); o["mkdir"]("X"); o["mkdir"]("D")
    o["close"](o["open"]("D/file", o["O_CREAT"] | o["O_WRONLY"]))
    o["chdir"]("a/" * up)
    target = "../" * up + secret.lstrip("/")  # seen from the cwd: inside; from tmp or X/: the secret
    try:
        dfd = o["open"](tmp, o["O_RDONLY"] | o["O_DIRECTORY"])
        out["via_dir_fd"] = o["read"](o["open"](target, o["O_RDONLY"], dir_fd=dfd), 200).decode()
    except OSError as e:
        out["via_dir_fd"] = e.errno
    try:
        o["symlink"](target, tmp + "/X/file")
        out["link"] = "made"
    except OSError as e:
        out["link"] = e.errno
    o["chdir"](tmp)
    sig, state = o["sys"].modules["signal"], {"swapped": False}
    def swap(signum, frame):
        if not state["swapped"] and frame is not None and frame.f_code.co_name == "inside":
            o["rename"]("D", "D_old"); o["rename"]("X", "D")
            state["swapped"] = True
    try:
        sig.signal(sig.SIGALRM, swap)
        sig.setitimer(sig.ITIMER_REAL, 0.00005, 0.00005)
    except OSError as e:
        out["timer"] = e.errno
    data = b""
    for _ in range(20000):
        if state["swapped"]:
            break
        fd = o["open"]("D/file", o["O_RDONLY"])
        data = o["read"](fd, 200)
        o["close"](fd)
    out["via_race"] = data.decode()
    try:
        out["via_link"] = o["read"](o["open"](tmp + "/X/file", 0), 200).decode()
    except OSError as e:
        out["via_link"] = e.errno
    return loot(o, secret, marker, out)
''',
}


@dataclass
class Outside:
    folder: str
    secret: str
    marker: str


@pytest.fixture
def outside():
    """A folder outside the sandbox that anyone may read and write, with a secret and a marker."""
    folder = tempfile.mkdtemp(prefix="lmforge-outside-")
    os.chmod(folder, 0o777)
    paths = Outside(folder, os.path.join(folder, "secret.txt"), os.path.join(folder, "marker.txt"))
    for path, text, mode in ((paths.secret, SECRET, 0o644), (paths.marker, "untouched", 0o666)):
        with open(path, "w") as f:
            f.write(text)
        os.chmod(path, mode)
    yield paths
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def layers_off(tmp_path, monkeypatch):
    """``layers_off("landlock")`` -> a prelude that switches those layers off in the child.

    A prelude is trusted code imported before the sandbox closes, so it can stand in for a machine
    without Landlock, or let Landlock be tested without the audit hook ("audit" stays listed).
    """

    def make(*names: str) -> str | None:
        if not names:
            return None
        module = "lmforge_test_off_" + "_".join(sorted(names))
        lines = ["import lmforge.common.sandbox as sb"]
        if "landlock" in names:
            lines.append("sb._landlock_ruleset = lambda tmp, roots: None")
        if "audit" in names:
            lines.append("sb._make_audit_hook = lambda tmp, roots, channel: (lambda e, a: None)")
        (tmp_path / f"{module}.py").write_text("\n".join(lines) + "\n")
        monkeypatch.syspath_prepend(str(tmp_path))
        return module

    return make


def assert_confined(result: SandboxResult, paths: Outside) -> None:
    seen = json.dumps([result.value, result.error, result.stdout])
    assert SECRET not in seen, result
    with open(paths.marker) as f:
        assert f.read() == "untouched", result
    assert sorted(os.listdir(paths.folder)) == ["marker.txt", "secret.txt"], result


VARIANTS = {
    "all_layers": (),
    "hook_without_landlock": ("landlock",),
    "landlock_without_hook": ("audit",),
}


def test_control_without_landlock_and_hook_the_outside_files_are_open(outside, layers_off):
    """The setup is meaningful: nothing else (the uid drop included) protects these files."""
    code = ATTACK + "def main(secret, marker):\n    return loot(real_os(), secret, marker, {})"
    args = {"secret": outside.secret, "marker": outside.marker}
    result = run(code, args=args, prelude=layers_off("landlock", "audit"))
    assert result.ok, result
    assert SECRET in result.value and "'marker': 'written'" in result.value


@pytest.mark.parametrize("variant", VARIANTS)
@pytest.mark.parametrize("route", ESCAPES)
def test_escape_routes_stay_confined(route, variant, outside, layers_off):
    if variant == "landlock_without_hook" and LANDLOCK_ABI < 1:
        pytest.skip("this kernel offers no Landlock")
    off = VARIANTS[variant]
    args = {"secret": outside.secret, "marker": outside.marker}
    result = run(ATTACK + ESCAPES[route], args=args, prelude=layers_off(*off))
    assert_confined(result, outside)
    assert ("landlock" in result.layers) == (LANDLOCK_ABI >= 1 and "landlock" not in off), result
    if "audit" not in off:
        # the hook ends the process at the first attempt, whatever the route did to it before
        assert result.kind == "forbidden", result
    else:
        # Landlock alone: the kernel answers EACCES and the code carries on, empty-handed
        assert result.ok, result
        for key in ("secret", "marker", "created"):
            assert f"'{key}': 13" in result.value, result.value
        if route.startswith("d_"):
            assert "'via_dir_fd': 13" in result.value and "'via_link': 13" in result.value
    if route.startswith("b_") and "seccomp" in result.layers:
        assert result.stdout.startswith("1 1\n"), result  # EPERM: no handler, no timer


@needs_landlock
def test_landlock_alone_allows_the_folder_and_the_read_roots(layers_off):
    code = ATTACK + '''
def main():
    o, out = real_os(), {}
    def attempt(name, fn):
        try:
            fn()
            out[name] = "ok"
        except OSError as e:
            out[name] = e.errno
    def write_inside():
        o["mkdir"]("sub")
        fd = o["open"]("sub/a.txt", o["O_CREAT"] | o["O_WRONLY"] | o["O_TRUNC"])
        o["write"](fd, b"x")
        o["close"](fd)
        o["rename"]("sub/a.txt", "b.txt")  # across folders: needs REFER beneath the folder
        o["remove"]("b.txt")
    attempt("inside", write_inside)
    package_file = o["sys"].modules["lmforge.common.sandbox"].__file__
    attempt("package", lambda: o["read"](o["open"](package_file, 0), 9))
    attempt("dev_null", lambda: o["write"](o["open"]("/dev/null", o["O_WRONLY"]), b"x"))
    attempt("list_root", lambda: o["listdir"]("/"))
    attempt("proc_environ", lambda: o["read"](o["open"]("/proc/self/environ", 0), 9))
    beside = o["path"].dirname(o["getcwd"]()) + "/lmforge-x"  # the folder's parent: /tmp
    attempt("write_tmp", lambda: o["open"](beside, o["O_CREAT"] | o["O_WRONLY"]))
    return out
'''
    result = run(code, prelude=layers_off("audit"))
    assert result.ok and "landlock" in result.layers, result
    assert result.value == {
        "inside": "ok", "package": "ok", "dev_null": "ok",
        "list_root": 13, "proc_environ": 13, "write_tmp": 13,
    }  # fmt: skip


def test_directories_cannot_be_opened_but_plain_open_says_so_kindly():
    code = escaping("""
        def main():
            try:
                open('.')
            except IsADirectoryError:
                pass
            g = real_os()
            return g['open']('.', g['O_RDONLY'])
    """)
    assert_failed(run(code), "forbidden", "directories cannot be opened", line_of(code, "g['open']"))


def test_links_are_refused_even_inside_the_folder():
    code = escaping("""
        def main():
            g = real_os()
            g['close'](g['open']('a.txt', g['O_CREAT'] | g['O_WRONLY']))
            g['link']('a.txt', 'b.txt')
    """)
    assert_failed(run(code), "forbidden", "os.link")


def test_the_hook_keeps_no_state_that_its_frames_could_change():
    """No globals, no closure cells (but its own ``busy``), only immutable defaults."""
    hook = sb._make_audit_hook("/nonexistent-sandbox", ("/usr",), sb._Channel(1, ["audit"]))
    names = hook.__code__.co_varnames[: hook.__code__.co_argcount]
    defaults = dict(zip(names[-len(hook.__defaults__) :], hook.__defaults__))
    own = defaults["own"]
    assert hook.__code__.co_freevars == ("busy",) and hook.__kwdefaults__ is None
    assert {fn.__name__ for fn in own} == {
        "realpath", "as_path", "inside", "json_escape", "refuse", "describe", "check", "hook",
    }  # fmt: skip
    immutable = (str, bytes, int, bool, float, type(None), tuple, frozenset, type, type(len),
                 type(str.join), type(os.stat_result.__repr__))  # fmt: skip
    for fn in own:
        ops = {ins.opname for ins in dis.get_instructions(fn)}
        assert not ops & {"LOAD_GLOBAL", "LOAD_NAME", "STORE_GLOBAL", "LOAD_CLASSDEREF"}, fn
        if fn is not hook:
            assert fn.__closure__ is None and fn.__kwdefaults__ is None, fn
        for value in fn.__defaults__ or ():
            items = value if isinstance(value, (tuple, frozenset)) else (value,)
            for item in items:
                assert isinstance(item, immutable) or item in own or item is None, (fn, item)


def test_lazily_loaded_codecs_work_after_the_uid_drop():
    code = """
        def main():
            return ['é'.encode('cp1252').hex(), 'bücher.de'.encode('idna').decode(),
                    'é'.encode('utf-16').hex(), 'é'.encode('utf-32-le').hex()]
    """
    assert run(code).value == ["e9", "xn--bcher-kva.de", "fffee900", "e9000000"]


def test_minions_chunk_size_is_the_default_of_every_sized_chunker():
    code = """
        def main(doc):
            chunkers = (chunk_by_section, chunk_by_size, chunk_by_heading)
            return [[len(c) for c in f(doc)] for f in chunkers]
    """
    doc = "# Title\n" + "x" * 242
    args = {"doc": doc, "_chunk_size": 100}
    result = run(code, args=args, prelude="lmforge.methods.minions.jobs")
    assert result.value == [[100, 100, 50]] * 3, result
    # without the argument the official default stays
    result = run(code, args={"doc": doc}, prelude="lmforge.methods.minions.jobs")
    assert result.value == [[250]] * 3, result


def _bpf(program: list, nr: int, arch: int, args: tuple = ()) -> int:
    """Run a classic-BPF seccomp program on one syscall (the five opcodes the sandbox uses)."""
    data = struct.pack("<iIQ6Q", nr, arch, 0, *(tuple(args) + (0,) * 6)[:6])
    pc = acc = 0
    while True:
        code, jt, jf, k = program[pc]
        if code == 0x06:
            return k
        if code == 0x20:
            acc, pc = struct.unpack_from("<I", data, k)[0], pc + 1
            continue
        taken = {0x15: acc == k, 0x35: acc >= k, 0x45: bool(acc & k)}[code]
        pc += 1 + (jt if taken else jf)


@pytest.mark.parametrize("machine", sorted(sb._SECCOMP_TABLES))
def test_seccomp_program_decisions(machine):
    table, pid, other = sb._SECCOMP_TABLES[machine], 4242, 4343
    prog = sb._seccomp_program(table, pid)
    allow, eperm, kill = 0x7FFF0000, 0x00050001, 0x80000000

    def verdict(name_or_nr, *args):
        nr = table[name_or_nr] if isinstance(name_or_nr, str) else name_or_nr
        return _bpf(prog, nr, table["arch"], args)

    assert all(0 <= jt < 256 and 0 <= jf < 256 and i + 1 + max(jt, jf) < len(prog)
               for i, (code, jt, jf, k) in enumerate(prog) if code != 0x06)  # fmt: skip
    assert _bpf(prog, 0, 0x40000003, ()) == kill  # another ABI (i386)
    signals = {"x86_64": (129, 297, 13, 37, 38, 222, 223), "aarch64": (138, 240, 134, 103, 107, 110)}
    for nr in table["deny"] + signals[machine]:
        assert verdict(nr) == eperm, nr
    read = {"x86_64": 0, "aarch64": 63}[machine]
    assert verdict(read) == allow
    assert verdict("clone", 0x00010000 | 0x100) == allow and verdict("clone", 0x11) == eperm
    assert verdict("kill", pid) == allow and verdict("kill", other) == eperm
    assert verdict("kill", 0) == eperm  # the whole process group
    for name in ("sched_setaffinity", "sched_setscheduler", "sched_setparam", "sched_setattr",
                 "prlimit64", "migrate_pages", "move_pages"):  # fmt: skip
        assert verdict(name, 0) == allow and verdict(name, pid) == allow, name
        assert verdict(name, other) == eperm, name
    assert verdict("setpriority", 0, 0) == allow and verdict("setpriority", 0, pid) == allow
    assert verdict("setpriority", 0, other) == eperm and verdict("setpriority", 1, 0) == eperm
    assert verdict("ioprio_set", 1, 0) == allow and verdict("ioprio_set", 2, 0) == eperm
    assert verdict("ioprio_set", 1, other) == eperm


# ---------------------------------------------------------------------------------- caller mistakes


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(args={"x": {1, 2}}), "JSON-serialisable"),
        (dict(entry="not a name"), "function name"),
        (dict(prelude="no.such.prelude"), "cannot be found"),
        (dict(allowed_imports="re"), "collection"),
        (dict(args=[1]), "dict"),
    ],
)
def test_caller_mistakes_raise_user_error(kwargs, needle):
    call = dict(code="def main(x=0):\n    pass", entry="main", args={}) | kwargs
    with pytest.raises(UserError, match=needle) as info:
        run_sandboxed(**call)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("field", ["cpu_seconds", "wall_seconds", "memory_mb", "max_output_bytes"])
@pytest.mark.parametrize("value", [0, -1, float("inf"), float("nan"), 10**400, True, "1"])
def test_limits_must_be_finite_positive_numbers(field, value):
    with pytest.raises(UserError, match=field) as info:
        SandboxLimits(**{field: value})
    assert "\n" not in str(info.value) and len(str(info.value)) < 200
