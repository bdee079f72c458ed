"""LLM-as-judge on pairs with diverging preferences, and the filter that drops those pairs.

Zhang et al. (ICML 2025, arXiv 2410.14632), Section 5: LLM judges pick a winner on diverging pairs
about as often as on high-agreement pairs, so a benchmark scored by a judge rewards one side of a
genuine disagreement. The paper's remedy is to identify diverging pairs (with a distributional
reward model) and leave them out of the evaluation. Here:

* :func:`judge_pairs` asks any chat client (the :class:`~lmforge.methods.minions.clients.ChatClient`
  interface: a local HF model, an OpenAI-compatible API, or a scripted client in tests) which
  response is better, MT-Bench style (``[[A]]``, ``[[B]]`` or ``[[C]]`` for a tie);
* :func:`filter_diverging` drops the pairs whose divergence score is at or above a threshold (or the
  top fraction);
* :func:`judge_report` measures the judge's decisiveness on high-agreement vs diverging pairs and its
  agreement with the annotators' majority, before and after the filter.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from lmforge.common.errors import UserError
from lmforge.methods.diverging_prefs import core
from lmforge.methods.diverging_prefs.data import PreferencePair

# NOTE: the paper's judge prompts (Arena-Hard / MT-Bench style) are not reproduced verbatim; this is
# a pairwise prompt with the MT-Bench verdict format.
JUDGE_SYSTEM = (
    "Please act as an impartial judge and evaluate the quality of the responses provided by two AI "
    "assistants to the user question below. Choose the assistant that follows the user's instructions "
    "and answers the question better. Do not let the order or the length of the responses influence "
    "you. After a short explanation, output your final verdict strictly in this format: \"[[A]]\" if "
    "assistant A is better, \"[[B]]\" if assistant B is better, and \"[[C]]\" for a tie."
)
_VERDICT = re.compile(r"\[\[\s*([ABC])\s*\]\]")


@dataclass
class JudgeVerdict:
    """One judgement: ``winner`` is +1 (A), −1 (B), 0 (tie) or None (no verdict found)."""

    pair_id: str
    winner: int | None
    text: str


def judge_messages(pair: PreferencePair) -> list[dict[str, str]]:
    """The judge's chat messages for ``pair``."""
    user = (f"[User Question]\n{pair.prompt}\n\n[The Start of Assistant A's Answer]\n{pair.response_a}\n"
            f"[The End of Assistant A's Answer]\n\n[The Start of Assistant B's Answer]\n{pair.response_b}\n"
            "[The End of Assistant B's Answer]")
    return [{"role": "system", "content": JUDGE_SYSTEM}, {"role": "user", "content": user}]


def parse_verdict(text: str) -> int | None:
    """The last ``[[A]]``/``[[B]]``/``[[C]]`` in ``text`` as +1/−1/0, or None."""
    found = _VERDICT.findall(text or "")
    return None if not found else {"A": 1, "B": -1, "C": 0}[found[-1]]


def judge_pairs(client: Any, pairs: Sequence[PreferencePair], max_tokens: int | None = None) -> list[JudgeVerdict]:
    """Ask ``client`` (``chat_batch(conversations)``) for a verdict on each pair."""
    replies = client.chat_batch([judge_messages(p) for p in pairs], max_tokens=max_tokens)
    return [JudgeVerdict(p.id, parse_verdict(r.text), r.text) for p, r in zip(pairs, replies, strict=True)]


def filter_diverging(pairs: Sequence[PreferencePair], divergence: Sequence[float], *, threshold: float | None = None,
                     drop_fraction: float | None = None) -> tuple[list[int], list[int]]:
    """Indices (kept, dropped): drop pairs with ``divergence >= threshold``, or the ``drop_fraction``
    with the highest divergence (exactly one of the two)."""
    d = np.asarray(divergence, dtype=np.float64)
    if len(d) != len(pairs):
        raise ValueError("one divergence score per pair is needed")
    if (threshold is None) == (drop_fraction is None):
        raise UserError("give exactly one of threshold or drop_fraction")
    if drop_fraction is not None:
        if not 0.0 <= drop_fraction < 1.0:
            raise UserError(f"drop_fraction must be in [0, 1), got {drop_fraction}")
        n_drop = int(round(drop_fraction * len(d)))
        order = np.argsort(-d, kind="stable")
        dropped = sorted(order[:n_drop].tolist())
    else:
        dropped = np.flatnonzero(d >= threshold).tolist()
    drop_set = set(dropped)
    return [i for i in range(len(d)) if i not in drop_set], dropped


def _stats(verdicts: Sequence[JudgeVerdict], pairs: Sequence[PreferencePair]) -> dict[str, Any]:
    by_kind: dict[str, list[int | None]] = {core.HIGH_AGREEMENT: [], core.DIVERGING: [], core.TIE: []}
    agree, n_ha = 0, 0
    for v, p in zip(verdicts, pairs, strict=True):
        kind = core.pair_kind(p.labels)
        by_kind[kind].append(v.winner)
        if kind == core.HIGH_AGREEMENT:
            n_ha += 1
            agree += int(v.winner == core.majority_side(p.labels))
    out: dict[str, Any] = {"pairs": len(pairs), "no_verdict": sum(v.winner is None for v in verdicts)}
    for kind, ws in by_kind.items():
        out[f"{kind}_pairs"] = len(ws)
        out[f"picks_winner_on_{kind}"] = (sum(w in (1, -1) for w in ws) / len(ws)) if ws else None
    out["agreement_with_majority_on_high_agreement"] = agree / n_ha if n_ha else None
    return out


def judge_report(verdicts: Sequence[JudgeVerdict], pairs: Sequence[PreferencePair],
                 kept: Sequence[int] | None = None) -> dict[str, Any]:
    """The judge's decisiveness per pair kind (fraction of pairs where it picks a winner) and its
    agreement with the majority on high-agreement pairs; with ``kept`` (from :func:`filter_diverging`)
    also the same on the kept pairs and how many diverging / high-agreement pairs the filter removed."""
    report: dict[str, Any] = {"all": _stats(verdicts, pairs)}
    if kept is not None:
        keep = sorted(set(kept))
        report["filtered"] = _stats([verdicts[i] for i in keep], [pairs[i] for i in keep])
        dropped = [i for i in range(len(pairs)) if i not in set(keep)]
        kinds = [core.pair_kind(pairs[i].labels) for i in dropped]
        report["dropped"] = {"pairs": len(dropped), "diverging": kinds.count(core.DIVERGING),
                             "high_agreement": kinds.count(core.HIGH_AGREEMENT), "ties": kinds.count(core.TIE)}
    return report
