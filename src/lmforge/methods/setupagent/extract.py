"""Install and test commands for a repository: a rule-based extractor, an LLM extractor, and the
allow-list every proposed command must pass.

SetUpAgent (Vergopoulos, Müller, Vechev, ICML 2025, arXiv 2503.07701) has an LLM read a
repository's README, CONTRIBUTING, CI configuration and setup/tox files and propose the commands
that install it and run its tests; the commands run in a clean environment and errors go back to
the model (:mod:`.repair`). No official code is released, so the prompt, the reply format and the
rules here are lmforge's.

* :class:`RuleExtractor` (no model): install commands from the packaging files (``pip install -r``
  for requirements files, ``pip install -e .`` / ``.[test]`` for an installable project with a
  test extra) and test commands from the lines of CI workflows, ``.travis.yml``, ``tox.ini``,
  ``noxfile.py``, README and CONTRIBUTING that run pytest, unittest or tox, forced verbose so that
  :mod:`.parsers` can read per-test statuses (pytest ``-rA``, unittest ``-v``). Each command's
  :attr:`SetupPlan.evidence` names the file and line it came from. Its :meth:`RuleExtractor.repair`
  adds ``pip install X`` for a ``No module named 'X'`` error.
* :class:`LLMExtractor` around any :class:`LLM` (``complete(prompt) -> str``): the same files,
  truncated to a character budget, in one prompt; the reply is a JSON object
  ``{"install": [...], "test_commands": [...], "test_framework": ...}``. A malformed reply is
  counted (:attr:`LLMExtractor.failures`) and gives None, never an exception. :class:`ChatLLM` /
  :func:`make_llm` adapt the chat clients of :mod:`lmforge.methods.minions.clients` (a local HF
  model in-process, or an OpenAI-compatible server); :class:`ScriptedLLM` replays fixed replies.
* :func:`check_command`: the model's commands are run by lmforge, so each must be one argv of an
  allowed executable (pip, python, pytest, tox, nox, uv) with no shell syntax, no inline code and
  no package source other than the index the runner provides; anything else is rejected with a
  reason (:attr:`SetupPlan.rejected`).

Libraries checked for an existing implementation: ``swebench`` (5.0.2) hard-codes install and test
commands per repository and version (``swebench.harness.constants``) and extracts none;
``installamatic`` (arXiv 2412.06294) has no released package; ``pip-requirements-parser`` and
``tox``'s own config loader parse one format each and run nothing. The rules and the allow-list
are written here; ``tomllib``/``configparser`` read the config files.
"""

from __future__ import annotations

import configparser
import json
import re
import shlex
import tomllib
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from lmforge.common.chat import extract_json
from lmforge.common.errors import UserError
from lmforge.methods.setupagent.parsers import PARSERS, runner_of

# ------------------------------------------------------------------------------------------ plan


@dataclass
class SetupPlan:
    """Commands that set a repository up and run its tests.

    Attributes:
        install: shell-quoted command strings, run in order in a fresh virtual environment.
        test_commands: the commands whose output :func:`.parsers.parse_log` reads.
        test_framework: a key of :data:`.parsers.PARSERS` (``pytest``, ``unittest``, ``tox``, ...).
        evidence: where each command came from (``file:line: text``, ``inferred: ...``, ``llm``).
        rejected: ``command: reason`` for each proposed command the allow-list refused.
    """

    install: list[str]
    test_commands: list[str]
    test_framework: str
    evidence: list[str] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def argvs(self) -> tuple[list[list[str]], list[list[str]]]:
        """The install and test commands as argv lists (each re-checked by :func:`check_command`)."""
        return [check_command(c) for c in self.install], [check_command(c) for c in self.test_commands]


# ------------------------------------------------------------------------------------ allow-list


class CommandRejected(ValueError):
    """A proposed command that the allow-list refuses; the message is the reason."""


