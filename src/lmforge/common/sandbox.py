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
3. **Kernel isolation** (Linux x86_64/aarch64, best effort: the layers that worked are listed in
   :attr:`SandboxResult.layers`, a missing one is simply absent; nothing else changes):

   * ``"netns"``: a new network namespace (``unshare(CLONE_NEWNET)``; needs root or CAP_SYS_ADMIN,
     some containers refuse it): only a down loopback inside, no route anywhere.
   * ``"uid"`` (started as root only): the child drops to ``nobody``, so file permissions apply
     (e.g. a 0700 ``/root``) and ``RLIMIT_NPROC`` counts (root ignores it).
   * ``"landlock"`` (kernel >= 5.13 with Landlock enabled; root or not, after ``no_new_privs``):
     **the file confinement that does not depend on Python**. Every filesystem right the kernel's
     Landlock ABI knows is handled (ABI 1: execute, read/write file, read dir, remove, make
     char/dir/reg/sock/fifo/block/sym; ABI 2 refer; ABI 3 truncate; ABI 5 device ioctl) and only
     these are granted: everything but execute and device nodes beneath the sandbox folder; read
     (files and listings) beneath the Python prefixes and lmforge's package folder; ``/dev/null``
     read-write; ``/dev/urandom`` and ``/dev/random`` read. The kernel checks the file actually
     reached, after symlinks, ``..``, ``dir_fd`` and any rename race, so nothing the code does in
     Python (or to the interpreter's memory) opens, creates, writes, removes, renames or links a
     file elsewhere. From ABI 6 signals and abstract unix sockets are also scoped to the sandbox.
     Landlock does not cover: ``stat``/``access``/``readlink``/``chdir`` (the code can learn
     whether a path exists, its size and owner, not its content), ``getxattr``, files opened
     before it (the inherited pipes), and, below ABI 3, ``truncate`` of an outside path.
   * ``"seccomp"``: a filter (EPERM) on ``socket``/``socketpair``, ``fork``/``vfork``/``clone``
     (threads excepted), ``execve``, ``ptrace`` and ``process_vm_*``, signals to other processes
     (``kill``/``tgkill`` only to itself; ``tkill``, ``rt_sigqueueinfo``, ``rt_tgsigqueueinfo``,
     ``pidfd_send_signal`` refused), ``rt_sigaction`` and every timer (``alarm``, ``setitimer``,
     ``timer_create``/``timer_settime``: installed after the sandbox's own handlers, so the code
     can install no signal handler and arm no timer), scheduling, priority, I/O priority, rlimit
     and page-migration calls on any process but itself, ``chmod``/``chown``/``utime``/xattr writes
     on any path (which Landlock does not cover), namespace and mount calls, ``bpf``, perf,
     ``userfaultfd``, keyrings, kexec, modules, reboot, ``io_uring``, handle-based opens,
     ``personality``, ``process_madvise``.
4. **Audit hook** (``sys.addaudithook``, cannot be removed): refuses sockets, process creation,
   signals, ``ctypes``, bytecode forging (``code.__new__``, ``marshal.loads``), ``gc`` object
   walks, symlink and hard-link creation, opening directories (a directory fd would make
   ``dir_fd``-relative paths uncheckable: the ``open`` event does not carry ``dir_fd``), and file
   access outside the sandbox folder (reads are also allowed under the Python prefixes and
   lmforge's package). A refusal writes a "forbidden" report and ends the process at once, so user
   code cannot catch it and carry on. The hook is built so that code reaching its frames (a gc
   finalizer, the CPU-limit handler) cannot switch it off: it reads no globals, has no closure
   cells but its own (``cell_contents`` is writable without an audit event), keeps no on/off flag,
   refuses any change to its functions' attributes, fails closed on any exception (a removed cwd,
   ``RecursionError``) and on re-entry (user code running in the middle of a check, the moment a
   TOCTOU rename or ``chdir`` would need). ``gc`` stays enabled: disabling it would be no control
   (the code can reach the ``gc`` module and re-enable it), and a finalizer that does anything the
   hook audits while a check is under way ends the process.
   Still, it is Python-level and best effort: where Landlock is active it is the second line for
   files; where Landlock is missing it is the only line for files the process's uid may access
   (all of the caller's files when not root; world-readable files as ``nobody``).
5. **Namespace**: the code runs with a reduced ``__builtins__`` (no ``exec``/``eval``/``compile``;
   ``open`` only inside the sandbox folder; ``__import__`` only for ``allowed_imports``, which are
   imported before the kernel layers close), plus the names the prelude exports. This layer is
   courtesy, not security: Python introspection can always reach the real builtins, which is why
   layers 1-4 exist. Its refusals raise catchable ``PermissionError``/``ImportError`` subclasses,
   reported as kind ``"forbidden"`` when uncaught.

In short, as root on a kernel with Landlock (the CI machines): all six layers; reads confined to the
sandbox folder, the Python install and lmforge's package, writes to the sandbox folder, by the
kernel. Not root: no ``"uid"`` (and usually no ``"netns"``), Landlock and seccomp still apply. No
Landlock: file confinement rests on the audit hook (and, as root, on ``nobody``'s permissions).

Arguments go to the child in a JSON file that it deletes before user code runs; the result comes
back as one JSON line on a dedicated pipe. **The parent never lets that pipe overrule what the
kernel tells it**: code that escapes the namespace can write to the pipe too (the descriptor can be
found by trying them), so a report is believed only when the process then ended by itself, in time,
with status 0 (the wrapper's only way out), and the layers are taken from the line the wrapper
writes *before* the user code starts (no user code can precede it). A wall-clock timeout, a death
by signal (the CPU hard limit, a SIGKILL) or any other exit status is reported as such whatever the
pipe holds. What code that ends itself with a report of its own can still choose is its value and
its error message, which it chooses anyway by returning or raising; it cannot make a run that timed
out or died look like a success, nor claim a defence that was not there. (The prelude's
``sandbox_encode`` is bypassed by such code, so callers check the shape of values as they must
anyway.) ``stdout`` is the captured ``print`` output, capped at
``max_output_bytes`` in the child and again in the parent; the child's stderr only feeds the one-line
``error`` when the process dies without a report. Codecs that ``str.encode`` would look up lazily
(``cp1252``, ``idna``, ``utf_16``, ...) are loaded before the uid drop and Landlock.

Known limits: the number of files written inside the sandbox folder is not capped (each file is,
by ``RLIMIT_FSIZE``, and the CPU limit bounds the total); a module the code imports for the first
time after the sandbox closed must be readable under the read roots; the code can still learn
metadata (existence, size, owner) of outside paths, and reach the Python objects of the trusted
prelude and allowed modules (so their results are only as trustworthy as the code's).
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
        _check_limits(self)


def _check_limits(limits: Any) -> None:
    """Every field of a limits dataclass must be a finite positive number (shared with
    :class:`lmforge.common.command_sandbox.CommandLimits`)."""
    for name in limits.__dataclass_fields__:
        value = getattr(limits, name)
        if not _finite_positive(value):
            raise UserError(
                f"{type(limits).__name__}.{name} must be a finite positive number, got {value!r:.40}"
            )


def _finite_positive(value: Any) -> bool:
    """A real number (not a bool) above zero, not inf or nan, and not an int too big for a float."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    try:
        number = float(value)
    except OverflowError:
        return False
    return math.isfinite(number) and number > 0


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
        layers: the defences that were active in the child, in the order they closed
            (``"rlimits"``, ``"netns"``, ``"uid"``, ``"landlock"``, ``"seccomp"``, ``"audit"``); a
            kernel layer this machine does not offer is absent; empty when the child died before
            the sandbox closed. Always the wrapper's own list, written before the code ran.
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

    report, layers = _reports(bufs["result"]) if not result_over else (None, ())
    stdout = bufs["stdout"].decode("utf-8", errors="replace")
    if stdout_over or (report is not None and report.get("stdout_truncated")):
        stdout += f"\n[sandbox: output truncated at {limits.max_output_bytes} bytes]"

    def fail(kind: str, error: str) -> SandboxResult:
        return SandboxResult(False, None, _one_line(error), stdout, kind, layers)

    if result_over:
        return fail("error", f"the result is larger than {limits.max_result_bytes} bytes")
    # What the kernel says comes first: the pipe may hold a report the code wrote itself before it
    # stalled or died. The wrapper always ends with os._exit(0) right after its report.
    if timed_out:
        return fail("timeout", f"wall-clock limit of {limits.wall_seconds:g}s exceeded")
    clean_exit = os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
    if clean_exit and report is not None and report.get("kind") in KINDS:
        if report["kind"] == "ok":
            return SandboxResult(True, report.get("value"), None, stdout, "ok", layers)
        return fail(report["kind"], str(report.get("error") or report["kind"]))
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


def _reports(raw: bytearray) -> tuple[dict | None, tuple[str, ...]]:
    """The final report on the result pipe and the layers of the wrapper's opening line.

    The wrapper writes ``{"stage": "running", "layers": [...]}`` just before the user code starts;
    nothing the code writes can come before it, so the layers are read from that line only. A
    report after it may be the code's own (believed only on a clean exit, see :func:`_classify`):
    the last one counts, as the wrapper writes last. Without the opening line the child never
    reached the user code, and its single report (a setup failure) is entirely the wrapper's.
    """
    lines = []
    for line in bytes(raw).splitlines():
        try:
            obj = json.loads(line)
        except ValueError:
            continue
        if isinstance(obj, dict):
            lines.append(obj)
    if not lines:
        return None, ()
    opening = lines[0]
    if opening.get("stage") == "running":
        reports = lines[1:]
    else:
        reports = lines[:1]
    layers = opening.get("layers", ())
    layers = tuple(str(x) for x in layers) if isinstance(layers, list) else ()
    return (reports[-1] if reports else None), layers


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
    # Hygiene only (a descriptor can be found by trying them): the parent never trusts the pipe
    # beyond what the kernel confirms, see _classify.
    del sys.argv[1:]
    if hasattr(sys, "orig_argv"):
        del sys.orig_argv[1:]
    layers: list[str] = []
    channel = _Channel(result_fd, layers)
    try:
        payload, prelude, tmp = _close_sandbox(payload_path, layers, channel)
    except _PreludeError as exc:
        channel.finish({"kind": "error", "error": str(exc)})
    except BaseException as exc:  # noqa: BLE001 - report any setup failure instead of a traceback
        channel.finish({"kind": "error", "error": f"sandbox setup failed: {_describe(exc)}"})
    limits = payload["limits"]
    layers.append("audit")
    sys.addaudithook(_make_audit_hook(tmp, _read_roots(), channel))
    # Kept in reserve so that a MemoryError report can still be built after the code used it all.
    reserve = bytearray(1 << 20)
    # The opening line: the layers as measured here, before any user code can write to the pipe.
    channel.send({"stage": "running"})
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


def _close_sandbox(
    payload_path: str, layers: list[str], channel: _Channel
) -> tuple[dict[str, Any], Any, str]:
    """Read the payload, set the limits, import what is trusted, then shut the kernel doors.

    The order matters: files are read (payload, prelude, codecs) while still root; the Landlock
    rules are built while the read roots can still be opened (they may live under a 0700 /root),
    enforced after the uid drop; the signal handlers are installed before the seccomp filter,
    which then refuses any further ``rt_sigaction``/timer call.

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
    _preload_lazy_stdlib()
    _limit_memory(limits["memory_mb"])
    tmp = os.path.realpath(os.getcwd())
    ruleset = _landlock_ruleset(tmp, _read_roots())
    if _drop_privileges():
        layers.append("uid")
    if ruleset is not None and _landlock_restrict(ruleset):
        layers.append("landlock")
    stdout = _CappedStdout(sys.stdout.buffer, limits["max_output_bytes"])
    sys.stdout = stdout
    channel.stdout = stdout
    _install_signal_handlers(channel, _cpu_limit(limits["cpu_seconds"]))
    if _install_seccomp():
        layers.append("seccomp")
    return payload, prelude, tmp


#: Codecs found lazily by ``codecs.lookup`` (an import of ``encodings.<name>``): looked up before
#: the uid drop and Landlock, which can leave the standard library unreadable.
_PRELOADED_CODECS = (
    "ascii", "latin_1", "cp1252", "cp1251", "cp1250", "cp437", "cp850", "iso8859_2", "iso8859_15",
    "mac_roman", "utf_16", "utf_16_le", "utf_16_be", "utf_32", "utf_32_le", "utf_32_be",
    "utf_8_sig", "utf_7", "idna", "punycode", "unicode_escape", "raw_unicode_escape", "charmap",
)  # fmt: skip


def _preload_lazy_stdlib() -> None:
    """Load what the standard library would otherwise read from disk on first use."""
    import codecs
    import time

    for name in _PRELOADED_CODECS:
        try:
            codecs.lookup(name)
        except LookupError:
            pass
    time.localtime()  # libc reads /etc/localtime once and keeps it


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


# seccomp: syscall numbers from <asm/unistd_64.h> (x86_64) and <asm-generic/unistd.h> (aarch64);
# 452 (fchmodat2, Linux 6.6), 463 (setxattrat) and 466 (removexattrat, 6.13) are newer than those
# headers here and come from the kernel's syscall tables (the same numbers on both architectures).
_SECCOMP_TABLES: dict[str, dict[str, Any]] = {
    "x86_64": {
        "arch": 0xC000003E,  # AUDIT_ARCH_X86_64
        "deny": (41, 53, 57, 58, 59, 322, 101, 310, 311, 165, 166, 155, 161, 272, 308, 321, 298,
                 323, 250, 248, 249, 246, 320, 175, 313, 176, 169, 425, 426, 427, 200, 303, 304, 135,
                 424, 438, 428, 429, 430, 431, 432, 433, 442,
                 129, 297, 13, 37, 38, 222, 223, 440,
                 90, 91, 92, 93, 94, 260, 268, 452, 132, 235, 261, 280,
                 188, 189, 190, 197, 198, 199, 463, 466),
        # socket socketpair fork vfork execve execveat ptrace process_vm_readv/writev mount umount2
        # pivot_root chroot unshare setns bpf perf_event_open userfaultfd keyctl add_key request_key
        # kexec_load kexec_file_load init_module finit_module delete_module reboot io_uring x3 tkill
        # name_to_handle_at open_by_handle_at personality pidfd_send_signal pidfd_getfd new mount API;
        # rt_sigqueueinfo rt_tgsigqueueinfo rt_sigaction alarm setitimer timer_create timer_settime
        # process_madvise; chmod fchmod chown fchown lchown fchownat fchmodat fchmodat2 utime utimes
        # futimesat utimensat; setxattr lsetxattr fsetxattr removexattr lremovexattr fremovexattr
        # setxattrat removexattrat
        "clone": 56, "clone3": 435, "kill": 62, "tgkill": 234,
        "sched_setparam": 142, "sched_setscheduler": 144, "sched_setaffinity": 203,
        "sched_setattr": 314, "prlimit64": 302, "migrate_pages": 256, "move_pages": 279,
        "setpriority": 141, "ioprio_set": 251,
    },
    "aarch64": {
        "arch": 0xC00000B7,  # AUDIT_ARCH_AARCH64
        "deny": (198, 199, 221, 281, 117, 270, 271, 40, 39, 41, 51, 97, 268, 280, 241, 282, 219,
                 217, 218, 104, 294, 105, 273, 106, 142, 425, 426, 427, 130, 264, 265, 92, 424, 438,
                 428, 429, 430, 431, 432, 433, 442,
                 138, 240, 134, 103, 107, 110, 440,
                 52, 55, 54, 53, 452, 88,
                 5, 6, 7, 14, 15, 16, 463, 466),
        # (aarch64 has no chmod/chown/lchown/utime/utimes/futimesat/alarm: only the *at forms)
        "clone": 220, "clone3": 435, "kill": 129, "tgkill": 131,
        "sched_setparam": 118, "sched_setscheduler": 119, "sched_setaffinity": 122,
        "sched_setattr": 274, "prlimit64": 261, "migrate_pages": 238, "move_pages": 239,
        "setpriority": 140, "ioprio_set": 30,
    },
}  # fmt: skip

_SELF = "self"  # stands for this process's pid in _SECCOMP_SELF_ONLY
#: Calls allowed only on this process: (syscall, ((argument index, allowed values), ...)).
_SECCOMP_SELF_ONLY = (
    ("kill", ((0, (_SELF,)),)),  # raise(); kill(0, ...) would signal the whole group
    ("tgkill", ((0, (_SELF,)),)),  # abort()
    ("sched_setparam", ((0, (0, _SELF)),)),
    ("sched_setscheduler", ((0, (0, _SELF)),)),
    ("sched_setaffinity", ((0, (0, _SELF)),)),
    ("sched_setattr", ((0, (0, _SELF)),)),
    ("prlimit64", ((0, (0, _SELF)),)),  # glibc's setrlimit is prlimit64(0, ...)
    ("migrate_pages", ((0, (0, _SELF)),)),
    ("move_pages", ((0, (0, _SELF)),)),
    ("setpriority", ((0, (0,)), (1, (0, _SELF)))),  # PRIO_PROCESS only, not PRIO_PGRP/PRIO_USER
    ("ioprio_set", ((0, (1,)), (1, (0, _SELF)))),  # IOPRIO_WHO_PROCESS only
)


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
    for name, conditions in _SECCOMP_SELF_ONLY:
        body: list[tuple[int, int, int, int]] = []
        for index, values in conditions:
            # The low 32 bits of the argument: these are all int/pid_t parameters.
            body.append((ld_abs, 0, 0, arg0 + 8 * index))
            allowed = [pid if v == _SELF else v for v in values]
            for i, value in enumerate(allowed):
                body.append((jeq, len(allowed) - i, 0, value))  # match: past the "deny" below
            body.append((ret, 0, 0, deny))
        body.append((ret, 0, 0, allow))
        prog.append((jeq, 0, len(body), table[name]))  # another syscall: skip this block
        prog += body
    prog.append((ret, 0, 0, allow))
    return prog


def _set_no_new_privs() -> bool:
    """``prctl(PR_SET_NO_NEW_PRIVS)``: required for seccomp and Landlock without CAP_SYS_ADMIN."""
    import ctypes

    try:
        prctl = _libc().prctl
        prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
        return prctl(38, 1, None, 0, 0) == 0
    except (OSError, AttributeError):
        return False


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
        if not _set_no_new_privs():
            return False
        prctl = _libc().prctl
        prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
        return prctl(22, 2, ctypes.addressof(fprog), 0, 0) == 0  # PR_SET_SECCOMP, MODE_FILTER
    except (OSError, AttributeError):
        return False


# Landlock (Linux >= 5.13, <linux/landlock.h>): the same syscall numbers on x86_64 and aarch64.
_LANDLOCK_CREATE_RULESET, _LANDLOCK_ADD_RULE, _LANDLOCK_RESTRICT_SELF = 444, 445, 446
_LL_EXECUTE, _LL_WRITE_FILE, _LL_READ_FILE, _LL_READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
_LL_MAKE_CHAR, _LL_MAKE_BLOCK = 1 << 6, 1 << 11
_LL_REFER, _LL_TRUNCATE, _LL_IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15  # since ABI 2, 3 and 5
_LL_SCOPE_ABSTRACT_UNIX_SOCKET, _LL_SCOPE_SIGNAL = 1 << 0, 1 << 1  # since ABI 6
# The rights that apply to a file (not a folder) beneath which a rule is added.
_LL_FILE_RIGHTS = _LL_EXECUTE | _LL_WRITE_FILE | _LL_READ_FILE | _LL_TRUNCATE | _LL_IOCTL_DEV


def _landlock_syscall(number: int, *args: Any) -> int:
    import ctypes

    syscall = _libc().syscall
    syscall.restype = ctypes.c_long
    return int(syscall(ctypes.c_long(number), *args))


def _landlock_abi() -> int:
    """The kernel's Landlock ABI version; 0 where there is none (old kernel, disabled, not Linux)."""
    import ctypes

    if sys.platform != "linux" or os.uname().machine not in _SECCOMP_TABLES:
        return 0
    try:  # LANDLOCK_CREATE_RULESET_VERSION
        version = _landlock_syscall(_LANDLOCK_CREATE_RULESET, None, ctypes.c_long(0), ctypes.c_long(1))
    except (OSError, AttributeError):
        return 0
    return max(version, 0)


def _landlock_fs_rights(abi: int) -> int:
    """Every filesystem access right the ABI knows: all of them are handled (denied by default)."""
    rights = (1 << 13) - 1  # ABI 1: EXECUTE .. MAKE_SYM
    if abi >= 2:
        rights |= _LL_REFER
    if abi >= 3:
        rights |= _LL_TRUNCATE
    if abi >= 5:
        rights |= _LL_IOCTL_DEV
    return rights


def _landlock_ruleset(tmp: str, read_roots: tuple[str, ...]) -> int | None:
    """Build the Landlock ruleset of the child; its fd, or None where Landlock is unavailable.

    Built before the uid drop (the read roots may be reachable only by root), enforced after it by
    :func:`_landlock_restrict`. Rules: everything but execute and device nodes beneath the sandbox
    folder; read (files and listings) beneath the read roots; ``/dev/null`` read-write and the
    random devices read-only. Everything else, every handled right, is denied.
    """
    abi = _landlock_abi()
    if abi < 1:
        return None
    handled = _landlock_fs_rights(abi)
    read = _LL_READ_FILE | _LL_READ_DIR
    rules = [(tmp, handled & ~(_LL_EXECUTE | _LL_MAKE_CHAR | _LL_MAKE_BLOCK), True)]
    rules += [(root, read, False) for root in read_roots]
    rules += [
        ("/dev/null", _LL_READ_FILE | _LL_WRITE_FILE | _LL_TRUNCATE, False),
        ("/dev/urandom", _LL_READ_FILE, False),
        ("/dev/random", _LL_READ_FILE, False),
    ]
    return _landlock_build(abi, rules)


def _landlock_build(abi: int, rules: list[tuple[str, int, bool]]) -> int | None:
    """A Landlock ruleset that handles every right ``abi`` knows and grants only ``rules``.

    Each rule is ``(path, rights, required)``: ``rights`` beneath ``path`` (masked to the handled
    rights, and to the rights that apply to a file when ``path`` is not a folder). A missing
    optional path is skipped; a required one that cannot be added means no ruleset (None), as does
    a kernel without Landlock (``abi < 1``). From ABI 6 signals and abstract unix sockets are scoped
    to the sandbox too. Shared with :mod:`lmforge.common.command_sandbox`.
    """
    import ctypes
    import stat

    if abi < 1:
        return None
    handled = _landlock_fs_rights(abi)

    class RulesetAttr(ctypes.Structure):
        _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64),
                    ("scoped", ctypes.c_uint64)]  # fmt: skip

    class PathBeneath(ctypes.Structure):
        _pack_ = 1
        _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]

    attr = RulesetAttr(handled, 0, 0)
    size = 8  # only handled_access_fs: what ABI 1 knows
    if abi >= 6:  # no signals to, nor abstract unix sockets of, processes outside the sandbox
        attr.scoped = _LL_SCOPE_ABSTRACT_UNIX_SOCKET | _LL_SCOPE_SIGNAL
        size = ctypes.sizeof(attr)
    try:
        ruleset = _landlock_syscall(
            _LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_long(size), ctypes.c_long(0)
        )
    except (OSError, AttributeError):
        return None
    if ruleset < 0:
        return None
    for path, access, required in rules:
        added = False
        try:
            fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
        except OSError:
            fd = -1
        if fd >= 0:
            try:
                if not stat.S_ISDIR(os.fstat(fd).st_mode):
                    access &= _LL_FILE_RIGHTS  # the kernel refuses folder rights on a file
                rule = PathBeneath(access & handled, fd)
                added = _landlock_syscall(
                    _LANDLOCK_ADD_RULE, ctypes.c_long(ruleset), ctypes.c_long(1),  # PATH_BENEATH
                    ctypes.byref(rule), ctypes.c_long(0),
                ) == 0  # fmt: skip
            except (OSError, AttributeError):
                pass
            finally:
                os.close(fd)
        if required and not added:  # without the folder the code could not work: no Landlock
            os.close(ruleset)
            return None
    return ruleset


def _landlock_restrict(ruleset: int) -> bool:
    """Enforce the ruleset on this process (and anything it could start); closes the fd."""
    import ctypes

    try:
        if not _set_no_new_privs():
            return False
        return _landlock_syscall(_LANDLOCK_RESTRICT_SELF, ctypes.c_long(ruleset), ctypes.c_long(0)) == 0
    except (OSError, AttributeError):
        return False
    finally:
        os.close(ruleset)


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
    """Build the audit hook. It is self-contained and immutable on purpose.

    User code can reach module globals, the ``builtins`` module and, through ``sys._getframe`` or
    a traceback, the hook's own frames and their locals (a gc finalizer or the CPU-limit handler
    may run *inside* the hook). So:

    * every function below reads only its parameters: no globals (which could be rebound), no
      closure cells (``cell.cell_contents`` can be assigned without any audit event); what they
      use is bound as positional defaults, which are tuples, strings, frozensets and builtin
      functions and types. Replacing a default, ``__code__`` or any attribute of these functions
      is an ``object.__setattr__`` event, refused;
    * there is no on/off flag: the only state is ``busy`` in the hook's own cell, and the hook
      function itself is unreachable (frames do not expose it, ``gc.get_referrers`` is refused);
    * a re-entered hook (a finalizer or signal handler running in the middle of a check, the
      moment a TOCTOU rename or ``chdir`` would need) refuses everything except the two read-only
      events the hook itself raises while reporting (``sys._getframe``, ``object.__getattr__``);
    * the whole check runs in ``try``/``except BaseException``: anything unexpected (a removed
      cwd, ``RecursionError``, ``KeyboardInterrupt``) fails closed with a "forbidden" report and
      ``os._exit``. If even that fails (no stack left), the exception propagates, which aborts
      the audited operation, and ``busy`` stays set, so every later audited operation is refused.
    """
    import posix

    write_flags = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
    # Directory fds are refused outright: the "open" event does not carry dir_fd, so a path that
    # is relative to a directory fd cannot be checked (nor can later dir_fd=/fchdir uses).
    dir_flags = os.O_DIRECTORY | getattr(os, "O_PATH", 0)
    # Flush the real buffer through its (immutable) type: user code can rebind attributes of
    # sys.stdout, and nothing user-controlled should run while the hook is reporting.
    binary = channel.stdout._out if channel.stdout is not None else None
    flush_binary = type(binary).flush if binary is not None else None
    layers_json = "[" + ", ".join('"' + name + '"' for name in channel.layers) + "]"
    fallback = ('\n{"kind": "forbidden", "error": "refused by the sandbox", "layers": '
                + layers_json + "}\n").encode()  # fmt: skip
    refused_exact = frozenset({
        "os.system", "os.fork", "os.forkpty", "os.kill", "os.killpg", "os.startfile",
        "os.posix_spawn", "os.exec", "os.spawn", "subprocess.Popen", "pty.spawn",
        "signal.pthread_kill", "resource.setrlimit", "resource.prlimit", "sys.addaudithook",
        "code.__new__", "marshal.load", "marshal.loads", "gc.get_objects", "gc.get_referrers",
        "gc.get_referents", "_thread.start_new_thread", "webbrowser.open", "urllib.Request",
        "sys.remote_exec", "os.symlink", "os.link",
    })  # fmt: skip
    refused_prefixes = ("socket.", "ctypes.", "_ctypes.", "subprocess.", "os.exec", "os.spawn",
                        "os.posix_spawn", "winreg.", "_winapi.", "msvcrt.", "ftplib.", "smtplib.",
                        "http.", "imaplib.", "nntplib.", "poplib.", "telnetlib.")  # fmt: skip
    refused_imports = frozenset({
        "ctypes", "_ctypes", "socket", "_socket", "subprocess", "_posixsubprocess", "multiprocessing",
        "_multiprocessing", "pty", "ssl", "_ssl", "select", "mmap",
    })  # fmt: skip
    write_events = frozenset({
        "os.remove", "os.rmdir", "os.rename", "os.mkdir", "os.chmod", "os.chown", "os.truncate",
        "os.utime", "os.chflags", "os.lchflags", "os.setxattr", "os.removexattr", "os.chdir",
        "os.mkfifo", "os.mknod", "shutil.rmtree", "shutil.copyfile", "shutil.copymode",
        "shutil.copystat", "shutil.copytree", "shutil.move", "shutil.chown", "shutil.make_archive",
        "shutil.unpack_archive",
    })  # fmt: skip
    read_events = frozenset(
        {"os.listdir", "os.scandir", "os.getxattr", "os.listxattr", "glob.glob", "glob.glob/2"}
    )
    special_rw = frozenset({"/dev/null"})
    special_r = frozenset({"/dev/urandom", "/dev/random"})
    tmp_roots = (tmp,)
    readable = tmp_roots + read_roots

    def realpath(
        path, getcwd=posix.getcwd, lstat=posix.lstat, readlink=posix.readlink, os_error=OSError,
        str_join=str.join,
    ):  # fmt: skip
        # Not os.path.realpath: it calls os.lstat through the os module, which user code can rebind.
        # A link's relative target continues from the link's own folder (``resolved``).
        if not path.startswith("/"):
            path = getcwd() + "/" + path  # a removed cwd raises: the hook then fails closed
        resolved = []
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

    def as_path(value, realpath=realpath, type_of=type, str_t=str, bytes_t=bytes):
        # Only exact str/bytes: a subclass or an os.PathLike could answer differently the next time.
        kind = type_of(value)
        if kind is str_t:
            return realpath(value)
        if kind is bytes_t:
            return realpath(value.decode("utf-8", "surrogateescape"))
        return None

    def inside(path, roots):
        for root in roots:
            if path == root or path.startswith(root + "/"):
                return True
        return False

    def json_escape(text, ord_of=ord, str_join=str.join):
        # json.dumps could have been rebound by the user code.
        out = []
        for ch in text:
            code = ord_of(ch)
            if ch == '"' or ch == "\\" or code < 32 or code > 126:
                out.append("\\u%04x" % code if code <= 0xFFFF else "?")
            else:
                out.append(ch)
        return str_join("", out)

    def refuse(
        event, detail, getframe=sys._getframe, filename=_FILENAME, json_escape=json_escape,
        flush_binary=flush_binary, binary=binary, layers_json=layers_json, fallback=fallback,
        write_fd=os.write, fd=channel.fd, exit_now=os._exit, base_exc=BaseException, int_t=int,
        type_of=type,
    ):  # fmt: skip
        # Write a "forbidden" report and end the process at once: user code must not catch the
        # refusal and carry on. Never returns.
        try:
            line = None
            frame = getframe(1)
            while frame is not None:
                if frame.f_code.co_filename == filename:
                    line = frame.f_lineno
                    break
                frame = frame.f_back
            where = " (line %d)" % line if type_of(line) is int_t else ""
            message = "refused by the sandbox: " + event + detail + where
            try:
                if flush_binary is not None:
                    flush_binary(binary)
            except base_exc:  # noqa: BLE001 - the report matters more than the output
                pass
            # A leading newline: whatever the code left unterminated on the pipe stays apart.
            text = '\n{"kind": "forbidden", "error": "' + json_escape(message) + '", "layers": '
            data = (text + layers_json + "}\n").encode("utf-8")
        except base_exc:  # noqa: BLE001
            data = fallback
        try:
            while data:
                data = data[write_fd(fd, data) :]
        finally:
            exit_now(0)

    def describe(value, type_of=type, str_t=str, bytes_t=bytes):
        kind = type_of(value)
        return "(" + (value.__repr__() if kind is str_t or kind is bytes_t else "a non-str path") + ")"

    def check(
        event, args, refuse=refuse, as_path=as_path, inside=inside, describe=describe,
        stat=posix.stat, type_of=type, int_t=int, str_t=str, tuple_t=tuple, os_error=OSError,
        refused_exact=refused_exact, refused_prefixes=refused_prefixes,
        refused_imports=refused_imports, write_events=write_events, read_events=read_events,
        special_rw=special_rw, special_r=special_r, tmp_roots=tmp_roots, readable=readable,
        write_flags=write_flags, dir_flags=dir_flags,
    ):  # fmt: skip
        if type_of(event) is not str_t or type_of(args) is not tuple_t:
            refuse("an audit event", " of an unexpected type")
        if event in refused_exact or event.startswith(refused_prefixes):
            refuse(event, "")
        elif event == "open":
            path, mode, flags = (args + (None, None, None))[:3]
            if type_of(path) is int_t:
                return  # an fd that is already open
            where = as_path(path)
            if where is None:
                refuse("open", describe(path))
            if type_of(flags) is int_t:
                writing = flags & write_flags != 0
                dir_open = flags & dir_flags != 0
            else:  # no flags to go by: assume the worst
                writing = dir_open = True
            if where in special_rw or (where in special_r and not writing):
                return
            if not dir_open:
                try:
                    dir_open = stat(where).st_mode & 0o170000 == 0o040000  # a directory
                except os_error:
                    pass
            if dir_open:
                refuse("open", describe(path) + ": directories cannot be opened in the sandbox")
            if not inside(where, tmp_roots if writing else readable):
                refuse("open", describe(path) + " outside the sandbox folder")
        elif event in write_events or event in read_events:
            allowed = tmp_roots if event in write_events else readable
            for value in args:
                if value is None or type_of(value) is int_t:
                    continue  # a dir_fd (only the cwd can be one: no directory fd can be opened)
                where = as_path(value)
                if where is None or not inside(where, allowed):
                    refuse(event, describe(value) + " outside the sandbox folder")
        elif event == "import" and args and args[0] in refused_imports:
            refuse("import", " of " + args[0])

    own = (realpath, as_path, inside, json_escape, refuse, describe, check)
    busy = False

    def hook(
        event, args, check=check, refuse=refuse, own=own, base_exc=BaseException, tuple_t=tuple,
        type_of=type,
    ):  # fmt: skip
        nonlocal busy
        if busy:
            # Re-entered: the hook's own frame walk while reporting, or user code (a gc finalizer,
            # a signal handler) running in the middle of a check. Only reads pass.
            if event == "sys._getframe" or event == "object.__getattr__":
                return
            refuse(event, " while the sandbox was checking another operation")
        busy = True
        try:
            if event == "object.__setattr__" or event == "object.__delattr__":
                target = args[0] if type_of(args) is tuple_t and args else None
                for fn in own:
                    if target is fn:
                        refuse(event, " on the sandbox's own functions")
            else:
                check(event, args)
        except base_exc:  # noqa: BLE001 - fail closed, whatever went wrong
            refuse(event, " (the sandbox could not check it)")
        busy = False

    # The hook guards itself too (set before it is installed: no audit event yet).
    hook.__defaults__ = (check, refuse, own + (hook,), BaseException, tuple, type)
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
        if os.path.isdir(real):  # the audit hook would end the process: say it the usual way
            raise IsADirectoryError(21, "Is a directory", path)
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
