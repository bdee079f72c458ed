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


def _next_token_logprobs(model: torch.nn.Module, tokenizer: Any, prompts: Sequence[str], token_ids: Sequence[int],
                         batch_size: int) -> list[list[float]]:
    """``log p(token | prompt)`` at the token after each prompt, for each of ``token_ids``: one
    forward per prompt, the LM head at its last position only."""
    from lmforge.common.batching import inference, run_in_batches
    from lmforge.common.generation import encode_prompt

    from lmforge.common.generation import max_positions

    limit = max_positions(model)
    # As score_continuations: a prompt longer than the model's positions is cut from the left.
    encoded = [ids[-limit:] if limit is not None and len(ids) > limit else ids
               for ids in (encode_prompt(tokenizer, p) for p in prompts)]
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else (tokenizer.eos_token_id or 0)
    device = next(model.parameters()).device
    head, decoder = model.get_output_embeddings(), model.get_decoder()

    def run(batch: list[int]) -> list[list[float]]:
        width = max(len(encoded[i]) for i in batch)
        ids = torch.full((len(batch), width), int(pad), dtype=torch.long)
        mask = torch.zeros_like(ids)
        for r, i in enumerate(batch):
            ids[r, :len(encoded[i])] = torch.tensor(encoded[i])
            mask[r, :len(encoded[i])] = 1
        hidden = decoder(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False).last_hidden_state
        last = hidden[torch.arange(len(batch)), torch.tensor([len(encoded[i]) - 1 for i in batch])]
        logp = torch.log_softmax(head(last).float(), dim=-1)[:, list(token_ids)]
        return logp.tolist()

    with inference(model):
        return run_in_batches([len(e) for e in encoded], batch_size, run, progress=False, description="score")


def label_logprobs(model: torch.nn.Module, tokenizer: Any, prompts: Sequence[str], labels: Sequence[str],
                   batch_size: int = 64) -> list[list[float]]:
    """``log p(" " + label | prompt)`` for every prompt (rows) and label (columns).

    When every label is one token (``" positive"``/``" negative"`` for SmolLM2's tokenizer) the
    log-probabilities all come from one forward per prompt; otherwise each (prompt, label) pair is
    scored as a continuation."""
    from lmforge.common.scoring import score_continuations

    if not labels:
        raise UserError("the label set is empty")
    ids = [tokenizer(completion(lab), add_special_tokens=False)["input_ids"] for lab in labels]
    if all(len(i) == 1 for i in ids) and hasattr(model, "get_decoder") and model.get_output_embeddings() is not None:
        return _next_token_logprobs(model, tokenizer, prompts, [i[0] for i in ids], batch_size)
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
