"""Diverging preferences (Zhang et al., "Diverging Preferences: When do Annotators Disagree and do Models
Know?", ICML 2025, arXiv 2410.14632).

``config.py`` (head settings), ``core.py`` (losses, pair categories, AUROC, divergence scores: pure
functions), ``heads.py`` (BT / mean-variance / classification heads on an MLP, a causal LM or an
AutoModelForSequenceClassification; save and safe load), ``data.py`` (MultiPref, HelpSteer2 and
lmforge JSONL loaders; the annotator-group simulator), ``train.py`` (training and evaluation),
``judge.py`` (LLM-as-judge and the filter that drops diverging pairs), ``apply.py`` (file-to-folder
entry points behind ``lmforge reward train`` / ``lmforge reward eval``).
"""

from lmforge.methods.diverging_prefs.config import DivergingPrefsConfig
from lmforge.registry import Method, register


def run_train(*args, **kwargs):  # noqa: ANN002, ANN003, ANN201
    """:func:`lmforge.methods.diverging_prefs.apply.run_train`, imported on first call (torch stays lazy)."""
    from lmforge.methods.diverging_prefs.apply import run_train as _run

    return _run(*args, **kwargs)


register(Method(name="diverging_prefs", family="reward", paper="Diverging preferences in human-labeled data (ICML 2025)",
                config_cls=DivergingPrefsConfig, entry=run_train, status="works"))
