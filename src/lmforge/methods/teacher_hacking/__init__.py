"""Teacher hacking in LM distillation (Tiapkin et al., ICML 2025, arXiv 2502.02671): the controlled
oracle → teacher → student harness.

``oracle.py``: a Markov oracle with exact log-probs; ``models.py``: tiny Llama teacher/student over the
oracle's token ids; ``train.py``: distillation from offline / online-teacher / online-student data with
the proxy KL(teacher‖student) and golden KL(oracle‖student) curves; ``detector.py``: the oracle-free
power-law deviation detector; ``harness.py``: the wiring (:func:`run_harness`).
"""

from lmforge.methods.teacher_hacking.config import TeacherHackingConfig
from lmforge.methods.teacher_hacking.harness import run_harness
from lmforge.registry import Method, register

register(Method(name="teacher_hacking", family="distill", paper="On teacher hacking in language model distillation (ICML 2025)",
                config_cls=TeacherHackingConfig, entry=run_harness, status="implemented"))
