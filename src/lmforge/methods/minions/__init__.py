"""Minions: local-remote LM collaboration (ICML 2025). Planned: see the open issue for this family."""

from lmforge.registry import Method, register

register(Method(name="minions", family="agent", paper="Minions: local-remote LM collaboration (ICML 2025)"))
