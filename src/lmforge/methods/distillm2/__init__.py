"""DistiLLM-2: contrastive distillation (Ko et al., ICML 2025): SKL on teacher responses + SRKL on student responses."""

from lmforge.methods.distillm2.config import DistillConfig
from lmforge.methods.distillm2.train import distill
from lmforge.registry import Method, register

register(Method(name="distillm2", family="distill", paper="DistiLLM-2: contrastive distillation (ICML 2025)",
                config_cls=DistillConfig, entry=distill, status="implemented"))
