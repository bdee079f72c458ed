"""How far a compressed model is from its original on the same inputs: answer NLL and KL, and
ACBench's analysis metrics (ERank per layer, top-k ranking agreement, energy histograms).

The answer NLL is the mean negative log-likelihood of a gold completion's tokens; the KL is
``KL(original || compressed)`` of the next-token distributions at those positions, averaged over
tokens. They sit beside exact-match scores because exact match hides damage until it is large (a
5M tool-call model kept its exact match down to 2 bits while its answer NLL rose).

Checked: lm-eval computes log-likelihoods of continuations but compares no two models, and no kept
library computes ERank/top-k agreement between two models; the math is :mod:`lmforge.eval.compare`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from lmforge.common.batching import inference
from lmforge.common.generation import encode_prompt, eos_token_ids, max_positions, model_device, pad_token_id
from lmforge.common.scoring import encode_pair
from lmforge.eval.compare import energy, erank, topk_agreement

__all__ = ["TOPK", "answer_divergence", "compare_internals"]

TOPK = (3, 10, 20)


def _fit(ctx: list[int], cont: list[int], limit: int | None) -> tuple[list[int], list[int]]:
    if limit is None or len(ctx) + len(cont) <= limit:
        return ctx, cont
    cont = cont[: max(1, limit - 1)]
    return ctx[-(limit - len(cont)) :], cont


def _batch(rows: list[list[int]], pad: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        ids[i, : len(r)] = torch.tensor(r, dtype=torch.long)
        mask[i, : len(r)] = 1
    return ids.to(device), mask.to(device)


@torch.no_grad()
def answer_divergence(
    model: nn.Module, base: nn.Module | None, tokenizer: Any, pairs: Sequence[tuple[str, str]], *, batch_size: int = 8,
    base_cache: dict[tuple[tuple[int, ...], tuple[int, ...]], torch.Tensor] | None = None,
) -> dict[str, list[float]]:
    """Per pair ``(prompt, gold completion)``: ``nll`` (mean over completion tokens, nats) of ``model``,
    and ``kl`` = mean ``KL(base || model)`` over those positions (0 when ``base`` is None).

    ``base_cache`` (optional) holds the base model's log-probabilities at the completion positions,
    keyed by the pair's tokens: with ``base`` None it is filled from ``model`` (the original, scored
    first), and with a ``base`` a batch whose pairs are all in it skips the base forward. One cache
    serves one base model at one dtype (ACBench keeps one per model of a run); a miss runs the base.
    """
    limit = max_positions(model)
    pad = pad_token_id(tokenizer, eos_token_ids(model, tokenizer))
    encoded = [_fit(*encode_pair(tokenizer, p, c), limit) for p, c in pairs]
    order = sorted(range(len(encoded)), key=lambda i: len(encoded[i][0]) + len(encoded[i][1]))
    nll = [0.0] * len(encoded)
    kl = [0.0] * len(encoded)
    dev = model_device(model)
    with inference(model):
        for s in range(0, len(order), batch_size):
            idx = order[s : s + batch_size]
            rows = [encoded[i][0] + encoded[i][1] for i in idx]
            ids, mask = _batch(rows, pad, dev)
            lp = F.log_softmax(model(input_ids=ids, attention_mask=mask, use_cache=False).logits.float(), -1)
            keys = [(tuple(encoded[i][0]), tuple(encoded[i][1])) for i in idx]
            cached = base is not None and base_cache is not None and all(k in base_cache for k in keys)
            lp_base = None
            if base is not None and not cached:
                with inference(base):
                    out = base(input_ids=ids.to(model_device(base)), attention_mask=mask.to(model_device(base)), use_cache=False)
                lp_base = F.log_softmax(out.logits.float(), -1).to(lp.device)
            for r, i in enumerate(idx):
                ctx, cont = encoded[i]
                pos = torch.arange(len(ctx) - 1, len(ctx) - 1 + len(cont), device=lp.device)
                target = torch.tensor(cont, device=lp.device)
                nll[i] = float(-lp[r, pos, target].mean())
                if base is None:
                    if base_cache is not None:
                        base_cache[keys[r]] = lp[r, pos].cpu().clone()
                    continue
                pb = base_cache[keys[r]].to(lp.device) if cached else lp_base[r, pos]
                if base_cache is not None and not cached:
                    base_cache[keys[r]] = pb.cpu().clone()
                kl[i] = float((pb.exp() * (pb - lp[r, pos])).sum(-1).mean())
    return {"nll": nll, "kl": kl}


def _forward_states(model: nn.Module, ids: torch.Tensor) -> tuple[list[torch.Tensor], torch.Tensor]:
    with inference(model):
        out = model(input_ids=ids.to(model_device(model)), output_hidden_states=True, use_cache=False)
    return [h[0].float().cpu() for h in out.hidden_states], out.logits[0].float().cpu()


@torch.no_grad()
def compare_internals(
    model: nn.Module, base: nn.Module, tokenizer: Any, texts: Sequence[str], *, max_tokens: int = 256,
    bins: int = 40,
) -> dict[str, Any]:
    """ACBench's analysis of ``model`` against ``base`` on ``texts`` (each cut to ``max_tokens``).

    Returns ``erank`` (per hidden-state layer, embeddings first: ``original``, ``compressed``, ``diff``),
    ``topk`` (``k`` -> Jaccard / Kendall tau / Spearman rho, averaged over all positions) and
    ``energy`` (a shared-bin histogram of the per-position energies of both models, with means).
    """
    limit = min(max_tokens, max_positions(model) or max_tokens)
    hs_o: list[list[torch.Tensor]] = []
    hs_c: list[list[torch.Tensor]] = []
    lo: list[torch.Tensor] = []
    lc: list[torch.Tensor] = []
    for text in texts:
        ids = torch.tensor([encode_prompt(tokenizer, text)[:limit]], dtype=torch.long)
        if ids.shape[1] < 2:
            continue
        h_o, z_o = _forward_states(base, ids)
        h_c, z_c = _forward_states(model, ids)
        hs_o.append(h_o)
        hs_c.append(h_c)
        lo.append(z_o)
        lc.append(z_c)
    if not lo:
        raise ValueError("no probe text has two or more tokens")
    n_layers = len(hs_o[0])
    er_o = [erank(torch.cat([h[layer] for h in hs_o])) for layer in range(n_layers)]
    er_c = [erank(torch.cat([h[layer] for h in hs_c])) for layer in range(n_layers)]
    zo, zc = torch.cat(lo), torch.cat(lc)
    topk = {str(k): topk_agreement(zo, zc, k) for k in TOPK if k <= zo.shape[-1]}
    e_o, e_c = energy(zo).numpy(), energy(zc).numpy()
    edges = np.linspace(float(min(e_o.min(), e_c.min())), float(max(e_o.max(), e_c.max())) + 1e-9, bins + 1)
    return {
        "tokens": int(zo.shape[0]),
        "erank": {"original": er_o, "compressed": er_c, "diff": [c - o for o, c in zip(er_o, er_c)]},
        "topk": topk,
        "energy": {
            "edges": edges.tolist(),
            "original": np.histogram(e_o, edges)[0].tolist(),
            "compressed": np.histogram(e_c, edges)[0].tolist(),
            "mean_original": float(e_o.mean()),
            "mean_compressed": float(e_c.mean()),
        },
    }
