"""Zigzag persistence of LLM layers and layer pruning (ICML 2025). Planned: see the open issue for this family."""

from lmforge.registry import Method, register

register(Method(name="zigzag", family="prune", paper="Zigzag persistence of LLM layers and layer pruning (ICML 2025)"))