# NOTE: the paper runs the model's commands in a container and lists no allow-list. lmforge runs
# them under its own sandbox, and adds this list as a first line: bare executable names only (a
# path such as ./pip or /usr/bin/python could be anything), with python3 / python3.X / pip3
# accepted as spellings of python / pip.
ALLOWED_EXECUTABLES = frozenset({"pip", "python", "pytest", "tox", "nox", "uv"})
_ALIASES = {"pip3": "pip", "python3": "python", "py.test": "pytest"}
_PYTHON_VERSIONED = re.compile(r"^python3\.\d+$")
# python -m MODULE: only the installers and test runners.
ALLOWED_PYTHON_MODULES = frozenset({"pip", "pytest", "unittest", "tox", "nox", "uv", "nose"})
_PIP_SUBCOMMANDS = frozenset({"install", "uninstall", "download", "wheel", "list", "freeze", "show", "check"})
# NOTE: options that choose where packages come from are refused: the runner points pip at the
# date-capped loopback index (and sets the cap itself), so a model must not bypass or move it.
_SOURCE_OPTIONS = frozenset({"-i", "--index-url", "--extra-index-url", "-f", "--find-links", "--trusted-host",
                             "--index", "--default-index", "--uploaded-prior-to", "--exclude-newer",
                             "--proxy", "--cert", "--client-cert"})
_SHELL_PUNCT = set("();<>|&")
_REMOTE = re.compile(r"^(?:[a-z][a-z0-9+.\-]*://|git\+|hg\+|svn\+|bzr\+)|@\s*[a-z][a-z0-9+.\-]*://", re.I)


def _tokens(command: str | Sequence[str]) -> list[str]:
    if isinstance(command, str):
        lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        try:
            punct = list(lexer)
            argv = shlex.split(command)
        except ValueError as exc:
            raise CommandRejected(f"cannot be split into arguments ({exc})") from None
        for tok in punct:
            if tok and set(tok) <= _SHELL_PUNCT:
                raise CommandRejected(f"shell operator {tok!r} (commands run without a shell)")
        return argv
    if not all(isinstance(t, str) for t in command):
        raise CommandRejected("an argv must be a list of strings")
    return list(command)


_SOURCE_SHORT = tuple(o for o in _SOURCE_OPTIONS if not o.startswith("--"))
_SOURCE_LONG = tuple(o for o in _SOURCE_OPTIONS if o.startswith("--"))


def _check_sources(args: Sequence[str]) -> None:
    for arg in args:
        opt = arg.split("=", 1)[0]
        # pip's option parser takes an attached short option's value (-ihttp://...) and any unique
        # prefix of a long option (--extra-index=..., --index-ur=...): refuse those spellings too
        short = next((o for o in _SOURCE_SHORT if arg.startswith(o) and not arg.startswith("--")), None)
        long = next((o for o in _SOURCE_LONG if opt.startswith("--") and len(opt) > 3 and o.startswith(opt)), None)
        if opt in _SOURCE_OPTIONS or short or long:
            raise CommandRejected(f"option {opt} chooses the package source; the runner sets it")
        if "://" in arg or _REMOTE.search(arg):
            raise CommandRejected(f"remote source {arg!r}; packages come from the runner's index only")
    # NOTE: ``-r FILE`` / ``-c FILE`` are allowed (the rule extractor proposes them); a requirements
    # file can itself name an index, so the runner must scan those files before running (part 2b).


def _check_python(args: list[str]) -> None:
    if not args:
        raise CommandRejected("python without arguments (an interactive interpreter)")
    first = args[0]
    if first == "-m":
        if len(args) < 2 or args[1] not in ALLOWED_PYTHON_MODULES:
            mod = args[1] if len(args) > 1 else ""
            raise CommandRejected(f"python -m {mod!r} is not an allowed module "
                                  f"({', '.join(sorted(ALLOWED_PYTHON_MODULES))})")
        rest = args[2:]
        if args[1] == "pip":
            _check_pip(rest)
        elif args[1] == "uv":
            _check_uv(rest)
        return
    if first.startswith("-"):
        raise CommandRejected(f"python option {first!r}: only 'python -m MODULE' or 'python FILE.py' is allowed")
    # NOTE: 'python FILE.py ...' (setup.py test, runtests.py, manage.py test) runs the repository's
    # own code, which its tests run anyway inside the sandbox; the file must be a relative path
    # inside the repository.
    if not first.endswith(".py") or first.startswith("/") or ".." in Path(first).parts:
        raise CommandRejected(f"python {first!r}: the script must be a relative .py path inside the repository")


def _check_pip(args: list[str]) -> None:
    if not args or args[0] not in _PIP_SUBCOMMANDS:
        sub = args[0] if args else ""
        raise CommandRejected(f"pip {sub!r} is not an allowed subcommand ({', '.join(sorted(_PIP_SUBCOMMANDS))})")
    _check_sources(args[1:])


