"""GANQ: GPU-Adaptive Non-Uniform Quantization (ICML 2025). Planned: see the open issue for this family."""

from lmforge.registry import Method, register

register(Method(name="ganq", family="quant", paper="GANQ: GPU-Adaptive Non-Uniform Quantization (ICML 2025)"))
