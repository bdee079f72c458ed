"""Run untrusted Python code (remote-written Minions code, later code from untrusted repositories).

The official Minions code runs the remote model's ``prepare_jobs`` code with ``exec`` in the host
process. lmforge instead runs it with :func:`run_sandboxed`: in a separate, limited process whose
failure is reported as a :class:`SandboxResult`, never as an exception in the caller.

Libraries checked before writing this (none is a maintained process sandbox for CPython):
RestrictedPython (9.x, maintained) rewrites the AST to police attribute access, but it runs in the
caller's process and sets no CPU, memory, file or network limits; Victor Stinner's ``pysandbox`` was
abandoned in 2013 as "broken by design"; ``pyseccomp`` (ctypes over libseccomp.so, which is not
installed everywhere) and ``python-prctl`` are thin bindings, not policies. PEP 578 and the
``sys.addaudithook`` docs say audit hooks alone are not a sandbox. So the defence is built in layers,
from the kernel outwards, each of which stops something the others might miss:

1. **Process** -- ``sys.executable -I`` (isolated: no ``PYTHON*`` variables, no user site, no script
   dir on ``sys.path``), a new session/process group, stdin ``/dev/null`` (rather than a closed fd 0,
   which the next ``open`` would reuse), a scrubbed environment
   (``PATH``, ``LANG``, ``HOME``/``TMPDIR`` = the sandbox folder: no API keys pass), cwd = a fresh
   temporary folder removed afterwards. The parent enforces the wall clock and always ends with
   ``os.killpg(SIGKILL)`` before reaping, so nothing is left running.
2. **Resource limits** (``setrlimit`` in the child): ``RLIMIT_CPU`` (the soft limit's SIGXCPU is
   turned into a "timeout" report, the hard limit one second later kills), ``RLIMIT_AS`` (memory on
   top of what the interpreter and prelude already use), ``RLIMIT_FSIZE``, ``RLIMIT_NOFILE``,
   ``RLIMIT_CORE=0`` and ``RLIMIT_NPROC=0``.
3. **Kernel isolation** (Linux, best effort, the layers that worked are listed in
   :attr:`SandboxResult.layers`): a new network namespace (``unshare(CLONE_NEWNET)`` through
   ``ctypes`` on Python 3.11; only a down loopback inside), then, when started as root, the child
   drops to ``nobody`` (so file permissions apply and ``RLIMIT_NPROC`` counts: root ignores it), sets
   ``no_new_privs`` and installs a seccomp filter that refuses ``socket``, ``fork``/``vfork``/
   ``clone`` (threads excepted), ``execve``, ``ptrace``, ``kill`` of other processes, namespace and
   mount calls, ``bpf``, ``io_uring`` and similar (x86_64 and aarch64 syscall tables).
4. **Audit hook** (``sys.addaudithook``, cannot be removed): refuses sockets, process creation,
   signals, ``ctypes``, bytecode forging (``code.__new__``, ``marshal.loads``), ``gc`` object
   walks, and file access outside the sandbox folder (reads are also allowed under the Python
   prefixes and lmforge's package). A refusal writes a "forbidden" report and ends the process at
   once, so user code cannot catch it and carry on.
5. **Namespace**: the code runs with a reduced ``__builtins__`` (no ``exec``/``eval``/``compile``;
   ``open`` only inside the sandbox folder; ``__import__`` only for ``allowed_imports``, which are
   imported before the kernel layers close), plus the names the prelude exports. This layer is
   courtesy, not security: Python introspection can always reach the real builtins, which is why
   layers 1-4 exist. Its refusals raise catchable ``PermissionError``/``ImportError`` subclasses,
   reported as kind ``"forbidden"`` when uncaught.

Arguments go to the child in a JSON file that it deletes before user code runs; the result comes
back as one JSON line on a dedicated pipe. ``stdout`` is the captured ``print`` output, capped at
``max_output_bytes`` in the child and again in the parent; the child's stderr only feeds the one-line
``error`` when the process dies without a report.

Known limits: the number of files written inside the sandbox folder is not capped (each file is,
by ``RLIMIT_FSIZE``, and the CPU limit bounds the total); without root there is no uid drop, and on
other architectures or kernels without seccomp that layer is skipped.
"""

from __future__ import annotations

import json
import keyword
import math
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, NoReturn

from lmforge.common.errors import UserError

# The parent's helpers (subprocess, selectors, tempfile, shutil) are imported inside the functions
# that use them: the child imports this module too, and every module loaded there is one more tool
# within reach of code that escapes the namespace (subprocess would bring _posixsubprocess).

__all__ = [
    "DEFAULT_ALLOWED_IMPORTS",
    "KINDS",
    "SandboxLimits",
    "SandboxResult",
    "run_sandboxed",
]

#: Pure, side-effect-free standard modules that remote-written code may import.
DEFAULT_ALLOWED_IMPORTS: frozenset[str] = frozenset(
    {
        "re", "json", "math", "typing", "collections", "itertools", "functools", "dataclasses",
        "string", "textwrap", "heapq", "bisect", "operator", "statistics", "copy", "enum",
        "fractions", "decimal", "difflib",
    }
)  # fmt: skip

#: Every value :attr:`SandboxResult.kind` can take.
KINDS = ("ok", "error", "timeout", "memory", "forbidden", "killed")

_FILENAME = "<sandbox>"  # the code's filename in tracebacks: how a frame is known to be user code
_NOBODY = 65534
_STDERR_TAIL = 64 * 1024
_MAX_ERROR_CHARS = 500
# The child runs this; the parent passes lmforge's source root so it imports even without an install.
_BOOTSTRAP = (
    "import sys; sys.path.insert(0, sys.argv[1]); "
    "from lmforge.common.sandbox import _child_main; _child_main(sys.argv[2], int(sys.argv[3]))"
)


