"""The adapter side of the duality: ``W = W0 + P Θ Qᵀ`` with P, Q frozen and Θ trained from 0.

Torroba-Hennigen, Lang, Guo, Kim, "On the Duality between Gradient Transformations and Adapters"
(ICML 2025): training Θ with an optimizer is training W through the gradient map ``G ↦ Pᵀ G Q``
with the same optimizer, because ``∇_Θ L = Pᵀ ∇_W L Q``. With ``Q = I`` this is one-sided LoRA
``W0 + P B`` (GaLore with a frozen projector); a GaLore refresh is :func:`merge_and_rebase`.

PEFT (0.21, ``peft.tuners.lora.layer.Linear``) was checked: its LoRA is ``W0 + (α/r)·lora_B @
lora_A`` with ``lora_A`` (r x in) applied to the input first and ``lora_B`` (out x r) zero-initialised.
GaLore's ``std`` projection of a weight with rows >= cols reduces the *input* side
(``G Q``, state out x r): that is PEFT LoRA with ``lora_A = Qᵀ`` frozen and ``lora_B`` trained from
its zero init (LoRA-FA's layout), with ``lora_alpha = r`` so that the scaling is 1. A wide weight
(rows < cols) is projected on the *output* side (``Pᵀ G``, state r x in): PEFT LoRA with
``lora_B = P`` frozen and ``lora_A`` trained from zero, which needs PEFT's init overridden.
:func:`peft_one_sided_lora` builds either on a PEFT model; the modules below are the reference
form (explicit merged weight, which also exposes ∇_W for SVD refreshes). A refresh that changes
P needs the merge, which PEFT does not do with optimizer state kept, hence ``merge_and_rebase`` here.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.common.errors import UserError
from lmforge.methods.grad_transforms.projectors import Projector


class KronAdapterLinear(nn.Module):
    """``y = x (W0 + P Θ Qᵀ)ᵀ + b`` with W0, b, P, Q frozen and Θ (r1 x r2) trained from 0.

    P or Q may be None (identity on that side), so this is also the one-sided adapter. The merged
    weight is formed explicitly: exact arithmetic for the equivalence tests, and its gradient
    (``weight_grad`` after backward) is the full ∇_W that a GaLore (SVD) refresh needs.
    NOTE: a production LoRA computes ``x W0ᵀ + ((x Q) Θᵀ) Pᵀ`` instead and never forms W; the
    math (and the trained Θ) is the same, only memory and rounding differ.

    Args:
        base: the ``nn.Linear`` to adapt (its weight becomes W0, frozen).
        left: P (out x r1) or None.
        right: Q (in x r2) or None.
    """

    def __init__(self, base: nn.Linear, left: torch.Tensor | None, right: torch.Tensor | None) -> None:
        super().__init__()
        w = base.weight
        self.weight0 = nn.Parameter(w.detach().clone(), requires_grad=False)
        self.bias = None if base.bias is None else nn.Parameter(base.bias.detach().clone(), requires_grad=False)
        self.in_features, self.out_features = base.in_features, base.out_features
        self.register_buffer("left", None if left is None else left.detach().to(w.dtype).clone())
        self.register_buffer("right", None if right is None else right.detach().to(w.dtype).clone())
        shape = Projector(left, right).low_shape(tuple(w.shape))
        self.theta = nn.Parameter(torch.zeros(shape, dtype=w.dtype, device=w.device))
        self._merged: torch.Tensor | None = None

    @property
    def projector(self) -> Projector:
        return Projector(self.left, self.right)

    def delta(self) -> torch.Tensor:
        """``P Θ Qᵀ``, the adapter's contribution to the weight."""
        return self.projector.back(self.theta)

    def effective_weight(self) -> torch.Tensor:
        """``W0 + P Θ Qᵀ`` (detached)."""
        return (self.weight0 + self.delta()).detach()

    @property
    def weight_grad(self) -> torch.Tensor | None:
        """∇_W L of the last backward (the full-space gradient), or None."""
        return None if self._merged is None else self._merged.grad

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = self.weight0 + self.delta()
        if w.requires_grad:
            w.retain_grad()
            self._merged = w
        return F.linear(x, w, self.bias)


class OneSidedLoRALinear(KronAdapterLinear):
    """One-sided LoRA: ``W0 + P B`` (``side="left"``, P out x r, B r x in) or ``W0 + B Qᵀ``
    (``side="right"``, Q in x r, B out x r); the projector frozen, B trained from 0."""

    def __init__(self, base: nn.Linear, proj: torch.Tensor, side: str = "left") -> None:
        if side not in ("left", "right"):
            raise UserError(f"side must be 'left' or 'right', got '{side}'")
        super().__init__(base, proj if side == "left" else None, proj if side == "right" else None)
        self.side = side

    @property
    def B(self) -> nn.Parameter:  # noqa: N802 - the paper's name
        return self.theta


