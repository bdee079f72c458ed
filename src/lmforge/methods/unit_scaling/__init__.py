"""µnit Scaling: simple and scalable FP8 LLM training (ICML 2025). Planned: see the open issue for this family."""

from lmforge.registry import Method, register

register(Method(name="unit_scaling", family="optim", paper="µnit Scaling: simple and scalable FP8 LLM training (ICML 2025)"))
