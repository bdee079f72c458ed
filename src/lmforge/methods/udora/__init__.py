"""UDora: reasoning-hijacking red-teaming of LLM agents (ICML 2025). Planned: see the open issue for this family."""

from lmforge.registry import Method, register

register(Method(name="udora", family="agent", paper="UDora: reasoning-hijacking red-teaming of LLM agents (ICML 2025)"))
