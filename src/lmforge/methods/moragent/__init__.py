"""MoRAgent: Mixture-of-Roles PEFT for agents (ICML 2025). Planned: see the open issue for this family."""

from lmforge.registry import Method, register

register(Method(name="moragent", family="agent", paper="MoRAgent: Mixture-of-Roles PEFT for agents (ICML 2025)"))
