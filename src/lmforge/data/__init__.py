"""Seeded synthetic data generators that write the formats real datasets use.

Every generator takes a ``random.Random`` (or a seed) and returns plain dict records, so that the
same seed always gives the same corpus:

- :mod:`lmforge.data.toolcalls`: function calls chosen from a tool list (xLAM/BFCL-style JSON).
- :mod:`lmforge.data.workflow`: multi-step plans as node lists + edges (WorfBench format).
- :mod:`lmforge.data.needle`: key-value needles in a long haystack (NIAH / RULER multi-key style).
- :mod:`lmforge.data.textworld`: blocksworld episodes (observation -> action) with a success check.
- :mod:`lmforge.data.text`: plain English text (the haystack filler, and language modelling data).

:mod:`lmforge.data.corpus` renders records to prompt/answer text for the zoo.
"""
