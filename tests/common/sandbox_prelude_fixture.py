"""A tiny prelude for tests/common/test_sandbox.py: exported names plus the decode/encode hooks.

It is trusted code, imported in the sandbox child before the sandbox closes. ``socket_module`` and
``crash`` exist only to test the layers below the namespace.
"""

from __future__ import annotations

import os
import socket
from dataclasses import dataclass
from typing import Any

SANDBOX_NAMES = ["Point", "scale", "crash", "socket_module"]

NOT_EXPORTED = "this name is defined in the prelude but not in SANDBOX_NAMES"

# Deliberately leaked: lets a test show that the audit hook stops sockets even when a name leaks.
socket_module = socket


@dataclass
class Point:
    x: float
    y: float


def scale(p: Point, k: float) -> Point:
    return Point(p.x * k, p.y * k)


def crash() -> None:
    """Die like a broken interpreter: a traceback on stderr and no report."""
    os.write(2, b"Traceback (most recent call last):\n  File 'x', line 1\n")
    os.write(2, b"RuntimeError: prelude crashed on purpose\n")
    os._exit(3)


def _is_point(value: Any) -> bool:
    return isinstance(value, dict) and set(value) == {"x", "y"}


def sandbox_decode(entry: str, args: dict[str, Any]) -> dict[str, Any]:
    """Turn every ``{"x": ..., "y": ...}`` argument into a Point."""
    return {k: Point(**v) if _is_point(v) else v for k, v in args.items()}


def sandbox_encode(entry: str, value: Any) -> Any:
    if isinstance(value, Point):
        return {"x": value.x, "y": value.y, "encoded_by": entry}
    return value
