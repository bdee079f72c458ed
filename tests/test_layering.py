"""The layering rule: the engines (``common``), ``data``, ``models`` and ``eval`` never import a method.

Dependencies point down: a method may import an engine, data, a model loader or an evaluation, never
the other way round; a method plugs into an engine through a registry instead (the trainer's
optimizer and parametrization factories, :mod:`lmforge.common.trainer`). The layers above the
methods (``lmforge.compression``, ``bench``, ``reproduce``, ``commands``, ``cli``) import methods, so
importing them from below would break the rule too. ``lmforge.registry`` is allowed: its
``load_all`` is how the trainer has every method register its plug-ins without naming one.

Every module of the four packages is parsed with ``ast`` (imports at the top level and inside
functions, relative imports resolved, ``importlib.import_module``/``__import__`` with a literal
name), and, as a check of the whole import chain, imported in a fresh interpreter that must then
hold no ``lmforge.methods`` module.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

SRC = Path(__file__).resolve().parents[1] / "src"
LOWER = ("common", "data", "models", "eval")
# The packages and modules that sit above the engines: each of them imports methods.
FORBIDDEN = ("lmforge.methods", "lmforge.compression", "lmforge.bench", "lmforge.reproduce",
             "lmforge.commands", "lmforge.cli")


def _modules() -> list[tuple[str, Path]]:
    out = []
    for pkg in LOWER:
        for path in sorted((SRC / "lmforge" / pkg).rglob("*.py")):
            parts = path.relative_to(SRC).with_suffix("").parts
            out.append((".".join(parts[:-1] if parts[-1] == "__init__" else parts), path))
    return out


def imported_names(source: str, module: str, is_package: bool = False) -> list[tuple[int, str]]:
    """(line, dotted name) of everything ``source`` imports, anywhere in it.

    ``from a import b`` gives both ``a`` and ``a.b`` (``b`` may be a submodule); relative imports are
    resolved against ``module``; ``importlib.import_module("x")`` and ``__import__("x")`` with a
    literal name count as imports of ``x``.
    """
    out: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = module.split(".") if is_package else module.split(".")[:-1]
                parts = parts[: len(parts) - (node.level - 1)]
                base = ".".join(parts + ([base] if base else []))
            out.append((node.lineno, base))
            out += [(node.lineno, f"{base}.{a.name}") for a in node.names]
        elif isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in ("import_module", "__import__") and isinstance(node.args[0].value, str):
                out.append((node.lineno, node.args[0].value))
    return out


def violations(source: str, module: str, is_package: bool = False) -> list[str]:
    """The imports of ``source`` that break the layering rule, as ``"line: name"``."""
    found = {(line, name) for line, name in imported_names(source, module, is_package)
             if any(name == f or name.startswith(f + ".") for f in FORBIDDEN)}
    return [f"{line}: {name}" for line, name in sorted(found)]


def test_the_checker_catches_every_form_of_import():
    src = '''
"""Docstring naming lmforge.methods.gptq is no import."""
import os
import lmforge.methods
from lmforge import methods
from lmforge.common.io import atomic_write_json

def f():
    from lmforge.methods.gptq.apply import apply_gptq
    import importlib
    importlib.import_module("lmforge.methods.ganq")
    __import__("lmforge.bench.acbench")
    x = "lmforge.methods.rtn"

class C:
    def g(self):
        from ..methods.wanda import config
        from .. import compression
        from . import io
'''
    found = violations(src, "lmforge.common.fake")
    assert found == ["4: lmforge.methods", "5: lmforge.methods", "9: lmforge.methods.gptq.apply",
                     "9: lmforge.methods.gptq.apply.apply_gptq", "11: lmforge.methods.ganq",
                     "12: lmforge.bench.acbench", "17: lmforge.methods.wanda",
                     "17: lmforge.methods.wanda.config", "18: lmforge.compression"]
    # a package's __init__ resolves "." to itself, so "from ..methods" there is lmforge.methods
    assert violations("from ..methods import x\n", "lmforge.common", is_package=True) == [
        "1: lmforge.methods", "1: lmforge.methods.x"]
    assert violations("from lmforge.registry import load_all\nimport lmforge.methodsx\n", "lmforge.common.t") == []


def test_lower_packages_import_no_method():
    modules = _modules()
    assert len(modules) > 30 and {m.split(".")[1] for m, _ in modules} == set(LOWER)
    bad = {}
    for module, path in modules:
        found = violations(path.read_text(), module, path.name == "__init__.py")
        if found:
            bad[str(path.relative_to(SRC))] = found
    assert not bad, f"these modules import a method (or a layer above the methods): {bad}"


@pytest.mark.timeout(300)
def test_importing_every_lower_module_loads_no_method():
    names = [m for m, _ in _modules()]
    code = ("import importlib, sys\n"
            f"for name in {names!r}:\n"
            "    importlib.import_module(name)\n"
            "print(sorted(m for m in sys.modules if m.startswith(('lmforge.methods', 'lmforge.bench', "
            "'lmforge.reproduce', 'lmforge.commands', 'lmforge.cli', 'lmforge.compression'))))\n")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=280)
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.strip() == "[]", res.stdout