def _check_uv(args: list[str]) -> None:
    if len(args) < 2 or args[0] != "pip" or args[1] not in _PIP_SUBCOMMANDS:
        raise CommandRejected("only 'uv pip SUBCOMMAND' is allowed for uv")
    _check_sources(args[2:])


def check_command(command: str | Sequence[str]) -> list[str]:
    """``command`` (a shell-style string or an argv list) as an argv list, or
    :class:`CommandRejected` with the reason it may not run.

    Allowed: ``pip``/``uv pip`` subcommands without package-source options or remote URLs;
    ``python -m`` an installer or test runner, or ``python FILE.py`` inside the repository;
    ``pytest``, ``tox`` and ``nox`` with any arguments. Refused: any other executable, a path as
    the executable, shell operators (``;``, ``|``, ``&&``, redirections), ``$`` and backquote
    expansions (nothing would expand them: commands run without a shell), ``python -c``.
    """
    argv = _tokens(command)
    if not argv or not argv[0]:
        raise CommandRejected("empty command")
    for tok in argv:
        if "$" in tok or "`" in tok:
            raise CommandRejected(f"shell expansion in {tok!r} (commands run without a shell)")
        if "\n" in tok or "\x00" in tok:
            raise CommandRejected("newline or NUL inside an argument")
    exe = argv[0]
    if "/" in exe or "\\" in exe:
        raise CommandRejected(f"executable {exe!r} is a path; name one of {', '.join(sorted(ALLOWED_EXECUTABLES))}")
    name = _ALIASES.get(exe, "python" if _PYTHON_VERSIONED.match(exe) else exe)
    if name not in ALLOWED_EXECUTABLES:
        raise CommandRejected(f"executable {exe!r} is not allowed ({', '.join(sorted(ALLOWED_EXECUTABLES))})")
    if name == "python":
        _check_python(argv[1:])
    elif name == "pip":
        _check_pip(argv[1:])
    elif name == "uv":
        _check_uv(argv[1:])
    return argv


def filter_commands(commands: Iterable[str | Sequence[str]]) -> tuple[list[str], list[str]]:
    """(allowed commands as canonical strings, ``command: reason`` for each refused one)."""
    kept: list[str] = []
    rejected: list[str] = []
    for cmd in commands:
        try:
            kept.append(shlex.join(check_command(cmd)))
        except CommandRejected as exc:
            shown = cmd if isinstance(cmd, str) else shlex.join(map(str, cmd))
            rejected.append(f"{shown}: {exc}")
    return kept, rejected


# ---------------------------------------------------------------------------------- repo reading

# NOTE: which files the paper's agent reads is listed only by kind (README, CONTRIBUTING, CI,
# setup and tox files); these names are lmforge's choice, in this order (the LLM prompt's order).
def _candidate_files(root: Path) -> list[Path]:
    out: list[Path] = []
    for pattern in ("README*", "CONTRIBUTING*", "contributing*", ".github/CONTRIBUTING*", "docs/CONTRIBUTING*"):
        out.extend(sorted(p for p in root.glob(pattern) if p.is_file()))
    wf = root / ".github" / "workflows"
    if wf.is_dir():
        out.extend(sorted(p for p in wf.iterdir() if p.suffix in (".yml", ".yaml") and p.is_file()))
    for name in (".travis.yml", "tox.ini", "noxfile.py", "setup.cfg", "pyproject.toml", "setup.py", "pytest.ini"):
        if (root / name).is_file():
            out.append(root / name)
    out.extend(sorted(p for p in root.glob("requirements*.txt") if p.is_file()))
    out.extend(sorted(p for p in root.glob("*requirements.txt") if p.is_file() and p.name != "requirements.txt"))
    req_dir = root / "requirements"
    if req_dir.is_dir():
        out.extend(sorted(p for p in req_dir.glob("*.txt") if p.is_file()))
    seen: set[Path] = set()
    return [p for p in out if not (p in seen or seen.add(p))]  # type: ignore[func-returns-value]


def repo_files(root: str | Path) -> list[Path]:
    """The files both extractors read, in prompt order; a missing folder is a UserError."""
    path = Path(root)
    if not path.is_dir():
        raise UserError(f"not a folder: {path}")
    return _candidate_files(path)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return ""


# ----------------------------------------------------------------------------- rule extraction

