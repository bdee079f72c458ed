"""Best-of-N citation sampling with the SelfCite reward.

The official pipeline (``eval-best-of-n-sampling.py`` and ``eval-best-of-n-reranking.py`` with
``LlamaForCausalLM.chat_best_of_n``):

1. sample one response to the prompt (temperature 0.95, top-p 0.7);
2. at every ``<cite>`` of it, sample N = 10 continuations of the response up to that tag
   (temperature 1.2, top-p 0.9, at most 24 new tokens, stopping at the end of the citation);
3. deduplicate the continuations by their text; a citation with at most one distinct candidate is left
   as it is;
4. score each candidate with the context-ablation reward (:mod:`.reward`) and splice the argmax into
   the response, last citation first.

Every branch is sampled from, and scored against, the **original** response: the previous statements
keep their original citations while a later one is reranked, as in the official code.

Candidates come from a :class:`Proposer`: the model itself by default (:class:`ModelProposer`, on
lmforge's batched KV-cached decoder), or any function, which is how the miniature feeds a fixed
candidate pool to a model that cannot write the format.

Checked: TRL's ``BestOfNSampler`` reranks whole responses with a reward model; SelfCite reranks the
citation blocks inside one response with an ablation reward, so the loop is written here.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from lmforge.common.errors import UserError
from lmforge.methods.selfcite.format import Sentence, build_prompt, parse_spans
from lmforge.methods.selfcite.reward import (CandidateReward, RewardQuery, RewardSettings, citation_rewards,
                                             render_user, statement_segments)

__all__ = ["BoNSettings", "Branch", "BoNResult", "normalise_candidate", "ModelProposer", "best_of_n",
           "sample_response"]


@dataclass(frozen=True)
class BoNSettings:
    """Sampling settings; the defaults are the official ones."""

    n: int = 10
    temperature: float = 1.2
    top_p: float = 0.9
    max_new_tokens: int = 24
    response_temperature: float = 0.95
    response_top_p: float = 0.7
    max_response_tokens: int = 1024
    seed: int = 0
    batch_size: int = 16

    def __post_init__(self) -> None:
        if self.n < 1:
            raise UserError(f"N must be >= 1, got {self.n}")
        if self.max_new_tokens < 1:
            raise UserError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


def normalise_candidate(text: str) -> str:
    """A sampled citation as its ``[s-e]`` spans, in the order written: ``"[3-4][7-7]"``. Whatever else
    the sample holds (stray brackets, tag fragments) is dropped, as the official reranker strips ``<``,
    ``>`` and turns ``><`` into ``][``; a sample without any span normalises to ``""``, and the
    official reranker drops that key."""
    return "".join(f"[{s}-{e}]" for s, e in parse_spans(text))


Proposer = Callable[[list[str], int], list[list[str]]]
"""``proposer(prefixes, n)``: for every prompt-plus-response prefix ending in ``<cite>``, ``n`` sampled
citation texts."""


class ModelProposer:
    """Samples citation continuations from the model (official temperature, top-p and length), all
    branches of a call in one batched decode, stopping at ``</cite>``."""

    def __init__(self, model: Any, tokenizer: Any, settings: BoNSettings):
        self.model, self.tokenizer, self.settings = model, tokenizer, settings
        self._calls = 0

    def __call__(self, prefixes: list[str], n: int) -> list[list[str]]:
        from lmforge.common.generation import generate

        s = self.settings
        prompts = [p for p in prefixes for _ in range(n)]
        outs = generate(self.model, self.tokenizer, prompts, max_new_tokens=s.max_new_tokens, do_sample=True,
                        temperature=s.temperature, top_p=s.top_p, stop=["</cite>"], batch_size=s.batch_size,
                        seed=s.seed + 7919 * self._calls)
        self._calls += 1
        return [[o.text for o in outs[i * n:(i + 1) * n]] for i in range(len(prefixes))]


@dataclass
class Branch:
    """One reranked citation: where it is, what was sampled, and the rewards."""

    index: int
    original: str
    candidates: list[CandidateReward] = field(default_factory=list)
    n_sampled: int = 0
    chosen: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {"index": self.index, "original": self.original, "n_sampled": self.n_sampled,
                "chosen": self.chosen,
                "candidates": {c.candidate: {"reward": c.reward, "hold": c.hold_logp, "drop": c.drop_logp,
                                             "cited_tokens": c.cited_tokens, "penalised": c.penalised}
                               for c in self.candidates}}


@dataclass
class BoNResult:
    """The reranked response and its branches."""

    original: str
    response: str
    branches: list[Branch]

    def to_json(self) -> dict[str, Any]:
        return {"original": self.original, "response": self.response,
                "branches": [b.to_json() for b in self.branches]}


def _user_prompt(tokenizer: Any, sentences: Sequence[Sentence], question: str, chat: bool) -> str:
    return render_user(tokenizer, build_prompt(sentences, question), chat)


def sample_response(model: Any, tokenizer: Any, sentences: Sequence[Sentence], question: str,
                    settings: BoNSettings | None = None, *, chat: bool = True) -> str:
    """Step 1: one response to the full prompt (official temperature 0.95, top-p 0.7)."""
    from lmforge.common.generation import generate

    s = settings or BoNSettings()
    out = generate(model, tokenizer, [_user_prompt(tokenizer, sentences, question, chat)],
                   max_new_tokens=s.max_response_tokens, do_sample=True, temperature=s.response_temperature,
                   top_p=s.response_top_p, seed=s.seed)
    return out[0].text.strip()


def best_of_n(model: Any, tokenizer: Any, sentences: Sequence[Sentence], question: str, response: str,
              settings: BoNSettings | None = None, reward: RewardSettings | None = None, *,
              proposer: Proposer | None = None) -> BoNResult:
    """Rerank every citation of ``response`` (steps 2-4).

    Args:
        model, tokenizer: the model that scores (and by default samples) the citations.
        sentences, question: the document and the question the response answers.
        response: the response with ``<statement>…<cite>…</cite></statement>`` blocks.
        settings: sampling settings (official defaults).
        reward: reward settings (official defaults).
        proposer: where candidates come from; the model by default.
    """
    settings = settings or BoNSettings()
    reward = reward or RewardSettings()
    proposer = proposer or ModelProposer(model, tokenizer, settings)
    segments = statement_segments(response)
    if not segments:
        return BoNResult(response, response, [])
    user = _user_prompt(tokenizer, sentences, question, reward.chat)
    prefixes = [user + response[:seg.content_start] for seg in segments]
    samples = proposer(prefixes, settings.n)
    branches: list[Branch] = []
    items: list[tuple[RewardQuery, str]] = []
    owners: list[int] = []
    for k, (seg, texts) in enumerate(zip(segments, samples)):
        branch = Branch(k, response[seg.content_start:seg.content_end], n_sampled=len(texts))
        branches.append(branch)
        distinct = list(dict.fromkeys(t for t in (normalise_candidate(x) for x in texts) if t))
        target = response[seg.prefix_end:seg.cite_start]
        if len(distinct) <= 1 or not target.strip():
            continue  # the official skips a branch with at most one option
        q = RewardQuery(sentences, question, response[:seg.prefix_end], target)
        for cand in distinct:
            items.append((q, cand))
            owners.append(k)
    scored = citation_rewards(model, tokenizer, items, reward) if items else []
    for k, r in zip(owners, scored):
        branches[k].candidates.append(r)
    edited = response
    for seg, branch in sorted(zip(segments, branches), key=lambda x: -x[0].content_start):
        if not branch.candidates:
            continue
        best = max(branch.candidates, key=lambda c: c.reward)  # first max on ties, as Python's max
        branch.chosen = best.candidate
        edited = edited[:seg.content_start] + best.candidate + edited[seg.content_end:]
    return BoNResult(response, edited, branches)
