"""A ``torch.utils.data`` batch sampler that yields ISF groups as micro-batches.

Give it the per-sample lengths; it packs them with :func:`~lmforge.methods.omnibal.isf.isf` and, on
each data-parallel rank, yields that rank's groups as lists of dataset indices, one group per
micro-batch, in the order Megatron's random sampler walks the official ``BalancedDataset`` (one
packed group per item, ``micro_batch_size = 1``; :func:`~lmforge.methods.omnibal.metrics.megatron_random_batches`).
Use it as ``DataLoader(dataset, batch_sampler=ISFBatchSampler(...), collate_fn=...)``; call
:meth:`set_epoch` each epoch for a fresh order (the epoch seeds the permutation, as in Megatron).
Every rank gets the same number of micro-batches (the remainder groups are dropped, as Megatron
drops them); :attr:`dropped` counts them.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
from torch.utils.data import Sampler

from lmforge.methods.omnibal.isf import ISFResult, isf
from lmforge.methods.omnibal.metrics import megatron_random_batches


class ISFBatchSampler(Sampler[list[int]]):
    """Yield this rank's ISF groups (lists of sample indices), one per micro-batch.

    Args:
        vit: ``vit_num`` per dataset sample.
        tok: ``token_num`` per dataset sample.
        vit_cap: ViT cap ``Q_v``.
        token_cap: token cap ``Q_t``.
        rank: this data-parallel rank.
        dp_size: number of data-parallel ranks.
        rounds: ISF rounds (official 50).
        seed: ISF seed (official 1024).
        token_floor: full-group token floor (default ``token_cap − 128``).
    """

    def __init__(self, vit: np.ndarray, tok: np.ndarray, vit_cap: int, token_cap: int, rank: int = 0,
                 dp_size: int = 1, rounds: int = 50, seed: int = 1024, token_floor: int | None = None) -> None:
        self._setup(isf(vit, tok, vit_cap, token_cap, rounds=rounds, seed=seed, token_floor=token_floor),
                    rank, dp_size)

    @classmethod
    def from_result(cls, result: ISFResult, rank: int = 0, dp_size: int = 1) -> ISFBatchSampler:
        """A sampler over groups ISF already made (no re-packing)."""
        self = cls.__new__(cls)
        self._setup(result, rank, dp_size)
        return self

    def _setup(self, result: ISFResult, rank: int, dp_size: int) -> None:
        self.result = result
        self.rank, self.dp_size, self.epoch = rank, dp_size, 0
        n = len(result.groups)
        if n < dp_size:
            raise ValueError(f"ISF made {n} groups, fewer than the {dp_size} data-parallel ranks")
        self.dropped = n - (n // dp_size) * dp_size

    def set_epoch(self, epoch: int) -> None:
        """Seed the next pass's permutation with ``epoch``."""
        self.epoch = int(epoch)

    def __len__(self) -> int:
        return len(self.result.groups) // self.dp_size

    def __iter__(self) -> Iterator[list[int]]:
        order = megatron_random_batches(len(self.result.groups), 1, self.rank, self.dp_size, self.epoch)
        for (i,) in order:
            yield self.result.groups[int(i)].tolist()
