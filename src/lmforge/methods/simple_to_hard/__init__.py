"""Simple-to-hard generalization in visual reasoning (Park et al., ICML 2025, arXiv 2501.02669).

Tasks (``tasks/``): the official Table Readout, Grid Navigation and Visual Analogy generators'
formats (SIMPLE/HARD, image and text twins, the four data types, the official CoT), with checkers.
Miniature (``mini.py``): 6 x 6 Table Readout at CPU size with a pixel-exact glyph decoder. Model
(``vlm.py``, ``base.py``): a transformers LLaVA (ViT tower, mlp2x_gelu projector, Llama) trained here,
``vlm-nano`` committed. Math: ``supervision.py`` (the official ``combine_data.py`` compositions:
Text, Image, Image-via-Text, Mix, Mix+, Align-Mix+), ``align.py`` (gradient alignment with
``torch.func``). Wiring: ``train.py``, ``experiment.py``. CLI: ``lmforge bench s2h-data``,
``lmforge train s2h-base``, ``lmforge train s2h``, ``lmforge bench s2h``. Official code:
princeton-pli/VLM_S2H (read, not copied).
"""

from typing import Any

from lmforge.registry import Method, register


def compose_strategy(*args: Any, **kwargs: Any) -> Any:
    """:func:`lmforge.methods.simple_to_hard.supervision.plan` (imported on first call)."""
    from lmforge.methods.simple_to_hard.supervision import plan

    return plan(*args, **kwargs)


register(Method(name="simple_to_hard", family="agent", paper="Simple-to-hard generalization in visual reasoning (ICML 2025)",
                entry=compose_strategy, status="implemented"))
