"""Recipes: a YAML file plus ``key=value`` overrides fill a typed dataclass.

Recipes only set fields (no class paths). An unknown key, or a value that cannot be converted to the
field's type, is a :class:`~lmforge.common.errors.UserError`. Nested dataclass fields are addressed
with dots (``train.lr=1e-3``).

Checked: transformers' ``HfArgumentParser`` fills dataclasses from argv or a YAML file and rejects
extra keys, but has no nested sections and no YAML-plus-overrides merge; that part is written here.
"""

from __future__ import annotations

import dataclasses
import json
import re
import types
import typing
from pathlib import Path
from typing import Any, TypeVar

import yaml

from lmforge.common.errors import UserError

C = TypeVar("C")


def _convert(value: Any, tp: Any, key: str) -> Any:
    """Convert ``value`` (from YAML or a CLI string) to the annotated type ``tp``."""
    origin = typing.get_origin(tp)
    args = typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            if type(None) in args:
                return None
        errors = []
        for arg in args:
            if arg is type(None):
                continue
            try:
                return _convert(value, arg, key)
            except UserError as exc:
                errors.append(str(exc))
        raise UserError(f"recipe key '{key}': cannot use {value!r} ({'; '.join(errors)})")
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise UserError(f"recipe key '{key}' is a section; give a mapping, not {value!r}")
        return from_dict(tp, value, prefix=f"{key}.")
    if origin in (list, tuple):
        if isinstance(value, str):
            try:
                value = yaml.safe_load(value)
            except yaml.YAMLError as exc:
                raise UserError(f"recipe key '{key}': cannot parse {value!r} as a list") from exc
        if not isinstance(value, (list, tuple)):
            raise UserError(f"recipe key '{key}' expects a list, got {value!r}")
        if origin is tuple and args and args[-1] is not Ellipsis:
            # A fixed-length tuple such as tuple[str, float]: one type per position.
            if len(value) != len(args):
                raise UserError(f"recipe key '{key}' expects {len(args)} items, got {value!r}")
            return tuple(_convert(v, t, key) for v, t in zip(value, args))
        inner = args[0] if args else Any
        items = [_convert(v, inner, key) for v in value]
        return tuple(items) if origin is tuple else items
    if origin is dict:
        if isinstance(value, str):
            value = yaml.safe_load(value)
        if not isinstance(value, dict):
            raise UserError(f"recipe key '{key}' expects a mapping, got {value!r}")
        return dict(value)
    if tp is bool:
        if isinstance(value, bool):
            return value
        if isinstance(value, str) and value.lower() in ("true", "1", "yes", "on"):
            return True
        if isinstance(value, str) and value.lower() in ("false", "0", "no", "off"):
            return False
        raise UserError(f"recipe key '{key}' expects true/false, got {value!r}")
    if tp in (int, float, str):
        if isinstance(value, bool) and tp is not str:
            raise UserError(f"recipe key '{key}' expects {tp.__name__}, got {value!r}")
        try:
            if tp is int and isinstance(value, str):
                return int(float(value)) if float(value).is_integer() else int(value)
            if tp is int and isinstance(value, float):
                if not value.is_integer():
                    raise ValueError
                return int(value)
            return tp(value)
        except (TypeError, ValueError) as exc:
            raise UserError(f"recipe key '{key}' expects {tp.__name__}, got {value!r}") from exc
    return value


def from_dict(cls: type[C], data: dict[str, Any], prefix: str = "") -> C:
    """Build dataclass ``cls`` from a mapping; unknown keys raise UserError naming the valid ones."""
    if not dataclasses.is_dataclass(cls):
        raise TypeError(f"{cls} is not a dataclass")
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.init}
    kwargs = {}
    for key, value in data.items():
        if key not in fields:
            valid = ", ".join(sorted(prefix + f for f in fields))
            raise UserError(f"unknown recipe key '{prefix}{key}' for {cls.__name__}; valid keys: {valid}")
        kwargs[key] = _convert(value, hints[key], prefix + key)
    try:
        return cls(**kwargs)
    except (TypeError, ValueError) as exc:
        raise UserError(f"invalid {cls.__name__}: {exc}") from exc


def _set_nested(data: dict[str, Any], dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = data
    for part in parts[:-1]:
        nxt = node.setdefault(part, {})
        if not isinstance(nxt, dict):
            raise UserError(f"recipe key '{dotted}': '{part}' is not a section")
        node = nxt
    node[parts[-1]] = value


def parse_overrides(overrides: list[str] | tuple[str, ...]) -> dict[str, Any]:
    """Turn ``["a=1", "b.c=x"]`` into a nested mapping; values are parsed as YAML scalars."""
    out: dict[str, Any] = {}
    for item in overrides:
        if "=" not in item:
            raise UserError(f"override '{item}' is not of the form key=value")
        key, raw = item.split("=", 1)
        key = key.strip()
        if not key:
            raise UserError(f"override '{item}' has an empty key")
        try:
            value = yaml.safe_load(raw) if raw.strip() else raw
        except yaml.YAMLError:
            value = raw
        if isinstance(value, int) and re.fullmatch(r"\s*\d+(:\d+)+\s*", raw):
            value = raw.strip()  # YAML 1.1 reads "2:4" as the base-60 number 124; keep ratios as text
        _set_nested(out, key, value)
    return out


def _merge(base: dict[str, Any], extra: dict[str, Any]) -> dict[str, Any]:
    merged = dict(base)
    for key, value in extra.items():
        if isinstance(value, dict) and isinstance(merged.get(key), dict):
            merged[key] = _merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def load_config(
    cls: type[C],
    recipe: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    base: dict[str, Any] | None = None,
    flags: dict[str, Any] | None = None,
) -> C:
    """Fill ``cls`` from ``base`` (e.g. a preset's fields), then an optional YAML recipe, then
    ``flags`` (typed values from dedicated CLI options), then ``key=value`` overrides; later sources
    win."""
    data: dict[str, Any] = {}
    if recipe is not None:
        path = Path(recipe)
        if not path.is_file():
            raise UserError(f"recipe '{path}' does not exist")
        try:
            loaded = yaml.safe_load(path.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            raise UserError(f"cannot read recipe '{path}': {exc}") from exc
        except yaml.YAMLError as exc:
            raise UserError(f"recipe '{path}' is not valid YAML: {str(exc).splitlines()[0]}") from exc
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise UserError(f"recipe '{path}' must be a mapping of keys to values")
        data = loaded
    data = _merge(base or {}, data)
    data = _merge(data, flags or {})
    data = _merge(data, parse_overrides(list(overrides)))
    return from_dict(cls, data)


def to_dict(cfg: Any) -> dict[str, Any]:
    """A JSON-able dict of a config dataclass."""
    return json.loads(json.dumps(dataclasses.asdict(cfg), default=str))
