"""``lmforge reproduce setupagent``: date-capped setup of generated repositories, end to end.

Vergopoulos, Müller, Vechev, "Automated Benchmark Generation for Repository-Level Coding Tasks"
(SetUpAgent, ICML 2025): an LLM-driven agent sets repositories up historically accurately, runs
their tests before and after each merged fix, and turns the changes into SWE-bench instances
(SWEE-Bench, SWA-Bench); agents are up to 60% less successful on them than on SWE-bench.

Miniature (offline; every setting fixed before the verdict run):

* :data:`N_REPOS` generated git repositories. Each depends on ``toydep``, whose 2.0 release
  (uploaded 2024-02-01) removed the ``scale`` function that the repositories' 2023 code calls.
  Each history has a base commit and an issue-linked fix ("Fix #N: clamp ignores its upper bound")
  that changes the code and adds tests: the planted FAIL_TO_PASS set is the added tests, the
  planted PASS_TO_PASS set the tests that were there. Two thirds test with pytest, one third with
  unittest; half import ``toydep`` at module level, half inside one function.
* Wheels (toydep 1.0 / 1.1 / 2.0, and pytest with its dependencies re-packed from this install)
  are served by :class:`lmforge.methods.setupagent.index.LocalIndex` with PEP 700 upload times,
  on loopback inside the command sandbox.
* The extractor is :class:`~lmforge.methods.setupagent.extract.LLMExtractor` around a scripted
  model (:func:`scripted_model`) that reads the README from the prompt and makes the mistakes a
  weak model makes (pytest repos: pytest not installed; unittest repos: a file pattern that matches no test file).
  It fixes a mistake only from the error text the repair loop sends back.
* Each repository runs through :func:`lmforge.methods.setupagent.pipeline.setup_repository` twice:
  with the date cap (pip ``--uploaded-prior-to`` = the fix's commit time) and without it.
* Conditions (:func:`conditions`): with the cap every repository yields exactly one valid
  instance whose FAIL_TO_PASS and PASS_TO_PASS equal the planted sets; without the cap at most
  half do; the scripted model repaired at least one error; and lmforge's parser agrees with
  swebench's on every test log of both runs (pytest logs: ``parse_log_pytest`` equal; unittest
  logs: ``parse_log_django`` equal once the keys it adds for the first word of each
  ``FAIL:``/``ERROR:`` header line are set aside, a known swebench artefact, see the parser tests).

NOTE (pilot, before the verdict run): two ``--quick`` runs (3 repositories) found two bugs in this
module's harness, not in the method, and they were fixed: the scripted model's unittest repair
matched the shell-quoted pattern text and never fired, and :func:`test_id` named unittest tests by
``tests.test_core`` where ``discover -s tests`` reports ``test_core``. The conditions did not change.

NOTE (changed after the verdict run, reported): a review found that the repair count behind the
third condition counted every round after the first, failed or repeated ones included; it now
counts setups whose working plan came from a repair (:func:`repaired`). The condition's text and
threshold are unchanged; the verdict was re-run with the corrected count.

NOTE: the paper's headline (agents up to 60% less successful on SWEE/SWA than on SWE-bench) needs
frontier coding agents run on hundreds of real repositories; it cannot be re-run on a CPU and is
not claimed here. What this checks is the mechanism the benchmark rests on: historically accurate
setup, repair from errors, and exact instance validation.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import time
from pathlib import Path
from typing import Any

from lmforge.reproduce.base import ClaimResult, ReproduceOptions, Table, register_reproduction

TITLE = ("Automated Benchmark Generation for Repository-Level Coding Tasks (SetUpAgent; Vergopoulos, Müller, "
         "Vechev, ICML 2025)")
N_REPOS = 12
N_REPOS_QUICK = 3
PAPER = {"repositories (SWEE-Bench vs SWE-bench)": "hundreds vs 12",
         "agent success vs SWE-bench": "up to 60% lower (ICML abstract; a stored arXiv version of 2503.07701 says "
                                       "40%; needs frontier agents, not reproduced)"}
TOYDEP = {"1.0": "2022-03-01T00:00:00Z", "1.1": "2022-11-15T00:00:00Z", "2.0": "2024-02-01T00:00:00Z"}
REFERENCE_UPLOAD = "2021-06-01T00:00:00Z"  # pytest and its dependencies, re-packed
RUNNER_DISTS = ("pytest", "pluggy", "iniconfig", "packaging", "pygments")


# ------------------------------------------------------------------------------------ the world


def _toydep_files(version: str) -> dict[str, str]:
    if version.startswith("1."):
        body = ('"""toydep 1.x."""\n__version__ = "%s"\n\n\ndef scale(values, k):\n'
                '    return [v * k for v in values]\n\n\ndef total(values):\n    return sum(values)\n' % version)
    else:
        body = ('"""toydep 2.0: scale() became multiply()."""\n__version__ = "2.0"\n\n\n'
                'def multiply(values, k):\n    return [v * k for v in values]\n\n\n'
                'def total(values):\n    return sum(values)\n')
    return {"toydep/__init__.py": body}


def build_index(folder: Path) -> Path:
    """The local index: toydep 1.0/1.1/2.0 and the test runner's distributions, with upload times."""
    from lmforge.methods.setupagent.index import UPLOAD_TIMES_FILE, build_wheel, wheel_from_installed

    times: dict[str, str] = {}
    for version, when in TOYDEP.items():
        times[build_wheel("toydep", version, _toydep_files(version), folder).name] = when
    for dist in RUNNER_DISTS:
        times[wheel_from_installed(dist, folder).name] = REFERENCE_UPLOAD
    (folder / UPLOAD_TIMES_FILE).write_text(json.dumps(times, indent=1), encoding="utf-8")
    return folder


