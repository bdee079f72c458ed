"""SelfCite: self-supervised citation alignment (ICML 2025). Planned: see the open issue for this family."""

from lmforge.registry import Method, register

register(Method(name="selfcite", family="align", paper="SelfCite: self-supervised citation alignment (ICML 2025)"))
