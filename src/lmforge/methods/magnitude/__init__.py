"""Magnitude pruning, the baseline of the Wanda and SparseGPT papers.

Core math in ``core.py``, settings in ``config.py``, model wiring in ``apply.py``; the CLI is
``lmforge compress magnitude``.
"""

from lmforge.methods.magnitude.apply import apply_magnitude
from lmforge.methods.magnitude.config import MagnitudeConfig
from lmforge.registry import Method, register

register(
    Method(
        name="magnitude",
        family="prune",
        paper="Magnitude pruning baseline (Han et al., 2015)",
        config_cls=MagnitudeConfig,
        entry=apply_magnitude,
        status="implemented",
    )
)
