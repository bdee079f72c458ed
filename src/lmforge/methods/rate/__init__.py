"""RATE: rewrite-based attribute treatment estimators for reward models (ICML 2025). Planned: see the open issue for this family."""

from lmforge.registry import Method, register

register(Method(name="rate", family="reward", paper="RATE: rewrite-based attribute treatment estimators for reward models (ICML 2025)"))
