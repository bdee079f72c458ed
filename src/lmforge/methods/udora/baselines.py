"""Baselines that share UDora's loop (:func:`~lmforge.methods.udora.attack.run_attack`), so that the
arms differ only in what the brief names and compare at equal numbers of evaluated candidates.

* :func:`gcg_attack` — GCG with the target at position 0: the surrogate is the first target's tokens
  as the whole response (nanoGCG's fixed target, a space prepended when ``add_space_before_target``),
  never moved, so the gradient loss is standard GCG's CE on the target and candidates are ranked by
  the same selection loss as UDora's (NOTE: nanoGCG ranks candidates by the CE itself; the ranking is
  kept equal across arms here so that only the placement differs). The trace is still generated every
  step for the success check and early stop.
* :func:`random_search_attack` — UDora's placement and selection loss, but the ``search_width``
  candidates change ``n_replace`` random positions to tokens drawn uniformly from the allowed set
  (ASCII blocklist unless ``allow_non_ascii``), no gradient; same retokenisation filter.

Not in the official repository (the paper compares against GCG-style baselines; these are ours).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from lmforge.methods.udora.attack import AttackResult, AttackState, Case, StepRecord, UDoraConfig, run_attack


def gcg_attack(
    model: torch.nn.Module,
    tokenizer: Any,
    case: Case,
    config: UDoraConfig | None = None,
    *,
    progress: bool = False,
    on_step: Callable[[StepRecord, AttackState], None] | None = None,
    resume_from: AttackState | dict[str, Any] | None = None,
) -> AttackResult:
    """GCG: ``case.targets[0]`` at the first response position (see the module docstring)."""
    return run_attack(model, tokenizer, case, config, placement="start", proposal="gradient",
                      progress=progress, on_step=on_step, resume_from=resume_from)


def random_search_attack(
    model: torch.nn.Module,
    tokenizer: Any,
    case: Case,
    config: UDoraConfig | None = None,
    *,
    progress: bool = False,
    on_step: Callable[[StepRecord, AttackState], None] | None = None,
    resume_from: AttackState | dict[str, Any] | None = None,
) -> AttackResult:
    """Random search with UDora's placement and selection loss (see the module docstring)."""
    return run_attack(model, tokenizer, case, config, placement="intervals", proposal="random",
                      progress=progress, on_step=on_step, resume_from=resume_from)
