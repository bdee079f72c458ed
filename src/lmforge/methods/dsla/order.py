"""DSLA-Serve's layer conversion order: last-token attention entropy per layer, lowest first.

Follows ``calculate_attention_entropy_order`` in the official ``src/server.py``
(utnslab/DSLA-Serve): one forward pass over a sample prompt with attention weights returned; for
each layer the attention row of the **last** query token is taken per head, the weights on masked
(padding) keys are set to 0 and the row is renormalised (sum clamped at 1e-9), the entropy
``-sum p log p`` is taken with terms ``p <= 1e-9`` counted as 0, and it is averaged over heads (and
over the batch rows). Layers are then sorted by **ascending** entropy (Python's stable sort, so ties
keep layer order): the first layer of the order is the first converted to DSLA. The official server
falls back to ``31, 30, ..., 0`` when this computation fails (:func:`fallback_order`).

Attention weights need the eager attention: the model is switched to ``"eager"`` with
``set_attn_implementation`` for that one forward and switched back to its previous implementation
afterwards (also on error); the training flag is restored too.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from lmforge.common.batching import inference
from lmforge.common.errors import UserError

_TINY = 1e-9  # the official clamp and the official "p counts as zero" threshold


def fallback_order(n_layers: int) -> list[int]:
    """The official order when the entropy computation fails: the last layer first.

    Args:
        n_layers: number of decoder layers (the official code hard-codes 32: ``range(31, -1, -1)``).

    Returns:
        ``[n_layers - 1, ..., 1, 0]``.
    """
    return list(range(n_layers - 1, -1, -1))


def last_row_entropy(last_row: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
    """Entropy of each head's last-query attention row, masked keys excluded.

    Args:
        last_row: ``(batch, heads, keys)`` attention probabilities of the last query position.
        attention_mask: ``(batch, keys)``, 0 on padding keys; None means no padding.

    Returns:
        ``(batch, heads)`` entropies in nats, computed in float64: the masked weights are zeroed,
        the row renormalised by its sum (clamped at 1e-9) and ``-sum p log p`` taken over
        ``p > 1e-9`` only, as the official code does.
    """
    p = last_row.detach().to(torch.float64).clone()
    if attention_mask is not None:
        mask = attention_mask.to(p.device)[:, None, :].expand_as(p)
        p[mask == 0] = 0.0
    p = p / p.sum(dim=-1, keepdim=True).clamp(min=_TINY)
    keep = p > _TINY
    terms = torch.where(keep, p * torch.log(torch.where(keep, p, torch.ones_like(p))), torch.zeros_like(p))
    return -terms.sum(dim=-1)


def entropy_order(
    model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None
) -> tuple[list[int], list[float]]:
    """Layer conversion order by ascending last-token attention entropy (official DSLA-Serve).

    Args:
        model: a Hugging Face causal LM whose attention modules return their weights under eager
            attention (Llama, Qwen2, Mistral, ...); all its layers must still be softmax attention.
        input_ids: ``(batch, seq)`` or ``(seq,)`` token ids of the sample prompt(s), at least 2
            tokens long. Padded batches must be **left**-padded (the last column is the query).
        attention_mask: ``(batch, seq)``, 0 on padding; None for an unpadded batch.

    Returns:
        ``(order, entropies)``: ``order`` lists the layer indices by ascending entropy (convert
        ``order[0]`` first); ``entropies[i]`` is layer ``i``'s entropy in nats, averaged over heads
        and batch rows.

    Raises:
        UserError: a prompt shorter than 2 tokens, a right-padded batch, or a model that returns no
            attention weights for every layer.
    """
    if input_ids.dim() == 1:
        input_ids = input_ids[None, :]
        if attention_mask is not None and attention_mask.dim() == 1:
            attention_mask = attention_mask[None, :]
    if input_ids.dim() != 2:
        raise UserError(f"entropy_order: input_ids must be (batch, seq), got shape {tuple(input_ids.shape)}")
    if input_ids.shape[1] < 2:
        # The official code raises here too (and the server then falls back to 31..0).
        raise UserError("entropy_order: the sample prompt is too short (fewer than 2 tokens)")
    kwargs: dict[str, Any] = {}
    if attention_mask is not None:
        if attention_mask.shape != input_ids.shape:
            raise UserError(
                f"entropy_order: attention_mask shape {tuple(attention_mask.shape)} != input_ids shape "
                f"{tuple(input_ids.shape)}"
            )
        if bool((attention_mask[:, -1] == 0).any()):
            raise UserError("entropy_order: a row ends in padding; pad on the left (the last token is the query)")
        if bool((attention_mask == 0).any()):
            # NOTE: the official code passes no position_ids (it only ever runs one unpadded prompt);
            # for a padded batch we give each row the positions it would have unpadded, as lmforge's
            # generation engine does, so a left-padded row scores exactly like the row alone.
            kwargs["position_ids"] = (attention_mask.long().cumsum(dim=-1) - 1).clamp(min=0).to(input_ids.device)
        kwargs["attention_mask"] = attention_mask.to(input_ids.device)

    n_layers = int(model.config.num_hidden_layers)
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with inference(model):
            out = model(input_ids=input_ids, output_attentions=True, use_cache=False, **kwargs)
    finally:
        model.set_attn_implementation(previous)

    attentions = getattr(out, "attentions", None)
    if attentions is None or len(attentions) != n_layers or any(a is None for a in attentions):
        got = 0 if attentions is None else sum(a is not None for a in attentions)
        raise UserError(
            f"entropy_order: the model returned attention weights for {got} of its {n_layers} layers; "
            "it needs eager softmax attention in every layer (compute the order before converting any)"
        )
    entropies: list[float] = []
    for i, attn in enumerate(attentions):
        if not bool(torch.isfinite(attn[:, :, -1, :]).all()):
            # transformers' eager mask overflows to -inf on fully padded query rows in float64,
            # which turns the next layers into NaN: say so rather than return entropies of 0.
            raise UserError(
                f"entropy_order: layer {i}'s attention weights are not finite (a padded float64 batch? "
                "use float32/bfloat16 or unpadded prompts)"
            )
        ent = last_row_entropy(attn[:, :, -1, :], attention_mask)
        entropies.append(float(ent.mean().item()))
    order = sorted(range(n_layers), key=lambda i: entropies[i])
    return order, entropies
