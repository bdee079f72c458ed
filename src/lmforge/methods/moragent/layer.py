"""The Mixture-of-Roles (MoR) LoRA layer: routed LoRA experts in three role groups on a frozen linear.

Han et al., "MoRAgent: Parameter Efficient Agent Tuning with Mixture-of-Roles" (ICML 2025). The
official layer is ``LinearMoELora`` in ``MoRAgent/moelora.py`` of
https://github.com/huawei-noah/noah-research (commit b59c500), a fork of an early PEFT LoRA file.
It was read to pin down the behaviour below; nothing here is copied from it.

For a token ``x`` (a row of the layer input) with role ``g`` the layer returns

    h = W0 x + b + s * sum_{e in group g} w_e(x) * (x A_e) B_e

* **Groups.** Three role groups in this order: reasoner (0), executor (1), summarizer (2). Group
  ``g`` holds ``routed[g]`` routed experts and one shared expert; the defaults are 4+1, 4+1, 3+1 (14
  experts). The experts are stored stacked, ``A [E, d_in, r]`` and ``B [E, r, d_out]``, in the
  official order: each group's routed experts followed by its shared expert
  (``[r0 r1 r2 r3 rS e0 e1 e2 e3 eS s0 s1 s2 sS]``), see :func:`expert_layout`.
* **Routing** (:func:`routed_weights`). Per group a bias-free ``Linear(d_in, routed[g])`` router;
  ``softmax`` in float32, keep the ``top_k[g]`` largest (3, 3, 2), renormalise them to sum 1.
* **Shared expert** (:func:`shared_weight`). Per group a bias-free ``Linear(d_in, 1)`` gate;
  weight ``sigmoid(.)``, not normalised with the routed weights.
* **Role gate** (:func:`role_mask`). A rule-based, per-token one-hot mask keeps only the weights of
  the token's own group; every other expert gets weight 0 (here: exactly 0 through ``torch.where``,
  so other roles' parameters get exactly zero gradient and cannot change the token's output). A token
  with role ``-1`` (:data:`NO_ROLE`) has an all-zero mask and gets the base output only.
* **Init.** ``A``: ``kaiming_uniform_(a=sqrt(5))`` on the stacked ``[E, d_in, r]`` tensor; ``B``:
  zeros, so a fresh layer equals its base; routers and gates: ``kaiming_uniform_(a=sqrt(5))`` (the
  ``nn.Linear`` default).
* **Auxiliary losses** (:func:`load_balance_loss`, :func:`importance_cv2_loss`,
  :func:`mor_aux_losses`): the training loss is ``CE + alpha1 * L1 + alpha2 * L2`` (paper Eq. 8,
  ``alpha1 = 1e-3``, ``alpha2 = 1e-4``). The official release only has the layer, which returns the
  11 renormalised routed weights for these terms; the terms themselves are not released. See the
  ``NOTE`` at :func:`mor_aux_losses` for what is implemented.

Efficiency: the official layer forms every expert's full output ``[B, T, E, d_out]`` and then
weights and sums it. Here the routing weight multiplies the rank-``r`` activation ``x A_e`` and one
matrix product with the flattened ``B [E * r, d_out]`` does the weighted sum (:func:`mor_delta`):
the same sum, ``E * r`` wide instead of ``E * d_out``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.common.errors import UserError

__all__ = [
    "NO_ROLE",
    "ROLE_NAMES",
    "MoRConfig",
    "MoRLinear",
    "broadcast_roles",
    "expert_layout",
    "importance_cv2_loss",
    "load_balance_loss",
    "mor_aux_losses",
    "mor_delta",
    "role_mask",
    "routed_weights",
    "shared_weight",
    "topk_renormalize",
]

ROLE_NAMES = ("reasoner", "executor", "summarizer")
NO_ROLE = -1  # a token that belongs to no role: base output only


@dataclass
class MoRConfig:
    """Shape and hyper-parameters of the MoR layers (defaults: the official code and the paper).

    Attributes:
        rank: rank of every expert. NOTE: the official layer hard-codes 16 and ignores its config's
            ``r`` (which only switches the adapter on when > 0); 16 is the default here.
        alpha: LoRA scale numerator; the update is multiplied by ``alpha / rank``. ``None`` (default)
            means no scaling (factor 1). NOTE: the official MoR path applies no ``alpha / r`` scaling
            at all (``lora_alpha`` is unused); ``alpha`` is an lmforge option, off by default.
        dropout: dropout on the experts' input (not on the routers' input), as the official layer.
        routed: routed experts per role group (reasoner, executor, summarizer).
        top_k: experts kept per group by the router.
        alpha1: weight of the auxiliary loss L1 (Eq. 8).
        alpha2: weight of the auxiliary loss L2 (Eq. 8).
    """

    rank: int = 16
    alpha: float | None = None
    dropout: float = 0.0
    routed: tuple[int, ...] = (4, 4, 3)
    top_k: tuple[int, ...] = (3, 3, 2)
    alpha1: float = 1e-3
    alpha2: float = 1e-4
    group_names: tuple[str, ...] = field(default=ROLE_NAMES)

    def __post_init__(self) -> None:
        self.routed = tuple(int(n) for n in self.routed)
        self.top_k = tuple(int(k) for k in self.top_k)
        self.group_names = tuple(str(n) for n in self.group_names)
        self.validate()

    def validate(self) -> None:
        """Raise a one-line :class:`UserError` for an impossible configuration."""
        if self.rank < 1:
            raise UserError(f"MoR rank must be >= 1, got {self.rank}")
        if self.alpha is not None and not self.alpha > 0:
            raise UserError(f"MoR alpha must be positive (or None for no scaling), got {self.alpha}")
        if not 0.0 <= self.dropout < 1.0:
            raise UserError(f"MoR dropout must be in [0, 1), got {self.dropout}")
        if len(self.routed) != len(self.top_k) or len(self.routed) != len(self.group_names):
            raise UserError(f"MoR needs one routed count and one top-k per group: routed={list(self.routed)}, "
                            f"top_k={list(self.top_k)}, groups={list(self.group_names)}")
        for name, n, k in zip(self.group_names, self.routed, self.top_k):
            if n < 1:
                raise UserError(f"MoR group {name!r} needs at least one routed expert, got {n}")
            if not 1 <= k <= n:
                raise UserError(f"MoR top-k {k} for group {name!r} must be between 1 and its {n} routed experts")
        if self.alpha1 < 0 or self.alpha2 < 0:
            raise UserError(f"MoR auxiliary-loss weights must be >= 0, got alpha1={self.alpha1}, alpha2={self.alpha2}")

    @property
    def n_groups(self) -> int:
        return len(self.routed)

    @property
    def n_experts(self) -> int:
        """Routed plus shared experts over all groups (14 by default)."""
        return sum(self.routed) + self.n_groups

    @property
    def scaling(self) -> float:
        return 1.0 if self.alpha is None else float(self.alpha) / self.rank

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["routed"], d["top_k"], d["group_names"] = list(self.routed), list(self.top_k), list(self.group_names)
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> MoRConfig:
        known = set(cls.__dataclass_fields__)
        unknown = sorted(set(d) - known)
        if unknown:
            raise UserError(f"unknown MoR config keys: {', '.join(unknown)}")
        return cls(**d)


# --------------------------------------------------------------------------------------------
# The math, on tensors.


def expert_layout(routed: Sequence[int]) -> tuple[list[int], list[bool]]:
    """Group id and shared flag of each stacked expert: each group's routed experts, then its shared one.

    ``expert_layout((4, 4, 3))`` gives groups ``[0]*5 + [1]*5 + [2]*4`` and the shared flag at
    indices 4, 9 and 13 (the official layout; the official code drops exactly those three columns to
    return the 11 routed weights).
    """
    groups: list[int] = []
    shared: list[bool] = []
    for g, n in enumerate(routed):
        groups += [g] * (n + 1)
        shared += [False] * n + [True]
    return groups, shared


def topk_renormalize(probs: torch.Tensor, k: int) -> torch.Tensor:
    """Keep the ``k`` largest entries of each row of ``probs`` (last dim), zero the rest, renormalise to sum 1."""
    n = probs.shape[-1]
    if not 1 <= k <= n:
        raise UserError(f"top-k {k} must be between 1 and the group's {n} routed experts")
    values, index = probs.topk(k, dim=-1)
    kept = torch.zeros_like(probs).scatter(-1, index, values)
    return kept / kept.sum(dim=-1, keepdim=True)


def routed_weights(logits: torch.Tensor, k: int) -> torch.Tensor:
    """Routed-expert weights of one group: ``softmax(logits)`` in float32, top-``k``, renormalised.

    Returns a float32 tensor with the shape of ``logits``; exactly ``k`` entries per row are nonzero
    (barring float32 underflow of the softmax) and they sum to 1.
    """
    return topk_renormalize(F.softmax(logits, dim=-1, dtype=torch.float32), k)


def shared_weight(logit: torch.Tensor) -> torch.Tensor:
    """Weight of a group's shared expert: ``sigmoid`` of its gate's logit (not normalised with the routed ones)."""
    return torch.sigmoid(logit)


def role_mask(role_ids: torch.Tensor, n_groups: int) -> torch.Tensor:
    """Boolean one-hot ``[..., n_groups]`` of the token roles; a role outside ``[0, n_groups)`` (-1) is all False."""
    # NOTE: the official forward takes the mask itself (``mask_moe [B, T, 3]``, multiplied into the
    # weights), built by an unreleased rule-based gate; it is one-hot per the paper, and a token
    # whose row is all zero gets only ``W0 x``, which is what role -1 gives here. A soft mask is not
    # supported: roles are integer ids.
    return role_ids.unsqueeze(-1) == torch.arange(n_groups, device=role_ids.device)


def broadcast_roles(role_ids: torch.Tensor | int, token_shape: torch.Size | Sequence[int],
                    device: torch.device | None = None) -> torch.Tensor:
    """Role ids shaped like the tokens ``token_shape`` (the input's shape without its feature dim).

    ``role_ids`` may be a scalar (one role for every token), ``[B]`` (one role per sequence), or the
    tokens' own shape ``[B, T]`` (or anything that broadcasts to it after trailing singleton dims
    are added). A shape that does not fit is a one-line :class:`UserError`.
    """
    token_shape = tuple(token_shape)
    ids = torch.as_tensor(role_ids, device=device)
    if ids.dtype.is_floating_point or ids.dtype == torch.bool or ids.is_complex():
        raise UserError(f"role ids must be integers (0 reasoner, 1 executor, 2 summarizer, -1 none), got {ids.dtype}")
    if ids.dim() > len(token_shape):
        raise UserError(f"role ids of shape {tuple(ids.shape)} do not fit tokens of shape {token_shape}")
    ids = ids.reshape(tuple(ids.shape) + (1,) * (len(token_shape) - ids.dim()))
    try:
        return torch.broadcast_to(ids, token_shape).to(torch.long)
    except RuntimeError:
        raise UserError(f"role ids of shape {tuple(torch.as_tensor(role_ids).shape)} do not fit tokens of shape "
                        f"{token_shape}; set one role per token being fed") from None


def mor_delta(x: torch.Tensor, A: torch.Tensor, B: torch.Tensor, weights: torch.Tensor,
              active: torch.Tensor | None = None) -> torch.Tensor:
    """The weighted expert sum ``sum_e w_e (x A_e) B_e`` for every token, batched.

    Args:
        x: ``[..., d_in]`` expert inputs.
        A: ``[E, d_in, r]`` down-projections.
        B: ``[E, r, d_out]`` up-projections.
        weights: ``[..., E]`` per-token expert weights.
        active: optional ``[..., E]`` boolean; an inactive expert's term is exactly 0 (not ``0 * value``),
            so its parameters can neither change the result nor receive a gradient through it.

    Returns:
        ``[..., d_out]``.
    """
    # NOTE: the official layer weights each expert's full [..., d_out] output and sums; here the
    # weight multiplies the rank-r activation before B. The same sum in exact arithmetic (round-off
    # differs; the per-expert loop in the tests agrees to 1e-12 in float64).
    E, d_in, r = A.shape
    xa = (x @ A.permute(1, 0, 2).reshape(d_in, E * r)).unflatten(-1, (E, r))  # [..., E, r]
    h = xa * weights.unsqueeze(-1)
    if active is not None:
        h = torch.where(active.unsqueeze(-1), h, torch.zeros((), dtype=h.dtype, device=h.device))
    return h.flatten(-2) @ B.reshape(E * r, B.shape[-1])


# --------------------------------------------------------------------------------------------
# Auxiliary routing losses.


def _token_select(weights: torch.Tensor, token_mask: torch.Tensor | None) -> torch.Tensor:
    w = weights.reshape(-1, weights.shape[-1])
    if token_mask is not None:
        w = w[token_mask.reshape(-1).to(torch.bool)]
    return w


def load_balance_loss(weights: torch.Tensor, k: int, token_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Switch/GShard load balance of one group: ``n * sum_i f_i P_i`` over the selected tokens.

    ``f_i`` is the fraction of the tokens' ``k`` expert slots that go to expert ``i`` (mean over
    tokens of ``1[w_i > 0] / k``, no gradient) and ``P_i`` the mean routing weight of expert ``i``.
    Equals 1 when the tokens are spread evenly, ``n / k`` when all go to the same ``k`` experts.

    Args:
        weights: ``[..., n]`` top-k renormalised routed weights of one group.
        k: the group's top-k.
        token_mask: optional ``[...]`` boolean, the tokens that count (e.g. the group's own tokens).

    Returns:
        A scalar; 0 when no token is selected.
    """
    w = _token_select(weights, token_mask)
    if w.shape[0] == 0:
        return weights.sum() * 0.0
    n = w.shape[-1]
    f = (w > 0).to(w.dtype).mean(dim=0) / k
    P = w.mean(dim=0)
    return n * (f * P).sum()