def _framework(i: int) -> str:
    return "unittest" if i % 3 == 2 else "pytest"


def _eager(i: int) -> bool:
    return i % 2 == 0


def _core(i: int, fixed: bool) -> str:
    clamp = "min(hi, max(lo, x))" if fixed else "max(lo, x)"
    head = f'"""proj{i}: small numeric helpers."""\n'
    if _eager(i):
        head += "from toydep import scale\n"
        scaled = f"    return scale(values, {2 + i % 3})\n"
    else:
        scaled = f"    from toydep import scale\n\n    return scale(values, {2 + i % 3})\n"
    return (f"{head}\n\ndef clamp(x, lo, hi):\n    \"\"\"Clamp x into [lo, hi].\"\"\"\n    return {clamp}\n\n\n"
            f"def grow(values):\n{scaled}\n\ndef mean(values):\n    return sum(values) / len(values)\n")


def planted_tests(i: int) -> tuple[list[str], list[str]]:
    """The test functions of repository ``i``: (present at the base, added by the fix)."""
    base = ["test_grow", "test_mean", "test_clamp_lower"] + [f"test_mean_{k}" for k in range(i % 3)]
    added = ["test_clamp_upper"] + (["test_clamp_inside"] if i % 2 else [])
    return base, added


def _test_body(name: str, i: int) -> str:
    k = 2 + i % 3
    bodies = {
        "test_grow": f"assert grow([1, 2]) == [{k}, {2 * k}]",
        "test_mean": "assert mean([1, 2, 3]) == 2",
        "test_clamp_lower": "assert clamp(-5, 0, 10) == 0",
        "test_clamp_upper": "assert clamp(50, 0, 10) == 10",
        "test_clamp_inside": "assert clamp(7, 0, 10) == 7 and clamp(11, 0, 10) == 10",
    }
    if name.startswith("test_mean_"):
        n = int(name.rsplit("_", 1)[1]) + 2
        return f"assert mean([{n}] * {n}) == {n}"
    return bodies[name]


def _tests_file(i: int, names: list[str]) -> str:
    if _framework(i) == "pytest":
        parts = [f"from proj{i}.core import clamp, grow, mean\n"]
        parts += [f"\n\ndef {n}():\n    {_test_body(n, i)}\n" for n in names]
        return "".join(parts)
    parts = [f"import unittest\n\nfrom proj{i}.core import clamp, grow, mean\n\n\nclass CoreTests(unittest.TestCase):\n"]
    for n in names:
        parts.append(f"    def {n}(self):\n        {_test_body(n, i)}\n\n")
    return "".join(parts).rstrip() + "\n"


