"""Run the commands of an untrusted repository (pip, python, pytest in a work-folder virtualenv).

:mod:`lmforge.common.sandbox` runs untrusted Python *functions* in a process that may not start
programs. Methods that install arbitrary repositories and run their tests need another profile:
executables must run, child processes are allowed, and the only network is loopback inside a
private network namespace where trusted services (a local package index) listen. This module is
that engine; it knows no method: what runs inside is given as argv lists and :class:`Service`
targets.

Libraries and tools checked before writing this: bubblewrap, firejail and nsjail do this job but are
programs, not Python packages, and none is installed here; Docker/podman are not available either;
``python-prctl``/``pyseccomp`` are bindings, not policies; ``os.unshare`` only exists from Python
3.12. So the engine is :mod:`subprocess` plus ``ctypes`` calls into libc (``unshare``, ``mount``,
``prctl``, the Landlock syscalls, reusing the helpers of :mod:`lmforge.common.sandbox`).

Processes (all started by :func:`run_commands`, which never raises for what the commands do):

* **parent** (the caller): validates the arguments, makes the work folder writable for ``nobody``
  (``chown -R 65534:65534`` when root; root can still read and remove it), writes the arguments to
  a JSON file, starts the *runner* (``sys.executable -I``, new session, stdin ``/dev/null``, a
  scrubbed environment) and reads its JSON lines from a dedicated pipe until it ends or the session
  deadline (the sum of the commands' wall limits plus slack) passes. It always ends with
  ``killpg(SIGKILL)`` of the runner's group and reaps it.
* **runner** (root, trusted): ``unshare(CLONE_NEWNET | CLONE_NEWPID)`` (then each alone, then
  none), then forks *init*, waits for it and exits.
* **init** (PID 1 of the new PID namespace, trusted): brings ``lo`` up in the new network namespace
  (``SIOCSIFFLAGS`` ioctl, no ``ip`` binary), makes its own IPC namespace and mount namespace with a
  fresh ``/proc`` (only this namespace's processes) and a private ``/dev/shm``, builds the Landlock
  ruleset, checks in a forked probe which confinement steps work (so :attr:`SessionResult.layers`
  is what the commands get), starts the services, then runs the commands one by one.
* **each command**: ``Popen(argv, stdout=PIPE, stderr=STDOUT, stdin=DEVNULL,
  start_new_session=True, preexec_fn=confine)``. ``confine`` runs in the forked child before
  ``exec``: a mount namespace of its own in which the folders ``nobody`` must reach are made
  traversable (below), the uid/gid drop to ``nobody`` (``setgroups([])`` first), ``no_new_privs``,
  Landlock, then the rlimits.

Layers (:data:`COMMAND_LAYERS`; the ones that worked are in :attr:`SessionResult.layers`):

* ``"rlimits"``: ``RLIMIT_CPU`` (soft; the hard limit one second later), ``RLIMIT_AS``,
  ``RLIMIT_FSIZE``, ``RLIMIT_NPROC`` and ``RLIMIT_CORE=0``, per process.
* ``"pidns"``: the commands cannot see or signal anything outside; after every command (ended,
  failed or timed out) init kills every other process of the namespace (``kill(-1, SIGKILL)`` from
  PID 1) and reaps them, so a daemonised grandchild never outlives its command.
* ``"netns"``: only loopback exists: nothing outside is reachable, and neither are the host's own
  ``127.0.0.1`` services (another namespace); the services listen on this loopback.
* ``"uid"`` (root only): commands run as ``nobody`` (65534), so file permissions apply and
  ``RLIMIT_NPROC`` counts (the kernel ignores it for root).
* ``"landlock"``: the work folder gets every right but making device nodes (execute included: the
  virtualenv lives there); read, list and execute beneath ``/usr``, ``/bin``, ``/lib``,
  ``/lib64``, ``/sbin``, ``/etc``, the Python install and ``read_roots``; read of ``/proc``;
  ``/dev/null`` read-write, ``/dev/urandom``/``/dev/random`` read; the private ``/dev/shm``
  read-write (Python's multiprocessing locks and torch's data loaders need it). Everything else,
  every right the kernel's Landlock ABI knows, is denied; from ABI 6 signals and abstract unix
  sockets are scoped to the command too.

Traversal (not a layer of its own): the Python install often lives below a private home (here
``/root`` is 0700), which ``nobody`` cannot traverse, so neither the interpreter nor a virtualenv
made from it would start. In each command's own mount namespace (private propagation: nothing
reaches the host), the topmost folder that blocks ``nobody`` on the way to a read root or the work
folder is covered by an empty tmpfs (mode 0711) into which exactly those folders are bind-mounted
back at the same paths (``open_tree``/``move_mount``). The rest of that private folder is not
there at all for the command. Where mount namespaces are refused, such folders stay unreachable.

Known gaps: without a PID namespace, leftovers that left the command's process group (``setsid``)
are not killed (the fallback is ``killpg`` of the command's group, plus the parent's kill of a
command that was running when the session ended); ``RLIMIT_NPROC`` counts every process of
``nobody`` on the machine, those of other sessions included; the CPU limit is per process, not per
command (the wall limit bounds the command); the number and total size of files written in the
work folder are not capped (each file is, by ``RLIMIT_FSIZE``), and the private ``/dev/shm`` (a tmpfs of ``memory_mb``) is memory outside ``RLIMIT_AS`` that lasts the whole session; the recursive ``chown`` of the work folder works by path, so a process left from an earlier session could race it (impossible with the PID namespace, which kills every leftover); Landlock (up to ABI 7) does not
cover ``connect`` to a unix socket file or path lookups (``stat``), so host sockets are guarded
only by their permissions against ``nobody``; ``/tmp`` is not writable (``TMPDIR`` points into the
work folder, which ``tempfile`` honours); services must not start processes (init kills every
process but itself after each command, and reaps every child). One session per work folder at a
time.
"""

from __future__ import annotations

import json
import math
import os
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

from lmforge.common.errors import UserError
from lmforge.common.sandbox import (
    _LL_EXECUTE,
    _LL_MAKE_BLOCK,
    _LL_MAKE_CHAR,
    _LL_READ_DIR,
    _LL_READ_FILE,
    _LL_TRUNCATE,
    _LL_WRITE_FILE,
    _check_limits,
    _has_exited,
    _killpg,
    _landlock_abi,
    _landlock_build,
    _landlock_fs_rights,
    _lower_limit,
    _one_line,
    _pidfd_open,
)

__all__ = [
    "COMMAND_LAYERS",
    "namespaces_available",
    "CommandLimits",
    "CommandResult",
    "Service",
    "SessionResult",
    "run_commands",
]

