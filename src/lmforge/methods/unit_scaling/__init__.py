"""µnit Scaling: simple and scalable FP8 LLM training (Narayan et al., ICML 2025).

``config.py``: :class:`MuSConfig`; ``fp8.py``: saturating E4M3/E5M2 casts, the FP8 linear and
underflow/overflow counters; ``model.py``: the µS Llama-style LM (Res-Post-LN, N(0,1) init, static
multipliers), its SP counterpart and save/load; ``optim.py``: Lion, µS LR groups, cosine-to-10%;
``apply.py``: the contract the CLI calls, and the hooks registered here with the trainer as
``lmforge train --parametrization mus`` (``--fp8``: its FP8 mode). Checked against Graphcore's
``unit-scaling`` 0.3.5 (tests only), ``lion-pytorch`` (tests only) and torch's float8 dtypes.
"""

from lmforge.common.trainer import FP8Mode, Parametrization, register_parametrization
from lmforge.methods.unit_scaling import apply as _apply
from lmforge.methods.unit_scaling.apply import build_mus_model, build_mus_optimizer, enable_fp8, is_mus
from lmforge.methods.unit_scaling.config import MuSConfig
from lmforge.methods.unit_scaling.model import MODEL_TYPE, save_mus
from lmforge.registry import Method, register

register(Method(name="unit_scaling", family="optim", paper="µnit Scaling: simple and scalable FP8 LLM training (ICML 2025)",
                config_cls=MuSConfig, entry=build_mus_model, status="implemented"))
register_parametrization(Parametrization(
    name="mus", label="µS", model_type=MODEL_TYPE, load=_apply.train_load, reinit=_apply.train_reinit,
    optimizer=_apply.train_optimizer, optimizer_note="Lion, per-layer learning rates", save=save_mus,
    fp8=FP8Mode(enable=enable_fp8, is_on=_apply.fp8_is_on, summary=_apply.fp8_summary, why=_apply.FP8_WHY)))

__all__ = ["MuSConfig", "build_mus_model", "build_mus_optimizer", "enable_fp8", "is_mus"]