def _readme(i: int) -> str:
    run = "pytest" if _framework(i) == "pytest" else "python -m unittest discover -s tests"
    return (f"# proj{i}\n\nSmall numeric helpers built on toydep.\n\n## Development\n\n"
            f"Install the requirements, then run the tests:\n\n    pip install -r requirements.txt\n    {run}\n")


def _git(root: Path, *args: str, when: str | None = None) -> None:
    env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": str(root), "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_AUTHOR_NAME": "dev", "GIT_AUTHOR_EMAIL": "dev@example.org",
           "GIT_COMMITTER_NAME": "dev", "GIT_COMMITTER_EMAIL": "dev@example.org"}
    if when:
        env["GIT_AUTHOR_DATE"] = env["GIT_COMMITTER_DATE"] = when
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, env=env)


def fix_time(i: int) -> str:
    return f"2023-06-{1 + i:02d}T12:00:00+00:00"


def make_repo(root: Path, i: int) -> Path:
    """Repository ``i``: a base commit (bug + base tests) and the issue-linked fix (code + added tests)."""
    base, added = planted_tests(i)
    pkg = root / f"proj{i}"
    pkg.mkdir(parents=True)
    (root / "tests").mkdir()
    (pkg / "__init__.py").write_text("", encoding="utf-8")
    (root / "tests" / "__init__.py").write_text("", encoding="utf-8")
    (root / "requirements.txt").write_text("toydep>=1.0\n", encoding="utf-8")
    (root / "README.md").write_text(_readme(i), encoding="utf-8")
    (pkg / "core.py").write_text(_core(i, fixed=False), encoding="utf-8")
    (root / "tests" / "test_core.py").write_text(_tests_file(i, base), encoding="utf-8")
    _git(root, "init", "-q", "-b", "main")
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", "Initial helpers", when=f"2023-02-{1 + i:02d}T12:00:00+00:00")
    (pkg / "core.py").write_text(_core(i, fixed=True), encoding="utf-8")
    (root / "tests" / "test_core.py").write_text(_tests_file(i, base + added), encoding="utf-8")
    _git(root, "add", "-A")
    _git(root, "commit", "-q", "-m", f"Fix #{i + 1}: clamp ignores its upper bound", when=fix_time(i))
    return root


def test_id(i: int, name: str) -> str:
    """The id lmforge's parser gives test ``name`` of repository ``i``: the pytest node id, or
    unittest's 3.11+ verbose form, where ``discover -s tests`` (no ``-t``) makes ``tests`` the top
    folder, so the module is ``test_core``."""
    if _framework(i) == "pytest":
        return f"tests/test_core.py::{name}"
    return f"{name} (test_core.CoreTests.{name})"


# ------------------------------------------------------------------------------- scripted model


def _drop_pattern(command: str) -> str:
    """``command`` without unittest's ``-p PATTERN`` (so the default ``test*.py`` applies)."""
    argv = shlex.split(command)
    if "-p" in argv:
        at = argv.index("-p")
        del argv[at:at + 2]
    return shlex.join(argv)


def scripted_model(prompt: str) -> str:
    """A stand-in for the extractor's LLM. First reply: the README's commands, without the test
    runner's install (pytest) or with a file pattern that finds no test (unittest). A repair reply fixes what
    the error text shows and nothing else; an error it does not recognise gets the same plan back."""
    if "The commands below failed." in prompt:
        previous = json.loads(prompt.split("Previous commands:\n", 1)[1].split("\n\nError:\n", 1)[0])
        error = prompt.split("\n\nError:\n", 1)[1]
        if re.search(r"No such file or directory: '?pytest|pytest: (?:command )?not found|exit 127", error):
            previous["install"] = [*previous["install"], "pip install pytest"]
        elif "Ran 0 tests" in error:
            previous["test_commands"] = [_drop_pattern(c) for c in previous["test_commands"]]
        return json.dumps(previous)
    if "python -m unittest" in prompt:
        return json.dumps({"install": ["pip install -r requirements.txt"],
                           "test_commands": ["python -m unittest discover -v -s tests -p *_test.py"],
                           "test_framework": "unittest"})
    return json.dumps({"install": ["pip install -r requirements.txt"], "test_commands": ["pytest -rA"],
                       "test_framework": "pytest"})