#: Every defence :attr:`SessionResult.layers` can list, in this order.
COMMAND_LAYERS = ("rlimits", "pidns", "netns", "uid", "landlock")
#: Every value :attr:`CommandResult.kind` can take.
COMMAND_KINDS = ("ok", "failed", "timeout", "killed", "not_run")

_NOBODY = 65534
_HOME = ".sandbox-home"
_TMP = ".sandbox-tmp"
_BASE_PATH = "/usr/local/bin:/usr/bin:/bin"
_SYSTEM_READ_ROOTS = ("/usr", "/bin", "/lib", "/lib64", "/sbin", "/etc")
# NOTE: the session deadline is the sum of the commands' wall limits plus this much for starting
# the runner and the services and for each command's cleanup; it only matters when init hangs.
_SESSION_SLACK_SECONDS = 60.0
_PER_COMMAND_SLACK_SECONDS = 5.0
_STDERR_TAIL = 64 * 1024
_MISSING = {
    "rlimits": "resource limits",
    "pidns": "a PID namespace (root or CAP_SYS_ADMIN)",
    "netns": "a network namespace (root or CAP_SYS_ADMIN)",
    "uid": "to run the commands as nobody (start it as root)",
    "landlock": "Landlock (Linux >= 5.13 with Landlock enabled)",
}
_TARGET = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")

# The runner: read and delete the payload, make lmforge and the caller's modules importable, go.
_BOOTSTRAP = (
    "import json, os, sys\n"
    "with open(sys.argv[1], encoding='utf-8') as f:\n"
    "    payload = json.load(f)\n"
    "os.unlink(sys.argv[1])\n"
    "sys.path[:0] = [p for p in payload['sys_path'] if p not in sys.path]\n"
    "from lmforge.common.command_sandbox import _runner_main\n"
    "_runner_main(payload, int(sys.argv[2]))\n"
)



def namespaces_available() -> bool:
    """Whether this process may give the commands their PID and network namespaces (Linux, root
    or CAP_SYS_ADMIN, and a kernel/container that allows them): probed in a throwaway child, so
    callers (and tests) can tell "this machine cannot sandbox" before trying."""
    import subprocess

    if sys.platform != "linux" or os.geteuid() != 0:
        return False
    probe = ("import ctypes, sys; "
             "sys.exit(ctypes.CDLL(None, use_errno=True).unshare(0x40000000 | 0x20000000) != 0)")
    try:
        return subprocess.run([sys.executable, "-I", "-c", probe], timeout=30, check=False).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False

@dataclass(frozen=True)
class CommandLimits:
    """Limits of every command of a session.

    Attributes:
        wall_seconds: wall clock per command; the command's whole process tree is killed after it.
        cpu_seconds: ``RLIMIT_CPU`` of each process (rounded up to whole seconds).
        memory_mb: ``RLIMIT_AS`` of each process.
        file_mb: ``RLIMIT_FSIZE``: the largest file a process may write.
        processes: ``RLIMIT_NPROC`` (processes and threads of ``nobody``).
        max_output_bytes: output kept per command; beyond it the first and last halves are kept
            with a ``[... N bytes dropped ...]`` line between (test summaries come at the end).
    """

    wall_seconds: float = 900.0
    cpu_seconds: float = 900.0
    memory_mb: int = 4096
    file_mb: int = 1024
    processes: int = 512
    max_output_bytes: int = 4_000_000

    def __post_init__(self) -> None:
        _check_limits(self)


@dataclass(frozen=True)
class Service:
    """Trusted code started inside the sandbox's network namespace before any command runs.

    Attributes:
        target: ``"package.module:callable"``; called with ``kwargs``, it returns an object with a
            ``url: str`` attribute and a ``stop()`` method (e.g. an HTTP server on 127.0.0.1:0).
        kwargs: JSON-serialisable keyword arguments.
        env: when non-empty, every command gets the service's ``url`` in this variable.
    """

    target: str
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    env: str = ""


@dataclass
class CommandResult:
    """How one command ended.

    Attributes:
        argv: the command.
        kind: ``"ok"`` (exit 0), ``"failed"`` (non-zero exit; an executable that was not found is
            127, one that could not be started 126, with the reason in ``output``), ``"timeout"``
            (killed at the wall limit, or by the CPU limit), ``"killed"`` (died of another signal),
            ``"not_run"`` (an earlier command failed with ``stop_on_failure``, or the session
            could not run).
        returncode: the exit status; None for ``"timeout"``, ``"killed"`` and ``"not_run"``.
        output: stdout and stderr interleaved, decoded as UTF-8 (invalid bytes replaced), capped
            at ``max_output_bytes``; a timeout or a killing signal adds a ``[command sandbox: ...]``
            line at the end.
        seconds: wall-clock time it took.
    """

    argv: list[str]
    kind: str
    returncode: int | None
    output: str
    seconds: float


@dataclass
class SessionResult:
    """What a :func:`run_commands` session produced.

    Attributes:
        commands: one result per argv, in order.
        layers: the defences that were active (from :data:`COMMAND_LAYERS`, in that order).
        services: each service's env name (its target when ``env`` is empty) -> its url.
        error: one line when the session could not run (a required layer missing, a service that
            failed to start, a runner that crashed or ran past the session deadline); the commands
            are then all ``"not_run"`` except those that had already finished.
    """

    commands: list[CommandResult]
    layers: tuple[str, ...]
    services: dict[str, str]
    error: str | None = None

    @property
    def ok(self) -> bool:
        """No error, and every command ended with exit status 0."""
        return self.error is None and all(c.kind == "ok" for c in self.commands)


# --------------------------------------------------------------------------------------------------
# Parent side
# --------------------------------------------------------------------------------------------------


