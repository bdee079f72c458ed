"""DSLA: dual-state linear attention (ICML 2025). Planned: see the open issue for this family."""

from lmforge.registry import Method, register

register(Method(name="dsla", family="optim", paper="DSLA: dual-state linear attention (ICML 2025)"))
