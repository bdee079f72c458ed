"""``build_optimizer``: the gradient-transformation optimizer for a model (the CLI's entry point).

``lmforge train --optimizer galore|sketch|orthogonal|kron --rank R --refresh T`` calls
:func:`build_optimizer`; :func:`state_bytes` gives the optimizer-state size for its summary.
Torroba-Hennigen, Lang, Guo, Kim (ICML 2025); the target set follows GaLore's training script
(galore-torch 1.0 README: the ``attn``/``mlp`` Linears are projected, embeddings, norms and the
LM head get plain AdamW).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from lmforge.common.errors import UserError
from lmforge.methods.grad_transforms.config import GradTransformConfig
from lmforge.methods.grad_transforms.optim import ProjectedAdam, state_bytes

__all__ = ["build_optimizer", "state_bytes", "target_weights", "train_optimizer"]


def _excluded_weights(model: nn.Module) -> set[int]:
    """ids of weights never projected: embeddings, the output head, and anything tied to them."""
    out: set[int] = set()
    for mod in model.modules():
        if isinstance(mod, nn.Embedding):
            out.add(id(mod.weight))
    get_out = getattr(model, "get_output_embeddings", None)
    head = get_out() if callable(get_out) else None
    if head is not None and getattr(head, "weight", None) is not None:
        out.add(id(head.weight))
    return out


def target_weights(model: nn.Module, cfg: GradTransformConfig) -> dict[str, nn.Parameter]:
    """The weights to project, by parameter name: 2-D weights of ``nn.Linear`` modules, minus the
    LM head and embeddings (also when tied), restricted to ``cfg.target`` substrings if given."""
    excluded = _excluded_weights(model)
    out: dict[str, nn.Parameter] = {}
    for name, mod in model.named_modules():
        if not isinstance(mod, nn.Linear) or not mod.weight.requires_grad:
            continue
        if id(mod.weight) in excluded or name.split(".")[-1] == "lm_head":
            continue
        if cfg.target is not None and not any(t in name for t in cfg.target):
            continue
        out[f"{name}.weight" if name else "weight"] = mod.weight
    return out


def build_optimizer(model: nn.Module, cfg: GradTransformConfig, lr: float, weight_decay: float = 0.0,
                    betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8) -> torch.optim.Optimizer:
    """A :class:`ProjectedAdam` over every trainable parameter of ``model``.

    Target weights (see :func:`target_weights`) go through ``cfg``'s projection; every other
    trainable parameter gets plain AdamW with the same lr, betas, eps and weight decay (the
    galore-torch README's two-group setup). ``weight_decay`` is decoupled and acts on the full
    weights, as in galore-torch (see ProjectedAdam: it breaks the exact adapter equivalence).
    NOTE: the decay applies to every group (biases and norms included), as the galore-torch README
    passes one ``weight_decay`` to the optimizer; no decay-exempt group is made here.
    NOTE: ProjectedAdam uses torch.optim.AdamW's formula here (``convention="torch"``), so the
    unprojected parameters train exactly as under ``--optimizer adamw``; galore-torch's own
    formula differs only in where eps enters and when the decay is applied.

    Raises:
        UserError: rank larger than a target layer allows (names the layer and shape), no target
            weights, or a bad config value.
    """
    targets = target_weights(model, cfg)
    if not targets:
        raise UserError("no nn.Linear weights to project (check --target / the model)")
    chosen = {id(p) for p in targets.values()}
    rest = [p for p in model.parameters() if p.requires_grad and id(p) not in chosen]
    groups: list[dict] = []
    if rest:
        groups.append({"params": rest})
    groups.append({"params": list(targets.values()), "names": list(targets), "kind": cfg.kind, "rank": cfg.rank,
                   "refresh": cfg.refresh, "scale": cfg.scale, "proj_type": cfg.proj_type, "seed": cfg.seed})
    return ProjectedAdam(groups, lr=lr, betas=betas, eps=eps, weight_decay=weight_decay)


def train_optimizer(kind: str, job: Any, model: nn.Module) -> torch.optim.Optimizer:
    """The ``lmforge train --optimizer KIND`` factory (registered with the trainer by this package's
    ``__init__``): :func:`build_optimizer` with the job's rank, refresh, scale and seed.

    Args:
        kind: one of :data:`~lmforge.methods.grad_transforms.config.KINDS`.
        job: a :class:`lmforge.common.trainer.TrainJob` (its ``rank`` was checked to be set).
        model: the model to train.
    """
    cfg = GradTransformConfig(kind=kind, rank=int(job.rank or 0), refresh=job.refresh, scale=job.scale,
                              seed=job.seed)
    return build_optimizer(model, cfg, lr=job.lr, weight_decay=job.weight_decay)