def importance_cv2_loss(weights: torch.Tensor, token_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Squared coefficient of variation of the experts' importance (Shazeer et al. 2017).

    Importance of expert ``i`` is the sum of its routing weights over the selected tokens; the loss is
    ``Var(importance) / mean(importance)^2`` with the population variance. 0 when the experts are
    equally important; 0 when no token is selected.
    """
    w = _token_select(weights, token_mask)
    if w.shape[0] == 0:
        return weights.sum() * 0.0
    importance = w.sum(dim=0)
    return importance.var(unbiased=False) / importance.mean().pow(2)


def mor_aux_losses(routed: Sequence[torch.Tensor], role_ids: torch.Tensor | None,
                   top_k: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(L1, L2)`` of one MoR layer: each group's loss on its own tokens, averaged over the groups with tokens.

    Args:
        routed: per group, the ``[..., n_g]`` top-k renormalised routed weights (what the official
            layer returns, before the role mask).
        role_ids: ``[...]`` token roles, or ``None`` to let every token count for every group.
        top_k: per group top-k.

    Returns:
        ``L1`` (:func:`load_balance_loss`) and ``L2`` (:func:`importance_cv2_loss`).
    """
    # NOTE: unconfirmed. Eq. 8 is taken as L = CE + alpha1 * L1 + alpha2 * L2 with alpha1 = 1e-3
    # and alpha2 = 1e-4 (from the issue and the project's paper notes; the paper's method section
    # could not be read here, so neither the weights nor the terms were checked against it, and the
    # official release has no training code). The official layer
    # returns only the 11 top-k renormalised routed weights (no logits, no shared weights), so both
    # terms are taken as functions of those: L1 = the Switch/GShard load-balance loss, L2 = the
    # squared coefficient of variation of expert importance (Shazeer et al. 2017), each per role
    # group on that group's own tokens (a group never sees another role's tokens, so the role
    # isolation of the gradients also holds for the auxiliary terms), averaged over the groups that
    # have tokens. The per-group token selection and the averaging are choices made here as well.
    l1: list[torch.Tensor] = []
    l2: list[torch.Tensor] = []
    for g, (w, k) in enumerate(zip(routed, top_k)):
        mask = None if role_ids is None else role_ids == g
        if mask is not None and not bool(mask.any()):
            continue
        l1.append(load_balance_loss(w, k, mask))
        l2.append(importance_cv2_loss(w, mask))
    if not l1:
        zero = sum(w.sum() for w in routed) * 0.0
        return zero, zero
    return torch.stack(l1).mean(), torch.stack(l2).mean()


# --------------------------------------------------------------------------------------------
# The module.


class MoRLinear(nn.Module):
    """A frozen ``nn.Linear`` plus the MoR experts; a drop-in for the linear (same call, same output shape).

    The token roles come from ``forward(x, role_ids=...)`` or, when the module sits inside a model
    that calls it as ``linear(x)`` (every transformers model), from :meth:`set_roles` (the adapter's
    ``set_roles`` / ``roles`` set it on every MoR layer of a model). Without roles the layer refuses
    to run (a one-line :class:`UserError`), so a forgotten role never silently trains the wrong group.

    Attributes:
        base: the wrapped linear (frozen).
        mor_A: ``[E, d_in, r]`` expert down-projections (float32, as the official layer).
        mor_B: ``[E, r, d_out]`` expert up-projections.
        routers: per group ``Linear(d_in, routed[g], bias=False)``.
        shared_gates: per group ``Linear(d_in, 1, bias=False)``.
        disabled: when True the layer returns ``base(x)`` exactly.
    """

    def __init__(self, base: nn.Linear, config: MoRConfig | None = None) -> None:
        super().__init__()
        if not isinstance(base, nn.Linear):
            raise UserError(f"MoR wraps nn.Linear layers only, got {type(base).__name__}")
        cfg = config or MoRConfig()
        cfg.validate()
        self.config = cfg
        self.base = base
        for p in base.parameters():
            p.requires_grad_(False)
        d_in, d_out = base.in_features, base.out_features
        device = base.weight.device
        # NOTE: the official adapter parameters are created in the default dtype (float32) whatever
        # the base dtype, and the input is cast to it; the same here.
        dtype = torch.float32
        E, r = cfg.n_experts, cfg.rank
        self.mor_A = nn.Parameter(torch.empty(E, d_in, r, device=device, dtype=dtype))
        self.mor_B = nn.Parameter(torch.empty(E, r, d_out, device=device, dtype=dtype))
        self.routers = nn.ModuleList(nn.Linear(d_in, n, bias=False, device=device, dtype=dtype) for n in cfg.routed)
        self.shared_gates = nn.ModuleList(nn.Linear(d_in, 1, bias=False, device=device, dtype=dtype)
                                          for _ in cfg.routed)
        self.dropout = nn.Dropout(cfg.dropout) if cfg.dropout > 0 else nn.Identity()
        groups, shared = expert_layout(cfg.routed)
        self.register_buffer("expert_group", torch.tensor(groups, device=device), persistent=False)
        self.register_buffer("expert_shared", torch.tensor(shared, device=device), persistent=False)
        self.disabled = False
        self.record_routing = True
        self._role_ids: torch.Tensor | int | None = None
        self.last_routing: tuple[list[torch.Tensor], torch.Tensor] | None = None
        self.reset_parameters()

    # -- the wrapped linear's attributes, for code that reads them (dtype checks, shapes) --
    @property
    def weight(self) -> torch.Tensor:
        return self.base.weight

    @property
    def bias(self) -> torch.Tensor | None:
        return self.base.bias

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    def reset_parameters(self) -> None:
        """A: Kaiming-uniform (a=sqrt(5)) on the stacked tensor; B: zeros; routers/gates: Kaiming-uniform."""
        # NOTE: as in the official layer, the Kaiming init is applied to the whole [E, d_in, r]
        # tensor, so torch's fan-in is d_in * r (bound 1/sqrt(d_in * r)), not d_in as for a plain
        # LoRA A of shape [r, d_in] (bound 1/sqrt(d_in)).
        nn.init.kaiming_uniform_(self.mor_A, a=math.sqrt(5))
        nn.init.zeros_(self.mor_B)
        for lin in [*self.routers, *self.shared_gates]:
            nn.init.kaiming_uniform_(lin.weight, a=math.sqrt(5))

    def set_roles(self, role_ids: torch.Tensor | int | None) -> None:
        """Roles for the next calls: per token (``[B, T]``), per sequence (``[B]``), one int, or None."""
        self._role_ids = role_ids

    def expert_index(self, group: int) -> torch.Tensor:
        """Indices into the stacked experts of ``group``'s routed and shared experts."""
        return (self.expert_group == group).nonzero().flatten()

    def group_parameters(self, group: int) -> list[tuple[str, torch.Tensor]]:
        """``(name, tensor)`` views of every adapter parameter that belongs to ``group`` (for checks)."""
        idx = self.expert_index(group)
        lo, hi = int(idx[0]), int(idx[-1]) + 1
        return [("mor_A", self.mor_A[lo:hi]), ("mor_B", self.mor_B[lo:hi]),
                (f"routers.{group}.weight", self.routers[group].weight),
                (f"shared_gates.{group}.weight", self.shared_gates[group].weight)]

    def routing(self, x: torch.Tensor, role_ids: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]:
        """Per-token expert weights.

        Args:
            x: ``[..., d_in]`` input in the adapter dtype.
            role_ids: ``[...]`` token roles.

        Returns:
            ``(weights [..., E], active [..., E], routed)``: the role-masked weights in the stacked
            layout (exactly 0 outside the token's group), the boolean active-expert mask, and per
            group the unmasked top-k renormalised routed weights (the official layer's second output).
        """
        cfg = self.config
        columns: list[torch.Tensor] = []
        routed: list[torch.Tensor] = []
        for g, k in enumerate(cfg.top_k):
            w = routed_weights(self.routers[g](x), k).to(x.dtype)
            routed.append(w)
            columns += [w, shared_weight(self.shared_gates[g](x))]
        weights = torch.cat(columns, dim=-1)
        active = role_mask(role_ids, cfg.n_groups)[..., self.expert_group]
        weights = torch.where(active, weights, torch.zeros((), dtype=weights.dtype, device=weights.device))
        return weights, active, routed

    def forward(self, x: torch.Tensor, role_ids: torch.Tensor | int | None = None) -> torch.Tensor:
        out = self.base(x)
        if self.disabled:
            # NOTE: the official forward fails when its adapters are disabled (it returns a routing
            # tensor that the disabled branch never defines); here the disabled layer is the base.
            return out
        roles = role_ids if role_ids is not None else self._role_ids
        if roles is None:
            raise UserError("MoR layer called without role ids; set them with set_roles(model, role_ids) "
                            "or the roles(...) context manager")
        roles = broadcast_roles(roles, x.shape[:-1], device=x.device)
        xa = x.to(self.mor_A.dtype)
        weights, active, routed = self.routing(xa, roles)
        if self.training and self.record_routing:
            self.last_routing = (routed, roles)
        delta = mor_delta(self.dropout(xa), self.mor_A, self.mor_B, weights, active)
        if self.config.scaling != 1.0:
            delta = delta * self.config.scaling
        # NOTE: the official layer adds the float32 update to the base output and casts the sum back
        # to the input dtype; the same here. Its forward also returns the routed weights as a second
        # output (which a stock transformers model cannot take); here they are kept on the module
        # (``last_routing``, in training mode) for the auxiliary losses.
        return (out + delta).to(out.dtype)

    def extra_repr(self) -> str:
        c = self.config
        return (f"in_features={self.in_features}, out_features={self.out_features}, rank={c.rank}, "
                f"routed={list(c.routed)}, top_k={list(c.top_k)}, experts={c.n_experts}, disabled={self.disabled}")