# NOTE: extras whose name says "tests" are preferred, in this order; the paper does not say.
TEST_EXTRAS = ("test", "tests", "testing", "dev")
_TEST_REQ_WORDS = re.compile(r"(?:^|[-_/])(?:test|tests|testing|dev)(?:[-_.]|$)")
_PROMPT_LINE = re.compile(r"^\s*(?:-\s+|run:\s*\|?\s*|script:\s*|\$\s+|>>>\s+|-\s*run:\s*)*")
_RUNNER = re.compile(r"^(?:py\.test|pytest|python3?(?:\.\d+)?\s+-m\s+(?:pytest|unittest)|tox|nosetests)(?:\s|$)")
_NOX_RUN = re.compile(r"session\.run\(\s*((?:[\"'][^\"']*[\"']\s*,?\s*)+)")
_REQ_NAME = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._\-]*)")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _req_names(lines: Iterable[str]) -> set[str]:
    names = set()
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if not line or line.startswith("-"):
            continue
        m = _REQ_NAME.match(line)
        if m:
            names.add(_norm(m.group(1)))
    return names


def _line_no(text: str, needle: str, key: str | None = None) -> int:
    """The line of ``needle``; with ``key``, the first line after it that sets ``key`` (``key =``,
    ``"key" =``, ``'key':``), else the needle's line."""
    lines = text.splitlines()
    for i, line in enumerate(lines, 1):
        if needle in line:
            if key is not None:
                pat = re.compile(rf"^\s*[\"']?{re.escape(key)}[\"']?\s*[=:]")
                for j in range(i, len(lines)):
                    if pat.match(lines[j]):
                        return j + 1
            return i
    return 0


@dataclass
class _Extras:
    names: dict[str, set[str]]
    file: str
    text: str
    header: str

    def where(self, extra: str) -> str:
        return f"{self.file}:{_line_no(self.text, self.header, extra)}"


def _declared_extras(root: Path) -> _Extras | None:
    pyproject = root / "pyproject.toml"
    if pyproject.is_file():
        text = _read(pyproject)
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError:
            data = {}
        opt = data.get("project", {}).get("optional-dependencies") or {}
        if isinstance(opt, dict) and opt:
            return _Extras({_norm(k): _req_names(v) for k, v in opt.items() if isinstance(v, list)},
                           "pyproject.toml", text, "optional-dependencies")
    setup_cfg = root / "setup.cfg"
    if setup_cfg.is_file():
        text = _read(setup_cfg)
        cfg = configparser.ConfigParser(interpolation=None)
        try:
            cfg.read_string(text)
        except configparser.Error:
            cfg = configparser.ConfigParser()
        if cfg.has_section("options.extras_require"):
            items = dict(cfg.items("options.extras_require"))
            return _Extras({_norm(k): _req_names(v.splitlines()) for k, v in items.items()},
                           "setup.cfg", text, "[options.extras_require]")
    setup_py = root / "setup.py"
    if setup_py.is_file():
        text = _read(setup_py)
        m = re.search(r"extras_require\s*=\s*\{(.*?)\}", text, re.S)
        if m:
            found = {}
            for key, body in re.findall(r"[\"']([\w.\-]+)[\"']\s*:\s*\[([^\]]*)\]", m.group(1)):
                found[_norm(key)] = _req_names(re.findall(r"[\"']([^\"']+)[\"']", body))
            if found:
                return _Extras(found, "setup.py", text, "extras_require")
    return None


def _installable(root: Path) -> str | None:
    if (root / "setup.py").is_file():
        return "setup.py"
    if (root / "setup.cfg").is_file() and "[metadata]" in _read(root / "setup.cfg"):
        return "setup.cfg"
    pyproject = root / "pyproject.toml"
    if pyproject.is_file():
        try:
            data = tomllib.loads(_read(pyproject))
        except tomllib.TOMLDecodeError:
            return None
        if "project" in data or "build-system" in data or "poetry" in data.get("tool", {}):
            return "pyproject.toml"
    return None


