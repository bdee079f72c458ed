"""File-to-folder entry points: train a reward head on a per-annotator dataset, evaluate a saved one.

Zhang et al. (ICML 2025, arXiv 2410.14632). ``run_train`` reads MultiPref / HelpSteer2 /
lmforge JSONL (:mod:`.data`), splits it (seeded) into train / dev / test, trains the head
(:mod:`.train`) on an MLP over ``features_*`` or on a Hugging Face body, and writes the model and
``metrics.json`` (preference accuracy and Diverging-ID AUROC on the test split, λ fitted on dev)
atomically into ``out``. ``run_eval`` scores a saved reward model on a file.
"""

from __future__ import annotations

import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from lmforge.common.errors import UserError
from lmforge.methods.diverging_prefs.config import DivergingPrefsConfig
from lmforge.methods.diverging_prefs.data import PreferencePair, load_pairs


def split_pairs(pairs: list[PreferencePair], dev_fraction: float, test_fraction: float,
                seed: int) -> tuple[list[PreferencePair], list[PreferencePair], list[PreferencePair]]:
    """A seeded (train, dev, test) split."""
    if not (0 <= dev_fraction < 1 and 0 <= test_fraction < 1 and dev_fraction + test_fraction < 1):
        raise UserError("dev and test fractions must be in [0, 1) and sum to less than 1")
    order = np.random.default_rng(seed).permutation(len(pairs))
    n_dev, n_test = int(round(dev_fraction * len(pairs))), int(round(test_fraction * len(pairs)))
    dev = [pairs[i] for i in order[:n_dev]]
    test = [pairs[i] for i in order[n_dev : n_dev + n_test]]
    train = [pairs[i] for i in order[n_dev + n_test :]]
    if not train:
        raise UserError(f"only {len(pairs)} pairs: nothing left to train on")
    return train, dev, test


def _safe_eval(fn: Any, *args: Any, **kwargs: Any) -> Any:
    try:
        return fn(*args, **kwargs)
    except ValueError as exc:  # e.g. a split with no diverging pair: no AUROC
        return {"error": str(exc)}


def run_train(
    data: str | os.PathLike[str],
    out: str | os.PathLike[str],
    cfg: DivergingPrefsConfig,
    *,
    model: str | None = None,
    body: str = "lm",
    fmt: str = "auto",
    dev_fraction: float = 0.1,
    test_fraction: float = 0.1,
    limit: int | None = None,
    max_length: int = 512,
    overwrite: bool = False,
    progress: bool = False,
) -> dict[str, Any]:
    """Train a reward head on ``data`` and save it with its metrics in ``out``.

    Args:
        data: a per-annotator preference file (see :mod:`.data`).
        out: the output folder (refused if it exists, unless ``overwrite``).
        cfg: head and training settings.
        model: ``zoo:NAME`` or a local HF folder for the body; None trains an MLP on ``features_a/_b``.
        body: ``"lm"`` (causal LM, last-token head) or ``"seqcls"`` (AutoModelForSequenceClassification).
        fmt: the data format (``auto`` detects it).
        dev_fraction, test_fraction: split sizes (seeded by ``cfg.seed``).
        limit: read at most this many pairs.
        max_length: tokens per text for HF bodies.
        overwrite: replace an existing ``out``.
        progress: show a progress bar.

    Returns:
        The record written to ``metrics.json``.
    """
    from lmforge.common.io import atomic_dir, atomic_write_json, check_output_dir
    from lmforge.methods.diverging_prefs.heads import make_model, save_reward_model
    from lmforge.methods.diverging_prefs.train import evaluate, train_reward_model

    check_output_dir(out, overwrite)
    pairs = load_pairs(data, fmt, limit=limit)
    train, dev, test = split_pairs(pairs, dev_fraction, test_fraction, cfg.seed)
    if model is None:
        if pairs[0].features_a is None:
            raise UserError("the data has no features_a/features_b; pass --model (zoo:NAME or a model folder)")
        net = make_model(cfg, in_dim=len(pairs[0].features_a))
    else:
        net = make_model(cfg, lm_spec=model, body=body, max_length=max_length)
    history = train_reward_model(net, train, cfg, progress=progress)
    record: dict[str, Any] = {
        "method": "diverging_prefs", "data": str(data), "model": model, "body": body if model else "mlp",
        "config": asdict(cfg), "train_pairs": len(train), "dev_pairs": len(dev), "test_pairs": len(test),
        "loss_history": history,
    }
    if test:
        record["test"] = _safe_eval(evaluate, net, test, cfg, dev_pairs=dev or None)
    with atomic_dir(out, overwrite=overwrite) as tmp:
        save_reward_model(net, cfg, tmp, extra={"train_record": {k: v for k, v in record.items() if k != "loss_history"}})
        atomic_write_json(Path(tmp) / "metrics.json", record)
    record["out"] = str(out)
    return record


def run_eval(reward_model: str | os.PathLike[str], data: str | os.PathLike[str], *, fmt: str = "auto",
             lam: float | None = None, dev_data: str | os.PathLike[str] | None = None,
             limit: int | None = None) -> dict[str, Any]:
    """Preference accuracy and Diverging-ID AUROC of a saved reward model on ``data``."""
    from lmforge.methods.diverging_prefs.heads import load_reward_model
    from lmforge.methods.diverging_prefs.train import evaluate

    net, cfg = load_reward_model(reward_model)
    pairs = load_pairs(data, fmt, limit=limit)
    dev = load_pairs(dev_data, fmt) if dev_data is not None else None
    try:
        result = evaluate(net, pairs, cfg, dev_pairs=dev, lam=lam)
    except ValueError as exc:
        raise UserError(f"cannot evaluate on '{data}': {exc}") from None
    result["reward_model"] = str(reward_model)
    result["data"] = str(data)
    return result
