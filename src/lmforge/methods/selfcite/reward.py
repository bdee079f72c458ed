"""SelfCite's context-ablation reward for a candidate citation.

For a statement r of a response that cites the sentence set E of the context C:

* Prob-Drop (necessity) = log p(r | C) − log p(r | C∖E),
* Prob-Hold (sufficiency) = log p(r | E) − log p(r | C),
* reward = Prob-Drop + Prob-Hold = log p(r | E only) − log p(r | C∖E); the full-context term cancels.

log p(r | ·) is the **mean** log-probability of the statement's tokens given the prompt built from the
ablated context and the whole previous response, as the official reranker
(``eval-best-of-n-reranking.py``, rerank method ``log_prob_drop_and_hold``, with
``query_log_prob_drop_ablating`` / ``query_log_prob_hold_pruning``) computes it. Ablated prompts keep
the sentences' original ``<C{i}>`` indices. A candidate whose cited sentences total more than
``length_limit`` tokens (384) and that cites more than one sentence gets −1000, as the official code
penalises it (it is not removed).

All prompts of all candidates go through :func:`lmforge.common.scoring.score_continuations` in one
batched call (pairs sorted by length, right-padded). The official code scores one candidate per forward
pass; the test checks that the batched rewards equal that per-candidate computation.

Checked: no library computes context-ablation citation rewards (ContextCite, the closest, fits a
linear surrogate over random ablations instead of scoring two fixed ones), so this module builds the
prompts itself and uses lmforge's scoring engine for the log-probabilities.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lmforge.common.errors import UserError
from lmforge.methods.selfcite.format import Sentence, build_prompt, parse_spans

__all__ = ["RewardSettings", "RewardQuery", "CandidateReward", "candidate_sentences", "ablated_prompt",
           "render_user", "citation_rewards", "statement_segments", "METHODS"]

METHODS = ("drop_and_hold", "drop", "hold")


@dataclass(frozen=True)
class RewardSettings:
    """Reward options; the defaults are the official reranker's.

    Attributes:
        method: ``drop_and_hold`` (the paper's reward), or one of its halves, ``drop`` (−log p(r|C∖E))
            and ``hold`` (log p(r|E)), as the official ``--rerank_method`` options (the constant
            log p(r|C) term is left out of all three, as there).
        length_limit: cited text longer than this many tokens, over more than one sentence, is
            penalised; 0 disables the check.
        penalty: what such a candidate loses (1000 in the official code).
        batch_size: prompts per forward pass.
        chat: render the prompt with the tokenizer's chat template (the official uses the model's chat
            format); False scores plain text, and a tokenizer without a template is scored plain.
    """

    method: str = "drop_and_hold"
    length_limit: int = 384
    penalty: float = 1000.0
    batch_size: int = 8
    chat: bool = True

    def __post_init__(self) -> None:
        if self.method not in METHODS:
            raise UserError(f"reward method must be one of {', '.join(METHODS)}, got {self.method!r}")
        if self.length_limit < 0:
            raise UserError(f"length_limit must be >= 0, got {self.length_limit}")
        if self.batch_size < 1:
            raise UserError(f"batch_size must be >= 1, got {self.batch_size}")


@dataclass(frozen=True)
class RewardQuery:
    """One statement to attribute.

    Attributes:
        sentences: the document's sentences (:func:`~lmforge.methods.selfcite.format.split_sentences`).
        question: the user's question.
        prefix: the response before the measured part (the previous statements with their citations).
        target: the measured part: the statement's tokens, from the end of the previous citation block
            to the statement's ``<cite>``.
    """

    sentences: Sequence[Sentence]
    question: str
    prefix: str
    target: str


@dataclass(frozen=True)
class CandidateReward:
    """The reward of one candidate citation (a string of ``[s-e]`` spans)."""

    candidate: str
    cited: tuple[int, ...]
    hold_logp: float | None
    drop_logp: float | None
    cited_tokens: int
    penalised: bool
    reward: float


def candidate_sentences(candidate: str) -> tuple[int, ...]:
    """The sentence ids a candidate cites: every ``[s-e]`` span expanded; spans with s > e are skipped,
    as the official reranker does (a negative index cannot be written in the ``[\\d+-\\d+]`` format).
    Ids outside the document stay: they match no sentence, so they change no prompt."""
    ids: set[int] = set()
    for s, e in parse_spans(candidate):
        if s > e:
            continue
        ids.update(range(s, e + 1))
    return tuple(sorted(ids))


def render_user(tokenizer: Any, text: str, chat: bool = True) -> str:
    """The user turn as the model sees it, ready for the assistant's reply: the chat template with the
    generation prompt when the tokenizer has one (and ``chat``), else the text itself."""
    if chat and getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                             add_generation_prompt=True)
    return text


def ablated_prompt(sentences: Sequence[Sentence], question: str, cited: Sequence[int], which: str) -> str:
    """The instruction prompt with only the cited sentences (``which="hold"``) or without them
    (``"drop"``), original indices kept."""
    if which == "hold":
        return build_prompt(sentences, question, keep=set(cited))
    if which == "drop":
        return build_prompt(sentences, question, drop=set(cited))
    raise ValueError(f"which must be hold or drop, not {which!r}")


def _cited_tokens(tokenizer: Any, sentences: Sequence[Sentence], cited: Sequence[int]) -> int:
    # NOTE: the official counts the cited text with the GLM-4 tokenizer (LongCite's); we count it with
    # the scored model's tokenizer (no GLM tokenizer offline). Like the official, the length is of each
    # sentence's own text (without the whitespace that follows it).
    n = len(sentences)
    return sum(len(tokenizer(sentences[i].content.strip(), add_special_tokens=False)["input_ids"])
               for i in cited if 0 <= i < n)


def citation_rewards(model: Any, tokenizer: Any, items: Sequence[tuple[RewardQuery, str]],
                     settings: RewardSettings | None = None, *, progress: bool = False) -> list[CandidateReward]:
    """The reward of every ``(query, candidate)`` item, all scored in one batched pass.

    Raises:
        UserError: an item's target is empty.
    """
    from lmforge.common.scoring import score_continuations

    settings = settings or RewardSettings()
    pairs: list[tuple[str, str]] = []
    slots: list[tuple[int | None, int | None]] = []
    cited_all: list[tuple[int, ...]] = []
    for q, cand in items:
        if not q.target.strip():
            raise UserError("a statement to score is empty")
        cited = candidate_sentences(cand)
        cited_all.append(cited)
        hold = drop = None
        if settings.method in ("drop_and_hold", "hold"):
            hold = len(pairs)
            pairs.append((render_user(tokenizer, ablated_prompt(q.sentences, q.question, cited, "hold"),
                                      settings.chat) + q.prefix, q.target))
        if settings.method in ("drop_and_hold", "drop"):
            drop = len(pairs)
            pairs.append((render_user(tokenizer, ablated_prompt(q.sentences, q.question, cited, "drop"),
                                      settings.chat) + q.prefix, q.target))
        slots.append((hold, drop))
    scores = score_continuations(model, tokenizer, pairs, batch_size=settings.batch_size, progress=progress)
    out = []
    for (q, cand), cited, (h, d) in zip(items, cited_all, slots):
        hold_lp = scores[h].mean if h is not None else None
        drop_lp = scores[d].mean if d is not None else None
        reward = (hold_lp or 0.0) - (drop_lp or 0.0)
        n_tok = _cited_tokens(tokenizer, q.sentences, cited)
        # NOTE: "more than one" counts cited sentences (the official ``len(to_drop)``), not spans as our
        # notes and the issue paraphrase it: one long span of several sentences is penalised too.
        penalised = settings.length_limit > 0 and n_tok > settings.length_limit and len(cited) > 1
        if penalised:
            reward -= settings.penalty
        out.append(CandidateReward(cand, cited, hold_lp, drop_lp, n_tok, penalised, reward))
    return out


_CITE_BLOCK = re.compile(r"<cite>(.*?)</cite>", re.DOTALL)


@dataclass(frozen=True)
class StatementSegment:
    """Where a response's citation block sits, and what the reward measures for it.

    Attributes:
        prefix_end: the measured part starts here (just after the previous ``</cite>``, or 0).
        cite_start: index of the ``<cite>`` tag; the measured part is ``response[prefix_end:cite_start]``.
        content_start, content_end: the citation text between ``<cite>`` and ``</cite>``.
    """

    prefix_end: int
    cite_start: int
    content_start: int
    content_end: int


def statement_segments(response: str) -> list[StatementSegment]:
    """The citation blocks of a response, in order.

    # NOTE: the official reranker finds the measured tokens by walking back from the ``<cite>`` token
    # to the previous ``></statement`` token pair of the LongCite tokenizer. We cut the text instead:
    # the measured part runs from the end of the previous ``</cite>`` (so it holds ``</statement>``,
    # the next ``<statement>`` and the statement) to the ``<cite>`` tag, and it is tokenized apart from
    # the prefix (score_continuations concatenates the two id lists).
    """
    out = []
    prev = 0
    for m in _CITE_BLOCK.finditer(response):
        out.append(StatementSegment(prev, m.start(), m.start(1), m.end(1)))
        prev = m.end()
    return out
