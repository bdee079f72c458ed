"""Synthetic citation documents: real essay sentences with inserted facts, and statements whose
supporting sentences are known.

The miniature of SelfCite needs documents where the gold citation of every statement is known
exactly (LongBench-Cite's gold is a GPT-4o judgement; we have no judge offline). A document is a run of
consecutive sentences from a held-out Paul Graham essay (:mod:`lmforge.data.essays`, evaluation split)
with two or three invented fact sentences about one invented entity inserted at random, non-adjacent
places. The response restates the facts:

* a **single** statement restates one fact (its gold is that sentence);
* a **fused** statement combines two facts placed apart in the document, so one citation is not enough
  (its gold is both sentences).

Entities, people and numbers are drawn at random, so no model knows them beforehand: a statement can
only be predicted from the document, which is what the context-ablation reward measures.

The sentence indices are those :func:`lmforge.methods.selfcite.format.split_sentences` gives for the
document's text, so gold spans, prompts and parsed citations all agree.

No dataset on the package registries carries gold sentence-level citations (LongCite-45k and
LongBench-Cite are on the hub only, and judged by GPT-4o), hence this generator.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Any

from lmforge.common.errors import UserError

__all__ = ["CiteStatement", "CiteDoc", "make_docs", "essay_sentences"]

_PLACES = ["Orsay", "Velmora", "Keswin", "Tarrow", "Brisk Hollow", "Lunden", "Marrowick", "Ostrava Bay",
           "Pellham", "Quarry Vale", "Rendham", "Saltmere", "Thornby", "Upton Reach", "Wexcombe", "Yarlow"]
_KINDS = ["Tide Museum", "Glass Archive", "Clockmakers' Guild", "Seed Library", "Lantern Society",
          "Map Institute", "Salt Exchange", "Bell Foundry", "Weather Station", "Rope Works", "Kite Club",
          "Chess Academy", "Print House", "Beekeepers' Hall", "Stone Bridge Trust", "River Observatory"]
_FIRST = ["Ilse", "Tomas", "Mirela", "Odo", "Wren", "Cato", "Lioba", "Anselm", "Petra", "Joren", "Halla",
          "Bram", "Sunniva", "Eero", "Dagny", "Fenna"]
_LAST = ["Marren", "Quill", "Ostby", "Varga", "Lindqvist", "Haskell", "Prewitt", "Okonjo", "Terhune",
         "Vasko", "Brandt", "Ellery", "Moravec", "Sandoval", "Achterberg", "Kowalczyk"]
_ITEMS = ["brass instruments", "pressed flowers", "ship logs", "glass plates", "hand-drawn maps",
          "wax cylinders", "clock movements", "seed packets", "paper kites", "wooden type blocks"]
_COLOURS = ["green", "red", "grey", "blue", "yellow", "white"]

# Each fact: (document sentence, statement restating it alone, clause for a fused statement).
# ``{e}`` is the entity, ``{E}`` the entity capitalised at the start of a sentence.


def _facts(rng: random.Random, entity: str) -> list[tuple[str, str, str]]:
    year = rng.randint(1820, 1990)
    person = f"{rng.choice(_FIRST)} {rng.choice(_LAST)}"
    count = rng.randint(12, 98) * 100 + rng.randint(1, 9) * 10
    item = rng.choice(_ITEMS)
    members = rng.randint(21, 480)
    colour = rng.choice(_COLOURS)
    floors = rng.randint(2, 9)
    place = rng.choice(_PLACES)
    return [
        (f"The {entity} was founded in {year} by a ferry captain named {person}.",
         f"The {entity} was founded in {year} by {person}.",
         f"founded in {year} by {person}"),
        (f"Today the {entity} keeps {count:,} {item} in its east wing.",
         f"The {entity} keeps {count:,} {item}.",
         f"keeps {count:,} {item}"),
        (f"Its members, {members} of them at the last count, meet every spring in {place}.",
         f"The {entity} has {members} members who meet every spring in {place}.",
         f"has {members} members who meet in {place}"),
        (f"The building of the {entity} has {floors} floors and a {colour} copper roof.",
         f"The {entity} is housed in a {floors}-floor building with a {colour} copper roof.",
         f"is housed in a {floors}-floor building with a {colour} roof"),
    ]


@dataclass(frozen=True)
class CiteStatement:
    """One statement of the reference response and its gold supporting sentences.

    Attributes:
        text: the statement (no tags).
        support: sentence indices (as :func:`~lmforge.methods.selfcite.format.split_sentences` numbers
            them) that together support it.
        kind: ``"single"`` (one fact) or ``"fused"`` (two facts placed apart).
    """

    text: str
    support: tuple[int, ...]
    kind: str


@dataclass
class CiteDoc:
    """A document, its question and the reference statements."""

    idx: str
    context: str
    question: str
    statements: list[CiteStatement]
    entity: str
    meta: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {"idx": self.idx, "context": self.context, "query": self.question, "entity": self.entity,
                "statements": [{"statement": s.text, "support": list(s.support), "kind": s.kind}
                               for s in self.statements]}


_BAD = re.compile(r"[<>\[\]{}|\\]|\d")


def essay_sentences(part: str = "evaluation", *, min_chars: int = 40, max_chars: int = 220) -> list[list[str]]:
    """Per essay, its sentences usable as filler: ``min_chars``–``max_chars`` long, and free of digits
    and of the characters the citation format uses (``<>[]{}``), so a filler sentence can never look
    like a fact or a tag."""
    from lmforge.data import essays

    out = []
    for text in essays.split(part):
        flat = " ".join(text.split())
        sents = [s.strip() for s in re.split(r"(?<=[.!?])\s+(?=[A-Z])", flat)]
        good = [s for s in sents if min_chars <= len(s) <= max_chars and not _BAD.search(s) and s[-1] in ".!?"]
        if len(good) >= 24:
            out.append(good)
    if not out:
        raise UserError("no essay has enough usable sentences")
    return out


def make_docs(n: int, seed: int = 0, *, n_filler: int = 9, n_statements: int = 2, fused_share: float = 0.5,
              part: str = "evaluation") -> list[CiteDoc]:
    """``n`` documents, each ``n_filler`` essay sentences plus the inserted facts.

    Every document holds three facts about one entity at non-adjacent places, and a response of
    ``n_statements`` statements (1 or 2): each statement is fused (two facts) with probability
    ``fused_share``, else single. Facts are never adjacent to each other, so neighbour spans of a gold
    sentence are filler.

    Raises:
        UserError: ``n`` < 1, ``n_statements`` not 1 or 2, or a document whose sentences the splitter
            does not recover one to one (never seen; checked so gold indices cannot drift).
    """
    from lmforge.methods.selfcite.format import split_sentences

    if n < 1:
        raise UserError(f"n must be >= 1, got {n}")
    if n_statements not in (1, 2):
        raise UserError(f"n_statements must be 1 or 2, got {n_statements}")
    rng = random.Random(seed)
    pool = essay_sentences(part)
    docs: list[CiteDoc] = []
    used: set[str] = set()
    while len(docs) < n:
        essay = rng.choice(pool)
        start = rng.randrange(0, len(essay) - n_filler)
        filler = essay[start:start + n_filler]
        entity = f"{rng.choice(_PLACES)} {rng.choice(_KINDS)}"
        if entity in used:
            continue
        facts = rng.sample(_facts(rng, entity), 3)
        # positions of the three facts among n_filler + 3 slots, pairwise at least 2 apart
        n_total = n_filler + 3
        while True:
            slots = sorted(rng.sample(range(n_total), 3))
            if all(b - a >= 2 for a, b in zip(slots, slots[1:])):
                break
        sentences: list[str] = []
        it = iter(filler)
        fact_at: dict[int, int] = {}
        for pos in range(n_total):
            if pos in slots:
                k = slots.index(pos)
                fact_at[k] = pos
                sentences.append(facts[k][0])
            else:
                sentences.append(next(it))
        context = " ".join(sentences)
        split = [s.content.strip() for s in split_sentences(context)]
        if split != sentences:
            continue  # the splitter merged or cut a filler sentence: draw another document
        statements: list[CiteStatement] = []
        order = rng.sample(range(3), 3)
        for j in range(n_statements):
            if rng.random() < fused_share:
                a, b = sorted(rng.sample(range(3), 2))
                clause_a, clause_b = facts[a][2], facts[b][2]
                text = f"The {entity} {clause_a}, and it {clause_b}."
                statements.append(CiteStatement(text, (fact_at[a], fact_at[b]), "fused"))
            else:
                k = order[j]
                statements.append(CiteStatement(facts[k][1], (fact_at[k],), "single"))
        used.add(entity)
        docs.append(CiteDoc(idx=f"doc{len(docs)}", context=context,
                            question=f"What does the document say about the {entity}?",
                            statements=statements, entity=entity))
    return docs
