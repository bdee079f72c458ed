"""AWQ: activation-aware per-channel scaling folded into the preceding op, then grouped RTN.

Core math in ``core.py``, settings in ``config.py``, model wiring in ``apply.py``; the CLI is
``lmforge compress awq``.
"""

from lmforge.methods.awq.apply import apply_awq
from lmforge.methods.awq.config import AWQConfig
from lmforge.registry import Method, register

register(
    Method(
        name="awq",
        family="quant",
        paper="AWQ (Lin et al., MLSys 2024), an ACBench compression baseline",
        config_cls=AWQConfig,
        entry=apply_awq,
        status="implemented",
    )
)