# ---------------------------------------------------------------------------------- the checks


def _swebench_parsers() -> Any:
    from lmforge.methods.setupagent.reference import load_swebench

    return load_swebench()


def parsers_agree(log: str, framework: str, ours: dict[str, str], ref: Any) -> bool:
    """The rule fixed before the run (module docstring)."""
    if framework == "pytest":
        return ours == ref.parse_log_pytest(log)
    sb = ref.parse_log_django(log)
    headers = {line.split()[1] for line in log.splitlines() if line.startswith(("FAIL:", "ERROR:")) and len(line.split()) > 1}
    return ours == {k: v for k, v in sb.items() if k not in headers}


def repaired(record: dict[str, Any]) -> bool:
    """Whether the plan that worked came from a repair: the loop ended ok after more than one
    round. (Counting rounds after the first would count failed and repeated rounds too.)"""
    loop = record.get("repair") or {}
    return bool(loop.get("ok")) and len(loop.get("rounds") or []) > 1


def conditions(capped: list[dict[str, Any]], uncapped: list[dict[str, Any]], repairs: int,
               agreement: list[bool] | None) -> dict[str, Any]:
    """``capped``/``uncapped``: per repository, ``{"valid": bool, "exact": bool}``. Held when every
    capped repository is valid and exact, at most half the uncapped ones are valid, at least one
    error was repaired, and swebench's parser agreed on every log (None: swebench absent)."""
    n = len(capped)
    checks = {
        "capped: all valid with the planted sets": all(r["valid"] and r["exact"] for r in capped),
        "uncapped: at most half valid": sum(r["valid"] for r in uncapped) <= n // 2,
        "the model repaired at least one error": repairs >= 1,  # setups whose working plan is a repair
        "parsers agree with swebench on every log": bool(agreement) and all(agreement),
    }
    return {"checks": checks, "held": all(checks.values()), "swebench_available": agreement is not None}


# ----------------------------------------------------------------------------- real-world run

#: Small pure-Python releases whose sdists carry their tests (``--full``), and the wheels their
#: plans install (build backends, runners), downloaded from the configured package registry.
REAL_WORLD = ("six==1.17.0", "idna==3.10", "more-itertools==10.7.0")
REAL_WORLD_WHEELS = ("pytest", "setuptools", "flit_core==3.10.1", "tox")


def _download(args: list[str], dest: Path) -> str | None:
    """``pip download ARGS -d dest`` with this interpreter's pip and the user's pip configuration;
    None when it worked, else the error's last line."""
    import sys

    proc = subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "-d", str(dest), *args],
                          capture_output=True, text=True, timeout=600, check=False)
    if proc.returncode == 0:
        return None
    lines = [ln for ln in (proc.stderr + proc.stdout).splitlines() if ln.strip()]
    return lines[-1] if lines else f"pip download exited {proc.returncode}"