def run_commands(
    argvs: Sequence[Sequence[str]],
    workdir: str | Path,
    *,
    env: Mapping[str, str] | None = None,
    path_prepend: Sequence[str | Path] = (),
    services: Sequence[Service] = (),
    limits: CommandLimits = CommandLimits(),
    read_roots: Sequence[str | Path] = (),
    require: Iterable[str] = ("netns",),
    stop_on_failure: bool = True,
    cwd: str | Path | None = None,
) -> SessionResult:
    """Run ``argvs`` one by one in the command sandbox, inside ``workdir``.

    Args:
        argvs: the commands; each is executed directly (no shell), the executable looked up on
            the commands' ``PATH``.
        workdir: the folder the commands may write (and execute from); it must exist. When root,
            its whole tree is given to ``nobody`` first.
        env: extra environment of the commands (nothing of this process's environment passes).
        path_prepend: folders put before ``/usr/local/bin:/usr/bin:/bin`` on ``PATH`` (relative
            ones are taken relative to ``workdir``).
        services: trusted services started in the sandbox's network namespace first.
        limits: the per-command limits.
        read_roots: extra folders the commands may read and execute from.
        require: layers without which nothing runs (the result's ``error`` says which is missing).
        stop_on_failure: after a command that is not ``"ok"``, the rest are ``"not_run"``.
        cwd: the folder inside ``workdir`` the commands run in (relative ones are taken relative
            to ``workdir``); default ``workdir``. It may be created by an earlier command.

    Returns:
        A :class:`SessionResult`; whatever the commands do ends in it, not in an exception.

    Raises:
        UserError: for caller mistakes: a missing ``workdir``, an empty argv or one that is not a
            list of strings, an unknown layer in ``require``, ``cwd`` outside ``workdir``, bad
            ``limits``, a malformed service or environment.
    """
    import shutil
    import tempfile

    commands = _check_argvs(argvs)
    root = _check_workdir(workdir)
    run_dir = _check_cwd(cwd, root)
    if not isinstance(limits, CommandLimits):
        raise UserError(f"limits must be a CommandLimits, got {type(limits).__name__}")
    required = _check_require(require)
    specs = _check_services(services)
    extra_env = _check_env(env)
    prepend = _check_path_prepend(path_prepend, root)
    roots = _check_read_roots(read_roots)

    home, tmp = os.path.join(root, _HOME), os.path.join(root, _TMP)
    for folder in (home, tmp):
        if os.path.islink(folder) or (os.path.lexists(folder) and not os.path.isdir(folder)):
            os.unlink(folder)  # planted by an earlier session's commands: never follow it
        os.makedirs(folder, exist_ok=True)
    if os.geteuid() == 0:
        _give_to_nobody(root)
    command_env = {
        "PATH": ":".join([*prepend, _BASE_PATH]),
        "HOME": home,
        "TMPDIR": tmp,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        **extra_env,
    }
    src_root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    payload = {
        "argvs": commands,
        "workdir": root,
        "cwd": run_dir,
        "env": command_env,
        "services": specs,
        "read_roots": [*_default_read_roots(), *roots],
        "require": sorted(required),
        "stop_on_failure": bool(stop_on_failure),
        "limits": {name: getattr(limits, name) for name in limits.__dataclass_fields__},
        "sys_path": [src_root] + [os.path.abspath(p or os.curdir) for p in sys.path],
        "parent_pid": os.getpid(),
    }
    deadline = (limits.wall_seconds + _PER_COMMAND_SLACK_SECONDS) * len(commands)
    deadline += _SESSION_SLACK_SECONDS
    scratch = tempfile.mkdtemp(prefix="lmforge-commands-")  # 0700: the commands never see it
    try:
        payload_path = os.path.join(scratch, "payload.json")
        with open(payload_path, "w", encoding="utf-8") as f:
            json.dump(payload, f)
        reports, stderr, timed_out = _spawn_runner(scratch, payload_path, deadline)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return _session_result(commands, reports, stderr, timed_out, deadline)


def _check_argvs(argvs: Any) -> list[list[str]]:
    if isinstance(argvs, (str, bytes, Mapping)) or not isinstance(argvs, Iterable):
        raise UserError("argvs must be a list of commands, each a list of strings")
    commands = []
    for argv in argvs:
        if isinstance(argv, (str, bytes)) or not isinstance(argv, Sequence):
            raise UserError(f"a command must be a list of strings, got {argv!r:.80}")
        if not argv:
            raise UserError("a command must not be empty")
        if not all(isinstance(arg, str) and "\0" not in arg for arg in argv):
            raise UserError(f"a command must be a list of strings without NUL, got {argv!r:.80}")
        commands.append(list(argv))
    return commands


def _check_workdir(workdir: Any) -> str:
    if not isinstance(workdir, (str, os.PathLike)):
        raise UserError(f"workdir must be a path, got {type(workdir).__name__}")
    root = os.path.realpath(os.fspath(workdir))
    if not os.path.isdir(root):
        raise UserError(
            f"the sandbox's work folder {os.fspath(workdir)} is missing or not a folder"
        )
    if root == "/":
        raise UserError("the sandbox's work folder cannot be /")
    return root


def _check_cwd(cwd: Any, root: str) -> str:
    if cwd is None:
        return root
    if not isinstance(cwd, (str, os.PathLike)):
        raise UserError(f"cwd must be a path, got {type(cwd).__name__}")
    path = os.path.realpath(os.path.join(root, os.fspath(cwd)))
    if path != root and not path.startswith(root + os.sep):
        raise UserError(f"cwd {os.fspath(cwd)} is outside the sandbox's work folder {root}")
    return path


def _check_require(require: Any) -> set[str]:
    if isinstance(require, (str, bytes)):
        raise UserError("require must be a collection of layer names, not a string")
    try:
        names = set(require)
    except TypeError:
        raise UserError("require must be a collection of layer names") from None
    unknown = sorted(str(n) for n in names if n not in COMMAND_LAYERS)
    if unknown:
        raise UserError(
            f"unknown sandbox layer(s) {', '.join(unknown)}; known: {', '.join(COMMAND_LAYERS)}"
        )
    return names


def _check_services(services: Any) -> list[dict[str, Any]]:
    specs = []
    for service in services:
        if not isinstance(service, Service):
            raise UserError(f"services must be Service objects, got {type(service).__name__}")
        if not isinstance(service.target, str) or not _TARGET.match(service.target):
            raise UserError(
                f"a service target must be 'package.module:callable', got {service.target!r:.80}"
            )
        if not isinstance(service.env, str) or (service.env and not _ENV_NAME.match(service.env)):
            raise UserError(f"a service's env must be a variable name, got {service.env!r:.80}")
        if not isinstance(service.kwargs, Mapping):
            raise UserError(f"the kwargs of service {service.target} must be a mapping")
        try:
            kwargs = json.loads(json.dumps(dict(service.kwargs)))
        except (TypeError, ValueError) as exc:
            raise UserError(
                f"the kwargs of service {service.target} must be JSON-serialisable: {exc}"
            ) from None
        specs.append({"target": service.target, "kwargs": kwargs, "env": service.env})
    return specs


def _check_env(env: Any) -> dict[str, str]:
    if env is None:
        return {}
    if not isinstance(env, Mapping):
        raise UserError(f"env must be a mapping of strings, got {type(env).__name__}")
    out = {}
    for key, value in env.items():
        if not isinstance(key, str) or not key or "=" in key or "\0" in key:
            raise UserError(f"env names must be non-empty strings without '=', got {key!r:.80}")
        if not isinstance(value, str) or "\0" in value:
            raise UserError(f"env[{key!r}] must be a string without NUL, got {value!r:.80}")
        out[key] = value
    return out


