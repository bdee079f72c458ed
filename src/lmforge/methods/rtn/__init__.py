"""Round-to-nearest quantization, the baseline of every quantization paper.

Core math in ``core.py``, settings in ``config.py``, model wiring in ``apply.py``; the CLI is
``lmforge compress rtn``.
"""

from lmforge.methods.rtn.apply import apply_rtn
from lmforge.methods.rtn.config import RTNConfig
from lmforge.registry import Method, register

register(
    Method(
        name="rtn",
        family="quant",
        paper="Round-to-nearest baseline (min-max grid per channel or group)",
        config_cls=RTNConfig,
        entry=apply_rtn,
        status="implemented",
    )
)
