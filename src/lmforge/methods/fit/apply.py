"""Wiring for ``lmforge align fit``: load a model, fine-tune it on FIT data, evaluate, save.

Focus Instruction Tuning (Lamb et al., ICML 2025, arXiv 2410.22944). The data comes from
:func:`lmforge.methods.fit.data.build_fit_data` (``lmforge align fit-data``); training is TRL's
``SFTTrainer`` (:mod:`lmforge.methods.fit.train`); evaluation is focus accuracy with label-set
scoring (:mod:`lmforge.methods.fit.evaluate`).
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from lmforge.common.errors import UserError
from lmforge.common.io import atomic_dir, atomic_write_json, check_output_dir, parse_json_lines, read_user_text
from lmforge.methods.fit.config import FITConfig


def read_jsonl(path: str | Path, what: str, required: Sequence[str] = ()) -> list[dict[str, Any]]:
    """Records of a JSON-lines file; each must be an object with the ``required`` fields."""
    rows = parse_json_lines(path, read_user_text(path, what))
    out = []
    for line, rec in rows:
        if not isinstance(rec, dict):
            raise UserError(f"{path}:{line}: expected a JSON object")
        missing = [f for f in required if f not in rec]
        if missing:
            raise UserError(f"{path}:{line}: missing field(s) {', '.join(missing)}")
        out.append(rec)
    if not out:
        raise UserError(f"{path}: no records")
    return out


def label_set(examples: Sequence[dict[str, Any]]) -> list[str]:
    """The labels seen as ``focus_label`` or ``label`` (or, failing those, completions), sorted."""
    labs: set[str] = set()
    for e in examples:
        for f in ("focus_label", "label", "spurious_label"):
            if e.get(f) is not None:
                labs.add(str(e[f]))
    if not labs:
        labs = {str(e["completion"]).strip() for e in examples}
    return sorted(labs)


def fit_model(model: str, train_examples: Sequence[dict[str, Any]], out: str | Path, cfg: FITConfig,
              eval_examples: Sequence[dict[str, Any]] | None = None, labels: Sequence[str] | None = None,
              val_fraction: float = 0.0, overwrite: bool = False, allow_pickle: bool = False,
              trust_remote_code: bool = False) -> dict[str, Any]:
    """Fine-tune ``model`` on prompt/completion ``train_examples`` and save it to ``out``.

    Args:
        model: a local HF causal-LM folder or ``zoo:NAME``.
        train_examples: FIT (or SFT) examples with ``prompt`` and ``completion``.
        out: output folder (model, tokenizer and ``fit.json``).
        cfg: the schedule; ``cfg.eval_every > 0`` with ``val_fraction > 0`` early-stops on a
            held-out share of the training examples.
        eval_examples: FIT examples to score after training (focus accuracy per focus type).
        labels: the label set for evaluation (default: every label the eval examples mention).
        val_fraction: share of ``train_examples`` held out for early stopping.
        overwrite: replace an existing ``out``.
    """
    import torch

    from lmforge.methods.fit.evaluate import evaluate_examples
    from lmforge.methods.fit.train import train_sft
    from lmforge.models import load

    out = check_output_dir(out, overwrite)
    bad = [i + 1 for i, e in enumerate(train_examples) if "prompt" not in e or "completion" not in e]
    if bad:
        raise UserError(f"training record {bad[0]} has no 'prompt'/'completion' (build it with `lmforge align fit-data`)")
    if not 0.0 <= val_fraction < 1.0:
        raise UserError(f"--val-fraction must be in [0, 1), got {val_fraction}")
    examples = list(train_examples)
    val: list[dict[str, Any]] = []
    if val_fraction > 0 and cfg.eval_every > 0:
        rng = random.Random(f"lmforge-fit-val:{cfg.seed}")
        rng.shuffle(examples)
        k = max(1, int(round(val_fraction * len(examples))))
        if k >= len(examples):
            raise UserError("the validation share leaves no training examples")
        val, examples = examples[:k], examples[k:]
    mdl, tok = load(model, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code)
    mdl = mdl.float()
    torch.manual_seed(cfg.seed)
    report = train_sft(mdl, tok, examples, cfg, val_examples=val or None)
    result: dict[str, Any] = {"model": model, "config": dataclasses.asdict(cfg), "n_train": len(examples),
                              "n_val": len(val), "train": dataclasses.asdict(report)}
    if eval_examples:
        labs = list(labels) if labels else label_set(eval_examples)
        result["labels"] = labs
        result["eval"] = evaluate_examples(mdl, tok, eval_examples, labs)
    with atomic_dir(out, overwrite=overwrite) as tmp:
        mdl.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        atomic_write_json(tmp / "fit.json", result)
    result["out"] = str(out)
    return result
