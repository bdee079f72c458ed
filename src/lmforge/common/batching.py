"""The loop the engines share: eval-mode inference over length-sorted batches with a progress bar.

Generation and continuation scoring both sort their inputs longest first (similar lengths share a
batch, and an out-of-memory error shows up on the first batch), run them in batches under
``torch.inference_mode()`` with the model in eval mode (its training flag restored afterwards), and
return results in input order.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

import torch
from torch import nn

from lmforge.common.progress import make_progress

R = TypeVar("R")


@contextlib.contextmanager
def inference(model: nn.Module) -> Iterator[None]:
    """Eval mode and ``torch.inference_mode()`` for the block; the training flag is restored."""
    was_training = model.training
    model.eval()
    try:
        with torch.inference_mode():
            yield
    finally:
        model.train(was_training)


def run_in_batches(
    lengths: Sequence[int],
    batch_size: int,
    fn: Callable[[list[int]], list[R]],
    *,
    progress: bool = False,
    description: str = "batches",
) -> list[R]:
    """Call ``fn(indices)`` on length-sorted batches of item indices; results in input order.

    Args:
        lengths: one length per item (the sort key).
        batch_size: items per call of ``fn``.
        fn: takes a batch of item indices and returns one result per index, in that order.
        progress: show a progress bar over items.
        description: the bar's label.
    """
    order = sorted(range(len(lengths)), key=lambda i: lengths[i], reverse=True)
    results: list[R | None] = [None] * len(lengths)
    prog = make_progress() if progress else None
    with prog if prog is not None else contextlib.nullcontext():
        task = prog.add_task(description, total=len(lengths), info="") if prog is not None else None
        for start in range(0, len(order), batch_size):
            batch = order[start : start + batch_size]
            outs = fn(batch)
            if len(outs) != len(batch):
                raise RuntimeError(f"batch function returned {len(outs)} results for {len(batch)} items")
            for i, out in zip(batch, outs):
                results[i] = out
            if prog is not None and task is not None:
                prog.advance(task, len(batch))
    return [r for r in results if r is not None]
