"""SparseGPT: one-shot pruning with OBS weight updates and adaptive per-block masks.

Core math in ``core.py``, settings in ``config.py``, model wiring in ``apply.py``; the CLI is
``lmforge compress sparsegpt``.
"""

from lmforge.methods.sparsegpt.apply import apply_sparsegpt
from lmforge.methods.sparsegpt.config import SparseGPTConfig
from lmforge.registry import Method, register

register(
    Method(
        name="sparsegpt",
        family="prune",
        paper="SparseGPT (Frantar & Alistarh, ICML 2023), an ACBench compression baseline",
        config_cls=SparseGPTConfig,
        entry=apply_sparsegpt,
        status="implemented",
    )
)
