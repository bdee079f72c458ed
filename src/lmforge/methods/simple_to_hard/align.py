"""Gradient alignment between a strategy's training data and HARD images (the paper's §5 measure).

The paper studies why a strategy helps simple-to-hard generalisation on images through the loss
dynamics and a gradient-alignment measure: how well a step on the strategy's training data also
lowers the loss on HARD image examples. Here, at checkpoints during training,

    alignment = cos(g_train, g_HARD-image),

with ``g_train`` the gradient of the mean loss over a batch of the strategy's own training data and
``g_HARD-image`` the gradient of the mean loss over a fixed set of HARD image examples (their gold
responses); the first-order loss drop a step of size eta predicts on HARD images is
``eta * <g_train, g_HARD-image>`` (:func:`predicted_drop`), reported beside it.

# NOTE: the paper's exact definition could not be confirmed offline: its §5 text is not in the
# stored pages (only the abstract: "a measure of gradient alignment that seems to identify training
# strategies that promote better S2H generalization") and the official repository has no alignment
# code. The cosine of the two full-parameter gradients is the reconstruction in the project's notes
# (``shared/papers/agents.md`` §5, marked [recon]); ``predicted_drop`` is the inner-product variant.

Gradients come from ``torch.func.grad`` over ``torch.func.functional_call``, so the model's own
``.grad`` fields are never touched (training state is left as it was).
"""

from __future__ import annotations

import torch
from torch.func import functional_call, grad


def flat_grad(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The gradient of ``model(**batch).loss`` over every trainable parameter, as one flat vector."""
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    params = {n: p.detach() for n, p in model.named_parameters() if p.requires_grad}
    frozen = {n: p.detach() for n, p in model.named_parameters() if not p.requires_grad}
    buffers = {n: b for n, b in model.named_buffers()}

    def loss_fn(ps: dict[str, torch.Tensor]) -> torch.Tensor:
        return functional_call(model, {**ps, **frozen, **buffers}, args=(), kwargs=batch).loss

    was = model.training
    model.eval()  # no dropout in the probe
    try:
        g = grad(loss_fn)(params)
    finally:
        model.train(was)
    return torch.cat([g[n].reshape(-1) for n in names])


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()  # float64: cos(g, g) is 1 to rounding
    return float(torch.dot(a, b) / (a.norm() * b.norm()).clamp_min(1e-300))


def predicted_drop(g_train: torch.Tensor, g_hard: torch.Tensor, lr: float) -> float:
    """First-order HARD-image loss drop of one plain gradient step of size ``lr`` on the training batch."""
    return float(lr * torch.dot(g_train, g_hard))


def alignment(model: torch.nn.Module, train_batch: dict[str, torch.Tensor],
              hard_batch: dict[str, torch.Tensor] | torch.Tensor) -> float:
    """cos(g_train, g_HARD-image); ``hard_batch`` may be a precomputed flat gradient."""
    g_h = hard_batch if isinstance(hard_batch, torch.Tensor) else flat_grad(model, hard_batch)
    return cosine(flat_grad(model, train_batch), g_h)
