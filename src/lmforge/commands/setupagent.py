"""``lmforge bench setup`` and ``lmforge bench swe-export``: SetUpAgent (Vergopoulos, Müller, Vechev,
ICML 2025), SWE-bench task instances from a git repository's issue-linked fixes.

- ``setup``: one repository through :func:`lmforge.methods.setupagent.pipeline.setup_repository`
  (mine candidates, extract install/test commands with rules or an LLM, run and repair them in
  lmforge's command sandbox against a local, date-capped package index, grade the tests before and
  after each fix). Resumable per instance.
- ``swe-export``: the instances of one or more ``setup`` output folders as one SWE-bench JSONL
  file, optionally with their patch-complexity statistics.

Every option is checked, and the repository, the index and the output folder are read, before
anything is written or a model is loaded.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlparse

import typer

from lmforge.commands.groups import bench_app
from lmforge.common.errors import UserError
from lmforge.methods.setupagent import StopRun

#: How many characters of the failing instances' reasons the single error line carries.
REASONS_CHARS = 300
_KILLED = "killed at the limit"  # the runner's log line for a command stopped at --timeout

_SETUP_HELP = (
    "Set up a git repository's issue-linked fixes as SWE-bench task instances (SetUpAgent).\n\n"
    "Candidates are the first-parent commits whose message links an issue (fixes #N) and that change both "
    "test and code files. For each, the install and test commands are extracted (rules, or an LLM with "
    "--extractor), run in a fresh virtual environment, repaired from their errors up to --max-rounds times, "
    "and the tests are run with the test patch before and after the fix.\n\n"
    "Written under --out:\n"
    "  runs/<instance_id>.json: one record per candidate (status, reason, repair rounds, grade)\n"
    "  logs/<instance_id>/*.log: the test logs before and after the fix\n"
    "  instances.jsonl: the valid instances (SWE-bench schema plus install/test_commands)\n"
    "  report.json: the summary (counts, per-instance statistics)\n\n"
    "Statuses:\n"
    "  valid: some test goes FAIL_TO_PASS and the after-fix pass rate is at least --threshold\n"
    "  invalid: graded, but no FAIL_TO_PASS test or a pass rate below --threshold\n"
    "  setup_failed: no plan installed and ran the tests within --max-rounds (a command failed, no test "
    "status could be parsed, or a command hung and was killed at --timeout)\n"
    "  fix_failed: the setup worked, but the fix did not apply or the tests did not run after it\n"
    "  error: something else went wrong for this candidate (the reason says what)\n\n"
    "Everything the repository brings (installs, its setup scripts, its tests) runs in lmforge's command "
    "sandbox: a private network namespace whose only service is the local index on loopback (no other "
    "network), in its own PID namespace, as the user nobody, with Landlock confining writes to a temporary "
    "work folder, and per-command limits (--timeout wall-clock and CPU seconds, --memory-mb address space). "
    "Every layer is required: where one is missing (not root, no namespaces, no Landlock) the command stops "
    "with one line before any of the repository's code runs. The index folder holds the "
    "wheels/sdists that may be installed; with the date cap (the default) each file needs a PEP 700 upload "
    "time in INDEX/upload-times.json (or --upload-times), and pip installs only files uploaded before the "
    "fix's commit time.\n\n"
    "Rerunning the same command resumes: candidates with a record in runs/ are not run again (records "
    "made with the other --cap/--no-cap setting are refused); --overwrite starts over. Exit status 0 when at least one instance is valid; otherwise one line "
    "'error: no valid instance ...' with each candidate's status and reason, and exit status 2 (the records "
    "stay in runs/, so a rerun resumes)."
)


# ---------------------------------------------------------------------------------- option checks


def _check_numbers(max_rounds: int, threshold: float, timeout: float, memory_mb: int,
                   max_commits: int | None) -> None:
    if max_rounds < 1:
        raise UserError(f"--max-rounds must be at least 1, got {max_rounds}")
    if not 0.0 <= threshold <= 1.0:  # also refuses nan
        raise UserError(f"--threshold must be in [0, 1], got {threshold}")
    if not (timeout > 0 and math.isfinite(timeout)):
        raise UserError(f"--timeout must be a positive number of seconds, got {timeout}")
    if memory_mb < 1:
        raise UserError(f"--memory-mb must be positive, got {memory_mb}")
    if max_commits is not None and max_commits < 1:
        raise UserError(f"--max-commits must be at least 1, got {max_commits}")


def _check_out(out: Path, root: Path, overwrite: bool) -> None:
    """An output folder that is new, empty, or an earlier run of this repository (resumed)."""
    from lmforge.common.io import check_output_folder

    check_output_folder(out)
    if overwrite or not out.is_dir():
        return
    if not (out / "runs").is_dir():
        if any(out.iterdir()):
            raise UserError(f"'{out}' is not empty and is not a `lmforge bench setup` output folder (no runs/); "
                            "give a new or empty folder, or pass --overwrite")
        return
    try:
        earlier = json.loads((out / "report.json").read_text(encoding="utf-8")).get("repository")
    except (OSError, ValueError, AttributeError):
        earlier = None
    if earlier and Path(earlier).resolve() != root.resolve():
        raise UserError(f"'{out}' holds the setup of another repository ({earlier}); pass --overwrite to start "
                        "over or give another --out")


def _is_loopback(url: str) -> bool:
    host = urlparse(url).hostname or ""
    return host in ("localhost", "::1") or host.startswith("127.")


class _ModelFailed(StopRun):
    """The extractor's model could not be made (stops the run; not one candidate's failure)."""


class _LazyLLMExtractor:
    """An :class:`~lmforge.methods.setupagent.extract.LLMExtractor` whose model is made at its
    first use: a resumed run with nothing left to do loads none. A failure to make it is raised as
    :class:`_ModelFailed`, which the pipeline does not record as a candidate's error."""

    name = "llm"

    def __init__(self, make: Callable[[], Any]) -> None:
        self._make = make
        self._inner: Any = None

    def _get(self) -> Any:
        if self._inner is None:
            from lmforge.methods.setupagent.extract import LLMExtractor

            try:
                self._inner = LLMExtractor(self._make())
            except Exception as exc:
                raise _ModelFailed(str(exc)) from exc
        return self._inner

    def extract(self, root: str | Path) -> Any:
        return self._get().extract(root)

    def repair(self, plan: Any, error: str) -> Any:
        return self._get().repair(plan, error)


