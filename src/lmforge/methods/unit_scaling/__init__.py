"""µnit Scaling: simple and scalable FP8 LLM training (Narayan et al., ICML 2025).

``config.py``: :class:`MuSConfig`; ``fp8.py``: saturating E4M3/E5M2 casts, the FP8 linear and
underflow/overflow counters; ``model.py``: the µS Llama-style LM (Res-Post-LN, N(0,1) init, static
multipliers), its SP counterpart and save/load; ``optim.py``: Lion, µS LR groups, cosine-to-10%;
``apply.py``: the contract the CLI calls. Checked against Graphcore's ``unit-scaling`` 0.3.5
(tests only), ``lion-pytorch`` (tests only) and torch's float8 dtypes.
"""

from lmforge.methods.unit_scaling.apply import build_mus_model, build_mus_optimizer, enable_fp8, is_mus
from lmforge.methods.unit_scaling.config import MuSConfig
from lmforge.registry import Method, register

register(Method(name="unit_scaling", family="optim", paper="µnit Scaling: simple and scalable FP8 LLM training (ICML 2025)",
                config_cls=MuSConfig, entry=build_mus_model, status="implemented"))

__all__ = ["MuSConfig", "build_mus_model", "build_mus_optimizer", "enable_fp8", "is_mus"]
