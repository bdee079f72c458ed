"""Model loading (local folders and ``zoo:NAME``) and the tiny-model zoo."""

from lmforge.models.load import load, resolve_spec

__all__ = ["load", "resolve_spec"]
