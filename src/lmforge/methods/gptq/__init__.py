"""GPTQ (Frantar et al., ICLR 2023), an ACBench compression baseline. Planned: see the open issue for this family."""

from lmforge.registry import Method, register

register(Method(name="gptq", family="quant", paper="GPTQ (Frantar et al., ICLR 2023), an ACBench compression baseline"))
