"""PadRatio and DistRatio exactly as the official test computes them (``test_balanced_dynamic_batch.py``).

A *dataset item* costs ``(vit, tok)``: one sample for plain random batching, one packed ISF group
(its sums) for OmniBal. Every data-parallel rank draws micro-batches of ``micro_bs`` items with
Megatron's random sampler (:func:`megatron_random_batches`: rank ``r`` owns the ``r``-th bucket of
``(N // (micro_bs·dp))·micro_bs`` items and walks it in ``torch.randperm`` order seeded by the
epoch). A micro-batch is padded to its longest item. Then:

* ``PadRatio = Σ (max_len − len_i) / Σ (max_len · micro_bs)`` over every micro-batch of every rank;
* at step ``k`` rank ``r`` costs ``T_r = max_len`` (LLM) and ``V_r = Σ vit`` (ViT), and
  ``DistRatio = mean_k Σ_r (T_max − T_r) / (T_max · dp)``, the same for ViT with the official
  ``max(V_max·dp, 1)`` guard.

Checked: no kept library computes these (they are the paper's definitions); written here in numpy.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class BalanceMetrics:
    """PadRatio and the two DistRatios (ViT, LLM), the paper's Table 1 columns."""

    pad_ratio: float
    dist_ratio_vit: float
    dist_ratio_llm: float
    steps: int

    @property
    def total(self) -> float:
        """The cap search's objective: PadRatio + both DistRatios."""
        return self.pad_ratio + self.dist_ratio_vit + self.dist_ratio_llm


def megatron_random_batches(n_items: int, micro_bs: int, rank: int, dp_size: int, epoch: int = 0) -> np.ndarray:
    """Rank ``rank``'s micro-batches as an ``[steps, micro_bs]`` index array (Megatron's RandomSampler)."""
    if n_items < 1 or micro_bs < 1 or dp_size < 1 or not 0 <= rank < dp_size:
        raise ValueError(f"bad sampler arguments: n_items={n_items} micro_bs={micro_bs} rank={rank} dp={dp_size}")
    bucket = (n_items // (micro_bs * dp_size)) * micro_bs
    g = torch.Generator()
    g.manual_seed(epoch)
    order = torch.randperm(bucket, generator=g).numpy().astype(np.int64)
    idx = rank * bucket + order
    steps = bucket // micro_bs
    return idx[: steps * micro_bs].reshape(steps, micro_bs)


def balance_metrics(item_vit: np.ndarray, item_tok: np.ndarray, dp_size: int, micro_bs: int,
                    epoch: int = 0) -> BalanceMetrics:
    """PadRatio and DistRatios of an epoch of Megatron random micro-batches over ``dp_size`` ranks."""
    item_vit = np.asarray(item_vit, dtype=np.int64)
    item_tok = np.asarray(item_tok, dtype=np.int64)
    per_rank = [megatron_random_batches(len(item_tok), micro_bs, r, dp_size, epoch) for r in range(dp_size)]
    steps = per_rank[0].shape[0]
    if steps == 0:
        raise ValueError(f"{len(item_tok)} items are too few for {dp_size} ranks × micro-batches of {micro_bs}")
    toks = np.stack([item_tok[b] for b in per_rank])  # [dp, steps, micro_bs]
    vits = np.stack([item_vit[b] for b in per_rank])
    max_len = toks.max(axis=2)  # [dp, steps]
    pad = float((max_len[..., None] - toks).sum())
    pad_ratio = pad / float((max_len * micro_bs).sum())
    t_max = max_len.max(axis=0)  # [steps]
    llm = ((t_max[None] - max_len).sum(axis=0) / (t_max * dp_size).astype(np.float64)).mean()
    v = vits.sum(axis=2)
    v_max = v.max(axis=0)
    vit_r = ((v_max[None] - v).sum(axis=0) / np.maximum(v_max * dp_size, 1).astype(np.float64)).mean()
    return BalanceMetrics(pad_ratio=float(pad_ratio), dist_ratio_vit=float(vit_r), dist_ratio_llm=float(llm),
                          steps=int(steps))
