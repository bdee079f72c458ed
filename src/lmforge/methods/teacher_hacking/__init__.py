"""On teacher hacking in language model distillation (ICML 2025). Planned: see the open issue for this family."""

from lmforge.registry import Method, register

register(Method(name="teacher_hacking", family="distill", paper="On teacher hacking in language model distillation (ICML 2025)"))