def _tox_commands(root: Path) -> list[tuple[str, int, str]]:
    """(command, line number, raw) of tox.ini's [testenv] ``commands``."""
    path = root / "tox.ini"
    if not path.is_file():
        return []
    out = []
    in_env = in_cmds = False
    for i, raw in enumerate(_read(path).splitlines(), 1):
        stripped = raw.strip()
        if stripped.startswith("["):
            in_env = stripped == "[testenv]"
            in_cmds = False
            continue
        if not in_env:
            continue
        key = re.match(r"^commands\s*=\s*(.*)$", raw)
        if key:
            in_cmds = True
            if key.group(1).strip():
                out.append((key.group(1).strip(), i, raw))
            continue
        if in_cmds:
            if raw[:1].isspace() and stripped:
                out.append((stripped, i, raw))
            elif stripped:
                in_cmds = False
    return out


def _command_lines(root: Path, files: list[Path]) -> list[tuple[str, str, int]]:
    """(command, file, line) for each line that runs a test runner, in the files' order, tox.ini's
    [testenv] commands read as tox (they run inside tox)."""
    found = []
    for path in files:
        rel = path.relative_to(root).as_posix()
        if path.name in ("tox.ini", "setup.cfg", "pyproject.toml", "setup.py") or path.suffix == ".txt":
            continue
        text = _read(path)
        if path.name == "noxfile.py":
            for i, line in enumerate(text.splitlines(), 1):
                m = _NOX_RUN.search(line)
                if m:
                    argv = re.findall(r"[\"']([^\"']*)[\"']", m.group(1))
                    cmd = shlex.join(argv)
                    if _RUNNER.match(cmd):
                        found.append((cmd, rel, i))
            continue
        for i, line in enumerate(text.splitlines(), 1):
            body = _PROMPT_LINE.sub("", line).strip().strip("`").strip()
            if _RUNNER.match(body):
                found.append((body, rel, i))
    return found


def _tox_posargs(tox_cmds: list[tuple[str, int, str]]) -> list[str]:
    """What to pass through tox's ``{posargs}`` so the inner runner prints one line per test:
    ``-rA`` for pytest, ``-v`` for unittest, unless the command has it already; nothing when no
    command takes ``{posargs}`` or the inner runner is neither."""
    for cmd, _, _ in tox_cmds:
        if "{posargs}" not in cmd:
            continue
        words = cmd.replace("{posargs}", " ").split()
        runner = runner_of(cmd)  # the same reading of a tox command as the tox log parser's
        if runner == "pytest":
            return [] if any(w == "-rA" or (w.startswith("-r") and "A" in w) for w in words) else ["-rA"]
        # NOTE: only `-m unittest` takes a bare -v; Django's runners want a level (-v 2) and nose
        # is left as it is.
        if runner == "unittest" and re.search(r"-m\s+unittest\b", cmd):
            return [] if any(w in ("-v", "--verbose") for w in words) else ["-v"]
        return []
    return []


def _force_verbose(argv: list[str], framework: str, posargs: list[str]) -> list[str]:
    argv = [_ALIASES.get(argv[0], argv[0])] + argv[1:]
    if framework == "pytest":
        if not any(a == "-rA" or (a.startswith("-r") and "A" in a) for a in argv):
            argv.append("-rA")
    elif framework == "unittest":
        if not any(a in ("-v", "--verbose") for a in argv):
            argv.append("-v")
    elif framework == "tox":
        # NOTE: tox runs the envlist's interpreters, which may not be installed; ``-e py`` runs
        # the current one. The inner runner is made verbose through {posargs} when tox.ini has it.
        if "-e" not in argv and not any(a.startswith("-e") for a in argv[1:]):
            argv += ["-e", "py"]
        # NOTE: a first version always passed -rA, which broke a tox.ini whose command is
        # ``python -m unittest -v {posargs}`` (more-itertools 10.7.0, the real-world run).
        if posargs and "--" not in argv:
            argv += ["--", *posargs]
    return argv


def _framework_of(cmd: str) -> str:
    if re.match(r"^tox\b", cmd):
        return "tox"
    if re.match(r"^nosetests\b", cmd):
        return "nose"
    if re.search(r"-m\s+unittest\b", cmd):
        return "unittest"
    return "pytest"


def _uses_pytest_config(root: Path) -> str | None:
    if (root / "pytest.ini").is_file():
        return "pytest.ini:1"
    if (root / "conftest.py").is_file():
        return "conftest.py:1"
    for name, marker in (("pyproject.toml", "[tool.pytest"), ("setup.cfg", "[tool:pytest]"), ("tox.ini", "[pytest]")):
        path = root / name
        if path.is_file():
            text = _read(path)
            if marker in text:
                return f"{name}:{_line_no(text, marker)}"
    return None