@dataclass(frozen=True)
class SandboxLimits:
    """Resource limits of one sandboxed run.

    Attributes:
        cpu_seconds: CPU time of the child, rounded up to whole seconds (``RLIMIT_CPU``'s unit).
        wall_seconds: wall-clock time, enforced by the parent.
        memory_mb: address space the code may add on top of the interpreter and prelude.
        max_output_bytes: cap on captured stdout (more is dropped) and on each file written.
        max_result_bytes: cap on the JSON result; a larger one is an "error".
    """

    cpu_seconds: float = 10.0
    wall_seconds: float = 20.0
    memory_mb: int = 1024
    max_output_bytes: int = 10_000_000
    max_result_bytes: int = 100_000_000

    def __post_init__(self) -> None:
        for name in self.__dataclass_fields__:
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                raise UserError(f"SandboxLimits.{name} must be a positive number, got {value!r}")


@dataclass
class SandboxResult:
    """What a sandboxed run produced; ``ok`` is True only for kind ``"ok"``.

    Attributes:
        ok: the entry function returned and its value crossed back as JSON.
        value: the returned value (after the prelude's ``sandbox_encode``), else None.
        error: one line, e.g. ``"ZeroDivisionError: division by zero (line 3)"``; None when ok.
        stdout: captured ``print`` output, capped at ``max_output_bytes``.
        kind: one of :data:`KINDS`: ``"ok"``, ``"error"`` (exception in the code), ``"timeout"``
            (CPU or wall clock), ``"memory"``, ``"forbidden"`` (refused operation or import),
            ``"killed"`` (the process died without a report).
        layers: the defences that were active in the child (``"rlimits"``, ``"netns"``, ``"uid"``,
            ``"seccomp"``, ``"audit"``); empty when the child reported nothing.
    """

    ok: bool
    value: Any
    error: str | None
    stdout: str
    kind: str
    layers: tuple[str, ...] = ()


# --------------------------------------------------------------------------------------------------
# Parent side
# --------------------------------------------------------------------------------------------------


def run_sandboxed(
    code: str,
    entry: str,
    args: dict[str, Any],
    *,
    prelude: str | None = None,
    allowed_imports: Iterable[str] = DEFAULT_ALLOWED_IMPORTS,
    limits: SandboxLimits = SandboxLimits(),
) -> SandboxResult:
    """Run ``code`` in a sandboxed child process and call ``entry(**args)`` there.

    Args:
        code: source that defines ``entry`` (and whatever it needs).
        entry: name of the function to call.
        args: keyword arguments, JSON-serialisable; the prelude's ``sandbox_decode`` may turn them
            into objects in the child.
        prelude: importable module path (trusted code) whose ``SANDBOX_NAMES`` are put in scope and
            whose optional ``sandbox_decode(entry, args) -> args`` and
            ``sandbox_encode(entry, value) -> JSON-able`` hooks convert arguments and result.
        allowed_imports: top-level modules the code may import (imported before the sandbox closes).
        limits: CPU, wall-clock, memory and output limits.

    Returns:
        A :class:`SandboxResult`; whatever the code does (raise, loop, allocate, fork, connect, read
        files outside the sandbox) ends in a result, not an exception.

    Raises:
        UserError: for caller mistakes: ``entry`` not an identifier, ``args`` not a JSON object,
            an unknown ``prelude`` or bad ``limits``.
    """
    import shutil
    import tempfile

    payload = _payload(code, entry, args, prelude, allowed_imports, limits)
    tmp = os.path.realpath(tempfile.mkdtemp(prefix="lmforge-sandbox-"))
    try:
        payload_path = os.path.join(tmp, ".payload.json")
        with open(payload_path, "w", encoding="utf-8") as f:
            f.write(payload)
        if os.geteuid() == 0:
            # The child drops to nobody after reading the payload; the folder must stay writable.
            os.chown(tmp, _NOBODY, _NOBODY)
        return _spawn_and_collect(tmp, payload_path, limits)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _payload(
    code: str,
    entry: str,
    args: dict[str, Any],
    prelude: str | None,
    allowed_imports: Iterable[str],
    limits: SandboxLimits,
) -> str:
    """Check the caller's arguments and serialise them for the child."""
    if not isinstance(code, str):
        raise UserError(f"sandbox code must be a string, got {type(code).__name__}")
    if not isinstance(entry, str) or not entry.isidentifier() or keyword.iskeyword(entry):
        raise UserError(f"sandbox entry must be a function name, got {entry!r}")
    if not isinstance(args, dict) or not all(isinstance(k, str) for k in args):
        raise UserError("sandbox args must be a dict with string keys")
    if not isinstance(limits, SandboxLimits):
        raise UserError(f"sandbox limits must be a SandboxLimits, got {type(limits).__name__}")
    if isinstance(allowed_imports, str):
        raise UserError("sandbox allowed_imports must be a collection of module names, not a string")
    allowed = sorted({str(m) for m in allowed_imports})
    if prelude is not None:
        _check_prelude(prelude)
    parent_path = [os.path.abspath(p or os.curdir) for p in sys.path]
    try:
        return json.dumps(
            {
                "code": code,
                "entry": entry,
                "args": args,
                "prelude": prelude,
                "allowed_imports": allowed,
                "sys_path": parent_path,
                "limits": {
                    "cpu_seconds": limits.cpu_seconds,
                    "memory_mb": limits.memory_mb,
                    "max_output_bytes": limits.max_output_bytes,
                },
            }
        )
    except (TypeError, ValueError) as exc:
        raise UserError(f"sandbox args must be JSON-serialisable: {exc}") from None