def real_world(out: Path, ref: Any, limits: Any) -> tuple[list[list[Any]], list[str]]:
    """Set up, test and parse :data:`REAL_WORLD`'s sdists (no fix, no date cap: the registry's
    upload times are not available offline), each as a one-commit repository, with the
    rule-based extractor and the repair loop in the command sandbox. Rows for the report, notes."""
    import tarfile
    from collections import Counter

    from lmforge.methods.setupagent.extract import RuleExtractor
    from lmforge.methods.setupagent.index import wheel_from_installed
    from lmforge.methods.setupagent.repair import repair_loop
    from lmforge.methods.setupagent.runner import InstanceRunner, RunnerSettings

    sdists, wheels = out / "sdists", out / "wheels"
    error = (_download(["--no-deps", "--no-binary", ":all:", *REAL_WORLD], sdists)
             or _download(["--only-binary", ":all:", *REAL_WORLD_WHEELS], wheels))
    if error:
        return [], [f"real-world run not done: the package registry did not serve the files ({error})"]
    pip_wheel = wheel_from_installed("pip", out / "pip")
    rows = []
    for sdist in sorted(sdists.glob("*.tar.gz")):
        name = sdist.name.removesuffix(".tar.gz")
        with tarfile.open(sdist) as tar:
            tar.extractall(out / "trees", filter="data")
        tree = out / "trees" / name
        _git(tree, "init", "-q", "-b", "main")
        _git(tree, "add", "-A", "-f")
        _git(tree, "commit", "-q", "-m", f"{name} as released")
        head = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
        extractor = RuleExtractor()
        plan = extractor.extract(tree)
        settings = RunnerSettings(index=wheels, cap=False, limits=limits)
        start = time.monotonic()
        with InstanceRunner(tree, head, "", "", "2030-01-01T00:00:00Z", settings, pip_wheel) as runner:
            result = repair_loop(plan, runner.attempt, extractor)
            run = runner.before_run if result.ok else None
        counts = Counter(run.statuses.values()) if run else Counter()
        agree: Any = "n/a (tox)"
        if run and ref is not None and plan.test_framework in ("pytest", "unittest"):
            agree = "yes" if parsers_agree(run.log, plan.test_framework, run.statuses, ref) else "no"
        final = result.plan or plan
        rows.append([name, "; ".join(final.install), "; ".join(final.test_commands), "yes" if result.ok else "no",
                     result.repairs, len(run.statuses) if run else 0, counts.get("PASSED", 0),
                     counts.get("FAILED", 0) + counts.get("ERROR", 0), counts.get("SKIPPED", 0), agree,
                     round(time.monotonic() - start, 1)])
    return rows, []


# ---------------------------------------------------------------------------------------- run


def _one_condition(repos: list[Path], index: Path, out: Path, cap: bool, ref: Any, limits: Any
                   ) -> tuple[list[dict[str, Any]], int, list[bool], list[dict[str, Any]]]:
    from lmforge.methods.setupagent.extract import LLMExtractor, ScriptedLLM
    from lmforge.methods.setupagent.parsers import parse_log
    from lmforge.methods.setupagent.pipeline import setup_repository
    from lmforge.methods.setupagent.runner import RunnerSettings

    rows, agree, details, repairs = [], [], [], 0
    for i, repo in enumerate(repos):
        extractor = LLMExtractor(ScriptedLLM(scripted_model))
        report = setup_repository(repo, out / f"proj{i}", index=index, cap=cap, extractor=extractor,
                                  settings=RunnerSettings(index=index, limits=limits), progress=False)
        base, added = planted_tests(i)
        want_f2p = sorted(test_id(i, n) for n in added)
        want_p2p = sorted(test_id(i, n) for n in base)
        rec = report.records[0] if len(report.records) == 1 else None
        inst = (rec or {}).get("instance") or {}
        valid = rec is not None and rec["status"] == "valid"
        exact = valid and sorted(inst["FAIL_TO_PASS"]) == want_f2p and sorted(inst["PASS_TO_PASS"]) == want_p2p
        repairs += sum(repaired(r) for r in report.records)
        rows.append({"valid": valid, "exact": exact})
        details.append({"repo": f"proj{i}", "framework": _framework(i), "eager_import": _eager(i),
                        "records": len(report.records), "status": rec["status"] if rec else "none",
                        "reason": rec["reason"] if rec else "", "repairs": rec.get("repairs") if rec else None,
                        "F2P": len(inst.get("FAIL_TO_PASS", [])), "P2P": len(inst.get("PASS_TO_PASS", [])),
                        "F2F": len(inst.get("FAIL_TO_FAIL", [])), "exact": exact,
                        "layers": rec.get("layers") if rec else None, "seconds": rec.get("seconds") if rec else None})
        if ref is not None and rec is not None:
            for which in ("before", "after"):
                log_path = out / f"proj{i}" / "logs" / rec["instance_id"] / f"{which}.log"
                if log_path.is_file():
                    log = log_path.read_text(encoding="utf-8")
                    agree.append(parsers_agree(log, _framework(i), parse_log(log, _framework(i)), ref))
    return rows, repairs, agree, details


@register_reproduction("setupagent", TITLE, "date-capped setup, repair and validation of generated repositories "
                       "whose dependency later broke (offline, in the command sandbox)")
