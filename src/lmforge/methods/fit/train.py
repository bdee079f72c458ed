"""Fine-tuning on FIT data with TRL's ``SFTTrainer`` (Lamb et al., ICML 2025, arXiv 2410.22944).

FIT is "only a data format over SFT" (the notes' TRL overlap): the examples from
:mod:`lmforge.methods.fit.data` are TRL prompt/completion records, and ``SFTTrainer`` with
``completion_only_loss=True`` minimises ``-log p(completion | prompt)``, which is the FIT objective
``E[-log p(y_focus | task, I_focus, x)]`` (plus the EOS token TRL appends to each completion).

Checked: TRL 1.16's ``SFTTrainer`` runs the tiny zoo-sized Llamas on one CPU thread; measured
here, it costs about 2-4x a bare loop per step (the Trainer's bookkeeping and TRL's entropy and
token-accuracy metrics), which the reproduction's budget affords, so it is used rather than a
hand-written loop. Early stopping on validation cross-entropy (the paper's rule) is a
``TrainerCallback`` that keeps the best weights in memory and restores them at the end, so no
checkpoint is written to disk.
"""

from __future__ import annotations

import copy
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from lmforge.methods.fit.config import FITConfig


@dataclass
class TrainReport:
    """What a run did.

    Attributes:
        losses: ``(step, training loss)`` as logged.
        eval_losses: ``(step, validation cross-entropy)`` at each check.
        best_step: the step whose weights were kept (the last step without early stopping).
        steps_run: optimiser steps actually taken.
        seconds: wall time of ``trainer.train()``.
    """

    losses: list[tuple[int, float]] = field(default_factory=list)
    eval_losses: list[tuple[int, float]] = field(default_factory=list)
    best_step: int = 0
    steps_run: int = 0
    seconds: float = 0.0


def _records(examples: Sequence[dict[str, Any]]) -> list[dict[str, str]]:
    return [{"prompt": e["prompt"], "completion": e["completion"]} for e in examples]


def train_sft(model: torch.nn.Module, tokenizer: Any, examples: Sequence[dict[str, Any]], cfg: FITConfig,
              val_examples: Sequence[dict[str, Any]] | None = None) -> TrainReport:
    """Fine-tune ``model`` in place on prompt/completion ``examples`` (FIT or SFT(y) data).

    Args:
        model: a causal LM (trained in fp32 on CPU).
        tokenizer: its tokenizer (needs a pad or EOS token).
        examples: records with ``prompt`` and ``completion``.
        cfg: the schedule.
        val_examples: held-out records for early stopping (needs ``cfg.eval_every > 0``).
    """
    import time

    import datasets
    from transformers import PrinterCallback, TrainerCallback
    from trl import SFTConfig, SFTTrainer

    datasets.disable_progress_bars()
    report = TrainReport()
    use_val = bool(val_examples) and cfg.eval_every > 0
    best: dict[str, Any] = {"loss": float("inf"), "state": None, "step": 0, "bad": 0}

    class _EarlyStop(TrainerCallback):  # type: ignore[misc]
        def on_evaluate(self, args: Any, state: Any, control: Any, metrics: dict[str, float] | None = None,
                        **kw: Any) -> None:
            loss = float((metrics or {}).get("eval_loss", float("inf")))
            report.eval_losses.append((int(state.global_step), loss))
            if loss < best["loss"]:
                best.update(loss=loss, step=int(state.global_step), bad=0,
                            state=copy.deepcopy({k: v.detach().clone() for k, v in model.state_dict().items()}))
            else:
                best["bad"] += 1
                if best["bad"] >= cfg.patience:
                    control.should_training_stop = True

    with tempfile.TemporaryDirectory(prefix="lmforge-fit-") as tmp:
        args = SFTConfig(
            output_dir=tmp, max_steps=cfg.steps, learning_rate=cfg.lr, per_device_train_batch_size=cfg.batch_size,
            per_device_eval_batch_size=max(cfg.batch_size, 64), warmup_steps=int(cfg.warmup_ratio * cfg.steps),
            weight_decay=cfg.weight_decay, max_length=cfg.max_length, completion_only_loss=True,
            eval_strategy="steps" if use_val else "no", eval_steps=cfg.eval_every if use_val else None,
            logging_steps=10, save_strategy="no", report_to=[], use_cpu=True, dataloader_num_workers=0,
            seed=cfg.seed, data_seed=cfg.seed, disable_tqdm=True, bf16=False, fp16=False,
        )
        trainer = SFTTrainer(
            model=model, args=args, processing_class=tokenizer,
            train_dataset=datasets.Dataset.from_list(_records(examples)),
            eval_dataset=datasets.Dataset.from_list(_records(val_examples)) if use_val else None,
            callbacks=[_EarlyStop()] if use_val else None,
        )
        # disable_tqdm swaps the progress bar for a callback that prints every log line; drop it.
        trainer.remove_callback(PrinterCallback)
        t0 = time.perf_counter()
        trainer.train()
        report.seconds = time.perf_counter() - t0
        report.steps_run = int(trainer.state.global_step)
        for rec in trainer.state.log_history:
            if "loss" in rec and "step" in rec:
                report.losses.append((int(rec["step"]), float(rec["loss"])))
    if use_val:
        # A last check at the final step, so a run that ends on its best weights keeps them.
        if not report.eval_losses or report.eval_losses[-1][0] != report.steps_run:
            loss = validation_loss(model, tokenizer, val_examples or [], batch_size=64)
            report.eval_losses.append((report.steps_run, loss))
            if loss < best["loss"]:
                best.update(loss=loss, step=report.steps_run, state=None)
        if best["state"] is not None:
            model.load_state_dict(best["state"])
        report.best_step = int(best["step"])
    else:
        report.best_step = report.steps_run
    model.eval()
    return report


def validation_loss(model: torch.nn.Module, tokenizer: Any, examples: Sequence[dict[str, Any]],
                    batch_size: int = 64) -> float:
    """Mean per-token cross-entropy of the completions (with the EOS that TRL appends) given their
    prompts: the quantity the trainer's ``eval_loss`` reports."""
    from lmforge.common.scoring import score_continuations

    eos = tokenizer.eos_token or ""
    scores = score_continuations(model, tokenizer, [(e["prompt"], e["completion"] + eos) for e in examples],
                                 batch_size=batch_size)
    n = sum(s.n_tokens for s in scores)
    return -sum(s.sum for s in scores) / max(1, n)
