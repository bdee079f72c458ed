"""Wanda: prune by |W| * ||X||, compared within each output row.

Core math in ``core.py``, settings in ``config.py``, model wiring in ``apply.py``; the CLI is
``lmforge compress wanda``.
"""

from lmforge.methods.wanda.apply import apply_wanda
from lmforge.methods.wanda.config import WandaConfig
from lmforge.registry import Method, register

register(
    Method(
        name="wanda",
        family="prune",
        paper="Wanda (Sun et al., ICLR 2024), an ACBench compression baseline",
        config_cls=WandaConfig,
        entry=apply_wanda,
        status="implemented",
    )
)
