"""Gradient alignment between a strategy's training data and HARD images (the paper's §5 measure).

The paper (Park et al., ICML 2025, arXiv 2501.02669, §5 "A Study on Loss Dynamics and Gradient
Alignment for S2H generalization") studies why a strategy helps simple-to-hard generalisation on
images through the loss dynamics on HARD images and a gradient-alignment score: how well a step on the
strategy's training data also lowers the loss on HARD image examples. Here, at probes during training,

    alignment = cos(g_train, g_HARD-image),

with ``g_train`` the gradient of the loss over a fixed batch of the strategy's own training data and
``g_HARD-image`` the gradient of the loss over a fixed set of HARD image examples (their gold
responses), both over every trainable parameter. The loss is the model's own: the mean cross-entropy
over all response tokens of the batch (token-weighted, as training uses it), so a batch's gradient is
the token-weighted mean of its examples' gradients. :func:`probe` reports beside the cosine

- ``drop = eta * <g_train, g_HARD>``: the first-order HARD-image loss drop of one plain gradient step
  of size eta on the training batch (:func:`predicted_drop`);
- ``ratio = <g_train, g_HARD> / |g_train|^2``: that drop per unit of the first-order drop of the
  training loss itself (:func:`drop_ratio`);
- the two gradient norms (the paper compares strategies' alignment against the gradient norm).

:func:`hard_image_losses` gives the §5 loss decomposition on HARD images: the conversion loss (the
image-to-text part of an image-via-text response), the reasoning loss (the CoT and answer given the
image and the gold conversion) and the direct loss (CoT and answer straight from the image).

# NOTE: what could and could not be confirmed (searched 2026-12-05 in the stored pages and code):
# - The paper's §5 text is not readable here: the stored arXiv pages (arxiv.org/html/2501.02669v2)
#   stop at the introduction, and the official repository (princeton-pli/VLM_S2H @ 9cba59a, all 32
#   commits) has no alignment or loss-analysis code; its README only says the method was "inspired"
#   by "a measure of gradient alignment".
# - Secondary sources (auto-generated summaries of the paper in public note repositories, three
#   files) say: (a) all three: the score relates the gradient of the training data to the gradient
#   of the HARD-image loss, higher meaning the training step lowers the HARD loss more, backed by a
#   first-order theorem in the appendix (H.1 in one, F.1/F.2 in another); (b) one: Mix+ and
#   Align-Mix+ score higher, especially at large gradient norm (translated); (c) one: §5 tracks three
#   HARD-image losses, conversion l_(I#;T), reasoning given the conversion l_(I,#T;S) and direct
#   l_(I;S).
# - Unconfirmed: the exact normalisation (the cosine here; one source's wording, "the ratio between
#   training-update alignment and immediate held-out hard-image loss decrease", may mean ``ratio``);
#   which HARD loss enters ``g_HARD`` (here both image formats' gold responses, see
#   ``experiment.hard_probe_batch``); which parameters (the official fine-tuning freezes the vision
#   towers, so its trainable set is the LLM and projector; here the ViT trains too and is included);
#   how scores are aggregated over training (the reproduction averages the cosine over its probes).
#   ``ratio`` and the norms are recorded so the alternative reading can be checked on the same runs.

Gradients come from ``torch.func.grad`` over ``torch.func.functional_call``, so the model's own
``.grad`` fields are never touched (training state is left as it was).
"""

from __future__ import annotations

import torch
from torch.func import functional_call, grad

from lmforge.methods.simple_to_hard import mini, vlm
from lmforge.methods.simple_to_hard.train import make_batch

MEASURES = ("cos", "ratio")


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
    return float(lr * torch.dot(g_train.double(), g_hard.double()))


def drop_ratio(g_train: torch.Tensor, g_hard: torch.Tensor) -> float:
    """``<g_train, g_hard> / |g_train|^2``: the first-order HARD-image loss drop of a plain gradient step
    on the training batch per unit of the first-order drop of the training loss (any step size)."""
    a, b = g_train.double(), g_hard.double()
    return float(torch.dot(a, b) / torch.dot(a, a).clamp_min(1e-300))


def alignment(model: torch.nn.Module, train_batch: dict[str, torch.Tensor],
              hard_batch: dict[str, torch.Tensor] | torch.Tensor, measure: str = "cos") -> float:
    """cos(g_train, g_HARD-image) (or :func:`drop_ratio` with ``measure="ratio"``); ``hard_batch`` may
    be a precomputed flat gradient."""
    if measure not in MEASURES:
        raise ValueError(f"unknown alignment measure {measure!r}; known: {', '.join(MEASURES)}")
    g_h = hard_batch if isinstance(hard_batch, torch.Tensor) else flat_grad(model, hard_batch)
    g_t = flat_grad(model, train_batch)
    return cosine(g_t, g_h) if measure == "cos" else drop_ratio(g_t, g_h)


def probe(model: torch.nn.Module, train_batch: dict[str, torch.Tensor],
          hard_batch: dict[str, torch.Tensor] | torch.Tensor, lr: float) -> dict[str, float]:
    """Every alignment statistic of one probe: ``cos``, ``drop`` (at step size ``lr``), ``ratio`` and
    the norms ``g_train_norm``, ``g_hard_norm``."""
    g_h = hard_batch if isinstance(hard_batch, torch.Tensor) else flat_grad(model, hard_batch)
    g_t = flat_grad(model, train_batch)
    return {"cos": cosine(g_t, g_h), "drop": predicted_drop(g_t, g_h, lr), "ratio": drop_ratio(g_t, g_h),
            "g_train_norm": float(g_t.double().norm()), "g_hard_norm": float(g_h.double().norm())}


def _examples(puzzles: list[mini.Puzzle], data_type: str) -> list[tuple]:
    out = []
    for p in puzzles:
        human, gpt = (t["value"] for t in mini.conversation(p, data_type)["conversations"])
        out.append((human, gpt, mini.render_array(p)))
    return out


def conversion_split(tok, puzzles: list[mini.Puzzle]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """Two label-masked copies of the HARD image-via-text batch (``image2answer+text``): the first keeps
    the loss on the conversion (``convert`` + the text table), the second on the rest (CoT, answer, EOS),
    which the model predicts given the image, the prompt and the gold conversion."""
    exs = _examples(puzzles, "image2answer+text")
    batch = make_batch(tok, exs, list(range(len(exs))))
    conv, reason = batch["labels"].clone(), batch["labels"].clone()
    for k, p in enumerate(puzzles):
        ids, _ = vlm.encode(tok, exs[k][0], f"convert {mini.text_table(p)}")
        start = len(ids) - 1  # the first CoT token (the encoding ends with EOS)
        conv[k, start:] = -100
        reason[k, :start] = -100
    return {**batch, "labels": conv}, {**batch, "labels": reason}


@torch.no_grad()
def hard_image_losses(model: torch.nn.Module, tok, puzzles: list[mini.Puzzle]) -> dict[str, float]:
    """The §5 loss decomposition on HARD images (mean token cross-entropy on gold responses):
    ``conversion`` l_(I#;T), ``reasoning`` l_(I,#T;S) (given the gold conversion) and ``direct``
    l_(I;S) (the image-only response: CoT and answer straight from the image)."""
    was = model.training
    model.eval()
    try:
        conv, reason = conversion_split(tok, puzzles)
        direct = make_batch(tok, _examples(puzzles, "image2answer"), list(range(len(puzzles))))
        return {"conversion": float(model(**conv).loss), "reasoning": float(model(**reason).loss),
                "direct": float(model(**direct).loss)}
    finally:
        model.train(was)
