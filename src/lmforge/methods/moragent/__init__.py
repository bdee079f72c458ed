"""MoRAgent: parameter-efficient agent tuning with Mixture-of-Roles (Han et al., ICML 2025).

Math: ``layer.py`` (the MoR linear: three role groups of routed LoRA experts plus a sigmoid-gated
shared expert, top-k renormalised routing, the per-token role mask, Eq. 8's auxiliary terms).
Wiring: ``adapter.py`` (in-place injection, roles, off switch, safetensors save/load), ``data.py``
(function-calling records -> verified three-role trajectories), ``agent.py`` (the reasoner ->
executor -> observation -> summarizer loop on lmforge's engine), ``train.py`` (completion-only loss per
role, the equal-parameter peft LoRA baseline). CLI: ``lmforge agent mor-data / mor-train / mor-run``.
Official layer: huawei-noah/noah-research ``MoRAgent/moelora.py`` (read, not copied).
"""

from typing import Any

from lmforge.registry import Method, register


def train_mor(*args: Any, **kwargs: Any) -> Any:
    """:func:`lmforge.methods.moragent.train.train_adapter` (imported on first call)."""
    from lmforge.methods.moragent.train import train_adapter

    return train_adapter(*args, **kwargs)


register(Method(name="moragent", family="agent", paper="MoRAgent: Mixture-of-Roles PEFT for agents (ICML 2025)",
                entry=train_mor, status="implemented"))