def _extractor(spec: str, base_url: str | None) -> Any:
    if spec == "rules":
        if base_url is not None:
            raise UserError("--base-url needs an LLM --extractor (a model name), not 'rules'")
        from lmforge.methods.setupagent.extract import RuleExtractor

        return RuleExtractor()
    if not spec.strip():
        raise UserError("--extractor is empty; give 'rules', a local model folder, zoo:NAME or a served model name")
    from lmforge.methods.minions.apply import is_local_model

    if base_url is None and not is_local_model(spec):
        raise UserError(f"--extractor {spec!r} is not 'rules', zoo:NAME or a local model folder; give --base-url "
                        "to use it as a model served by an OpenAI-compatible server")

    from lmforge.methods.setupagent.extract import LLMExtractor, make_llm

    if base_url is not None:  # a served model: the client is cheap to make, so its problems show now
        try:
            return LLMExtractor(make_llm(spec, base_url=base_url, require_key=not _is_loopback(base_url)))
        except UserError as exc:
            raise UserError(f"--extractor {spec!r} at --base-url {base_url}: {exc}") from None
    return _LazyLLMExtractor(lambda: make_llm(spec))


# ------------------------------------------------------------------------------------- reporting


def _why(record: dict[str, Any]) -> str:
    """A record's reason, plus the runner's "killed at the limit" line when a command hung."""
    reason = str(record.get("reason") or "")
    rounds = ((record.get("repair") or {}).get("rounds")) or []
    for rnd in rounds:
        for line in str(rnd.get("error_tail") or "").splitlines():
            if _KILLED in line and _KILLED not in reason:
                killed = line.replace("[lmforge]", "").strip()
                return f"{reason}; {killed}" if reason else killed
    return reason


def _record_line(record: dict[str, Any]) -> str:
    status = record.get("status", "?")
    if status == "valid":
        inst = record.get("instance") or {}
        why = f"{len(inst.get('FAIL_TO_PASS', []))} FAIL_TO_PASS, {len(inst.get('PASS_TO_PASS', []))} PASS_TO_PASS"
    else:
        why = " ".join(_why(record).split())
    return f"{record.get('instance_id', '?')}: {status}" + (f" ({why})" if why else "")


