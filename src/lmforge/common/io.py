"""Atomic, non-destructive output.

Results are written to a temporary sibling path and renamed into place, so an interrupted run never
leaves a half-written model or report, and an existing output is never replaced unless the caller
passes ``overwrite=True`` (the CLI's ``--overwrite``).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from lmforge.common.errors import UserError


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _public(path: Path, mode: int) -> None:
    # mkstemp/mkdtemp create owner-only files (0600/0700); results should get the usual modes.
    os.chmod(path, mode & ~_umask())


def check_output_dir(out: str | Path, overwrite: bool) -> Path:
    """Return ``out`` as a Path, or raise :class:`UserError` if it exists and ``overwrite`` is off."""
    path = Path(out)
    if path.exists() and not overwrite:
        raise UserError(f"output '{path}' already exists; pass --overwrite to replace it")
    for parent in path.parents:  # before any work: a file in the way would only fail at the end
        if parent.exists():
            if not parent.is_dir():
                raise UserError(f"cannot write '{path}': '{parent}' is a file, not a folder")
            break
    return path


def check_output_file(out: str | Path, overwrite: bool) -> Path:
    """``out`` as a Path, checked before any work: a one-line :class:`UserError` if it is a folder,
    exists without ``overwrite``, or sits under a path that is a file."""
    path = Path(out)
    if path.is_dir():
        raise UserError(f"output '{path}' is a folder; give a file path")
    if path.exists() and not overwrite:
        raise UserError(f"output '{path}' already exists; pass --overwrite to replace it")
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise UserError(f"cannot write '{path}': '{parent}' is a file, not a folder")
            break
    return path


def check_output_folder(out: str | Path) -> Path:
    """``out`` as a Path for a run folder (created later): a one-line :class:`UserError` if it or
    one of its parents is a file."""
    path = Path(out)
    for p in (path, *path.parents):
        if p.exists():
            if not p.is_dir():
                raise UserError(f"cannot use '{path}' as a folder: '{p}' is a file")
            break
    return path


@contextlib.contextmanager
def atomic_dir(out: str | Path, overwrite: bool = False) -> Iterator[Path]:
    """Yield a temporary directory that replaces ``out`` only when the block succeeds.

    Args:
        out: final directory.
        overwrite: replace an existing ``out``; otherwise an existing ``out`` is a UserError.
    """
    final = check_output_dir(out, overwrite)
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.tmp-", dir=final.parent))
    _public(tmp, 0o777)
    try:
        yield tmp
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    # Libraries that write through private temp files (safetensors) leave 0600 files behind; the
    # result is shared like any file the user creates.
    for path in tmp.rglob("*"):
        if path.is_file() and not path.is_symlink():
            _public(path, 0o666)
        elif path.is_dir():
            _public(path, 0o777)
    if final.exists() and not overwrite:
        # Something appeared at the destination while we worked: never replace it silently.
        shutil.rmtree(tmp, ignore_errors=True)
        raise UserError(f"output '{final}' appeared while writing; pass --overwrite to replace it")
    if final.exists():
        # Move the old result aside first so that a failure mid-swap still leaves one of the two.
        old = final.with_name(f".{final.name}.old-{os.getpid()}")
        os.replace(final, old)
        os.replace(tmp, final)
        if old.is_dir():
            shutil.rmtree(old, ignore_errors=True)
        else:
            old.unlink(missing_ok=True)
    else:
        os.replace(tmp, final)


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` to ``path`` via a temporary file and an atomic rename."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(text)
        _public(Path(tmp), 0o666)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_json(path: str | Path, obj: Any) -> Path:
    """Write ``obj`` as indented JSON atomically.

    Strict JSON only: a NaN or an infinity is a :class:`ValueError` that names where it is (e.g.
    ``$.runs[2].auroc``), raised before anything is written, so it is fixed where it arises (an
    undefined statistic is None there, with its reason) and never lands in a results file as the
    non-standard ``NaN`` that other JSON readers refuse. Numpy and torch float scalars are written
    as numbers (and checked), other unknown objects as their ``str``, as before.
    """
    try:
        text = json.dumps(obj, indent=2, sort_keys=False, default=_json_default, allow_nan=False)
    except ValueError as exc:
        where = _non_finite_path(obj)
        if where is None:
            raise
        raise ValueError(f"{Path(path).name}: {where[1]} at {where[0]} cannot be written as JSON; an "
                         "undefined value must be None (null)") from exc
    return atomic_write_text(path, text + "\n")


def _json_default(obj: Any) -> Any:
    # numpy.float32 / a 0-d float tensor would otherwise become the string "nan" or "0.5".
    dtype = getattr(obj, "dtype", None)
    if dtype is not None and getattr(obj, "ndim", None) == 0 and getattr(dtype, "is_floating_point",
                                                                          getattr(dtype, "kind", "") == "f"):
        return float(obj)
    return str(obj)


def _non_finite_path(obj: Any, where: str = "$") -> tuple[str, str] | None:
    """The JSON path and repr of the first NaN or infinity in ``obj``; None if there is none."""
    if isinstance(obj, float) or (getattr(obj, "ndim", None) == 0 and hasattr(obj, "dtype")):
        try:
            value = float(obj)
        except (TypeError, ValueError):
            return None
        return None if value == value and abs(value) != float("inf") else (where, repr(value))
    if isinstance(obj, dict):
        for key, value in obj.items():
            found = _non_finite_path(value, f"{where}.{key}")
            if found:
                return found
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            found = _non_finite_path(value, f"{where}[{i}]")
            if found:
                return found
    return None


# ---------------------------------------------------------------- reading user files


def read_user_text(path: str | Path, what: str) -> str:
    """A user's UTF-8 file; a missing or unreadable file is a one-line :class:`UserError`."""
    path = Path(path)
    try:
        return path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise UserError(f"{what} file not found: {path}") from None
    except IsADirectoryError:
        raise UserError(f"{what} file {path} is a directory, not a file") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None


def parse_json_text(path: str | Path, raw: str) -> Any:
    """``json.loads(raw)``; invalid JSON is a one-line error naming ``path`` and the line."""
    try:
        return json.loads(raw)
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}:{exc.lineno}: not valid JSON ({exc.msg})") from None


def parse_json_lines(path: str | Path, raw: str) -> list[tuple[int, Any]]:
    """``(line number, value)`` of each non-blank line of a JSON-lines text; a bad line is a
    one-line error naming ``path`` and the line."""
    out = []
    for i, line in enumerate(raw.splitlines(), 1):
        if not line.strip():
            continue
        try:
            out.append((i, json.loads(line)))
        except json.JSONDecodeError as exc:
            raise UserError(f"{path}:{i}: not valid JSON ({exc.msg})") from None
    return out


def read_json_objects(path: str | Path, what: str) -> list[dict[str, Any]]:
    """The objects of a user's JSON list or JSON-lines file (a file starting with ``[`` is a list);
    a missing file, bad JSON, a non-object entry or an empty file is a one-line :class:`UserError`."""
    path = Path(path)
    raw = read_user_text(path, what)
    if raw.lstrip().startswith("["):
        data = parse_json_text(path, raw)
        rows = list(enumerate(data if isinstance(data, list) else [data], 1))
    else:
        rows = parse_json_lines(path, raw)
    out = []
    for line, obj in rows:
        if not isinstance(obj, dict):
            raise UserError(f"{path}:{line}: expected a JSON object")
        out.append(obj)
    if not out:
        raise UserError(f"{path}: no {what} in the file")
    return out
