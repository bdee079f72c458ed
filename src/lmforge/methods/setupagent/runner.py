"""Run one candidate instance end to end in the command sandbox: a fresh virtual environment, the
plan's installs against the date-capped local index, the tests before and after the fix, and the
grade.

SetUpAgent (Vergopoulos, Müller, Vechev, ICML 2025, arXiv 2503.07701) validates an instance by
installing the repository at the fix's parent commit in a clean environment, running the tests
with the test patch applied ("before") and with the fix applied too ("after"), and keeping it when
some test goes from failing to passing. :class:`InstanceRunner` does this:

* everything the repository brings (installs, its ``setup.py``, its tests) runs under
  :func:`lmforge.common.command_sandbox.run_commands`: a private network namespace whose only
  service is the loopback index (:func:`.index.serve`), CPU/memory/time limits, writes confined to
  the instance's work folder by Landlock;
* the work folder lives under a fresh system temporary folder (the output folder may sit below a
  private home that sandboxed processes cannot traverse); the repository tree at ``base_commit``
  is exported with ``git archive`` and unpacked with ``tarfile``'s ``data`` filter (no links out,
  no device files); the patches are applied *inside* the sandbox by ``git apply``, so no file the
  repository's code could have planted (a symlink) is ever written through by this process;
* each environment gets the pip this process runs (re-packed by :func:`.index.wheel_from_installed`,
  so ``--uploaded-prior-to`` exists whatever pip ``ensurepip`` would bring), installed offline from
  the wheel; pip's config files and this machine's pip environment variables are ignored
  (``PIP_CONFIG_FILE=/dev/null``, a scrubbed environment);
* the date cap is pip's ``--uploaded-prior-to`` set to the instance's ``created_at``
  (``PIP_UPLOADED_PRIOR_TO``), see :mod:`.index` for why this mechanism.

A plan "runs" (:class:`.repair.RunOutcome` ``ok``) when every install exits 0 and the test
commands' output parses to at least one test; otherwise the failing command and its output go to
the repair loop (:mod:`.repair`). The tests' own exit status does not count: failing tests are
expected before the fix.

Libraries checked: ``swebench`` builds Docker images from fixed per-repository specs (no Docker
here, and its specs are what SetUpAgent replaces); ``virtualenv``/``venv`` make the environment
(``venv`` is used); ``tox`` runs commands but neither sandboxes them nor caps dates. The
orchestration is written here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmforge.common.command_sandbox import (
    COMMAND_LAYERS,
    CommandLimits,
    CommandResult,
    Service,
    SessionResult,
    run_commands,
)
from lmforge.common.errors import UserError
from lmforge.methods.setupagent import StopRun
from lmforge.methods.setupagent.extract import CommandRejected, SetupPlan
from lmforge.methods.setupagent.grade import Grade, grade
from lmforge.methods.setupagent.mine import GIT_SAFETY
from lmforge.methods.setupagent.parsers import parse_log
from lmforge.methods.setupagent.repair import RunOutcome

__all__ = ["FixFailed", "InstanceRunner", "SandboxUnavailable", "RunnerSettings", "TestRun", "export_tree"]

_VENV = "venv"
_REPO = "repo"
_PIP_WHEEL_DIR = "pip"
_INDEX_ENV = "PIP_INDEX_URL"


@dataclass(frozen=True)
class RunnerSettings:
    """How instances are run.

    Attributes:
        index: the local index folder (wheels/sdists plus ``upload-times.json``), served inside
            each sandbox on loopback; the only package source.
        upload_times: another upload-times map for the folder (see :func:`.index.scan_folder`).
        cap: cap dependencies at each instance's ``created_at`` (the paper's historical accuracy).
        limits: per-command sandbox limits; ``wall_seconds`` is how long a hanging test command
            may run before it is killed and reported.
        python: the interpreter that creates each virtual environment.
        require: sandbox layers without which nothing runs; default all of
            :data:`.command_sandbox.COMMAND_LAYERS` (a machine that cannot give them stops the run
            with :class:`SandboxUnavailable` rather than run a repository's code with less).
    """

    index: Path
    upload_times: Path | None = None
    cap: bool = True
    limits: CommandLimits = field(default_factory=lambda: CommandLimits(wall_seconds=600.0, cpu_seconds=600.0))
    python: str = sys.executable
    require: tuple[str, ...] = COMMAND_LAYERS


@dataclass
class TestRun:
    """One run of the test commands: their combined log, the parsed statuses, and how each ended."""

    log: str
    statuses: dict[str, str]
    kinds: list[str]

    def to_dict(self) -> dict[str, Any]:
        return {"statuses": self.statuses, "kinds": self.kinds, "tests": len(self.statuses)}


def _git_out(repo_root: Path, *args: str, stdin: bytes | None = None) -> bytes:
    proc = subprocess.run(["git", *GIT_SAFETY, "-C", str(repo_root), *args], input=stdin, capture_output=True,
                          check=False, env={"PATH": os.environ.get("PATH", os.defpath), "LC_ALL": "C",
                                            "GIT_TERMINAL_PROMPT": "0", "GIT_CONFIG_NOSYSTEM": "1"})
    if proc.returncode != 0:
        raise UserError(f"git {args[0]} failed: {proc.stderr.decode(errors='replace').strip()[:200]}")
    return proc.stdout


def export_tree(repo_root: Path, commit: str, dest: Path) -> None:
    """Write the tree of ``commit`` into ``dest`` (created) exactly as stored: file bytes, the
    executable bit, symlinks (empty folders for submodules).

    NOTE: read with the plumbing commands ``git ls-tree`` and ``git cat-file --batch``, which apply
    no ``.gitattributes`` and run nothing: ``git archive`` (the first version) honours the
    repository's ``export-ignore``/``export-subst`` (a repository could drop its own tests from the
    export) and runs the smudge filters its configuration names, outside any sandbox. A symlink
    whose target is absolute or leaves the tree, and a path with ``..`` or ``.git`` parts, are
    refused (:class:`UserError`), as ``tarfile``'s ``data`` filter would.
    """
    if commit.startswith("-"):
        raise UserError(f"'{commit}' is not a commit")
    listing = _git_out(repo_root, "ls-tree", "-r", "-z", "--full-tree", f"{commit}^{{tree}}")
    entries = []
    for item in listing.split(b"\0"):
        if not item:
            continue
        meta, _, raw_path = item.partition(b"\t")
        mode, kind, sha = meta.decode().split()
        path = os.fsdecode(raw_path)
        parts = path.split("/")
        if path.startswith("/") or any(p in ("", ".", "..", ".git") for p in parts):
            raise UserError(f"the tree of {commit[:12]} cannot be unpacked safely: bad path {path!r}")
        entries.append((mode, kind, sha, path))
    blobs = [e for e in entries if e[1] == "blob"]
    data = _git_out(repo_root, "cat-file", "--batch",
                    stdin="".join(f"{sha}\n" for _, _, sha, _ in blobs).encode()) if blobs else b""
    contents: dict[str, bytes] = {}
    at = 0
    for _, _, sha, path in blobs:
        header_end = data.index(b"\n", at)
        size = int(data[at:header_end].split()[2])
        contents[path] = data[header_end + 1:header_end + 1 + size]
        at = header_end + 1 + size + 1
    dest.mkdir(parents=True, exist_ok=False)
    root = dest.resolve()
    links = []
    for mode, kind, _, path in entries:
        target = dest / path
        if kind == "commit":  # a submodule: its folder, empty (as a clone without --recursive)
            target.mkdir(parents=True, exist_ok=True)
            continue
        if mode == "120000":
            links.append((target, os.fsdecode(contents[path]), path))
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o755 if mode == "100755" else 0o644)
        with os.fdopen(fd, "wb") as f:
            f.write(contents[path])
    for target, link, path in links:  # after every file: no write can go through a link
        resolved = os.path.normpath(os.path.join(os.path.dirname(os.path.join(str(root), path)), link))
        if os.path.isabs(link) or not (resolved == str(root) or resolved.startswith(str(root) + os.sep)):
            raise UserError(f"the tree of {commit[:12]} cannot be unpacked safely: the link {path!r} points "
                            f"outside the tree ({'absolute' if os.path.isabs(link) else 'relative'} target {link!r})")
        target.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(link, target)
    for target, link, path in links:  # chains of links, resolved by the filesystem (e.g. "l -> ." then "m -> l/..")
        real = os.path.realpath(target)
        if not (real == str(root) or real.startswith(str(root) + os.sep)):
            raise UserError(f"the tree of {commit[:12]} cannot be unpacked safely: the link {path!r} points "
                            f"outside the tree through other links (target {link!r})")


def _combined(results: Sequence[CommandResult]) -> str:
    parts = []
    for r in results:
        if r.kind == "not_run":
            continue
        parts.append(f"$ {' '.join(r.argv)}\n{r.output}")
        if r.kind == "timeout":
            parts.append(f"[lmforge] killed at the limit after {r.seconds:.0f} s: {' '.join(r.argv)}")
    return "\n".join(parts)


class InstanceRunner:
    """Runs one instance's plans in fresh sandboxed environments.

    Args:
        repo_root: the git work tree (read with ``git archive`` only).
        base_commit: the instance's starting commit.
        patch, test_patch: the fix and the test change (unified diffs).
        created_at: the instance's time; the date cap when ``settings.cap``.
        settings: :class:`RunnerSettings`.
        pip_wheel: a pip wheel with ``--uploaded-prior-to`` (built once by the caller with
            :func:`.index.wheel_from_installed`).

    :meth:`attempt` is the repair loop's ``run``: it sets up a fresh environment for the plan and
    runs the tests with the test patch ("before"). After a successful attempt, :meth:`after`
    applies the fix in the same environment and runs the tests again. :meth:`close` removes the
    work folder.
    """

    def __init__(self, repo_root: Path, base_commit: str, patch: str, test_patch: str, created_at: str,
                 settings: RunnerSettings, pip_wheel: Path) -> None:
        self.repo_root = Path(repo_root)
        self.base_commit = base_commit
        self.created_at = created_at
        self.settings = settings
        self.top = Path(tempfile.mkdtemp(prefix="lmforge-setup-"))
        os.chmod(self.top, 0o755)  # traversable by the sandbox's unprivileged user
        self.tools = self.top / "tools"  # read-only for the sandbox: the patches and pip
        self.tools.mkdir()
        (self.tools / _PIP_WHEEL_DIR).mkdir()
        self.pip_wheel = self.tools / _PIP_WHEEL_DIR / Path(pip_wheel).name
        shutil.copyfile(pip_wheel, self.pip_wheel)
        self.pip_version = self.pip_wheel.name.split("-")[1]
        (self.tools / "test.patch").write_text(test_patch, encoding="utf-8")
        (self.tools / "fix.patch").write_text(patch, encoding="utf-8")
        for path in (self.tools, self.tools / _PIP_WHEEL_DIR):
            os.chmod(path, 0o755)
        for path in (self.pip_wheel, self.tools / "test.patch", self.tools / "fix.patch"):
            os.chmod(path, 0o644)
        self.has_test_patch = bool(test_patch.strip())
        self.work: Path | None = None
        self.plan: SetupPlan | None = None
        self.before_run: TestRun | None = None
        self.layers: tuple[str, ...] = ()
        self.attempts = 0

    # ------------------------------------------------------------------ sandbox plumbing
    def _env(self) -> dict[str, str]:
        assert self.work is not None
        env = {
            "VIRTUAL_ENV": str(self.work / _VENV),
            "PIP_CONFIG_FILE": os.devnull,  # no machine or user pip configuration
            "PIP_NO_CACHE_DIR": "1",
            "PIP_DISABLE_PIP_VERSION_CHECK": "1",
            "PIP_NO_INPUT": "1",
            "PIP_PROGRESS_BAR": "off",
            "PYTHONDONTWRITEBYTECODE": "1",
        }
        if self.settings.cap:
            env["PIP_UPLOADED_PRIOR_TO"] = self.created_at
        # NOTE: tox (and nox) make their environments with virtualenv, which seeds its own bundled
        # pip; one older than 26 ignores PIP_UPLOADED_PRIOR_TO. virtualenv is told to seed the
        # re-packed pip from the tools folder instead, and never to download.
        env["VIRTUALENV_EXTRA_SEARCH_DIR"] = str(self.pip_wheel.parent)
        env["VIRTUALENV_PIP"] = self.pip_version
        env["VIRTUALENV_DOWNLOAD"] = "0"
        env["VIRTUALENV_NO_PERIODIC_UPDATE"] = "1"
        return env

    def _session(self, argvs: Sequence[Sequence[str]], *, stop_on_failure: bool) -> SessionResult:
        assert self.work is not None
        index = Service("lmforge.methods.setupagent.index:serve",
                        {"folder": str(self.settings.index),
                         "upload_times": str(self.settings.upload_times) if self.settings.upload_times else None},
                        env=_INDEX_ENV)
        result = run_commands(argvs, self.work, env=self._env(), path_prepend=[self.work / _VENV / "bin"],
                              services=[index], limits=self.settings.limits, read_roots=[self.tools],
                              require=self.settings.require, stop_on_failure=stop_on_failure,
                              cwd=self.work / _REPO)
        self.layers = result.layers
        return result

    def _fresh_work(self) -> None:
        if self.work is not None:
            shutil.rmtree(self.work, ignore_errors=True)
        self.attempts += 1
        self.work = self.top / f"work{self.attempts}"
        self.work.mkdir()
        export_tree(self.repo_root, self.base_commit, self.work / _REPO)

    def _tests(self, plan: SetupPlan, test_argvs: list[list[str]], prefix: Sequence[Sequence[str]] = ()
               ) -> tuple[SessionResult, TestRun | None]:
        """Run ``prefix`` (stopping at a failure), then every test command (each runs whatever the
        previous gave)."""
        if prefix:
            pre = self._session(prefix, stop_on_failure=True)
            if pre.error or not pre.ok:
                return pre, None
        result = self._session(test_argvs, stop_on_failure=False)
        if result.error:
            return result, None
        log = _combined(result.commands)
        try:
            statuses = parse_log(log, plan.test_framework)
        except (KeyError, ValueError) as exc:
            raise UserError(f"cannot parse the test log: {exc}") from None
        return result, TestRun(log, statuses, [c.kind for c in result.commands])

    # ------------------------------------------------------------------ the steps
    def attempt(self, plan: SetupPlan) -> RunOutcome:
        """Fresh environment, the plan's installs, the test patch, the tests ("before")."""
        self.plan, self.before_run = None, None
        try:
            install, tests = plan.argvs()
        except CommandRejected as exc:
            return RunOutcome(False, f"rejected: {exc}", failed_command="(plan)", returncode=None)
        if not tests:
            return RunOutcome(False, "the plan has no test command", failed_command="(plan)")
        self._fresh_work()
        assert self.work is not None
        venv_py = str(self.work / _VENV / "bin" / "python")
        setup = [
            [self.settings.python, "-m", "venv", "--without-pip", str(self.work / _VENV)],
            [venv_py, str(self.pip_wheel / "pip"), "install", "--quiet", "--no-index", "--no-deps",
             str(self.pip_wheel)],
            *install,
        ]
        if self.has_test_patch:  # a release checked as it is (no fix) has none
            setup.append(["git", "apply", "--verbose", str(self.tools / "test.patch")])
        # the setup session's result when it failed, else the test session's
        session, run = self._tests(plan, tests, prefix=setup)
        if session.error:  # the sandbox itself, not the plan: no repair can help, and no record is kept
            raise SandboxUnavailable(session.error)
        if run is None:
            failed = next((c for c in session.commands if c.kind not in ("ok", "not_run")), None)
            return RunOutcome(False, _combined(session.commands),
                              failed_command=" ".join(failed.argv) if failed else None,
                              returncode=failed.returncode if failed else None)
        hung = next((c for c in session.commands if c.kind == "timeout"), None)
        if hung is not None:
            # NOTE: statuses from a run that was killed are partial; the plan does not count as run.
            return RunOutcome(False, run.log, failed_command=" ".join(hung.argv), returncode=None)
        if not run.statuses:
            # the first test command that did not end well, else the first one (none printed a test)
            ran = [c for c in session.commands if c.kind != "not_run"]
            cmd = next((c for c in ran if c.kind != "ok"), ran[0] if ran else None)
            return RunOutcome(False, run.log + "\n[lmforge] no test status could be parsed from the output",
                              failed_command=" ".join(cmd.argv) if cmd else None,
                              returncode=cmd.returncode if cmd else None)
        self.plan, self.before_run = plan, run
        return RunOutcome(True, run.log)

    def after(self) -> TestRun:
        """Apply the fix in the environment of the last successful :meth:`attempt`; run the tests."""
        if self.plan is None or self.before_run is None:
            raise RuntimeError("after() needs a successful attempt() first")
        _, tests = self.plan.argvs()
        fix = [["git", "apply", "--verbose", str(self.tools / "fix.patch")]]
        result, run = self._tests(self.plan, tests, prefix=fix)
        if result.error:
            raise SandboxUnavailable(result.error)
        if run is None:
            why = result.error or _combined(result.commands)[-2000:]
            raise FixFailed(f"the fix did not apply or the tests could not run: {why}")
        hung = next((c for c in result.commands if c.kind == "timeout"), None)
        if hung is not None:
            raise FixFailed(f"the tests after the fix were killed at the limit after {hung.seconds:.0f} s: "
                            f"{' '.join(hung.argv)}")
        return run

    def grade(self, after: TestRun) -> Grade:
        assert self.before_run is not None
        return grade(self.before_run.statuses, after.statuses)

    def close(self) -> None:
        shutil.rmtree(self.top, ignore_errors=True)

    def __enter__(self) -> InstanceRunner:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class SandboxUnavailable(StopRun):
    """The command sandbox could not run a session (a required layer is missing, a service did not
    start): the whole run stops, with the sandbox's one-line reason."""


class FixFailed(RuntimeError):
    """The gold patch did not apply, or the tests did not run after it."""
