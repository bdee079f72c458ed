"""ACBench: agent capabilities of compressed LLMs (ICML 2025). Planned: see the open issue for this family."""

from lmforge.registry import Method, register

register(Method(name="acbench", family="bench", paper="ACBench: agent capabilities of compressed LLMs (ICML 2025)"))
