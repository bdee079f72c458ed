"""OmniBal: balanced computation for VLM 3D-parallel training (Yao, Tan, Zhang et al., ICML 2025).

Math: ``isf.py`` (iterative sampling and filtering, the official loop), ``metrics.py`` (PadRatio and
DistRatio as the official test computes them), ``search.py`` (the official cap search),
``simulate.py`` (a 1F1B event simulator), ``bmp.py`` (greedy anchor, ±1 neighbours, ranking,
exhaustive reference), ``recompute.py`` (the knapsack recompute plan, saved-activation bytes).
Wiring: ``sampler.py`` (a ``torch.utils.data`` batch sampler of ISF groups), ``profile.py``,
``pipeline.py`` (a VLM-shaped model on ``torch.distributed.pipelining`` 1F1B with data
parallelism), ``plan.py`` (memory, the measured or modelled capacity) and ``experiment.py``
(lengths → plans → timed runs), ``torchrun.py`` (the runtime on ranks torchrun starts). CLI:
``lmforge train omnibal``; reproduction: ``lmforge reproduce omnibal``.
"""

from typing import Any

from lmforge.registry import Method, register


def balance_data(*args: Any, **kwargs: Any) -> Any:
    """:func:`lmforge.methods.omnibal.experiment.balance_data`, imported on first call (the runtime
    imports ``torch.distributed.pipelining``, about a second, which the registry should not pay)."""
    from lmforge.methods.omnibal.experiment import balance_data as fn

    return fn(*args, **kwargs)


register(Method(name="omnibal", family="optim", paper="OmniBal: balanced computation for VLM 3D-parallel training (ICML 2025)",
                entry=balance_data, status="implemented"))
