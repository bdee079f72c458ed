"""GANQ: per-row non-uniform codebooks by alternating back-substitution and closed-form codebook steps.

Core math in ``core.py``, settings in ``config.py``, model wiring in ``apply.py``; the CLI is
``lmforge compress ganq``.
"""

from lmforge.methods.ganq.apply import apply_ganq
from lmforge.methods.ganq.config import GANQConfig
from lmforge.registry import Method, register

register(
    Method(
        name="ganq",
        family="quant",
        paper="GANQ: GPU-Adaptive Non-Uniform Quantization (ICML 2025)",
        config_cls=GANQConfig,
        entry=apply_ganq,
        status="works",
    )
)
