"""GPTQ: Hessian-aware column-by-column quantization with lazy batched OBS updates.

Core math in ``core.py``, settings in ``config.py``, model wiring in ``apply.py``; the CLI is
``lmforge compress gptq``.
"""

from lmforge.methods.gptq.apply import apply_gptq
from lmforge.methods.gptq.config import GPTQConfig
from lmforge.registry import Method, register

register(
    Method(
        name="gptq",
        family="quant",
        paper="GPTQ (Frantar et al., ICLR 2023), an ACBench compression baseline",
        config_cls=GPTQConfig,
        entry=apply_gptq,
        status="implemented",
    )
)
