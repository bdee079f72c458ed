"""Selective DPO: principled data selection by difficulty (Gao et al., ICML 2025, arXiv 2502.09650).

``config.py``: :class:`SelectiveDPOConfig` (paper defaults); ``core.py``: the DPO loss, half splits,
checkpoint schedule, difficulty and easy-to-hard selection as pure functions; ``train.py``: the
reference runs, :func:`selective_dpo` (the entry) and a TRL ``DPOTrainer`` path with a sequential
sampler; ``toy.py``: the tiny SFT model for the synthetic task of ``lmforge.data.preferences``.
Checked against the official code (github.com/glorgao/SelectiveDPO) and TRL 1.16's DPOTrainer.
"""

from lmforge.methods.selective_dpo.config import SelectiveDPOConfig
from lmforge.methods.selective_dpo.train import compute_difficulty, selective_dpo
from lmforge.registry import Method, register

register(Method(name="selective_dpo", family="align", paper="Selective DPO: principled data selection by difficulty (ICML 2025)",
                config_cls=SelectiveDPOConfig, entry=selective_dpo, status="works"))

__all__ = ["SelectiveDPOConfig", "compute_difficulty", "selective_dpo"]
