"""Diverging preferences in human-labeled data (ICML 2025). Planned: see the open issue for this family."""

from lmforge.registry import Method, register

register(Method(name="diverging_prefs", family="reward", paper="Diverging preferences in human-labeled data (ICML 2025)"))
