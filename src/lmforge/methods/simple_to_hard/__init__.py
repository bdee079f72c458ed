"""Simple-to-hard generalization in visual reasoning (ICML 2025). Planned: see the open issue for this family."""

from lmforge.registry import Method, register

register(Method(name="simple_to_hard", family="agent", paper="Simple-to-hard generalization in visual reasoning (ICML 2025)"))