def _check_path_prepend(path_prepend: Any, root: str) -> list[str]:
    if isinstance(path_prepend, (str, bytes, os.PathLike)):
        raise UserError("path_prepend must be a list of folders, not one path")
    folders = []
    for entry in path_prepend:
        if not isinstance(entry, (str, os.PathLike)):
            raise UserError(f"path_prepend entries must be paths, got {entry!r:.80}")
        folder = os.path.join(root, os.fspath(entry))
        if ":" in folder or "\0" in folder:
            raise UserError(f"a PATH folder cannot contain ':', got {folder!r:.80}")
        folders.append(folder)
    return folders


def _check_read_roots(read_roots: Any) -> list[str]:
    if isinstance(read_roots, (str, bytes, os.PathLike)):
        raise UserError("read_roots must be a list of folders, not one path")
    roots = []
    for entry in read_roots:
        if not isinstance(entry, (str, os.PathLike)):
            raise UserError(f"read_roots entries must be paths, got {entry!r:.80}")
        root = os.path.abspath(os.fspath(entry))
        if os.path.realpath(root) == "/":
            raise UserError("a read root cannot be / (that would let the commands read everything)")
        roots.append(root)
    return roots


def _default_read_roots() -> list[str]:
    """The system folders and the Python install (its prefixes; realpaths are taken in init)."""
    roots = list(_SYSTEM_READ_ROOTS)
    for prefix in (sys.base_prefix, sys.prefix, sys.exec_prefix, sys.base_exec_prefix):
        if prefix:
            roots.append(prefix)
    return roots


def _give_to_nobody(root: str) -> None:
    """``chown -R 65534:65534 root`` without following any link.

    NOTE: a file with several hard links keeps its owner: one of its names may be outside the
    folder (a link planted by an earlier session), and chown would give that file to the commands.
    """
    import stat

    def own(path: str, st: os.stat_result) -> None:
        if st.st_uid == _NOBODY and st.st_gid == _NOBODY:
            return
        if not stat.S_ISDIR(st.st_mode) and st.st_nlink > 1:
            return
        try:
            os.chown(path, _NOBODY, _NOBODY, follow_symlinks=False)
        except OSError:
            pass  # vanished, or a filesystem without owners: the commands find out

    own(root, os.lstat(root))
    pending = [root]
    while pending:
        folder = pending.pop()
        try:
            entries = list(os.scandir(folder))
        except OSError:
            continue
        for entry in entries:
            try:
                st = entry.stat(follow_symlinks=False)
            except OSError:
                continue
            own(entry.path, st)
            if stat.S_ISDIR(st.st_mode):
                pending.append(entry.path)