def _summary(counts: dict[str, int], n: int) -> str:
    parts = [f"{counts['valid']} valid"] + [f"{k} {s}" for s, k in counts.items() if s != "valid" and k]
    return f"{n} candidate{'s' if n != 1 else ''}: {', '.join(parts)}"


@bench_app.command("setup", help=_SETUP_HELP)
def setup(
    path: Annotated[Path, typer.Argument(metavar="REPO", help="A folder inside the git work tree to set up.")],
    out: Annotated[Path, typer.Option(help="Output folder (layout above); an earlier run there is resumed.")],
    index: Annotated[Path, typer.Option(help="Local index folder: the wheels/sdists that may be installed, with "
                                             "upload-times.json (PEP 700 upload times) for the date cap.")],
    upload_times: Annotated[Path | None, typer.Option(help="Another {filename: ISO 8601 time} JSON file for "
                                                           "the index (default: INDEX/upload-times.json).")] = None,
    cap: Annotated[bool, typer.Option("--cap/--no-cap", help="Cap dependencies at each fix's commit time "
                                                             "(pip --uploaded-prior-to).")] = True,
    extractor: Annotated[str, typer.Option(help="'rules' (no model), or an LLM: a local HF folder, zoo:NAME, or a "
                                                "model name served at --base-url.")] = "rules",
    base_url: Annotated[str | None, typer.Option(help="OpenAI-compatible /v1 URL serving the --extractor model "
                                                      "(key from OPENAI_API_KEY; none needed on localhost).")] = None,
    max_rounds: Annotated[int, typer.Option(help="Runs per candidate: the first plan plus up to N-1 repairs.")] = 3,
    threshold: Annotated[float, typer.Option(help="After-fix pass rate a valid instance needs, in [0, 1].")] = 0.95,
    timeout: Annotated[float, typer.Option(help="Wall-clock (and CPU) seconds per command in the sandbox; a "
                                                "command still running is killed and reported.")] = 600.0,
    memory_mb: Annotated[int, typer.Option(help="Address-space limit (MB) of each process in the sandbox.")] = 4096,
    repo: Annotated[str | None, typer.Option(help="The instances' 'repo' field and id prefix, e.g. owner/name "
                                                  "(default: the work tree's folder name).")] = None,
    issues: Annotated[Path | None, typer.Option(help="issues.json ({number: {title, body}}) for the problem "
                                                     "statements (default: the commit messages).")] = None,
    max_commits: Annotated[int | None, typer.Option(help="Read at most N first-parent commits (newest first).")] = None,
    overwrite: Annotated[bool, typer.Option(help="Remove the earlier records in --out and start over.")] = False,
) -> None:
    _check_numbers(max_rounds, threshold, timeout, memory_mb, max_commits)
    chosen = _extractor(extractor, base_url)
    from lmforge.common.command_sandbox import CommandLimits
    from lmforge.common.progress import progress_enabled
    from lmforge.methods.setupagent.mine import repo_root
    from lmforge.methods.setupagent.pipeline import setup_repository
    from lmforge.methods.setupagent.runner import RunnerSettings

    root = repo_root(path)
    _check_out(out, root, overwrite)
    limits = CommandLimits(wall_seconds=timeout, cpu_seconds=timeout, memory_mb=memory_mb)
    lines: list[str] = []
    try:
        report = setup_repository(
            path, out, index=index, upload_times=upload_times, cap=cap, extractor=chosen, max_rounds=max_rounds,
            threshold=threshold, settings=RunnerSettings(index=index, limits=limits), repo=repo, issues=issues,
            max_commits=max_commits, overwrite=overwrite, progress=progress_enabled(),
            on_record=lambda r: lines.append(_record_line(r)))
    except _ModelFailed as exc:
        raise UserError(f"cannot make the extractor model {extractor!r}: {' '.join(str(exc).split())}") from None
    except StopRun as exc:  # e.g. the command sandbox cannot run on this machine
        raise UserError(f"{' '.join(str(exc).split())} (nothing was recorded for the candidate it stopped at)") from None
    summary = _summary(report.counts(), len(report.records))
    if not report.valid:
        failing = "; ".join(_record_line(r) for r in report.records)
        if len(failing) > REASONS_CHARS:
            failing = failing[: REASONS_CHARS - 3] + "..."
        raise UserError(f"no valid instance in {path}: {summary} (records in {out / 'runs'}; rerun to resume): "
                        f"{failing}")
    for line in lines:
        typer.echo(line)
    if report.resumed:
        typer.echo(f"resumed: {report.resumed} candidate(s) already recorded in {out / 'runs'}, skipped")
    typer.echo(f"{summary} -> {out / 'instances.jsonl'}")


