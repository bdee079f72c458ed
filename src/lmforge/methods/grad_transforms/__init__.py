"""Linear gradient transformations are adapters (ICML 2025). Planned: see the open issue for this family."""

from lmforge.registry import Method, register

register(Method(name="grad_transforms", family="peft", paper="Linear gradient transformations are adapters (ICML 2025)"))
