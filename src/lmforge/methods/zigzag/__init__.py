"""Zigzag persistence of LLM layers and zigzag layer pruning (Gardinazzi, Viswanathan et al., ICML 2025).

``persistence.py``: zigzag persistent homology over Z/2 (FastZigzag), checked against a brute-force
rank computation; ``descriptors.py``: point clouds, kNN clique complexes, the effective persistence
image, births frequency, inter-layer persistence and the pruning score; ``layer_prune.py``: the
zigzag criterion beside angular distance (Gromov et al.) and Block Influence (ShortGPT), layer
removal and ``lmforge prune layers``.
"""

from lmforge.methods.zigzag.layer_prune import prune_layers
from lmforge.registry import Method, register

register(Method(name="zigzag", family="prune", paper="Zigzag persistence of LLM layers and layer pruning (ICML 2025)",
                entry=prune_layers, status="implemented"))
