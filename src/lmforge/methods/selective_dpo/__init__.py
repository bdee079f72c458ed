"""Selective DPO: principled data selection by difficulty (ICML 2025). Planned: see the open issue for this family."""

from lmforge.registry import Method, register

register(Method(name="selective_dpo", family="align", paper="Selective DPO: principled data selection by difficulty (ICML 2025)"))
