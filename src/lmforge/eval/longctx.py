"""Long-context and real-world scorers of ACBench: NIAH, LongBench QA/retrieval, AgentBoard progress.

* **NIAH** (the Needle-in-a-Haystack test ACBench runs through KVCache-Factory): the score of a
  response is ``10 * ROUGE-1 F`` against the needle sentence (rouge-score's scorer with stemming, as
  that harness uses), on a grid of context lengths x needle depths shown as a heatmap.
* **LongBench** (Bai et al., 2024, ``metrics.py``): QA is the token-level F1 of the SQuAD-normalised
  answer (lower case, punctuation and English articles removed, whitespace collapsed), the maximum over
  the gold answers; retrieval is exact match of the normalised answer. Scores are reported in context
  length buckets 0-4k / 4-8k / 8k+ tokens.
* **AgentBoard** (Ma et al., 2024): the progress rate of an episode is the largest fraction of its
  subgoals met at any step, success is a progress rate of 1, grounding accuracy the share of the
  agent's actions that the environment accepted as valid; episodes stop after 30 steps.

Checked: rouge-score (installed with lm-eval) does ROUGE; the LongBench and AgentBoard formulas are a
few lines each and written here.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence

__all__ = [
    "MAX_STEPS",
    "episode_scores",
    "length_bucket",
    "niah_score",
    "normalize_answer",
    "qa_f1",
    "retrieval_em",
]

MAX_STEPS = 30


def niah_score(needle: str, response: str) -> float:
    """``10 * ROUGE-1 F`` of the response against the needle (0..10)."""
    from rouge_score import rouge_scorer

    scorer = rouge_scorer.RougeScorer(["rouge1"], use_stemmer=True)
    return 10.0 * scorer.score(needle, response)["rouge1"].fmeasure


def normalize_answer(text: str) -> str:
    """SQuAD/LongBench normalisation: lower case, no punctuation, no a/an/the, single spaces."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in set(string.punctuation))
    text = re.sub(r"\b(a|an|the)\b", " ", text)
    return " ".join(text.split())


def _f1(pred_tokens: list[str], gold_tokens: list[str]) -> float:
    common = Counter(pred_tokens) & Counter(gold_tokens)
    same = sum(common.values())
    if same == 0:
        return 0.0
    p, r = same / len(pred_tokens), same / len(gold_tokens)
    return 2 * p * r / (p + r)


def qa_f1(prediction: str, answers: str | Sequence[str]) -> float:
    """LongBench ``qa_f1_score``: the best token F1 over the gold answers."""
    golds = [answers] if isinstance(answers, str) else list(answers)
    pred = normalize_answer(prediction).split()
    return max((_f1(pred, normalize_answer(g).split()) for g in golds), default=0.0)


def retrieval_em(prediction: str, answers: str | Sequence[str]) -> float:
    golds = [answers] if isinstance(answers, str) else list(answers)
    p = normalize_answer(prediction)
    return float(any(p == normalize_answer(g) for g in golds))


def length_bucket(n_tokens: int) -> str:
    """LongBench-E's buckets."""
    if n_tokens < 4000:
        return "0-4k"
    if n_tokens < 8000:
        return "4-8k"
    return "8k+"


def episode_scores(subgoals_met: Sequence[int], n_subgoals: int, valid_actions: Sequence[bool]) -> dict[str, float]:
    """AgentBoard's metrics of one episode.

    Args:
        subgoals_met: after each step, how many of the goal's subgoals hold (at most ``MAX_STEPS``
            steps are counted).
        n_subgoals: subgoals of the goal (> 0).
        valid_actions: per step, whether the environment accepted the action.
    """
    if n_subgoals <= 0:
        raise ValueError("an episode needs at least one subgoal")
    met = list(subgoals_met)[:MAX_STEPS]
    valid = list(valid_actions)[:MAX_STEPS]
    progress = max((m / n_subgoals for m in met), default=0.0)
    return {
        "progress_rate": progress,
        "success": float(progress >= 1.0),
        "grounding": (sum(valid) / len(valid)) if valid else 0.0,
    }