def _spawn_runner(scratch: str, payload_path: str, seconds: float) -> tuple[list[dict], str, bool]:
    """Start the runner and read its reports until it ends or ``seconds`` pass.

    Returns:
        The JSON objects it reported, the tail of its stderr, and whether the deadline passed.
    """
    import selectors
    import signal
    import subprocess
    import time

    env = {"PATH": os.defpath, "LANG": "C.UTF-8", "LC_ALL": "C.UTF-8"}
    report_r, report_w = os.pipe()
    deadline = time.monotonic() + seconds
    try:
        proc = subprocess.Popen(
            [sys.executable, "-I", "-c", _BOOTSTRAP, payload_path, str(report_w)],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            cwd=scratch,
            env=env,
            start_new_session=True,  # its own process group: one killpg ends it and init
            pass_fds=(report_w,),
        )
    except BaseException:
        os.close(report_r)
        raise
    finally:
        os.close(report_w)  # EOF on the report pipe then means runner and init are gone
    pid = proc.pid
    assert proc.stderr is not None
    reports: list[dict] = []
    pending = bytearray()
    stderr = bytearray()
    running: dict[int, int] = {}  # command index -> its process group, while it runs
    no_pidns = False
    streams = {report_r: "report", proc.stderr.fileno(): "stderr"}
    exited = timed_out = False
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
                timed_out = not exited or report_r in streams
                break
            events = sel.select(remaining if pidfd is not None else min(remaining, 0.05))
            for key, _ in events:
                if key.fd == pidfd:
                    sel.unregister(pidfd)
                    exited = True
                    continue
                chunk = os.read(key.fd, 1 << 16)
                if not chunk:
                    sel.unregister(key.fd)
                    del streams[key.fd]
                    continue
                if streams[key.fd] == "stderr":
                    stderr += chunk
                    if len(stderr) > 2 * _STDERR_TAIL:
                        del stderr[:-_STDERR_TAIL]
                    continue
                pending += chunk
                *lines, rest = pending.split(b"\n")
                pending = bytearray(rest)
                for line in lines:
                    report = _parse_report(line)
                    if report is None:
                        continue
                    reports.append(report)
                    if "layers" in report:
                        no_pidns = "pidns" not in report["layers"]
                    if "started" in report:
                        running[report["started"]] = report.get("pgid", 0)
                    if "command" in report:
                        running.clear()
                    if "done" in report:
                        # Only the services' stop() is left: a moment, not the whole deadline.
                        deadline = min(deadline, time.monotonic() + 5.0)
            if not exited and pidfd is None:
                exited = _has_exited(pid)
            if exited and report_r not in streams:
                break
    finally:
        sel.close()
        _killpg(pid)
        if no_pidns:
            # NOTE: without a PID namespace a command's group is not ended by init's death; the
            # command that was running when the session ended is killed here (its group id is
            # still its own: init had not reaped it).
            for pgid in running.values():
                if isinstance(pgid, int) and pgid > 1:
                    try:
                        os.killpg(pgid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass
        _, status = os.waitpid(pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)  # so Popen does not re-wait
        for fd in (report_r, pidfd):
            if fd is not None:
                os.close(fd)
        proc.stderr.close()
    if pending:
        report = _parse_report(bytes(pending))
        if report is not None:
            reports.append(report)
    return reports, stderr.decode("utf-8", errors="replace"), timed_out


def _parse_report(line: bytes) -> dict | None:
    try:
        obj = json.loads(line)
    except ValueError:
        return None
    return obj if isinstance(obj, dict) else None


def _session_result(
    commands: list[list[str]], reports: list[dict], stderr: str, timed_out: bool, deadline: float
) -> SessionResult:
    """Assemble the runner's reports; what it never reported is ``"not_run"``."""
    layers: tuple[str, ...] = ()
    urls: dict[str, str] = {}
    results: list[CommandResult] = []
    error: str | None = None
    done = False
    for report in reports:
        if isinstance(report.get("layers"), list):
            found = {str(x) for x in report["layers"]}
            layers = tuple(name for name in COMMAND_LAYERS if name in found)
        if isinstance(report.get("services"), dict):
            urls = {str(k): str(v) for k, v in report["services"].items()}
        if isinstance(report.get("command"), dict) and len(results) < len(commands):
            results.append(_command_result(commands[len(results)], report["command"]))
        if report.get("error") and error is None:
            error = _one_line(str(report["error"]))
        if report.get("done"):
            done = True
    if error is None and not done:
        if timed_out:
            error = f"the command session ran past its deadline of {deadline:g}s and was killed"
        else:
            last = next((ln.strip() for ln in reversed(stderr.splitlines()) if ln.strip()), "")
            error = "the command sandbox's runner ended without finishing"
            error = _one_line(error + (f": {last}" if last else ""))
    for argv in commands[len(results) :]:
        results.append(CommandResult(list(argv), "not_run", None, "", 0.0))
    return SessionResult(results, layers, urls, error)


def _command_result(argv: list[str], report: dict) -> CommandResult:
    kind = report.get("kind")
    if kind not in COMMAND_KINDS:
        kind = "killed"
    code = report.get("returncode")
    if kind not in ("ok", "failed") or not isinstance(code, int):
        code = None
    output, seconds = str(report.get("output", "")), float(report.get("seconds", 0.0))
    return CommandResult(list(argv), str(kind), code, output, seconds)


# --------------------------------------------------------------------------------------------------
# Runner and init: everything below runs in the sandbox's processes (as root when started as root)
# --------------------------------------------------------------------------------------------------

_CLONE_NEWNS, _CLONE_NEWIPC = 0x00020000, 0x08000000
_CLONE_NEWPID, _CLONE_NEWNET = 0x20000000, 0x40000000
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 0x2, 0x4, 0x8
_MS_REC, _MS_PRIVATE = 0x4000, 1 << 18
_PR_SET_PDEATHSIG, _PR_SET_NO_NEW_PRIVS = 1, 38
# open_tree/move_mount (Linux 5.2): the same numbers on x86_64 and aarch64, as every syscall >= 424.
_SYS_OPEN_TREE, _SYS_MOVE_MOUNT = 428, 429
_LANDLOCK_RESTRICT_SELF = 446
_AT_FDCWD, _AT_RECURSIVE = -100, 0x8000
_OPEN_TREE_CLONE, _MOVE_MOUNT_F_EMPTY_PATH = 1, 0x4
_SIOCGIFFLAGS, _SIOCSIFFLAGS, _IFF_UP = 0x8913, 0x8914, 0x1
# The confinement steps, as bits of the probe's exit status.
_STEP_MOUNTS, _STEP_UID, _STEP_LANDLOCK, _STEP_RLIMITS = 1, 2, 4, 8


class _Reporter:
    """The report pipe: one JSON line per report."""

    def __init__(self, fd: int) -> None:
        self.fd = fd

    def send(self, report: dict[str, Any]) -> None:
        data = (json.dumps(report) + "\n").encode("utf-8")
        while data:
            data = data[os.write(self.fd, data) :]


def _runner_main(payload: dict[str, Any], report_fd: int) -> NoReturn:
    """The runner (started by :func:`run_commands`): namespaces, then init; never returns."""
    reporter = _Reporter(report_fd)
    code = 1
    try:
        _die_with_parent(payload["parent_pid"])
        entered = _enter_namespaces()
        pid = os.fork()
        if pid == 0:
            _init_entry(payload, reporter, entered)
        os.close(report_fd)  # init holds the pipe now: its EOF tells the parent that init is gone
        while True:
            try:
                _, status = os.waitpid(pid, 0)
            except InterruptedError:
                continue
            break
        code = 0 if os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0 else 1
    except BaseException as exc:  # noqa: BLE001 - report instead of a traceback
        try:
            reporter.send({"error": f"the command sandbox's runner failed: {_describe(exc)}"})
        except OSError:
            pass
    os._exit(code)


def _init_entry(payload: dict[str, Any], reporter: _Reporter, entered: set[str]) -> NoReturn:
    code = 1
    try:
        _die_with_parent(None)  # (in a PID namespace getppid() is 0: the runner is outside)
        _init_main(payload, reporter, entered)
        code = 0
    except BaseException as exc:  # noqa: BLE001
        try:
            reporter.send({"error": f"the command sandbox failed: {_describe(exc)}"})
        except OSError:
            pass
    os._exit(code)


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return _one_line(f"{type(exc).__name__}: {text}" if text else type(exc).__name__)


def _libc() -> Any:
    import ctypes

    return ctypes.CDLL(None, use_errno=True)


def _die_with_parent(parent_pid: int | None) -> None:
    """``PR_SET_PDEATHSIG(SIGKILL)``: this process dies with the one that started it.

    Args:
        parent_pid: that process's pid, to catch its death before the call; None: not checked.
    """
    import ctypes
    import signal

    prctl = _libc().prctl
    prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0)
    if parent_pid is not None and os.getppid() != parent_pid:  # it was already gone
        os._exit(1)


def _enter_namespaces() -> set[str]:
    """``unshare`` a network and a PID namespace (together, else each alone); what worked."""
    if sys.platform != "linux":
        return set()
    unshare = _libc().unshare
    if unshare(_CLONE_NEWNET | _CLONE_NEWPID) == 0:
        return {"netns", "pidns"}
    entered = set()
    if unshare(_CLONE_NEWNET) == 0:
        entered.add("netns")
    if unshare(_CLONE_NEWPID) == 0:
        entered.add("pidns")
    return entered


def _loopback_up() -> None:
    """Bring ``lo`` up (SIOCGIFFLAGS, SIOCSIFFLAGS with IFF_UP): 127.0.0.1 then works here."""
    import fcntl
    import socket
    import struct

    layout = "16sH22x"  # struct ifreq: the name, ifr_flags, the rest of the 24-byte union
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        got = fcntl.ioctl(sock.fileno(), _SIOCGIFFLAGS, struct.pack(layout, b"lo", 0))
        flags = struct.unpack(layout, got)[1]
        fcntl.ioctl(sock.fileno(), _SIOCSIFFLAGS, struct.pack(layout, b"lo", flags | _IFF_UP))


