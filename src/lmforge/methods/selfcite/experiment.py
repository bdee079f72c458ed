"""The SelfCite miniature, tier A: a real model as its own citation judge.

For every statement of a :mod:`.data` document, a fixed pool of eight candidate citations:

* ``gold``: the supporting sentences;
* ``before`` / ``after``: every gold sentence moved one sentence back / forward (filler, since facts are
  never adjacent);
* ``partial``: for a fused statement, only one of its two sentences; for a single one, a random filler
  sentence;
* ``random1`` / ``random2``: a random filler sentence, and a random two-sentence filler span;
* ``wide``: each gold sentence widened by two sentences on both sides (one merged span for a single
  statement);
* ``document``: every sentence of the document.

The reward (:mod:`.reward`) scores each candidate. Two measures, whose thresholds are fixed in
``lmforge.reproduce.selfcite`` before any run:

* **AUROC** of gold against the seven others, pairwise **within a statement** (a gold candidate and a
  negative of the same statement; ties count one half): the rewards of different statements are not on
  one scale, and the claim is that the reward ranks a statement's candidates;
* **best-of-8 vs first sample**: the candidates of a statement in a seeded random order stand for eight
  samples; the first sample's citation F1 against the argmax-reward candidate's (gold-set citation F1
  of :mod:`.metrics`, per response).
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lmforge.methods.selfcite.data import CiteDoc

__all__ = ["CANDIDATE_KINDS", "Candidate", "candidate_pool", "gold_response", "pairwise_auroc", "spans_str"]

CANDIDATE_KINDS = ("gold", "before", "after", "partial", "random1", "random2", "wide", "document")


@dataclass(frozen=True)
class Candidate:
    kind: str
    sentences: tuple[int, ...]

    @property
    def text(self) -> str:
        return spans_str(self.sentences)


def spans_str(ids: Sequence[int]) -> str:
    """Sentence ids as merged ``[s-e]`` spans: ``(3, 4, 7) -> "[3-4][7-7]"``."""
    out: list[list[int]] = []
    for i in sorted(set(ids)):
        if out and i == out[-1][1] + 1:
            out[-1][1] = i
        else:
            out.append([i, i])
    return "".join(f"[{s}-{e}]" for s, e in out)


def candidate_pool(doc: CiteDoc, j: int, n_sentences: int, rng: random.Random) -> list[Candidate]:
    """The eight candidates of statement ``j`` (see the module docstring)."""
    gold = tuple(sorted(doc.statements[j].support))
    facts = {i for s in doc.statements for i in s.support}
    filler = [i for i in range(n_sentences) if i not in facts and i not in gold]
    last = n_sentences - 1
    before = tuple(sorted({max(0, g - 1) for g in gold} - set(gold))) or (rng.choice(filler),)
    after = tuple(sorted({min(last, g + 1) for g in gold} - set(gold))) or (rng.choice(filler),)
    partial = (gold[0],) if len(gold) > 1 else (rng.choice(filler),)
    random1 = (rng.choice(filler),)
    starts = [i for i in filler if i + 1 in filler]
    s = rng.choice(starts) if starts else filler[0]
    random2 = (s, s + 1) if starts else (s,)
    wide = tuple(sorted({k for g in gold for k in range(max(0, g - 2), min(last, g + 2) + 1)}))
    document = tuple(range(n_sentences))
    return [Candidate("gold", gold), Candidate("before", before), Candidate("after", after),
            Candidate("partial", partial), Candidate("random1", random1), Candidate("random2", random2),
            Candidate("wide", wide), Candidate("document", document)]


def gold_response(doc: CiteDoc) -> str:
    """The reference response with gold citations, in the LongCite format."""
    return "".join(f"<statement>{s.text}<cite>{spans_str(s.support)}</cite></statement>" for s in doc.statements)


def pairwise_auroc(groups: Sequence[tuple[Sequence[float], Sequence[float]]]) -> float:
    """AUROC over within-group pairs: for each group ``(positives, negatives)``, every
    (positive, negative) pair scores 1 when the positive is higher, 0.5 on a tie, 0 otherwise; the
    result is the mean over all pairs of all groups."""
    total = 0.0
    n = 0
    for pos, neg in groups:
        for p in pos:
            for q in neg:
                total += 1.0 if p > q else (0.5 if p == q else 0.0)
                n += 1
    if n == 0:
        raise ValueError("no pairs to rank")
    return total / n


def by_kind(rows: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Per negative kind, the within-statement AUROC of gold against that kind."""
    out = {}
    for kind in CANDIDATE_KINDS[1:]:
        groups = []
        for r in rows:
            groups.append(([r["rewards"]["gold"]], [r["rewards"][kind]]))
        out[kind] = pairwise_auroc(groups)
    return out