class RuleExtractor:
    """The rule-based extractor (no model): :meth:`extract` reads the files, :meth:`repair` adds a
    missing module's package."""

    name = "rules"

    def extract(self, root: str | Path) -> SetupPlan | None:
        return extract_rules(root)

    def repair(self, plan: SetupPlan, error: str) -> SetupPlan | None:
        """``pip install X`` before the installs already there, for the last ``No module named
        'X'`` in ``error``; None when the error names no module or X is already installed.

        NOTE: the import name is taken as the distribution name (true for many packages, not for
        e.g. ``yaml``/PyYAML); a model does better, which is why the paper uses one.
        """
        mods = re.findall(r"No module named ['\"]([\w.]+)['\"]", error)
        if not mods:
            return None
        dist = mods[-1].split(".")[0]
        cmd = shlex.join(["pip", "install", dist])
        if cmd in plan.install:
            return None
        return SetupPlan([cmd, *plan.install], list(plan.test_commands), plan.test_framework,
                         [*plan.evidence, f"repair: {cmd} for No module named {mods[-1]!r}"], list(plan.rejected))


def extract_rules(root: str | Path) -> SetupPlan:
    """The rule-based :class:`SetupPlan` for the repository folder ``root``.

    Install, in order: ``pip install -r requirements.txt``; each test/dev requirements file
    (``requirements-dev.txt``, ``test-requirements.txt``, ``requirements/test.txt``, ...); the
    project itself (``pip install -e .``, or ``.[EXTRA]`` for the first of :data:`TEST_EXTRAS` it
    declares) when it has setup.py, setup.cfg metadata or a pyproject; then the runner itself when
    no dependency list names it. With tox as the framework only ``pip install tox`` (tox installs
    the project in its own environment).

    Test command: the first runner line found in the CI workflows, .travis.yml, noxfile.py, README
    or CONTRIBUTING, in that order, made verbose; else tox's (``tox -e py``) when tox.ini has
    [testenv] commands; else ``pytest -rA`` when pytest is configured (pytest.ini, conftest.py,
    ``[tool.pytest...]``, ``[tool:pytest]``) or named in a dependency list; else
    ``python -m unittest discover -v``. Commands the allow-list refuses are skipped and listed in
    :attr:`SetupPlan.rejected`.
    """
    path = Path(root)
    files = repo_files(path)
    evidence: list[str] = []
    rejected: list[str] = []

    # ---- test command
    test_cmd: list[str] | None = None
    framework = ""
    tox_cmds = _tox_commands(path)
    posargs = _tox_posargs(tox_cmds)
    for cmd, rel, line in _command_lines(path, files):
        try:
            argv = check_command(cmd)
        except CommandRejected as exc:
            rejected.append(f"{cmd}: {exc} ({rel}:{line})")
            continue
        framework = _framework_of(cmd)
        test_cmd = _force_verbose(argv, framework, posargs)
        evidence.append(f"{rel}:{line}: {cmd}")
        break
    if test_cmd is None and tox_cmds:
        framework = "tox"
        test_cmd = _force_verbose(["tox"], "tox", posargs)
        evidence.append(f"tox.ini:{tox_cmds[0][1]}: {tox_cmds[0][0]}")
    if test_cmd is None:
        where = _uses_pytest_config(path)
        if where:
            framework, test_cmd = "pytest", ["pytest", "-rA"]
            evidence.append(f"inferred from {where}: pytest")

    # ---- install
    install: list[tuple[str, str]] = []
    declared: set[str] = set()
    req_files = [p for p in files if p.suffix == ".txt"]
    main_req = path / "requirements.txt"
    if framework != "tox":
        if main_req.is_file():
            install.append((shlex.join(["pip", "install", "-r", "requirements.txt"]), "requirements.txt:1"))
            declared |= _req_names(_read(main_req).splitlines())
        for req in req_files:
            rel = req.relative_to(path).as_posix()
            if req == main_req or not _TEST_REQ_WORDS.search(rel.lower().removesuffix(".txt")):
                continue
            install.append((shlex.join(["pip", "install", "-r", rel]), f"{rel}:1"))
            declared |= _req_names(_read(req).splitlines())
        how = _installable(path)
        if how:
            extras = _declared_extras(path)
            chosen = next((e for e in TEST_EXTRAS if extras and e in extras.names), None)
            if chosen and extras:
                install.append((shlex.join(["pip", "install", "-e", f".[{chosen}]"]),
                                f"{extras.where(chosen)}: extra {chosen!r}"))
                declared |= extras.names[chosen]
            else:
                install.append((shlex.join(["pip", "install", "-e", "."]), f"{how}: installable project"))

    if test_cmd is None and "pytest" in declared:
        framework, test_cmd = "pytest", ["pytest", "-rA"]
        evidence.append("inferred: pytest in the dependencies")
    if test_cmd is None:
        # NOTE: with nothing saying how tests run, unittest discovery is the fallback (it needs
        # nothing installed); tests/ without __init__.py is given as the start folder.
        framework = "unittest"
        test_cmd = ["python", "-m", "unittest", "discover", "-v"]
        tests = path / "tests"
        if tests.is_dir() and not (tests / "__init__.py").is_file():
            test_cmd = ["python", "-m", "unittest", "discover", "-s", "tests", "-t", ".", "-v"]
        evidence.append("inferred: no test command found, unittest discovery")

    runner_pkg = {"pytest": "pytest", "tox": "tox", "nose": "nose"}.get(framework)
    if runner_pkg and runner_pkg not in declared:
        install.append((shlex.join(["pip", "install", runner_pkg]),
                        f"inferred: {runner_pkg} runs the tests and no dependency list names it"))

    install_cmds = [c for c, _ in install]
    shown = shlex.join(test_cmd)
    evidence = [f"install {c!r} <- {why}" for c, why in install] + [f"test {shown!r} <- {e}" for e in evidence]
    return SetupPlan(install_cmds, [shlex.join(test_cmd)], framework, evidence, rejected)


