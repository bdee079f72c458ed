"""Wanda (Sun et al., ICLR 2024), an ACBench compression baseline. Planned: see the open issue for this family."""

from lmforge.registry import Method, register

register(Method(name="wanda", family="prune", paper="Wanda (Sun et al., ICLR 2024), an ACBench compression baseline"))
