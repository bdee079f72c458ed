"""RATE: Rewrite-based Attribute Treatment Estimators (Reber, Richardson, Nief, Garbacea, Veitch, "RATE:
Causal Explainability of Reward Models with Imperfect Counterfactuals", ICML 2025, arXiv 2410.11348).

``config.py`` (prompt and settings), ``estimators.py`` (naive, single-rewrite and RATE ATT/ATU/ATE
with the official code's SEs: pure numpy), ``rewriters.py`` (programmatic, local HF and OpenAI-compatible
rewriters; built-in rule attributes), ``apply.py`` (rewrite twice, score, estimate, count failed
rewrites), ``synthetic.py`` (a task with known effects).
"""

from lmforge.methods.rate.config import RateConfig
from lmforge.registry import Method, register


def run_rate(*args, **kwargs):  # noqa: ANN002, ANN003, ANN201
    """:func:`lmforge.methods.rate.apply.run_rate`, imported on first call."""
    from lmforge.methods.rate.apply import run_rate as _run

    return _run(*args, **kwargs)


register(Method(name="rate", family="reward",
                paper="RATE: rewrite-based attribute treatment estimators for reward models (ICML 2025)",
                config_cls=RateConfig, entry=run_rate, status="works"))