def run(cfg: ReproduceOptions) -> ClaimResult:
    from lmforge.common.command_sandbox import CommandLimits

    start = time.monotonic()
    out = Path(cfg.out_dir)
    n = N_REPOS_QUICK if cfg.quick else N_REPOS
    index = build_index(out / "index")
    repos = [make_repo(out / "repos" / f"proj{i}", i) for i in range(n)]
    ref = _swebench_parsers()
    limits = CommandLimits(wall_seconds=120.0, cpu_seconds=120.0, memory_mb=2048)
    capped, rep_c, agree_c, det_c = _one_condition(repos, index, out / "capped", True, ref, limits)
    uncapped, rep_u, agree_u, det_u = _one_condition(repos, index, out / "uncapped", False, ref, limits)
    verdict = conditions(capped, uncapped, rep_c + rep_u, (agree_c + agree_u) if ref is not None else None)
    measured = {
        "capped: valid with the planted sets": f"{sum(r['exact'] for r in capped)}/{n}",
        "capped: valid": f"{sum(r['valid'] for r in capped)}/{n}",
        "uncapped: valid": f"{sum(r['valid'] for r in uncapped)}/{n}",
        "setups whose working plan came from a repair": rep_c + rep_u,
        "logs where lmforge's parser agrees with swebench's":
            f"{sum(agree_c + agree_u)}/{len(agree_c + agree_u)}" if ref is not None else "swebench not installed",
        "sandbox layers": ", ".join(det_c[0]["layers"] or []) if det_c and det_c[0]["layers"] else "none",
    }
    table_rows = [[d["repo"], d["framework"], "module" if d["eager_import"] else "function", cond, d["status"],
                   d["F2P"], d["P2P"], d["F2F"], "yes" if d["exact"] else "no", d["repairs"], d["reason"][:60]]
                  for cond, dets in (("cap", det_c), ("no cap", det_u)) for d in dets]
    (out / "details.json").write_text(json.dumps({"capped": det_c, "uncapped": det_u, "verdict": verdict},
                                                 indent=1), encoding="utf-8")
    notes = [
        "The paper's headline (agents up to 60% less successful on SWEE/SWA-Bench than on SWE-bench) needs "
        "frontier coding agents on hundreds of real repositories; it is not reproducible on a CPU and not claimed.",
        "The date-cap mechanism is pip's --uploaded-prior-to over PEP 700 upload times; the paper's own mechanism "
        "is unconfirmed (no code released).",
        "Generated repositories and a scripted extractor model stand in for GitHub and the paper's LLM; the "
        "conditions were fixed in this module before the verdict run.",
    ]
    tables = [Table("Per repository and condition",
                    ["repo", "tests", "toydep import", "cap", "status", "F2P", "P2P", "F2F", "planted sets",
                     "repairs", "reason"], table_rows)]
    if cfg.full:
        rw_rows, rw_notes = real_world(out / "real-world", ref, CommandLimits(wall_seconds=600.0, cpu_seconds=600.0))
        notes += rw_notes
        if rw_rows:
            tables.append(Table("Real-world run (--full): released sdists set up, tested and parsed in the sandbox "
                                "(rule-based extractor, no date cap, not part of the verdict)",
                                ["sdist", "install", "tests", "ran", "repairs", "tests parsed", "passed", "failed",
                                 "skipped", "swebench parser agrees", "seconds"], rw_rows))
    else:
        notes.append("The real-world run on released sdists (six, idna, more-itertools) needs the package registry: "
                     "--full runs it.")
    if cfg.quick:
        notes.append(f"quick run: {n} repositories instead of {N_REPOS}")
    if ref is None:
        notes.append("swebench is not installed: the parser-agreement condition could not be checked (not held)")
    return ClaimResult(
        name="setupagent", title=TITLE,
        claim="Repository setup capped at each change's date yields valid SWE-bench instances with exactly the "
              "planted FAIL_TO_PASS/PASS_TO_PASS sets where uncapped setup breaks on a later dependency release.",
        paper=PAPER, measured={**measured, **{k: v for k, v in verdict["checks"].items()}},
        held=verdict["held"],
        tables=tables,
        notes=notes, seconds=time.monotonic() - start)
