"""SetUpAgent / SWEE-Bench: repository setup for code-agent benchmarks (ICML 2025). Planned: see the open issue for this family."""

from lmforge.registry import Method, register

register(Method(name="setupagent", family="bench", paper="SetUpAgent / SWEE-Bench: repository setup for code-agent benchmarks (ICML 2025)"))
