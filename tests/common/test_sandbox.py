"""Tests for lmforge.common.sandbox: every misbehaviour ends in a SandboxResult, the caller goes on.

Several tests reach the real ``os`` module through object introspection (``ESCAPE``), the classic
way out of a restricted namespace, to show that the layers below the namespace (audit hook, kernel)
still hold when the namespace layer is bypassed.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from textwrap import dedent

import pytest

import lmforge
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
    assert set(result.layers) == expected


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
    proc = run_python(f"""
        import sys, os, json, socket, threading, ctypes
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
        print(json.dumps(out))
    """)
    out = json.loads(proc.stdout)
    assert out["layers"] == [True, True], proc.stderr
    eperm, eacces = 1, 13
    assert (out["socket"], out["fork"], out["exec"]) == (eperm, eperm, eperm)
    assert out["read_root"] == eacces
    assert out["thread"] == "ok"  # threads (clone with CLONE_THREAD) stay allowed by the filter


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
def test_limits_must_be_positive(field):
    with pytest.raises(UserError, match=field):
        SandboxLimits(**{field: 0})
