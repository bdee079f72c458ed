"""Focus Instruction Tuning, FIT (Lamb et al., "Focus On This, Not That! Steering LLMs with Adaptive
Feature Specification", ICML 2025, arXiv 2410.22944).

``data.py``: the six focus instructions, the prompt and the focus label (``y`` or ``y_S``);
``config.py``: the schedule; ``train.py``: completion-only SFT with TRL's ``SFTTrainer`` and early
stopping on validation cross-entropy; ``evaluate.py``: focus accuracy with label-set scoring;
``apply.py``: ``fit_model`` behind ``lmforge align fit``. The synthetic suite is
:mod:`lmforge.data.spurious`; the miniature experiment is ``lmforge reproduce fit``.
"""

from lmforge.methods.fit.apply import fit_model
from lmforge.methods.fit.config import FITConfig
from lmforge.registry import Method, register

register(Method(name="fit", family="align", paper="Focus Instruction Tuning (ICML 2025)", config_cls=FITConfig,
                entry=fit_model, status="implemented"))
