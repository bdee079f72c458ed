"""DistiLLM-2: contrastive distillation (ICML 2025). Planned: see the open issue for this family."""

from lmforge.registry import Method, register

register(Method(name="distillm2", family="distill", paper="DistiLLM-2: contrastive distillation (ICML 2025)"))
