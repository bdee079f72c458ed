"""AWQ (Lin et al., MLSys 2024), an ACBench compression baseline. Planned: see the open issue for this family."""

from lmforge.registry import Method, register

register(Method(name="awq", family="quant", paper="AWQ (Lin et al., MLSys 2024), an ACBench compression baseline"))
