"""The SWE-bench task-instance record, and its JSONL files.

SetUpAgent (Vergopoulos, Müller, Vechev, ICML 2025, arXiv 2503.07701) exports SWEE-Bench and
SWA-Bench in SWE-bench's instance schema, with setup per instance instead of per version: the
datasets' cards (HF ``LogicStar/SWEE-Bench``, ``LogicStar/SWA-Bench``) list ``repo, instance_id,
base_commit, patch, test_patch, problem_statement, hints_text, created_at, merged_at, PASS_TO_PASS,
PASS_TO_FAIL, FAIL_TO_PASS, FAIL_TO_FAIL, install, test_framework, test_commands, version`` (null),
``environment_setup_commit`` (null) and ``docker_image_root``.

Library checked: ``swebench`` (5.0.2) has the record only as a ``TypedDict``
(``swebench.types.SWEbenchInstance``: SWE-bench's twelve keys, including ``hints_text``) and reads
datasets with ``datasets``; there is no validating reader. :class:`Instance` is that record plus
SetUpAgent's keys, written here.

The four test lists: SWE-bench's own files store ``FAIL_TO_PASS`` / ``PASS_TO_PASS`` as
JSON-encoded strings in some releases (the HF parquet files, SWEE's card: ``dtype: string``) and as
lists in others (the JSON files the harness was first run on); swebench's harness accepts both
(``json.loads`` when the value is a str). :func:`read_jsonl` reads both; :func:`write_jsonl` always
writes lists. ``install`` and ``test_commands`` are read the same way (a JSON list in a string, a
list, or one plain command string).

Keys this record does not know (``merged_at``, ``docker_image_root``, ...) are kept in
:attr:`Instance.extra` and written back unchanged after the known ones.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, fields
from datetime import datetime
from pathlib import Path
from typing import Any

from lmforge.common.errors import UserError
from lmforge.common.io import atomic_write_text

TEST_LISTS = ("FAIL_TO_PASS", "PASS_TO_PASS", "PASS_TO_FAIL", "FAIL_TO_FAIL")
COMMAND_LISTS = ("install", "test_commands")
REQUIRED = ("repo", "instance_id", "base_commit", "patch", "test_patch", "problem_statement",
            "created_at", "FAIL_TO_PASS", "PASS_TO_PASS")


@dataclass
class Instance:
    """One SWE-bench-style task instance.

    Attributes:
        repo: ``owner/name`` (or a local name).
        instance_id: unique id, SWE-bench style ``owner__name-<suffix>``.
        base_commit: the commit the task starts from (the fix's parent).
        patch: the gold fix, a unified diff of the non-test files.
        test_patch: the diff of the test files.
        problem_statement: the issue text.
        created_at: ISO 8601 time of the change (UTC, ``...Z``).
        version: SWE-bench's package version; None for per-instance setup (SWEE/SWA).
        FAIL_TO_PASS, PASS_TO_PASS, PASS_TO_FAIL, FAIL_TO_FAIL: test names (:mod:`.grade`).
        environment_setup_commit: SWE-bench's per-version setup commit; None here.
        install: shell commands that install the repository at ``base_commit``.
        test_framework: ``pytest``, ``unittest``, ``django``, ``nose`` or ``tox`` (a key of
            :data:`lmforge.methods.setupagent.parsers.PARSERS`), or ``""`` when not known yet.
        test_commands: shell commands that run the tests with per-test verbose output.
        hints_text: SWE-bench's hints (issue comments before the fix); required by swebench's
            ``SWEbenchInstance``, empty when there are none.
        extra: other keys of a record read from a file, written back as they were.
    """

    repo: str
    instance_id: str
    base_commit: str
    patch: str
    test_patch: str
    problem_statement: str
    created_at: str
    version: str | None = None
    FAIL_TO_PASS: list[str] = field(default_factory=list)
    PASS_TO_PASS: list[str] = field(default_factory=list)
    PASS_TO_FAIL: list[str] = field(default_factory=list)
    FAIL_TO_FAIL: list[str] = field(default_factory=list)
    environment_setup_commit: str | None = None
    install: list[str] = field(default_factory=list)
    test_framework: str = ""
    test_commands: list[str] = field(default_factory=list)
    hints_text: str = ""
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The record as one JSON object: known keys in schema order, lists as lists, then extras."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name == "extra":
                continue
            value = getattr(self, f.name)
            out[f.name] = list(value) if isinstance(value, list) else value
        for key, value in self.extra.items():
            out.setdefault(key, value)
        return out

    @classmethod
    def from_dict(cls, record: Mapping[str, Any]) -> Instance:
        """Build and validate a record; a :class:`ValueError` names the first bad field."""
        if not isinstance(record, Mapping):
            raise ValueError(f"a record must be a JSON object, got {type(record).__name__}")
        for key in REQUIRED:
            if key not in record:
                raise ValueError(f"field '{key}' is missing")
        known = {f.name for f in fields(cls)} - {"extra"}
        kwargs: dict[str, Any] = {}
        for key in known:
            if key not in record:
                continue
            value = record[key]
            if key in TEST_LISTS:
                value = _string_list(key, value, allow_plain=False)
            elif key in COMMAND_LISTS:
                value = _string_list(key, value, allow_plain=True)
            elif key in ("version", "environment_setup_commit"):
                if value is not None and not isinstance(value, str):
                    if isinstance(value, (int, float)) and not isinstance(value, bool):
                        value = str(value)  # some dumps store versions such as 3.0 as numbers
                    else:
                        raise ValueError(f"field '{key}' must be a string or null, got {type(value).__name__}")
            elif key in ("hints_text", "test_framework") and value is None:
                value = ""
            elif not isinstance(value, str):
                raise ValueError(f"field '{key}' must be a string, got {type(value).__name__}")
            kwargs[key] = value
        for key in ("repo", "instance_id", "base_commit"):
            if not kwargs[key].strip():
                raise ValueError(f"field '{key}' is empty")
        _check_time(kwargs["created_at"])
        extra = {k: v for k, v in record.items() if k not in known}
        return cls(**kwargs, extra=extra)


def _string_list(key: str, value: Any, allow_plain: bool) -> list[str]:
    """A list of strings from a list or a JSON-encoded list; for commands also one plain string."""
    if isinstance(value, str):
        try:
            decoded = json.loads(value)
        except json.JSONDecodeError:
            if allow_plain:
                return [value] if value.strip() else []
            raise ValueError(f"field '{key}' is a string that is not a JSON list") from None
        if allow_plain and not isinstance(decoded, list):
            return [value] if value.strip() else []  # a command that happens to be JSON ("true")
        value = decoded
    elif value is None and allow_plain:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise ValueError(f"field '{key}' must be a list of strings (or one JSON-encoded)")
    return list(value)


def _check_time(text: str) -> None:
    try:
        when = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(f"field 'created_at' is not an ISO 8601 time: {text!r}") from None
    # NOTE: the time is the instance's date cap; without an offset pip reads it in local time and
    # uv as the end of that local day (measured, tests/methods/setupagent/test_uv_crosscheck.py),
    # so a naive time is refused rather than guessed.
    if when.tzinfo is None:
        raise ValueError(f"field 'created_at' has no time zone (write it in UTC, ...Z): {text!r}")


def write_jsonl(path: str | Path, instances: Iterable[Instance]) -> Path:
    """Write one record per line, atomically (a temporary file renamed into place; an existing file
    is replaced, so callers check ``--overwrite`` first). A repeated instance_id is a ValueError
    raised before anything is written."""
    seen: set[str] = set()
    lines = []
    for inst in instances:
        if inst.instance_id in seen:
            raise ValueError(f"instance_id '{inst.instance_id}' appears twice")
        seen.add(inst.instance_id)
        lines.append(json.dumps(inst.to_dict(), ensure_ascii=False))
    return atomic_write_text(path, "".join(line + "\n" for line in lines))


def read_jsonl(path: str | Path) -> list[Instance]:
    """Read and validate a JSONL file of instances (blank lines are skipped).

    Any problem is a one-line :class:`UserError` ``FILE:LINE: ...`` naming the field: bad JSON, a
    missing or mistyped field, a test list that is neither a list nor a JSON-encoded one, a
    ``created_at`` that is not ISO 8601, a repeated instance_id.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"'{path}' does not exist") from None
    except IsADirectoryError:
        raise UserError(f"'{path}' is a folder, not a JSONL file") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"'{path}' is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    out: list[Instance] = []
    seen: dict[str, int] = {}
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}:{lineno}: not valid JSON ({exc.msg}, column {exc.colno})") from None
        try:
            inst = Instance.from_dict(record)
        except ValueError as exc:
            raise UserError(f"{path}:{lineno}: {exc}") from None
        if inst.instance_id in seen:
            raise UserError(f"{path}:{lineno}: field 'instance_id': '{inst.instance_id}' already "
                            f"appears on line {seen[inst.instance_id]}")
        seen[inst.instance_id] = lineno
        out.append(inst)
    return out
