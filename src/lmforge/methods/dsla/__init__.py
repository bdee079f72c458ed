"""DSLA-Serve: dual-state linear attention, chained distillation and load-adaptive swapping (Ro et al., ICML 2025).

Math: ``layer.py`` (the dual-state GLA layer: recurrent and chunked forms, GQA expansion, its decode
cache slot), ``policy.py`` (the official swap policy). Wiring: ``convert.py`` (exact convert/restore
and the DSLA-only state dict), ``order.py`` (last-token attention-entropy order), ``distill.py``
(local MSE, then the official loss, stage by stage with checkpoints), ``serve.py`` (a virtual-clock
serve runtime), ``speed.py`` (decode ms/token with filled caches). CLI: ``lmforge train dsla``,
``lmforge serve-sim``; reproduction: ``lmforge reproduce dsla``. Official code: utnslab/DSLA-Serve.
"""

from typing import Any

from lmforge.registry import Method, register


def convert_layers(*args: Any, **kwargs: Any) -> Any:
    """:func:`lmforge.methods.dsla.convert.convert_layers` (imported on first call)."""
    from lmforge.methods.dsla.convert import convert_layers as fn

    return fn(*args, **kwargs)


register(Method(name="dsla", family="optim", paper="DSLA: dual-state linear attention (ICML 2025)",
                entry=convert_layers, status="implemented"))