def _private_mounts(pidns: bool, shm_mb: int) -> str | None:
    """Mount and IPC namespaces for init: a fresh ``/proc``, a private ``/dev/shm`` (best effort).

    Returns:
        The private shared-memory folder, or None where none could be made.
    """
    import ctypes

    libc = _libc()
    libc.mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                           ctypes.c_char_p]  # fmt: skip
    # NOTE: an IPC namespace as well (best effort, not a listed layer): System V shared memory,
    # semaphores and message queues of the host are out of reach.
    libc.unshare(_CLONE_NEWIPC)
    if libc.unshare(_CLONE_NEWNS) != 0:
        return None
    # Nothing mounted from now on may propagate to the host's mount namespace.
    if libc.mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
        return None
    if pidns and os.path.isdir("/proc"):
        # This namespace's processes only (the host's /proc lists every command line on it).
        libc.mount(b"proc", b"/proc", b"proc", _MS_NOSUID | _MS_NODEV | _MS_NOEXEC, None)
    shm = "/dev/shm"
    if not os.path.isdir(shm):
        return None
    options = f"mode=1777,size={int(shm_mb)}m".encode()
    if libc.mount(b"tmpfs", shm.encode(), b"tmpfs", _MS_NOSUID | _MS_NODEV, options) != 0:
        return None
    return shm


def _existing_roots(paths: Iterable[str]) -> list[str]:
    """Realpaths of the paths that exist, without duplicates, in order."""
    roots: list[str] = []
    for path in paths:
        real = os.path.realpath(path)
        if real != "/" and os.path.exists(real) and real not in roots:
            roots.append(real)
    return roots


def _command_ruleset(workdir: str, roots: list[str], shm: str | None) -> int | None:
    """The Landlock ruleset of every command (see the module docstring); None without Landlock."""
    abi = _landlock_abi()
    if abi < 1:
        return None
    handled = _landlock_fs_rights(abi)
    no_devices = handled & ~(_LL_MAKE_CHAR | _LL_MAKE_BLOCK)
    read_exec = _LL_READ_FILE | _LL_READ_DIR | _LL_EXECUTE
    rules = [(workdir, no_devices, True)]
    rules += [(root, read_exec, False) for root in roots]
    rules += [
        ("/proc", _LL_READ_FILE | _LL_READ_DIR, False),
        ("/dev/null", _LL_READ_FILE | _LL_WRITE_FILE | _LL_TRUNCATE, False),
        ("/dev/urandom", _LL_READ_FILE, False),
        ("/dev/random", _LL_READ_FILE, False),
    ]
    if shm is not None:
        rules.append((shm, no_devices & ~_LL_EXECUTE, False))
    return _landlock_build(abi, rules)


def _searchable_by_nobody(st: os.stat_result) -> bool:
    if st.st_uid == _NOBODY:
        return bool(st.st_mode & 0o100)
    if st.st_gid == _NOBODY:
        return bool(st.st_mode & 0o010)
    return bool(st.st_mode & 0o001)


def _reveal_plan(targets: list[str]) -> list[tuple[str, list[tuple[str, bool]]]]:
    """For each topmost folder that ``nobody`` cannot traverse, the targets beneath it.

    Returns:
        ``[(blocking folder, [(target, is_dir), ...]), ...]``, outermost targets only: a target
        beneath another one comes with it (bind mounts are recursive).
    """
    groups: dict[str, list[str]] = {}
    for target in targets:
        parts = target.strip("/").split("/")
        for i in range(1, len(parts)):
            ancestor = "/" + "/".join(parts[:i])
            try:
                st = os.stat(ancestor)
            except OSError:
                break
            if not _searchable_by_nobody(st):
                groups.setdefault(ancestor, []).append(target)
                break
    plan = []
    for ancestor, members in sorted(groups.items()):
        members = sorted(set(members))
        outer = [
            t for t in members if not any(t != o and t.startswith(o + "/") for o in members)
        ]
        if ancestor in outer:
            continue  # a target is the blocking folder itself: nothing to reveal
        plan.append((ancestor, [(t, os.path.isdir(t)) for t in outer]))
    return plan