# ----------------------------------------------------------------------------------------- LLMs


@runtime_checkable
class LLM(Protocol):
    """Anything that completes a prompt."""

    def complete(self, prompt: str) -> str: ...


class ChatLLM:
    """An :class:`LLM` on a chat client of :mod:`lmforge.methods.minions.clients` (the prompt as
    one user message; the reply's text)."""

    def __init__(self, client: Any, *, max_tokens: int | None = 512) -> None:
        self.client = client
        self.max_tokens = max_tokens
        self.name = getattr(client, "name", type(client).__name__)

    @classmethod
    def from_model(cls, model: Any, tokenizer: Any, *, max_tokens: int = 512, **kwargs: Any) -> ChatLLM:
        """An in-process Hugging Face model (minions' ``HFChatClient``)."""
        from lmforge.methods.minions.clients import HFChatClient

        return cls(HFChatClient(model, tokenizer, max_tokens=max_tokens, **kwargs), max_tokens=max_tokens)

    def complete(self, prompt: str) -> str:
        return self.client.chat([{"role": "user", "content": prompt}], max_tokens=self.max_tokens).text


def make_llm(spec: str, *, base_url: str | None = None, max_tokens: int = 512, **kwargs: Any) -> ChatLLM:
    """A :class:`ChatLLM` on :func:`lmforge.methods.minions.apply.make_client` (``zoo:NAME`` or a
    local HF folder in-process; a model name at an OpenAI-compatible ``base_url``)."""
    from lmforge.methods.minions.apply import make_client

    return ChatLLM(make_client(spec, base_url=base_url, max_tokens=max_tokens, **kwargs), max_tokens=max_tokens)


class ScriptedLLM:
    """Replays ``replies`` in order (a function of the prompt when callable); records the prompts.
    Running out of replies is a RuntimeError (a test's mistake)."""

    name = "scripted"

    def __init__(self, replies: Sequence[str] | Callable[[str], str]) -> None:
        self._replies = replies if callable(replies) else list(replies)
        self.prompts: list[str] = []

    def complete(self, prompt: str) -> str:
        self.prompts.append(prompt)
        if callable(self._replies):
            return self._replies(prompt)
        if len(self.prompts) > len(self._replies):
            raise RuntimeError(f"ScriptedLLM has only {len(self._replies)} replies")
        return self._replies[len(self.prompts) - 1]


_INSTRUCTIONS = (
    "You set up a Python repository so that its test suite can run. From the files below, give the "
    "shell commands that install it in a fresh virtual environment and the commands that run its "
    "tests with one line per test (pytest: -rA; unittest: -v). Allowed executables: pip, python, "
    "pytest, tox, nox, uv; no shell operators, no URLs, no index options (the index is set for you). "
    'Reply with one JSON object: {"install": [...], "test_commands": [...], "test_framework": '
    '"pytest" | "unittest" | "tox" | "nose" | "django"}.')
