"""OmniBal: balanced computation for VLM 3D-parallel training (ICML 2025). Planned: see the open issue for this family."""

from lmforge.registry import Method, register

register(Method(name="omnibal", family="optim", paper="OmniBal: balanced computation for VLM 3D-parallel training (ICML 2025)"))