class _Confiner:
    """The ``preexec_fn`` of every command (and of init's probe): mounts, uid, Landlock, rlimits.

    Everything it calls is bound here, in init, before the services start threads: the forked child
    must not import, ``dlopen`` or take a lock another thread may have held at the fork.
    """

    def __init__(
        self,
        *,
        reveal: list[tuple[str, list[tuple[str, bool]]]],
        drop_uid: bool,
        ruleset: int | None,
        limits: dict[str, Any],
    ) -> None:
        import ctypes
        import resource

        libc = _libc()
        self._ctypes = ctypes
        self._unshare = libc.unshare
        self._unshare.argtypes = [ctypes.c_int]
        self._mount = libc.mount
        self._mount.argtypes = [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_char_p, ctypes.c_ulong,
                                ctypes.c_char_p]  # fmt: skip
        self._prctl = libc.prctl
        self._prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong,
                                ctypes.c_ulong]  # fmt: skip
        self._syscall = libc.syscall
        self._syscall.restype = ctypes.c_long
        self.reveal = [(a.encode(), [(t.encode(), d) for t, d in ts]) for a, ts in reveal]
        self.drop_uid = drop_uid
        self.ruleset = ruleset
        cpu = max(1, math.ceil(limits["cpu_seconds"]))
        mib = 1 << 20
        # NOTE: RLIMIT_AS last: once it is set, the child's own (large, init-sized) address space
        # leaves little room, and only exec clears it.
        self.rlimits = [
            (resource.RLIMIT_CPU, cpu, cpu + 1),  # SIGXCPU, then SIGKILL a second later
            (resource.RLIMIT_FSIZE, int(limits["file_mb"]) * mib, None),
            (resource.RLIMIT_NPROC, int(limits["processes"]), None),
            (resource.RLIMIT_CORE, 0, None),
            (resource.RLIMIT_AS, int(limits["memory_mb"]) * mib, None),
        ]
        self.cpu_limit = cpu
        self.steps = _STEP_RLIMITS
        self.steps |= _STEP_MOUNTS if self.reveal else 0
        self.steps |= _STEP_UID if drop_uid else 0
        self.steps |= _STEP_LANDLOCK if ruleset is not None else 0
        self.cwd: bytes | None = None
        self.root = ""  # the work folder's real path: the working folder must stay beneath it

    def __call__(self) -> None:
        """Confine this (forked, about to exec) process; raise if a step that worked in the probe
        fails now, so that no command runs with less than :attr:`SessionResult.layers`."""
        self.apply(strict=True)

    def apply(self, *, strict: bool) -> int:
        """Apply the steps in :attr:`steps`; the bits of the ones that worked."""
        ctypes = self._ctypes
        done = 0

        def fail(step: str) -> int:
            if strict:
                raise OSError(ctypes.get_errno(), f"the command sandbox could not {step}")
            return 0

        # 1. Mounts first: Landlock forbids mounting, and only root may.
        if self.steps & _STEP_MOUNTS:
            if self._reveal():
                done |= _STEP_MOUNTS
            else:
                fail("make the read roots traversable")
        # 2. nobody; 3. no_new_privs (Landlock's condition without CAP_SYS_ADMIN); 4. Landlock.
        if self.steps & _STEP_UID:
            try:
                os.setgroups([])
                os.setgid(_NOBODY)
                os.setuid(_NOBODY)
                done |= _STEP_UID if os.getuid() == _NOBODY and os.geteuid() == _NOBODY else 0
            except OSError:
                pass
            if not done & _STEP_UID:
                fail("drop to the user nobody")
        # The working folder, entered only now (Popen gets no cwd: its chdir would run as root
        # before this function), with the command's own permissions, and it must still be inside
        # the work folder: an earlier command of the session may have put a link in its place.
        if self.cwd is not None:
            try:
                os.chdir(self.cwd)
                here = os.getcwd()
            except OSError:
                here = ""
            if not (here == self.root or here.startswith(self.root + os.sep)):
                raise OSError(1, "the command sandbox could not enter the working folder inside the work folder")
        nnp = self._prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) == 0
        if self.steps & _STEP_LANDLOCK:
            assert self.ruleset is not None
            restricted = nnp and self._syscall(
                ctypes.c_long(_LANDLOCK_RESTRICT_SELF), ctypes.c_long(self.ruleset),
                ctypes.c_long(0),
            ) == 0  # fmt: skip
            if restricted:
                done |= _STEP_LANDLOCK
            else:
                fail("enforce Landlock")
        # 5. The limits.
        try:
            for which, soft, hard in self.rlimits:
                _lower_limit(which, soft, hard)
            done |= _STEP_RLIMITS
        except (OSError, ValueError):
            fail("set the resource limits")
        return done

    def _reveal(self) -> bool:
        """A mount namespace of this process's own in which the read roots can be traversed."""
        ctypes = self._ctypes
        if self._unshare(_CLONE_NEWNS) != 0:
            return False
        if self._mount(None, b"/", None, _MS_REC | _MS_PRIVATE, None) != 0:
            return False
        for ancestor, targets in self.reveal:
            clones = []
            for target, _ in targets:
                flags = _OPEN_TREE_CLONE | _AT_RECURSIVE | os.O_CLOEXEC
                fd = self._syscall(
                    ctypes.c_long(_SYS_OPEN_TREE), ctypes.c_long(_AT_FDCWD),
                    ctypes.c_char_p(target), ctypes.c_long(flags),
                )  # fmt: skip
                if fd < 0:
                    return False
                clones.append(fd)
            options = b"mode=711,size=1m"  # root's, traversable, not listable
            if self._mount(b"tmpfs", ancestor, b"tmpfs", _MS_NOSUID | _MS_NODEV, options) != 0:
                return False
            for (target, is_dir), fd in zip(targets, clones):
                try:
                    if is_dir:
                        os.makedirs(target, mode=0o711, exist_ok=True)
                    else:
                        os.makedirs(os.path.dirname(target), mode=0o711, exist_ok=True)
                        os.close(os.open(target, os.O_CREAT | os.O_WRONLY, 0o600))
                except OSError:
                    return False
                moved = self._syscall(
                    ctypes.c_long(_SYS_MOVE_MOUNT), ctypes.c_long(fd), ctypes.c_char_p(b""),
                    ctypes.c_long(_AT_FDCWD), ctypes.c_char_p(target),
                    ctypes.c_long(_MOVE_MOUNT_F_EMPTY_PATH),
                )  # fmt: skip
                os.close(fd)
                if moved != 0:
                    return False
        return True

    def probe(self) -> int:
        """Apply every step in a forked child; keep (and return) only the steps that worked."""
        pid = os.fork()
        if pid == 0:
            mask = 0
            try:
                mask = self.apply(strict=False)
            finally:
                os._exit(mask)
        _, status = os.waitpid(pid, 0)
        mask = os.WEXITSTATUS(status) if os.WIFEXITED(status) else 0
        self.steps &= mask
        return self.steps


def _init_main(payload: dict[str, Any], reporter: _Reporter, entered: set[str]) -> None:
    """Init: set up the namespace, start the services, run the commands; report as it goes."""
    import importlib

    pidns = "pidns" in entered and os.getpid() == 1
    layers = []
    if "netns" in entered:
        _loopback_up()
    os.umask(0o022)
    os.chdir("/")
    limits = payload["limits"]
    workdir = payload["workdir"]
    shm = _private_mounts(pidns, limits["memory_mb"]) if sys.platform == "linux" else None
    roots = _existing_roots(payload["read_roots"])
    ruleset = _command_ruleset(workdir, roots, shm)
    drop_uid = os.geteuid() == 0
    reveal = _reveal_plan([workdir, *roots]) if drop_uid else []
    confiner = _Confiner(reveal=reveal, drop_uid=drop_uid, ruleset=ruleset, limits=limits)
    steps = confiner.probe()
    for name, present in (
        ("rlimits", steps & _STEP_RLIMITS),
        ("pidns", pidns),
        ("netns", "netns" in entered),
        ("uid", steps & _STEP_UID),
        ("landlock", steps & _STEP_LANDLOCK),
    ):
        if present:
            layers.append(name)
    reporter.send({"layers": layers})
    missing = [name for name in COMMAND_LAYERS if name in payload["require"] and name not in layers]
    if missing:
        needs = ", ".join(_MISSING[name] for name in missing)
        them = "it" if len(missing) == 1 else "them"
        reporter.send({"error": f"the command sandbox needs {needs}; this machine refused {them}"})
        return

    env = dict(payload["env"])
    urls: dict[str, str] = {}
    handles: list[Any] = []
    for spec in payload["services"]:
        target = spec["target"]
        try:
            module, _, attr = target.partition(":")
            obj: Any = importlib.import_module(module)
            for part in attr.split("."):
                obj = getattr(obj, part)
            handle = obj(**spec["kwargs"])
            handles.append(handle)
            url = handle.url
            if not isinstance(url, str):
                raise TypeError(f"its url is a {type(url).__name__}, not a str")
        except BaseException as exc:  # noqa: BLE001 - trusted, but its failure is a session error
            reporter.send({"error": f"service {target} failed to start: {_describe(exc)}"})
            _stop_services(handles)
            return
        urls[spec["env"] or target] = url
        if spec["env"]:
            env[spec["env"]] = url
    reporter.send({"services": urls})

    confiner.cwd = payload["cwd"].encode()
    confiner.root = payload["workdir"]
    for index, argv in enumerate(payload["argvs"]):
        result = _run_one(argv, index, payload["cwd"], env, limits, confiner, reporter, pidns)
        reporter.send({"command": result})
        if payload["stop_on_failure"] and result["kind"] != "ok":
            break
    reporter.send({"done": True})
    _stop_services(handles)