def _check_prelude(prelude: str) -> None:
    import importlib.util

    try:
        spec = importlib.util.find_spec(prelude)
    except (ImportError, ValueError) as exc:
        spec = None
        reason = f": {exc}"
    else:
        reason = ""
    if spec is None:
        raise UserError(f"sandbox prelude module {prelude!r} cannot be found{reason}")


def _spawn_and_collect(tmp: str, payload_path: str, limits: SandboxLimits) -> SandboxResult:
    """Start the child, read its three streams until it exits or the wall clock runs out."""
    import selectors
    import subprocess
    import time

    src_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {"PATH": os.defpath, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8", "HOME": tmp, "TMPDIR": tmp}
    result_r, result_w = os.pipe()
    deadline = time.monotonic() + limits.wall_seconds
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-c", _BOOTSTRAP, src_root, payload_path, str(result_w)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=tmp,
            env=env,
            start_new_session=True,  # its own process group: one killpg ends everything it started
            pass_fds=(result_w,),
        )
    except BaseException:
        os.close(result_r)
        raise
    finally:
        os.close(result_w)  # only the child may hold the write end, so EOF means "child gone"
    pid = proc.pid
    assert proc.stdout is not None and proc.stderr is not None
    streams = {proc.stdout.fileno(): "stdout", proc.stderr.fileno(): "stderr", result_r: "result"}
    bufs = {"stdout": bytearray(), "stderr": bytearray(), "result": bytearray()}
    stdout_over = result_over = timed_out = exited = False
    sel = selectors.DefaultSelector()
    pidfd = _pidfd_open(pid)
    try:
        for fd in streams:
            sel.register(fd, selectors.EVENT_READ)
        if pidfd is not None:
            sel.register(pidfd, selectors.EVENT_READ)
        while streams or not exited:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = not exited
                break
            # Without a pidfd, poll for the exit so a leftover holding a pipe cannot stall us.
            events = sel.select(remaining if pidfd is not None else min(remaining, 0.05))
            for key, _ in events:
                if key.fd == pidfd:
                    sel.unregister(pidfd)
                    exited = True
                    continue
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fd)
                    del streams[key.fd]
                    continue
                name = streams[key.fd]
                buf = bufs[name]
                if name == "stdout":
                    room = limits.max_output_bytes - len(buf)
                    stdout_over |= len(chunk) > room
                    # Keep draining past the cap so the child never blocks on a full pipe.
                    buf += chunk[: max(room, 0)]
                elif name == "stderr":
                    buf += chunk
                    if len(buf) > 2 * _STDERR_TAIL:
                        del buf[:-_STDERR_TAIL]  # only the end matters: it holds the final error
                else:
                    buf += chunk
                    if len(buf) > limits.max_result_bytes:
                        result_over = True
            if result_over:
                break
            if not exited and pidfd is None:
                exited = _has_exited(pid)
            if exited:
                # The child is gone; whatever is still buffered in the pipes arrives at once.
                deadline = min(deadline, time.monotonic() + 0.5)
    finally:
        sel.close()
        # Kill the whole group before reaping: an unreaped leader keeps the group id from being reused.
        _killpg(pid)
        _, status, rusage = os.wait4(pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)  # so Popen does not warn or re-wait
        for fd in (result_r, pidfd):
            if fd is not None:
                os.close(fd)
        proc.stdout.close()
        proc.stderr.close()
    cpu_used = rusage.ru_utime + rusage.ru_stime
    return _classify(
        bufs, status, cpu_used, limits,
        timed_out=timed_out, stdout_over=stdout_over, result_over=result_over,
    )  # fmt: skip