_REPAIR = ("The commands below failed. Fix them, and reply with the whole corrected JSON object in the "
           "same format.")


@dataclass
class LLMExtractor:
    """SetUpAgent's extractor: one prompt with the repository's files, one JSON reply.

    Attributes:
        llm: the model.
        budget_chars: characters of file text in a prompt, all files together.
        file_chars: characters kept of one file (its head).
        calls, failures: replies asked for, and the ones that gave no usable plan.
        errors: one line per failure (why the reply was refused).
    """

    llm: LLM
    budget_chars: int = 12_000
    file_chars: int = 3_000
    calls: int = 0
    failures: int = 0
    errors: list[str] = field(default_factory=list)
    _context: str = ""

    name = "llm"

    def context(self, root: str | Path) -> str:
        """The files' text for the prompt: each file's head (``file_chars``) under a ``### path``
        header, in :func:`repo_files` order, until ``budget_chars`` is spent."""
        path = Path(root)
        parts: list[str] = []
        left = self.budget_chars
        for f in repo_files(path):
            if left <= 0:
                break
            text = _read(f)
            keep = min(self.file_chars, left)
            cut = text[:keep] + ("\n[... truncated]" if len(text) > keep else "")
            parts.append(f"### {f.relative_to(path).as_posix()}\n{cut}")
            left -= keep
        return "\n\n".join(parts)

    def prompt(self, root: str | Path) -> str:
        self._context = self.context(root)
        return f"{_INSTRUCTIONS}\n\n{self._context}"

    def _ask(self, prompt: str) -> SetupPlan | None:
        self.calls += 1
        try:
            reply = self.llm.complete(prompt)
        except Exception as exc:  # a client's network or decoding error is a failed call, counted
            return self._fail(f"model call failed: {type(exc).__name__}: {exc}")
        return self.parse(reply)

    def _fail(self, why: str) -> None:
        self.failures += 1
        self.errors.append(why)
        return None

    def parse(self, reply: str) -> SetupPlan | None:
        """The reply as a checked :class:`SetupPlan`; None (counted in :attr:`failures`) when it
        holds no JSON object, a key has the wrong type, the framework is unknown, or no test
        command passes the allow-list. Refused commands are kept in :attr:`SetupPlan.rejected`."""
        obj = extract_json(reply)
        if obj is None:
            return self._fail("no JSON object in the reply")
        install, tests, fw = obj.get("install", []), obj.get("test_commands"), obj.get("test_framework")
        if isinstance(install, str):
            install = [install]
        if isinstance(tests, str):
            tests = [tests]
        if not isinstance(install, list) or not all(isinstance(c, (str, list)) for c in install):
            return self._fail("'install' is not a list of commands")
        if not isinstance(tests, list) or not tests or not all(isinstance(c, (str, list)) for c in tests):
            return self._fail("'test_commands' is missing or not a list of commands")
        if not isinstance(fw, str) or fw not in PARSERS:
            return self._fail(f"unknown test_framework {fw!r} (known: {', '.join(PARSERS)})")
        kept_install, rej1 = filter_commands(install)
        kept_tests, rej2 = filter_commands(tests)
        if not kept_tests:
            return self._fail("no test command passed the allow-list: " + "; ".join(rej2))
        evidence = [f"llm:{getattr(self.llm, 'name', type(self.llm).__name__)}"]
        extra = obj.get("evidence")
        if isinstance(extra, list):
            evidence += [str(e) for e in extra]
        return SetupPlan(kept_install, kept_tests, fw, evidence, rej1 + rej2)

    def extract(self, root: str | Path) -> SetupPlan | None:
        return self._ask(self.prompt(root))

    def repair(self, plan: SetupPlan, error: str) -> SetupPlan | None:
        """Ask again with the failed plan and the error text (the files of the last
        :meth:`extract` stay in the prompt)."""
        previous = json.dumps({"install": plan.install, "test_commands": plan.test_commands,
                               "test_framework": plan.test_framework})
        prompt = (f"{_INSTRUCTIONS}\n\n{self._context}\n\n{_REPAIR}\n\nPrevious commands:\n{previous}\n\n"
                  f"Error:\n{error}")
        return self._ask(prompt)
