"""Focus Instruction Tuning (ICML 2025). Planned: see the open issue for this family."""

from lmforge.registry import Method, register

register(Method(name="fit", family="align", paper="Focus Instruction Tuning (ICML 2025)"))