def _pidfd_open(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (AttributeError, OSError):
        return None


def _has_exited(pid: int) -> bool:
    # WNOWAIT leaves the child a zombie, so its pid and group id stay reserved until we reap it.
    info = os.waitid(os.P_PID, pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
    return info is not None


def _killpg(pgid: int) -> None:
    import signal

    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _classify(
    bufs: dict[str, bytearray],
    status: int,
    cpu_used: float,
    limits: SandboxLimits,
    *,
    timed_out: bool,
    stdout_over: bool,
    result_over: bool,
) -> SandboxResult:
    """Turn the child's report, exit status and stderr into a :class:`SandboxResult`."""
    import signal

    report = _last_report(bufs["result"]) if not result_over else None
    stdout = bufs["stdout"].decode("utf-8", errors="replace")
    if stdout_over or (report is not None and report.get("stdout_truncated")):
        stdout += f"\n[sandbox: output truncated at {limits.max_output_bytes} bytes]"
    layers = tuple(str(x) for x in report.get("layers", ())) if report else ()

    def fail(kind: str, error: str) -> SandboxResult:
        return SandboxResult(False, None, _one_line(error), stdout, kind, layers)

    if result_over:
        return fail("error", f"the result is larger than {limits.max_result_bytes} bytes")
    if report is not None and report.get("kind") in KINDS:
        if report["kind"] == "ok":
            return SandboxResult(True, report.get("value"), None, stdout, "ok", layers)
        return fail(report["kind"], str(report.get("error") or report["kind"]))
    if timed_out:
        return fail("timeout", f"wall-clock limit of {limits.wall_seconds:g}s exceeded")
    stderr = bufs["stderr"].decode("utf-8", errors="replace")
    last = next((ln.strip() for ln in reversed(stderr.splitlines()) if ln.strip()), "")
    cpu_limit = _cpu_limit(limits.cpu_seconds)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and cpu_used >= cpu_limit - 0.05):
            return fail("timeout", f"CPU time limit of {cpu_limit}s exceeded")
        if "MemoryError" in stderr:
            return fail("memory", f"memory limit of {limits.memory_mb} MB exceeded")
        return fail("killed", last or f"sandbox process killed by {signal.Signals(sig).name}")
    if "MemoryError" in last:
        return fail("memory", f"memory limit of {limits.memory_mb} MB exceeded")
    code = os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else status
    return fail("killed", last or f"sandbox process exited with status {code} without a result")


def _last_report(raw: bytearray) -> dict | None:
    # User code can write to the result pipe too; the bootstrap's report is the last line it wrote.
    for line in reversed(bytes(raw).splitlines()):
        try:
            report = json.loads(line)
        except ValueError:
            continue
        if isinstance(report, dict):
            return report
    return None


def _cpu_limit(cpu_seconds: float) -> int:
    return max(1, math.ceil(cpu_seconds))


def _one_line(text: str) -> str:
    line = " / ".join(part.strip() for part in str(text).splitlines() if part.strip())
    return line if len(line) <= _MAX_ERROR_CHARS else line[: _MAX_ERROR_CHARS - 3] + "..."


# --------------------------------------------------------------------------------------------------
# Child side: everything below runs in the sandbox process
# --------------------------------------------------------------------------------------------------


class SandboxRefused(PermissionError):
    """Raised by the restricted builtins (``open`` outside the folder, ``eval``): kind "forbidden"."""


class SandboxImportRefused(ImportError):
    """Raised by the restricted ``__import__`` for a module outside ``allowed_imports``."""


_SAFE_BUILTINS = (
    "abs", "all", "any", "ascii", "bin", "bool", "bytearray", "bytes", "callable", "chr",
    "classmethod", "complex", "delattr", "dict", "dir", "divmod", "enumerate", "filter", "float",
    "format", "frozenset", "getattr", "hasattr", "hash", "hex", "id", "int", "isinstance",
    "issubclass", "iter", "len", "list", "map", "max", "min", "next", "object", "oct", "ord", "pow",
    "print", "property", "range", "repr", "reversed", "round", "set", "setattr", "slice", "sorted",
    "staticmethod", "str", "sum", "super", "tuple", "type", "zip", "__build_class__",
    "NotImplemented", "Ellipsis", "aiter", "anext", "memoryview", "vars", "locals", "globals",
)  # fmt: skip
_REFUSED_BUILTINS = ("eval", "exec", "compile", "input", "breakpoint", "help", "exit", "quit")


class _Channel:
    """The result pipe: one JSON line per report; the parent keeps the last one."""

    def __init__(self, fd: int, layers: list[str]) -> None:
        self.fd = fd
        self.layers = layers
        self.stdout: _CappedStdout | None = None

    def send(self, report: dict[str, Any]) -> None:
        report["layers"] = list(self.layers)
        if self.stdout is not None:
            report["stdout_truncated"] = self.stdout.truncated
        try:
            text = json.dumps(report)
        except (TypeError, ValueError) as exc:  # only the returned value can be the culprit
            raise _NotJSONError(str(exc)) from None
        _write_all(self.fd, (text + "\n").encode("utf-8"))

    def finish(self, report: dict[str, Any]) -> NoReturn:
        """Send ``report`` and end the process without running user ``__del__``/atexit code."""
        try:
            if self.stdout is not None:
                self.stdout.flush()
        except BaseException:  # noqa: BLE001 - the report matters more than the output
            pass
        self.send(report)
        os._exit(0)


def _write_all(fd: int, data: bytes) -> None:
    while data:
        data = data[os.write(fd, data) :]


class _CappedStdout:
    """``sys.stdout`` of the user code: UTF-8, silently cut after ``cap`` bytes."""

    encoding = "utf-8"
    errors = "backslashreplace"

    def __init__(self, binary: Any, cap: int) -> None:
        self._out = binary
        self._left = int(cap)
        self.truncated = False

    def write(self, text: str) -> int:
        if not isinstance(text, str):
            raise TypeError(f"write() argument must be str, not {type(text).__name__}")
        data = text.encode("utf-8", "backslashreplace")
        if len(data) > self._left:
            data, self.truncated = data[: self._left], True
        if data:
            self._out.write(data)
            self._left -= len(data)
        return len(text)

    def flush(self) -> None:
        self._out.flush()

    def writable(self) -> bool:
        return True

    def isatty(self) -> bool:
        return False


def _child_main(payload_path: str, result_fd: int) -> None:
    """Entry point of the sandbox process (started by :func:`run_sandboxed`); never returns."""
    layers: list[str] = []
    channel = _Channel(result_fd, layers)
    try:
        payload, prelude, tmp = _close_sandbox(payload_path, layers)
    except _PreludeError as exc:
        channel.finish({"kind": "error", "error": str(exc)})
    except BaseException as exc:  # noqa: BLE001 - report any setup failure instead of a traceback
        channel.finish({"kind": "error", "error": f"sandbox setup failed: {_describe(exc)}"})
    limits = payload["limits"]
    stdout = _CappedStdout(sys.stdout.buffer, limits["max_output_bytes"])
    sys.stdout = stdout
    channel.stdout = stdout
    _install_signal_handlers(channel, _cpu_limit(limits["cpu_seconds"]))
    layers.append("audit")
    sys.addaudithook(_make_audit_hook(tmp, _read_roots(), channel))
    # Kept in reserve so that a MemoryError report can still be built after the code used it all.
    reserve = bytearray(1 << 20)
    try:
        report = _run_user_code(payload, prelude, tmp)
        channel.finish(report)  # serialises the value: may raise _NotJSONError or MemoryError
    except _NotJSONError as exc:
        entry = payload["entry"]
        message = f"TypeError: {entry}() returned a value that is not JSON-serialisable: {exc}"
        report = {"kind": "error", "error": _one_line(message)}
    except MemoryError as exc:
        reserve = None  # noqa: F841 - freeing it is the point
        line = _user_line(exc)
        where = f" (line {line})" if line is not None else ""
        message = f"MemoryError: memory limit of {limits['memory_mb']} MB exceeded{where}"
        report = {"kind": "memory", "error": message}
    except BaseException as exc:  # noqa: BLE001 - user code may raise anything, SystemExit included
        kind = "forbidden" if isinstance(exc, (SandboxRefused, SandboxImportRefused)) else "error"
        report = {"kind": kind, "error": _describe(exc)}
    channel.finish(report)


def _close_sandbox(payload_path: str, layers: list[str]) -> tuple[dict[str, Any], Any, str]:
    """Read the payload, set the limits, import what is trusted, then shut the kernel doors.

    Returns:
        The payload, the prelude module (or None) and the sandbox folder.
    """
    # Every module the bootstrap needs is imported first: after the uid drop the standard library
    # may be unreadable (here it lives under /root), and imports would fail.
    import builtins  # noqa: F401
    import ctypes  # noqa: F401
    import importlib  # noqa: F401
    import io  # noqa: F401
    import posix  # noqa: F401
    import resource  # noqa: F401
    import signal  # noqa: F401
    import types  # noqa: F401

    with open(payload_path, encoding="utf-8") as f:
        payload = json.load(f)
    os.unlink(payload_path)  # the code need not see its own arguments as a file
    limits = payload["limits"]
    _set_limits(limits)
    layers.append("rlimits")
    if _unshare_network():
        layers.append("netns")
    # The prelude and the allowed modules are trusted: import them while files are still readable.
    sys.path[:0] = [p for p in payload["sys_path"] if p not in sys.path]
    prelude = _import_prelude(payload["prelude"])
    for name in payload["allowed_imports"]:
        try:
            __import__(name)
        except Exception:  # noqa: BLE001 - a missing module fails later, at the user's import
            pass
    _limit_memory(limits["memory_mb"])
    if _drop_privileges():
        layers.append("uid")
    if _install_seccomp():
        layers.append("seccomp")
    return payload, prelude, os.path.realpath(os.getcwd())


class _PreludeError(Exception):
    pass


class _NotJSONError(Exception):
    pass


def _import_prelude(name: str | None) -> Any:
    if name is None:
        return None
    import importlib

    try:
        return importlib.import_module(name)
    except BaseException as exc:  # noqa: BLE001
        raise _PreludeError(f"prelude {name!r} failed to import: {_describe(exc)}") from None


def _set_limits(limits: dict[str, Any]) -> None:
    import resource

    cpu = _cpu_limit(limits["cpu_seconds"])
    # The soft CPU limit raises SIGXCPU (reported as "timeout"); the hard one kills a second later
    # in case the code is stuck inside a C call where the Python handler cannot run.
    _lower_limit(resource.RLIMIT_CPU, cpu, cpu + 1)
    _lower_limit(resource.RLIMIT_CORE, 0)
    fsize = max(int(limits["max_output_bytes"]), 1 << 20)
    _lower_limit(resource.RLIMIT_FSIZE, fsize)
    _lower_limit(resource.RLIMIT_NOFILE, 64)
    # No new processes or threads; effective once the uid is not root (root ignores RLIMIT_NPROC).
    _lower_limit(resource.RLIMIT_NPROC, 0)


def _lower_limit(which: int, soft: int, hard: int | None = None) -> None:
    """Set a limit, never above the current hard limit (raising it would fail without root)."""
    import resource

    hard = soft if hard is None else hard
    _, current = resource.getrlimit(which)
    if current != resource.RLIM_INFINITY:
        soft, hard = min(soft, current), min(hard, current)
    resource.setrlimit(which, (soft, hard))


def _limit_memory(memory_mb: int) -> None:
    """Cap the address space at what is mapped now plus ``memory_mb``.

    Relative, because the prelude may pull in large libraries whose mappings the code did not make.
    """
    import resource

    try:
        with open("/proc/self/statm") as f:
            current = int(f.read().split()[0]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        current = 0  # no /proc: the limit becomes absolute
    _lower_limit(resource.RLIMIT_AS, current + int(memory_mb) * (1 << 20))


def _libc() -> Any:
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def _unshare_network() -> bool:
    """Move into a new, empty network namespace (needs root / CAP_SYS_ADMIN); False if refused."""
    clone_newnet = 0x40000000
    if sys.platform != "linux":
        return False
    try:
        if hasattr(os, "unshare"):  # Python 3.12+
            os.unshare(clone_newnet)
            return True
        return _libc().unshare(clone_newnet) == 0
    except (OSError, AttributeError):
        return False


def _drop_privileges() -> bool:
    """As root, become ``nobody`` so the kernel's file permissions and RLIMIT_NPROC apply."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        return False
    try:
        os.setgroups([])
        os.setgid(_NOBODY)
        os.setuid(_NOBODY)
    except OSError:
        return False
    return os.geteuid() == _NOBODY


# seccomp: syscall numbers from <asm/unistd_64.h> (x86_64) and <asm-generic/unistd.h> (aarch64).
_SECCOMP_TABLES: dict[str, dict[str, Any]] = {
    "x86_64": {
        "arch": 0xC000003E,  # AUDIT_ARCH_X86_64
        "deny": (41, 53, 57, 58, 59, 322, 101, 310, 311, 165, 166, 155, 161, 272, 308, 321, 298,
                 323, 250, 248, 249, 246, 320, 175, 313, 176, 169, 425, 426, 427, 200, 303, 304, 135,
                 424, 438, 428, 429, 430, 431, 432, 433, 442),
        # socket socketpair fork vfork execve execveat ptrace process_vm_readv/writev mount umount2
        # pivot_root chroot unshare setns bpf perf_event_open userfaultfd keyctl add_key request_key
        # kexec_load kexec_file_load init_module finit_module delete_module reboot io_uring x3 tkill
        # name_to_handle_at open_by_handle_at personality pidfd_send_signal pidfd_getfd new mount API
        "clone": 56, "clone3": 435, "kill": 62, "tgkill": 234,
    },
    "aarch64": {
        "arch": 0xC00000B7,  # AUDIT_ARCH_AARCH64
        "deny": (198, 199, 221, 281, 117, 270, 271, 40, 39, 41, 51, 97, 268, 280, 241, 282, 219,
                 217, 218, 104, 294, 105, 273, 106, 142, 425, 426, 427, 130, 264, 265, 92, 424, 438,
                 428, 429, 430, 431, 432, 433, 442),
        "clone": 220, "clone3": 435, "kill": 129, "tgkill": 131,
    },
}  # fmt: skip


def _seccomp_program(table: dict[str, Any], pid: int) -> list[tuple[int, int, int, int]]:
    """A classic-BPF deny list: (code, jump-if-true, jump-if-false, k) instructions."""
    ld_abs, jeq, jge, jset, ret = 0x20, 0x15, 0x35, 0x45, 0x06
    allow, kill_process = 0x7FFF0000, 0x80000000
    deny, nosys = 0x00050000 | 1, 0x00050000 | 38  # SECCOMP_RET_ERRNO with EPERM / ENOSYS
    clone_thread = 0x00010000
    nr, arch, arg0 = 0, 4, 16  # offsets in struct seccomp_data (little-endian low half of args[0])
    prog = [
        (ld_abs, 0, 0, arch),
        (jeq, 1, 0, table["arch"]),
        (ret, 0, 0, kill_process),  # another syscall ABI (e.g. int 0x80) would bypass the numbers
        (ld_abs, 0, 0, nr),
        (jge, 0, 1, 0x40000000),  # x32 syscall numbers on x86_64
        (ret, 0, 0, deny),
    ]
    for number in table["deny"]:
        prog += [(jeq, 0, 1, number), (ret, 0, 0, deny)]
    # clone3 hides its flags in memory BPF cannot read; ENOSYS makes libc fall back to clone.
    prog += [(jeq, 0, 1, table["clone3"]), (ret, 0, 0, nosys)]
    prog += [
        (jeq, 0, 4, table["clone"]),
        (ld_abs, 0, 0, arg0),
        (jset, 0, 1, clone_thread),
        (ret, 0, 0, allow),  # a thread, not a process
        (ret, 0, 0, deny),
    ]
    for name in ("kill", "tgkill"):  # signals only to itself (raise(), abort())
        prog += [
            (jeq, 0, 4, table[name]),
            (ld_abs, 0, 0, arg0),
            (jeq, 0, 1, pid),
            (ret, 0, 0, allow),
            (ret, 0, 0, deny),
        ]
    prog.append((ret, 0, 0, allow))
    return prog


def _install_seccomp() -> bool:
    """Install the seccomp filter (after ``no_new_privs``); False where unsupported or refused."""
    import ctypes

    table = _SECCOMP_TABLES.get(os.uname().machine)
    if sys.platform != "linux" or table is None:
        return False

    class SockFilter(ctypes.Structure):
        _fields_ = [("code", ctypes.c_ushort), ("jt", ctypes.c_ubyte), ("jf", ctypes.c_ubyte),
                    ("k", ctypes.c_uint)]  # fmt: skip

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.POINTER(SockFilter))]

    program = _seccomp_program(table, os.getpid())
    filters = (SockFilter * len(program))(*[SockFilter(*ins) for ins in program])
    fprog = SockFprog(len(program), filters)
    try:
        libc = _libc()
        prctl = libc.prctl
        prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
        if prctl(38, 1, None, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS: required to filter without root
            return False
        return prctl(22, 2, ctypes.addressof(fprog), 0, 0) == 0  # PR_SET_SECCOMP, MODE_FILTER
    except (OSError, AttributeError):
        return False


def _read_roots() -> tuple[str, ...]:
    """Folders whose files may be read after the sandbox closes: the Python install and lmforge."""
    roots = {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix}
    roots.add(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the lmforge package
    return tuple(sorted({os.path.realpath(r) for r in roots if r} - {"/"}))


def _install_signal_handlers(channel: _Channel, cpu_limit: int) -> None:
    import signal

    # A file over RLIMIT_FSIZE should fail with EFBIG (an OSError), not kill the process.
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)

    def on_cpu_limit(signum: int, frame: Any) -> None:
        line = _frame_line(frame)
        where = f" (line {line})" if line else ""
        channel.finish({"kind": "timeout", "error": f"CPU time limit of {cpu_limit}s exceeded{where}"})

    signal.signal(signal.SIGXCPU, on_cpu_limit)


def _frame_line(frame: Any) -> int | None:
    """The line of the innermost user-code frame at or above ``frame``."""
    while frame is not None:
        if frame.f_code.co_filename == _FILENAME:
            return frame.f_lineno
        frame = frame.f_back
    return None


def _make_audit_hook(tmp: str, read_roots: tuple[str, ...], channel: _Channel) -> Any:
    """Build the audit hook. It is self-contained on purpose.

    User code can reach module globals, and even the ``builtins`` module, through introspection and
    rebind them. So the hook uses only what is captured here, before the code runs: strings,
    frozensets, and builtin functions and types, none of which can be changed afterwards.
    """
    import posix

    lstat, stat, readlink, getcwd = posix.lstat, posix.stat, posix.readlink, posix.getcwd
    getframe, exit_now, write_fd, fd = sys._getframe, os._exit, os.write, channel.fd
    type_of, str_t, bytes_t, int_t = type, str, bytes, int
    os_error, base_exc, ord_of, str_join = OSError, BaseException, ord, str.join
    filename = _FILENAME
    write_flags = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
    # A directory fd outside the folder would let dir_fd-relative calls escape the path checks.
    dir_flags = os.O_DIRECTORY | getattr(os, "O_PATH", 0)
    # Flush the real buffer through its (immutable) type: user code can rebind attributes of
    # sys.stdout, and nothing user-controlled may run while the hook is reporting.
    binary = channel.stdout._out if channel.stdout is not None else None
    flush_binary = type(binary).flush if binary is not None else None
    layers_json = "[" + ", ".join('"' + name + '"' for name in channel.layers) + "]"
    special_rw = frozenset({"/dev/null"})
    special_r = frozenset({"/dev/urandom", "/dev/random"})
    refused_exact = frozenset({
        "os.system", "os.fork", "os.forkpty", "os.kill", "os.killpg", "os.startfile",
        "os.posix_spawn", "os.exec", "os.spawn", "subprocess.Popen", "pty.spawn",
        "signal.pthread_kill", "resource.setrlimit", "resource.prlimit", "sys.addaudithook",
        "code.__new__", "marshal.load", "marshal.loads", "gc.get_objects", "gc.get_referrers",
        "gc.get_referents", "_thread.start_new_thread", "webbrowser.open", "urllib.Request",
        "sys.remote_exec",
    })  # fmt: skip
    refused_prefixes = ("socket.", "ctypes.", "_ctypes.", "subprocess.", "os.exec", "os.spawn",
                        "os.posix_spawn", "winreg.", "_winapi.", "msvcrt.", "ftplib.", "smtplib.",
                        "http.", "imaplib.", "nntplib.", "poplib.", "telnetlib.")  # fmt: skip
    refused_imports = frozenset({
        "ctypes", "_ctypes", "socket", "_socket", "subprocess", "_posixsubprocess", "multiprocessing",
        "_multiprocessing", "pty", "ssl", "_ssl", "select", "mmap",
    })  # fmt: skip
    write_events = frozenset({
        "os.remove", "os.rmdir", "os.rename", "os.link", "os.symlink", "os.mkdir", "os.chmod",
        "os.chown", "os.truncate", "os.utime", "os.chflags", "os.lchflags", "os.setxattr",
        "os.removexattr", "os.chdir", "os.mkfifo", "os.mknod", "shutil.rmtree", "shutil.copyfile",
        "shutil.copymode", "shutil.copystat", "shutil.copytree", "shutil.move", "shutil.chown",
        "shutil.make_archive", "shutil.unpack_archive",
    })  # fmt: skip
    read_events = frozenset(
        {"os.listdir", "os.scandir", "os.getxattr", "os.listxattr", "glob.glob", "glob.glob/2"}
    )
    tmp_roots = (tmp,)
    readable = tmp_roots + read_roots
    reporting = [False]  # set once a refusal is being reported: the process ends right after

    def realpath(path: str) -> str:
        # Not os.path.realpath: it calls os.lstat through the os module, which user code can rebind.
        if not path.startswith("/"):
            path = getcwd() + "/" + path
        resolved: list[str] = []
        pending = path.split("/")[::-1]
        hops = 0
        while pending:
            part = pending.pop()
            if part == "" or part == ".":
                continue
            if part == "..":
                if resolved:
                    resolved.pop()
                continue
            candidate = "/" + str_join("/", resolved + [part])
            try:
                mode = lstat(candidate).st_mode
            except os_error:
                resolved.append(part)  # does not exist (yet): the kernel resolves it no further
                continue
            if mode & 0o170000 == 0o120000:  # a symlink: go on from its target
                hops += 1
                if hops > 40:
                    return "/"
                target = readlink(candidate)
                if target.startswith("/"):
                    resolved = []
                pending.extend(target.split("/")[::-1])
            else:
                resolved.append(part)
        return "/" + str_join("/", resolved)

    def as_path(value: Any) -> str | None:
        # Only exact str/bytes: a subclass or an os.PathLike could answer differently the next time.
        kind = type_of(value)
        if kind is str_t:
            return realpath(value)
        if kind is bytes_t:
            return realpath(value.decode("utf-8", "surrogateescape"))
        return None

    def inside(path: str, roots: tuple[str, ...]) -> bool:
        for root in roots:
            if path == root or path.startswith(root + "/"):
                return True
        return False

    def json_escape(text: str) -> str:
        # json.dumps could have been rebound by the user code.
        out = []
        for ch in text:
            code = ord_of(ch)
            if ch == '"' or ch == "\\" or code < 32 or code > 126:
                out.append("\\u%04x" % code if code <= 0xFFFF else "?")
            else:
                out.append(ch)
        return str_join("", out)

    def refuse(event: str, detail: str) -> None:
        if reporting[0]:
            return
        reporting[0] = True
        line = None
        frame = getframe(1)
        while frame is not None:
            if frame.f_code.co_filename == filename:
                line = frame.f_lineno
                break
            frame = frame.f_back
        where = "" if line is None else " (line %d)" % line
        message = "refused by the sandbox: " + event + detail + where
        try:
            if flush_binary is not None:
                flush_binary(binary)
        except base_exc:  # noqa: BLE001 - the report matters more than the output
            pass
        text = '{"kind": "forbidden", "error": "' + json_escape(message) + '", "layers": '
        text += layers_json + "}\n"
        data = text.encode("utf-8")
        while data:
            data = data[write_fd(fd, data) :]
        exit_now(0)  # at once: user code must not catch the refusal and carry on

    def describe(value: Any) -> str:
        kind = type_of(value)
        return "(" + (value.__repr__() if kind is str_t or kind is bytes_t else "a non-str path") + ")"

    def hook(event: str, args: tuple[Any, ...]) -> None:
        if reporting[0]:
            return
        if event in refused_exact or event.startswith(refused_prefixes):
            refuse(event, "")
        elif event == "open":
            path, mode, flags = (args + (None, None, None))[:3]
            if type_of(path) is int_t:
                return  # an fd that is already open
            where = as_path(path)
            if where is None:
                refuse("open", describe(path))
                return
            if type_of(flags) is int_t:
                writing = flags & write_flags != 0
                dir_open = flags & dir_flags != 0
            else:  # no flags to go by: assume the worst
                writing = dir_open = True
            if where in special_rw or (where in special_r and not writing):
                return
            if not writing and not dir_open and not inside(where, tmp_roots):
                try:
                    dir_open = stat(where).st_mode & 0o170000 == 0o040000  # a directory
                except os_error:
                    pass
            allowed = tmp_roots if (writing or dir_open) else readable
            if not inside(where, allowed):
                refuse("open", describe(path) + " outside the sandbox folder")
        elif event in write_events or event in read_events:
            allowed = tmp_roots if event in write_events else readable
            for value in args:
                if value is None or type_of(value) is int_t:
                    continue
                where = as_path(value)
                if where is None or not inside(where, allowed):
                    refuse(event, describe(value) + " outside the sandbox folder")
        elif event == "import" and args and args[0] in refused_imports:
            refuse("import", " of " + args[0])

    return hook


def _describe(exc: BaseException) -> str:
    """``"ExcType: message (line N)"``, the line being the last one in the user's code."""
    name = type(exc).__name__
    if isinstance(exc, SyntaxError) and exc.filename == _FILENAME:
        return _one_line(f"{name}: {exc.msg} (line {exc.lineno})")
    try:
        message = str(exc)
    except BaseException:  # noqa: BLE001 - a user exception's __str__ may itself fail
        message = ""
    line = _user_line(exc)
    text = f"{name}: {message}" if message else name
    return _one_line(text + (f" (line {line})" if line is not None else ""))


def _user_line(exc: BaseException) -> int | None:
    """The line of the last traceback entry that is in the user's code."""
    line = None
    tb = exc.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename == _FILENAME:
            line = tb.tb_lineno
        tb = tb.tb_next
    return line


def _run_user_code(payload: dict[str, Any], prelude: Any, tmp: str) -> dict[str, Any]:
    """Compile and run the code in a fresh module and call the entry; returns the report."""
    import builtins
    import types

    entry = payload["entry"]
    module = types.ModuleType("__sandbox__")
    sys.modules["__sandbox__"] = module  # dataclasses and pickle look classes up by module name
    namespace = module.__dict__
    allowed = frozenset(payload["allowed_imports"])
    namespace["__builtins__"] = _restricted_builtins(builtins, allowed, tmp)
    for name in getattr(prelude, "SANDBOX_NAMES", ()):
        namespace[name] = getattr(prelude, name)
    code = compile(payload["code"], _FILENAME, "exec")
    exec(code, namespace)  # noqa: S102 - this is the sandbox
    fn = namespace.get(entry)
    if fn is None:
        return {"kind": "error", "error": f"NameError: entry {entry!r} is not defined by the code"}
    if not callable(fn):
        return {"kind": "error", "error": f"TypeError: entry {entry!r} is not callable"}
    args = payload["args"]
    decode = getattr(prelude, "sandbox_decode", None)
    if decode is not None:
        args = decode(entry, args)
    value = fn(**args)
    encode = getattr(prelude, "sandbox_encode", None)
    if encode is not None:
        value = encode(entry, value)
    return {"kind": "ok", "value": value}


def _restricted_builtins(builtins: Any, allowed: frozenset[str], tmp: str) -> dict[str, Any]:
    import io
    import types

    safe = {name: getattr(builtins, name) for name in _SAFE_BUILTINS if hasattr(builtins, name)}
    for name in dir(builtins):  # every exception and warning class
        obj = getattr(builtins, name)
        if isinstance(obj, type) and issubclass(obj, BaseException):
            safe[name] = obj
    real_import = builtins.__import__

    def guarded_import(
        name: str, globals: Any = None, locals: Any = None, fromlist: Any = (), level: int = 0
    ) -> Any:
        if level != 0:
            raise SandboxImportRefused("relative imports are not allowed in the sandbox")
        if name.partition(".")[0] not in allowed:
            raise SandboxImportRefused(f"import of {name!r} is not allowed in the sandbox", name=name)
        module = real_import(name, globals, locals, fromlist, level)
        for item in fromlist or ():
            value = getattr(module, item, None)
            # `from typing import sys` would hand out a module that is not on the list.
            if isinstance(value, types.ModuleType) and value.__name__.partition(".")[0] not in allowed:
                raise SandboxImportRefused(
                    f"import of {value.__name__!r} is not allowed in the sandbox", name=value.__name__
                )
        return module

    def guarded_open(file: Any, mode: str = "r", buffering: int = -1, encoding: str | None = None,
                     errors: str | None = None, newline: str | None = None) -> Any:  # fmt: skip
        if isinstance(file, int):
            raise SandboxRefused("open() of a file descriptor is not allowed in the sandbox")
        path = os.fspath(file)
        if isinstance(path, bytes):
            path = os.fsdecode(path)
        real = os.path.realpath(path)
        if real != tmp and not real.startswith(tmp + os.sep):
            raise SandboxRefused(
                f"open({path!r}) is refused: only files inside the sandbox folder can be opened"
            )
        return io.open(real, mode, buffering, encoding, errors, newline)

    def refused(name: str) -> Any:
        def stub(*args: Any, **kwargs: Any) -> Any:
            raise SandboxRefused(f"{name}() is not available in the sandbox")

        stub.__name__ = name
        return stub

    safe["__import__"] = guarded_import
    safe["open"] = guarded_open
    for name in _REFUSED_BUILTINS:
        safe[name] = refused(name)
    return safe
