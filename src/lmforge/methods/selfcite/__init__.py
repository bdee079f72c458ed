"""SelfCite: self-supervised alignment for context attribution (Chuang et al., ICML 2025).

Math: ``format.py`` (the LongCite format: sentence tags, citation parsing and merging, the official
prompt), ``reward.py`` (the context-ablation reward, batched on ``common.scoring``), ``balance.py``
(the official length balancing of rejected responses), ``metrics.py`` (citation recall/precision/F1
against gold supporting sentences, LongBench-Cite's structure), and SimPO's loss in ``train.py``.
Wiring: ``bon.py`` (best-of-N citation reranking), ``train.py`` (SimPO with TRL's CPOTrainer and LoRA),
``data.py`` / ``experiment.py`` (the miniature's documents and candidates). CLI: ``lmforge align
selfcite-bon``, ``lmforge align selfcite-simpo``, ``lmforge bench citations``; reproduction:
``lmforge reproduce selfcite``. Official code: facebookresearch/SelfCite (CC BY-NC; read, not copied).
"""

from typing import Any

from lmforge.registry import Method, register


def best_of_n(*args: Any, **kwargs: Any) -> Any:
    """:func:`lmforge.methods.selfcite.bon.best_of_n` (imported on first call)."""
    from lmforge.methods.selfcite.bon import best_of_n as fn

    return fn(*args, **kwargs)


register(Method(name="selfcite", family="align", paper="SelfCite: self-supervised citation alignment (ICML 2025)",
                entry=best_of_n, status="implemented"))
