"""SparseGPT (Frantar & Alistarh, ICML 2023), an ACBench compression baseline. Planned: see the open issue for this family."""

from lmforge.registry import Method, register

register(Method(name="sparsegpt", family="prune", paper="SparseGPT (Frantar & Alistarh, ICML 2023), an ACBench compression baseline"))
