"""SetUpAgent end to end for one repository: mine candidates, extract a setup plan, run and repair
it in the sandbox, grade the runs before and after the fix, and write SWE-bench instances.

The steps are the paper's (Vergopoulos, Müller, Vechev, ICML 2025, arXiv 2503.07701; notes in
``papers/wave2.md`` §4): candidate changes (:mod:`.mine`), command extraction (:mod:`.extract`),
the repair loop (:mod:`.repair`) around the sandboxed runner (:mod:`.runner`), date-capped
installs (:mod:`.index`), per-test parsing (:mod:`.parsers`) and validation (:mod:`.grade`).
:func:`setup_repository` wires them and owns the output folder::

    OUT/runs/<instance_id>.json      one record per candidate (status, reason, repair rounds, grade)
    OUT/logs/<instance_id>/*.log     the test logs before and after the fix
    OUT/instances.jsonl              the valid instances (SWE-bench schema plus install/test_commands)
    OUT/report.json                  the summary

It is resumable per instance: a candidate whose ``runs/`` record exists is not run again (unless
``overwrite``), and ``instances.jsonl``/``report.json`` are rebuilt from every record. One
candidate's failure (a command that hangs, a patch that does not apply, a crash) is recorded as
that candidate's status and never stops the others.

Bad input is refused before anything is written: a path outside a git work tree, a history with no
candidate (no commit changes tests and code with an issue link), an index folder with files that
carry no upload time when the date cap is asked.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

from lmforge.common.errors import UserError
from lmforge.common.io import atomic_write_json, atomic_write_text
from lmforge.common.progress import track
from lmforge.methods.setupagent import StopRun
from lmforge.methods.setupagent.extract import RuleExtractor
from lmforge.methods.setupagent.grade import DEFAULT_PASS_RATE, keep, with_grade
from lmforge.methods.setupagent.index import LocalIndex, wheel_from_installed
from lmforge.methods.setupagent.mine import Candidate, mine, repo_root
from lmforge.methods.setupagent.repair import DEFAULT_MAX_ROUNDS, Repairer, repair_loop
from lmforge.methods.setupagent.runner import FixFailed, InstanceRunner, RunnerSettings, export_tree
from lmforge.methods.setupagent.schema import Instance, write_jsonl
from lmforge.methods.setupagent.stats import instance_stats

__all__ = ["STATUSES", "SetupReport", "StopRun", "check_index", "setup_repository"]

#: A candidate's status: a kept instance, a graded one that is not kept, a plan that never ran,
#: a fix that did not apply after a working setup, or an unexpected error.
STATUSES = ("valid", "invalid", "setup_failed", "fix_failed", "error")


class Extractor(Repairer, Protocol):
    """What the pipeline needs of an extractor: ``extract`` a plan from a tree, ``repair`` one."""

    def extract(self, root: str | Path) -> Any: ...


@dataclass
class SetupReport:
    """What :func:`setup_repository` did: the records by status and where it wrote them."""

    out: Path
    records: list[dict[str, Any]] = field(default_factory=list)
    skipped_commits: int = 0
    resumed: int = 0

    @property
    def valid(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r["status"] == "valid"]

    def counts(self) -> dict[str, int]:
        return {s: sum(r["status"] == s for r in self.records) for s in STATUSES}


def check_index(index: Path, upload_times: Path | None, cap: bool) -> None:
    """Refuse an index that cannot serve the run: missing, empty, or, with the cap, a file with no
    upload time (pip would refuse it anyway; this says which, before anything runs)."""
    if not Path(index).is_dir():
        raise UserError(f"index folder not found: {index}")
    local = LocalIndex(index, upload_times)
    if not local.files:
        raise UserError(f"the index folder {index} holds no wheel or sdist")
    missing = local.missing_upload_times()
    if cap and missing:
        raise UserError(f"the date cap needs an upload time for every file of the index; {len(missing)} have none "
                        f"(first: {missing[0]}); add them to upload-times.json or run without the cap")


def _record_path(out: Path, instance_id: str) -> Path:
    return out / "runs" / f"{instance_id}.json"


def _run_one(cand: Candidate, root: Path, out: Path, settings: RunnerSettings, extractor: Extractor,
             pip_wheel: Path, max_rounds: int, threshold: float) -> dict[str, Any]:
    inst = cand.instance
    record: dict[str, Any] = {"instance_id": inst.instance_id, "commit": cand.commit, "cap": settings.cap,
                              "status": "error", "reason": "", "instance": None, "repair": None}
    start = time.monotonic()
    scratch = out / "runs" / f".{inst.instance_id}.tree"
    shutil.rmtree(scratch, ignore_errors=True)
    try:
        export_tree(root, inst.base_commit, scratch)
        plan = extractor.extract(scratch)
        if plan is None:
            record.update(status="setup_failed", reason="the extractor proposed no plan")
            return record
        with InstanceRunner(root, inst.base_commit, inst.patch, inst.test_patch, inst.created_at, settings,
                            pip_wheel) as runner:
            result = repair_loop(plan, runner.attempt, extractor, max_rounds=max_rounds)
            record["repair"] = result.to_dict()
            record["repairs"] = result.repairs
            record["layers"] = list(runner.layers)
            if not result.ok:
                record.update(status="setup_failed",
                              reason=f"no plan ran after {len(result.rounds)} round(s): {_why(result)}")
                return record
            before = runner.before_run
            assert before is not None and result.plan is not None
            try:
                after = runner.after()
            except FixFailed as exc:
                record.update(status="fix_failed", reason=str(exc)[:500])
                return record
            logs = out / "logs" / inst.instance_id
            logs.mkdir(parents=True, exist_ok=True)
            atomic_write_text(logs / "before.log", before.log)
            atomic_write_text(logs / "after.log", after.log)
            graded = runner.grade(after)
        plan = result.plan
        done = with_grade(replace(inst, install=list(plan.install), test_commands=list(plan.test_commands),
                                  test_framework=plan.test_framework), graded)
        kept = keep(graded, threshold)
        record["instance"] = done.to_dict()
        record["pass_rate"] = graded.pass_rate
        record["before"], record["after"] = before.to_dict(), after.to_dict()
        if kept:
            record.update(status="valid", reason="")
        elif not graded.FAIL_TO_PASS:
            record.update(status="invalid", reason="no FAIL_TO_PASS test")
        else:
            record.update(status="invalid", reason=f"after-fix pass rate {graded.pass_rate:.3f} < {threshold}")
        return record
    except UserError as exc:
        record.update(status="error", reason=str(exc)[:500])
        return record
    except StopRun:
        raise
    except Exception as exc:  # noqa: BLE001 - one candidate's crash is its record, never the others' end
        record.update(status="error", reason=f"{type(exc).__name__}: {exc}"[:500])
        return record
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        record["seconds"] = round(time.monotonic() - start, 2)


def _why(result: Any) -> str:
    """The last failure of a repair loop that ran something: its command, and a kill at the limit."""
    ran = [r for r in result.rounds if r.outcome is not None]
    if not ran:
        return result.rounds[-1].note if result.rounds else "nothing ran"
    last = ran[-1]
    why = last.outcome.failed_command or last.note
    if last.outcome.log and "killed at the limit" in last.outcome.log:
        why = next(line for line in last.outcome.log.splitlines() if "killed at the limit" in line).strip()
    elif last.outcome.returncode is not None:
        why += f" (exit {last.outcome.returncode})"
    return why


def setup_repository(path: str | Path, out: str | Path, *, index: str | Path, upload_times: str | Path | None = None,
                     cap: bool = True, extractor: Extractor | None = None, max_rounds: int = DEFAULT_MAX_ROUNDS,
                     threshold: float = DEFAULT_PASS_RATE, settings: RunnerSettings | None = None,
                     repo: str | None = None, issues: str | Path | None = None, max_commits: int | None = None,
                     overwrite: bool = False, progress: bool = True,
                     on_record: Callable[[dict[str, Any]], None] | None = None) -> SetupReport:
    """Set up every candidate instance of the repository at ``path``; write them under ``out``.

    Args:
        path: a folder inside a git work tree.
        out: the output folder (created; an existing one is resumed, or cleared with ``overwrite``).
        index: the local index folder (the only package source; served on loopback in the sandbox).
        upload_times: another upload-times map for ``index``.
        cap: cap dependencies at each instance's ``created_at``.
        extractor: proposes and repairs plans (default: :class:`.extract.RuleExtractor`).
        max_rounds: the repair loop's bound.
        threshold: the pass rate an instance needs (:func:`.grade.keep`).
        settings: runner settings (limits, interpreter, required layers); ``index``/``cap`` override
            its fields.
        repo, issues, max_commits: passed to :func:`.mine.mine`.
        overwrite: remove ``out``'s earlier records first.
        progress: show a progress bar.
        on_record: called with each new record (e.g. to print a line).

    Returns:
        a :class:`SetupReport` over every record in ``out`` (resumed ones included).
    """
    if not 0.0 <= threshold <= 1.0:
        raise UserError(f"the pass-rate threshold must be in [0, 1], got {threshold}")
    if max_rounds < 1:
        raise UserError(f"max_rounds must be at least 1, got {max_rounds}")
    root = repo_root(path)
    if (repo or root.name).startswith("."):
        raise UserError(f"the repository name {repo or root.name!r} starts with '.', which would start every "
                        "instance id (and its record's file name) with one; give another with --repo")
    index_path = Path(index)
    times_path = Path(upload_times) if upload_times is not None else None
    check_index(index_path, times_path, cap)
    mined = mine(root, repo=repo, issues=issues, max_commits=max_commits)
    if not mined.candidates:
        reasons = sorted({why for _, why in mined.skipped})
        raise UserError(f"no candidate instance in {root}: no commit links an issue and changes both tests and code "
                        f"({len(mined.skipped)} commit(s) passed over: {', '.join(reasons) or 'none'})")
    base = settings or RunnerSettings(index=index_path)
    settings = RunnerSettings(index=index_path.resolve(), upload_times=times_path.resolve() if times_path else None,
                              cap=cap, limits=base.limits, python=base.python, require=base.require)
    extractor = extractor or RuleExtractor()
    out = Path(out)
    if out.exists() and not out.is_dir():
        raise UserError(f"output path exists and is not a folder: {out}")
    if not overwrite and (out / "runs").is_dir():
        # NOTE: a resumed record must have been made the way this run would make it; only the cap
        # changes what a record means (limits and the extractor change how likely it is to work).
        made = {bool(r["cap"]) for r in _read_records(out) if "cap" in r}
        if made - {cap}:
            raise UserError(f"{out} holds records made {'with' if not cap else 'without'} the date cap; run with "
                            "the same setting to resume, or give --overwrite to start over")
    if overwrite:
        for sub in ("runs", "logs"):
            shutil.rmtree(out / sub, ignore_errors=True)
        for name in ("instances.jsonl", "report.json"):
            (out / name).unlink(missing_ok=True)
    (out / "runs").mkdir(parents=True, exist_ok=True)
    report = SetupReport(out=out, skipped_commits=len(mined.skipped))
    pip_dir = out / "runs" / ".pip"
    shutil.rmtree(pip_dir, ignore_errors=True)
    pip_wheel = wheel_from_installed("pip", pip_dir)
    try:
        todo = []
        for cand in mined.candidates:
            target = _record_path(out, cand.instance.instance_id)
            if target.is_file():
                report.resumed += 1
            else:
                todo.append(cand)
        for cand in track(todo, "setting up instances") if progress else todo:
            record = _run_one(cand, root, out, settings, extractor, pip_wheel, max_rounds, threshold)
            atomic_write_json(_record_path(out, cand.instance.instance_id), record)
            if on_record is not None:
                on_record(record)
    finally:
        shutil.rmtree(pip_dir, ignore_errors=True)
    report.records = _read_records(out)
    _write_summary(out, report, root)
    return report


def _read_records(out: Path) -> list[dict[str, Any]]:
    records = []
    for path in sorted((out / "runs").glob("*.json")):
        try:
            records.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, json.JSONDecodeError) as exc:
            raise UserError(f"cannot read the run record {path}: {exc}") from None
    return records


def _write_summary(out: Path, report: SetupReport, root: Path) -> None:
    valid = [Instance.from_dict(r["instance"]) for r in report.valid]
    write_jsonl(out / "instances.jsonl", valid)
    summary = {
        "repository": str(root),
        "counts": report.counts(),
        "candidates": len(report.records),
        "commits_passed_over": report.skipped_commits,
        "resumed": report.resumed,
        "repairs": sum(int(r.get("repairs") or 0) for r in report.records),
        "instances": [{"instance_id": r["instance_id"], "status": r["status"], "reason": r["reason"],
                       **({"stats": instance_stats(Instance.from_dict(r["instance"]))} if r.get("instance") else {})}
                      for r in report.records],
    }
    atomic_write_json(out / "report.json", summary)