def _stop_services(handles: list[Any]) -> None:
    for handle in handles:
        try:
            handle.stop()
        except BaseException:  # noqa: BLE001 - the session is over; the kill follows anyway
            pass


class _CappedOutput:
    """The first and last halves of ``cap`` bytes of a stream, and how much came in between."""

    def __init__(self, cap: int) -> None:
        self.head_cap = max(int(cap) // 2, 1)
        self.tail_cap = max(int(cap) - self.head_cap, 1)
        self.head = bytearray()
        self.tail = bytearray()
        self.total = 0

    def add(self, chunk: bytes) -> None:
        self.total += len(chunk)
        room = self.head_cap - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            if len(self.tail) > 2 * self.tail_cap:
                del self.tail[: -self.tail_cap]

    def text(self) -> str:
        tail = self.tail[-self.tail_cap :]
        dropped = self.total - len(self.head) - len(tail)
        head = self.head.decode("utf-8", errors="replace")
        if dropped <= 0:
            return (self.head + self.tail).decode("utf-8", errors="replace")
        end = tail.decode("utf-8", errors="replace")
        return head + f"\n[... {dropped} bytes dropped ...]\n" + end


def _run_one(
    argv: list[str],
    index: int,
    cwd: str,
    env: dict[str, str],
    limits: dict[str, Any],
    confiner: _Confiner,
    reporter: _Reporter,
    pidns: bool,
) -> dict[str, Any]:
    """Run one command to its end (or its wall limit), then clear its namespace; its report."""
    import signal
    import subprocess
    import time

    start = time.monotonic()

    def result(kind: str, code: int | None, output: str) -> dict[str, Any]:
        seconds = round(time.monotonic() - start, 3)
        return {"kind": kind, "returncode": code, "output": output, "seconds": seconds}

    if os.path.islink(cwd) or not os.path.isdir(cwd):  # for the message; the check that counts is the child's
        return result("failed", 126, f"[command sandbox: the folder {cwd} does not exist or is a link]\n")
    try:
        proc = subprocess.Popen(
            argv,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=confiner,  # noqa: PLW1509 - everything it calls is bound before the fork
        )
    except FileNotFoundError:
        return result("failed", 127, f"[command sandbox: {argv[0]}: command not found]\n")
    except PermissionError:
        return result("failed", 126, f"[command sandbox: {argv[0]}: permission denied]\n")
    except OSError as exc:
        return result("failed", 126, f"[command sandbox: {argv[0]} could not start: {exc}]\n")
    except subprocess.SubprocessError as exc:
        message = f"[command sandbox: the command could not be confined: {exc}]\n"
        return result("failed", 126, message)
    reporter.send({"started": index, "pgid": proc.pid})
    assert proc.stdout is not None
    output = _CappedOutput(limits["max_output_bytes"])
    timed_out = _collect(proc, output, start + float(limits["wall_seconds"]), pidns)
    # The command is a zombie (or killed) but not reaped: its group id is still its own.
    _killpg(proc.pid)
    if pidns:
        _kill_namespace()
    _, status, rusage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)  # so Popen does not re-wait
    _reap(pidns)
    _drain(proc.stdout.fileno(), output, time.monotonic() + (1.0 if pidns else 0.2))
    proc.stdout.close()
    text = output.text()
    cpu_used = rusage.ru_utime + rusage.ru_stime
    if timed_out:
        note = f"wall-clock limit of {limits['wall_seconds']:g}s exceeded; killed"
        return result("timeout", None, text + f"\n[command sandbox: {note}]\n")
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        at_cpu_limit = cpu_used >= confiner.cpu_limit - 0.05
        if sig == signal.SIGXCPU or (sig == signal.SIGKILL and at_cpu_limit):
            note = f"CPU time limit of {confiner.cpu_limit}s exceeded"
            return result("timeout", None, text + f"\n[command sandbox: {note}]\n")
        try:
            name = signal.Signals(sig).name
        except ValueError:
            name = f"signal {sig}"
        return result("killed", None, text + f"\n[command sandbox: killed by {name}]\n")
    code = os.WEXITSTATUS(status)
    return result("ok" if code == 0 else "failed", code, text)


def _collect(proc: Any, output: _CappedOutput, deadline: float, pidns: bool) -> bool:
    """Read the command's output until its main process ends or ``deadline``; True on timeout.

    Reading goes on while it runs, so a full pipe never blocks it; the end of the main process
    (not EOF) ends the wait: a leftover that holds the pipe is killed next.
    """
    import selectors
    import time

    fd = proc.stdout.fileno()
    pidfd = _pidfd_open(proc.pid)
    sel = selectors.DefaultSelector()
    open_stream = True
    try:
        sel.register(fd, selectors.EVENT_READ)
        if pidfd is not None:
            sel.register(pidfd, selectors.EVENT_READ)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return True
            wait = remaining if pidfd is not None else min(remaining, 0.05)
            if not open_stream and pidfd is None:
                time.sleep(wait)
                events = []
            else:
                events = sel.select(wait)
            for key, _ in events:
                if key.fd == pidfd:
                    return False
                chunk = os.read(fd, 1 << 16)
                if chunk:
                    output.add(chunk)
                else:
                    sel.unregister(fd)
                    open_stream = False
            if pidfd is None and _has_exited(proc.pid):
                return False
    finally:
        sel.close()
        if pidfd is not None:
            os.close(pidfd)


def _drain(fd: int, output: _CappedOutput, deadline: float) -> None:
    """Read what is left in the pipe until EOF (every writer gone) or ``deadline``."""
    import select
    import time

    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return
        ready, _, _ = select.select([fd], [], [], remaining)
        if not ready:
            return
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return
        output.add(chunk)


def _kill_namespace() -> None:
    """As PID 1 of the PID namespace: SIGKILL every other process in it (init survives)."""
    import signal

    if os.getpid() != 1:  # never outside a PID namespace: kill(-1) would reach the whole machine
        return
    try:
        os.kill(-1, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _reap(pidns: bool) -> None:
    """Reap the zombies left behind; in a PID namespace, wait for every killed process too."""
    while True:
        try:
            if pidns:
                _kill_namespace()  # one forked while the last kill was under way
                pid, _ = os.waitpid(-1, 0)
            else:
                pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        except InterruptedError:
            continue
        if pid == 0:
            return

