"""The method registry: one explicit line per method (peft's ``register_peft_method`` pattern).

``REGISTRY`` maps a method name to a :class:`Method` record. A method's ``__init__.py`` calls
:func:`register` once; :func:`load_all` imports every method package so their lines run. The
family is a tag, not a folder, so a method never moves.
"""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

FAMILIES = ("quant", "prune", "peft", "optim", "align", "distill", "reward", "agent", "bench", "core")


@dataclass(frozen=True)
class Method:
    """One registered method.

    Attributes:
        name: CLI/registry name, e.g. ``"gptq"``.
        family: one of :data:`FAMILIES`.
        paper: short citation, e.g. ``"GPTQ (Frantar et al., ICLR 2023)"``.
        config_cls: the method's config dataclass, or None while unimplemented.
        entry: the function that applies/trains the method, or None while unimplemented.
        status: ``"planned"``, ``"implemented"`` or ``"works"`` (reproduce shows the effect).
    """

    name: str
    family: str
    paper: str
    config_cls: type | None = None
    entry: Callable[..., Any] | None = None
    status: str = "planned"


REGISTRY: dict[str, Method] = {}


def register(method: Method) -> Method:
    """Add ``method`` to the registry; a second registration of the same name is a bug."""
    if method.family not in FAMILIES:
        raise ValueError(f"unknown family {method.family!r} for {method.name!r}")
    if method.name in REGISTRY and REGISTRY[method.name] != method:
        raise ValueError(f"method {method.name!r} registered twice")
    REGISTRY[method.name] = method
    return method


def load_all() -> dict[str, Method]:
    """Import every ``lmforge.methods.<name>`` package so that each registers itself."""
    import lmforge.methods as methods_pkg

    for info in pkgutil.iter_modules(methods_pkg.__path__):
        importlib.import_module(f"lmforge.methods.{info.name}")
    return REGISTRY
