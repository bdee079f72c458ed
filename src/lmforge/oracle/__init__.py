"""Reference implementations run through their own libraries, for checking lmforge's methods against.

:mod:`lmforge.oracle.llmcompressor` runs llm-compressor's GPTQ, AWQ, SparseGPT and Wanda on an
in-memory model (optional dependency: ``pip install lmforge[oracle]``).
"""