def wrap_linears(model: nn.Module, projectors: dict[str, Projector],
                 freeze_rest: bool = True) -> dict[str, KronAdapterLinear]:
    """Replace each named ``nn.Linear`` by a ``KronAdapterLinear`` with its projector. With
    ``freeze_rest`` every other weight is frozen too (LoRA fine-tuning); without it they keep their
    ``requires_grad`` (pre-training where embeddings and norms train fully, as in GaLore's setup).
    Returns the adapters by module name."""
    modules = dict(model.named_modules())
    out: dict[str, KronAdapterLinear] = {}
    if freeze_rest:
        for p in model.parameters():
            p.requires_grad_(False)
    for name, proj in projectors.items():
        lin = modules.get(name)
        if not isinstance(lin, nn.Linear):
            raise UserError(f"'{name}' is not an nn.Linear of the model")
        ad = KronAdapterLinear(lin, proj.left, proj.right)
        parent_name, _, child = name.rpartition(".")
        setattr(modules[parent_name] if parent_name else model, child, ad)
        out[name] = ad
    return out


@torch.no_grad()
def merge_and_rebase(model: nn.Module, optimizer: torch.optim.Optimizer | None,
                     new_projectors: dict[str, Projector], reset_state: bool = False) -> None:
    """The adapter form of a GaLore refresh: ``W0 ← W0 + P Θ Qᵀ``, new P/Q, ``Θ ← 0``.

    The effective weight is unchanged. The optimizer's state for Θ (same Parameter object) is
    carried over as it is, the adapter reading of galore-torch not resetting its moments at a
    refresh; ``reset_state=True`` drops it instead. If the adapter saw a backward since its last
    forward, ``Θ.grad`` is replaced by ``Pᵀ ∇_W Q`` for the new projector, so that the step that
    follows is the one GaLore takes with the projector it just computed from that gradient.

    Args:
        model: a model with adapters from :func:`wrap_linears` (or any KronAdapterLinear).
        optimizer: the optimizer training the Θ's (None: no state handling).
        new_projectors: module name -> the new projector.
        reset_state: clear Θ's optimizer state instead of carrying it.
    """
    modules = dict(model.named_modules())
    for name, proj in new_projectors.items():
        ad = modules.get(name)
        if not isinstance(ad, KronAdapterLinear):
            raise UserError(f"'{name}' is not an adapter module of the model")
        ad.weight0.add_(ad.delta())
        ad.left = None if proj.left is None else proj.left.to(ad.weight0.dtype).clone()
        ad.right = None if proj.right is None else proj.right.to(ad.weight0.dtype).clone()
        shape = proj.low_shape(tuple(ad.weight0.shape))
        g_full = ad.weight_grad
        if tuple(ad.theta.shape) != shape:
            # A rank change cannot carry Adam state: the moments have the old shape.
            ad.theta.data = torch.zeros(shape, dtype=ad.theta.dtype, device=ad.theta.device)
            if optimizer is not None:
                optimizer.state.pop(ad.theta, None)
        else:
            ad.theta.zero_()
            if optimizer is not None and reset_state:
                optimizer.state.pop(ad.theta, None)
        ad.theta.grad = None if g_full is None else proj.project(g_full).clone()


def peft_one_sided_lora(model: nn.Module, projectors: dict[str, Projector]) -> nn.Module:
    """PEFT's LoRA set up as one-sided LoRA with the given frozen projectors.

    A right projector Q (in x r) becomes a frozen ``lora_A = Qᵀ`` with ``lora_B`` trained from 0; a
    left projector P (out x r) becomes a frozen ``lora_B = P`` with ``lora_A`` trained from 0.
    ``lora_alpha = r`` and ``use_rslora=False`` make PEFT's scaling 1; dropout 0.

    Returns:
        The PEFT model (``peft.PeftModel``); its trainable parameters are exactly the Θ's.
    """
    from peft import LoraConfig, get_peft_model

    ranks = {proj.low_shape((1, 1)) for proj in projectors.values()}
    sizes = set()
    for proj in projectors.values():
        if (proj.left is None) == (proj.right is None):
            raise UserError("PEFT LoRA expresses one-sided projectors only (exactly one of P, Q)")
        sizes.add((proj.left if proj.left is not None else proj.right).shape[1])
    if len(sizes) != 1:
        raise UserError(f"peft_one_sided_lora needs one rank for all layers, got {sorted(sizes)} ({ranks})")
    r = sizes.pop()
    names = list(projectors)
    cfg = LoraConfig(r=r, lora_alpha=r, lora_dropout=0.0, target_modules=names, bias="none", use_rslora=False)
    peft_model = get_peft_model(model, cfg)
    mods = dict(peft_model.base_model.model.named_modules())
    with torch.no_grad():
        for name, proj in projectors.items():
            layer = mods[name]
            lora_a: Any = layer.lora_A["default"].weight
            lora_b: Any = layer.lora_B["default"].weight
            if proj.right is not None:
                lora_a.copy_(proj.right.t())
                lora_b.zero_()
                lora_a.requires_grad_(False)
            else:
                lora_b.copy_(proj.left)
                lora_a.zero_()
                lora_b.requires_grad_(False)
    return peft_model