# ------------------------------------------------------------------------------------- swe-export


def _read_run_records(folder: Path) -> list[tuple[Path, dict[str, Any]]]:
    runs = folder / "runs"
    if not folder.is_dir():
        raise UserError(f"'{folder}' is not a folder")
    if not runs.is_dir():
        raise UserError(f"'{folder}' is not a `lmforge bench setup` output folder (no runs/)")
    records = []
    for file in sorted(runs.glob("*.json")):
        if file.name.startswith(".") or not file.is_file():
            continue
        try:
            record = json.loads(file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise UserError(f"cannot read the run record {file}: {exc}") from None
        if not isinstance(record, dict) or not isinstance(record.get("status"), str):
            raise UserError(f"{file} is not a run record (a JSON object with a 'status')")
        records.append((file, record))
    return records


@bench_app.command("swe-export")
def swe_export(
    folders: Annotated[list[Path], typer.Argument(metavar="DIR...", help="`lmforge bench setup` output folders.")],
    out: Annotated[Path, typer.Option(help="The SWE-bench JSONL file to write (one instance per line).")],
    all_graded: Annotated[bool, typer.Option("--all", help="Also export the graded instances that are not valid "
                                                          "(status 'invalid'), not only the valid ones.")] = False,
    stats: Annotated[Path | None, typer.Option(help="Also write each instance's patch-complexity statistics and "
                                                    "their means (JSON).")] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace existing --out / --stats files.")] = False,
) -> None:
    """Collect the instances of `lmforge bench setup` output folders into one SWE-bench JSONL file.

    The instances come from each folder's runs/*.json records (status 'valid'; with --all also 'invalid'), \
are validated against the SWE-bench schema, and must have distinct instance_ids.
    """
    from lmforge.common.io import atomic_write_json, check_output_file
    from lmforge.methods.setupagent.schema import Instance, write_jsonl
    from lmforge.methods.setupagent.stats import instance_stats

    check_output_file(out, overwrite)
    if stats is not None:
        check_output_file(stats, overwrite)
        if stats.resolve() == out.resolve():
            raise UserError("--stats and --out name the same file")
    wanted = ("valid", "invalid") if all_graded else ("valid",)
    instances: list[Instance] = []
    seen: dict[str, Path] = {}
    looked = n_valid = 0
    for folder in folders:
        for file, record in _read_run_records(folder):
            looked += 1
            if record["status"] not in wanted or record.get("instance") is None:
                continue
            try:
                inst = Instance.from_dict(record["instance"])
            except ValueError as exc:
                raise UserError(f"{file}: the instance is not valid: {exc}") from None
            if inst.instance_id in seen:
                raise UserError(f"instance_id '{inst.instance_id}' is in both {seen[inst.instance_id]} and {file}")
            seen[inst.instance_id] = file
            instances.append(inst)
            n_valid += record["status"] == "valid"
    if not instances:
        which = "valid or invalid" if all_graded else "valid"
        hint = "" if all_graded else " (--all also exports the graded invalid ones)"
        raise UserError(f"no {which} instance to export in {', '.join(map(str, folders))} "
                        f"({looked} run record(s)){hint}")
    rows = []
    if stats is not None:
        try:
            rows = [instance_stats(i) for i in instances]
        except ValueError as exc:
            raise UserError(f"cannot compute the statistics: {exc}") from None
    write_jsonl(out, instances)
    if stats is not None:
        keys = [k for k in rows[0] if k != "instance_id"]
        means = {k: sum(r[k] for r in rows) / len(rows) for k in keys}
        atomic_write_json(stats, {"instances": len(rows), "means": means, "per_instance": rows})
    typer.echo(f"exported {len(instances)} instance(s) ({n_valid} valid) from {len(folders)} folder(s) -> {out}"
               + (f"; statistics -> {stats}" if stats is not None else ""))
