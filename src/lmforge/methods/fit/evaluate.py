"""Focus accuracy with decoding constrained to the label set (Lamb et al., ICML 2025, arXiv 2410.22944).

The paper's metric is focus accuracy ``A_focus = P(prediction = y_focus)`` per focus instruction and
test split, with decoding constrained to the label set. Here each label is scored as a
continuation of the prompt (the sum of its tokens' log-probabilities, with
:func:`lmforge.common.scoring.score_continuations`) and the prediction is the argmax over labels.

# NOTE: for labels that differ in their first token (as here: " positive" / " negative") the argmax
# of the full log-likelihood and constrained greedy decoding agree on the first token; for
# multi-token labels sharing a prefix they can differ. The paper's exact constrained decoder is
# unverified; summed log-likelihood is the standard label-set scoring (lm-eval's multiple choice).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from typing import Any

import torch

from lmforge.common.errors import UserError
from lmforge.methods.fit.data import completion


def label_logprobs(model: torch.nn.Module, tokenizer: Any, prompts: Sequence[str], labels: Sequence[str],
                   batch_size: int = 64) -> list[list[float]]:
    """``log p(" " + label | prompt)`` for every prompt (rows) and label (columns)."""
    from lmforge.common.scoring import score_continuations

    if not labels:
        raise UserError("the label set is empty")
    pairs = [(p, completion(lab)) for p in prompts for lab in labels]
    scores = score_continuations(model, tokenizer, pairs, batch_size=batch_size)
    k = len(labels)
    return [[scores[i * k + j].sum for j in range(k)] for i in range(len(prompts))]


def predict(model: torch.nn.Module, tokenizer: Any, prompts: Sequence[str], labels: Sequence[str],
            batch_size: int = 64) -> list[str]:
    """The label with the highest log-likelihood for each prompt (the first on ties)."""
    rows = label_logprobs(model, tokenizer, prompts, labels, batch_size)
    return [labels[max(range(len(labels)), key=lambda j: r[j])] for r in rows]


def focus_accuracy(examples: Sequence[dict[str, Any]], predictions: Sequence[str]) -> dict[str, Any]:
    """Focus accuracy overall and per focus type, plus, per type, how often the prediction equals
    the task label ``y`` and the spurious label ``y_S`` (which of the two the model followed).

    Args:
        examples: FIT examples (``focus_type``, ``focus_label``, ``label`` and, if known,
            ``spurious_label``).
        predictions: one predicted label per example.
    """
    if len(examples) != len(predictions):
        raise UserError(f"{len(examples)} examples but {len(predictions)} predictions")
    per: dict[str, list[int]] = defaultdict(lambda: [0, 0, 0, 0])  # focus hits, y hits, y_S hits, n
    for e, p in zip(examples, predictions):
        c = per[e["focus_type"]]
        c[0] += int(p == e["focus_label"])
        c[1] += int(p == e["label"])
        c[2] += int(p == e.get("spurious_label"))
        c[3] += 1
    n = len(examples)
    return {
        "focus_accuracy": sum(c[0] for c in per.values()) / n if n else float("nan"),
        "n": n,
        "by_type": {k: {"focus_accuracy": c[0] / c[3], "agrees_with_label": c[1] / c[3],
                        "agrees_with_spurious": c[2] / c[3], "n": c[3]} for k, c in per.items()},
    }


def evaluate_examples(model: torch.nn.Module, tokenizer: Any, examples: Sequence[dict[str, Any]],
                      labels: Sequence[str], batch_size: int = 64) -> dict[str, Any]:
    """Predict every example's label (constrained to ``labels``) and score focus accuracy."""
    preds = predict(model, tokenizer, [e["prompt"] for e in examples], labels, batch_size)
    return focus_accuracy(examples, preds)
