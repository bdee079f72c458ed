"""Natural-language film reviews with a spurious keyword sentence: SS-style data for a real model.

Focus Instruction Tuning's SS set (Lamb et al., ICML 2025, arXiv 2410.22944) is binary SST-5 with
keywords inserted, each tied to one label at a controlled co-occurrence rate. SST cannot be read here
(nothing from the Hub), so this module writes short reviews in plain English that an instruction-
tuned model can read, and adds one sentence that mentions a keyword of a named feature family:

* the **core** C: one or two sentiment clauses of the label's polarity (``"The acting was superb."``,
  ``"I was bored within ten minutes."``), drawn from hand-written clause banks; optionally a neutral
  clause (``"It runs for about two hours."``);
* the **spurious** S: one sentence naming a keyword of the family (``"I ate a pineapple during the
  trailers."``), the keyword tied to a label as in :mod:`lmforge.data.spurious`;
* the order of the sentences is random, so position carries no signal.

The data-generating process, splits (iid ρ = 0.9, high 1, low 0.5, flipped 0; a held-out family) and
the record fields are those of :mod:`lmforge.data.spurious`, whose ``FAMILIES``, ``LABELS`` and
``SPLIT_RHO`` are reused; records have ``text``, ``label``, ``keyword``, ``family``,
``keyword_label``, ``ambiguous``, ``sentiment`` (the core clauses).

Training and validation reviews draw their clauses from the first :data:`N_TRAIN_CLAUSES` of each
bank, test reviews from the rest, so the core is read from unseen sentences at test time (as SST's
test sentences are unseen), by the model's own sense of sentiment rather than a memorised clause.

Ambiguous training texts (``ambiguity``): as SST's labels are not always readable from the text, a
share of the training and validation reviews is written with the *other* polarity while keeping the
gold label (``ambiguous: True``). Test splits are never ambiguous.

Checked first: no installed package ships labelled review sentences (nltk's corpora and
``sklearn``'s datasets download at run time), so the clause banks are written here. Train and test
draw clauses from the same banks (the core is a familiar feature, as SST's sentiment is to an LLM);
the held-out family's keywords and sentences never appear in training.
"""

from __future__ import annotations

import random
from typing import Any

from lmforge.data.spurious import FAMILIES, HELDOUT_FAMILIES, LABELS, SPLIT_RHO, TRAIN_FAMILIES, TRAIN_RHO, other

POSITIVE = (
    "The acting was superb.", "I loved every minute of it.", "The story kept me gripped to the end.",
    "It is a warm, funny and moving film.", "The soundtrack is beautiful.", "The cast is wonderful.",
    "I left the cinema smiling.", "The dialogue is sharp and witty.", "It is the best film I have seen this year.",
    "The photography is stunning.", "The ending was perfect.", "I would happily watch it again.",
    "The lead gives a brilliant performance.", "Every scene feels fresh.", "It is a delight from start to finish.",
    "The jokes land every time.", "The plot is clever and satisfying.", "I was moved to tears in the best way.",
    "The pacing is excellent.", "It is a charming little gem.",
)
NEGATIVE = (
    "The acting was wooden.", "I was bored within ten minutes.", "The story makes no sense.",
    "It is a dull and lifeless film.", "The soundtrack is grating.", "The cast looks lost.",
    "I walked out before the end.", "The dialogue is clumsy and flat.", "It is the worst film I have seen this year.",
    "The photography is ugly and murky.", "The ending was a letdown.", "I would never watch it again.",
    "The lead gives a lazy performance.", "Every scene drags.", "It is a chore from start to finish.",
    "None of the jokes land.", "The plot is silly and predictable.", "I felt my evening was wasted.",
    "The pacing is painfully slow.", "It is a forgettable mess.",
)
NEUTRAL = (
    "It runs for about two hours.", "I saw it on a Sunday afternoon.", "It is based on a novel.",
    "The film was shot in the spring.", "It opened in cinemas last month.", "My cousin came along with me.",
)
# One sentence per family; "{kw}" is the keyword (articles chosen to read naturally for both keywords).
KEYWORD_SENTENCES: dict[str, tuple[str, ...]] = {
    "fruit": ("I ate a {kw} during the trailers.", "Someone next to me was eating a {kw}.",
              "The poster shows a giant {kw}."),
    "animal": ("There is a {kw} in the opening scene.", "A {kw} appears near the end.",
               "The hero keeps a pet {kw}."),
    "colour": ("The poster is mostly {kw}.", "The hero drives a {kw} car.", "The cinema seats were {kw}."),
    "tool": ("The villain carries a {kw}.", "A {kw} hangs on the wall in every scene.",
             "The hero fixes the car with a {kw}."),
}


N_TRAIN_CLAUSES = 14


def _article(sentence: str, kw: str) -> str:
    """``a`` -> ``an`` before a vowel sound, for the keyword sentences."""
    text = sentence.format(kw=kw)
    return text.replace(f" a {kw}", f" an {kw}") if kw[0] in "aeiou" else text


def review(rng: random.Random, rho: float, families: tuple[str, ...] = TRAIN_FAMILIES, ambiguity: float = 0.0,
           ambiguity_rng: random.Random | None = None, part: str = "train") -> dict[str, Any]:
    """One record with co-occurrence ``rho`` (``P(label = keyword_label)``); ``part`` (``"train"`` or
    ``"test"``) picks the clause half; see the module."""
    if part not in ("train", "test"):
        raise ValueError(f"part must be 'train' or 'test', got {part!r}")
    if not 0.0 <= rho <= 1.0:
        raise ValueError(f"rho must be in [0, 1], got {rho}")
    if not 0.0 <= ambiguity <= 1.0:
        raise ValueError(f"ambiguity must be in [0, 1], got {ambiguity}")
    family = rng.choice(families)
    keyword = rng.choice(FAMILIES[family])
    y_s = LABELS[0] if keyword == FAMILIES[family][0] else LABELS[1]
    label = y_s if rng.random() < rho else other(y_s)
    ambiguous = ambiguity > 0 and (ambiguity_rng or rng).random() < ambiguity
    written = other(label) if ambiguous else label
    bank = POSITIVE if written == LABELS[0] else NEGATIVE
    bank = bank[:N_TRAIN_CLAUSES] if part == "train" else bank[N_TRAIN_CLAUSES:]
    core = rng.sample(bank, rng.randint(1, 2))
    sentences = [*core, _article(rng.choice(KEYWORD_SENTENCES[family]), keyword)]
    if rng.random() < 0.5:
        sentences.append(rng.choice(NEUTRAL))
    rng.shuffle(sentences)
    return {"text": " ".join(sentences), "label": label, "sentiment": " ".join(core), "keyword": keyword,
            "family": family, "keyword_label": y_s, "ambiguous": ambiguous}


def make_split(seed: int | str, n: int, rho: float, families: tuple[str, ...] = TRAIN_FAMILIES, exact: bool = True,
               ambiguity: float = 0.0, part: str = "train") -> list[dict[str, Any]]:
    """``n`` reviews at co-occurrence ``rho``; ``exact`` fixes the agreeing count at ``round(rho·n)``
    (as :func:`lmforge.data.spurious.make_split`); ``part`` picks the clause half."""
    rng = random.Random(f"lmforge-reviews:{seed}")
    amb_rng = random.Random(f"lmforge-reviews-ambiguity:{seed}")
    if not exact:
        return [review(rng, rho, families, ambiguity, amb_rng, part) for _ in range(n)]
    k = round(rho * n)
    agree = [True] * k + [False] * (n - k)
    rng.shuffle(agree)
    return [review(rng, 1.0 if a else 0.0, families, ambiguity, amb_rng, part) for a in agree]


def suite(seed: int, n_train: int, n_test: int, train_rho: float = TRAIN_RHO, n_val: int = 0,
          ambiguity: float = 0.0) -> dict[str, list[dict[str, Any]]]:
    """Training and validation sets (``ambiguity`` applies to them only), the four test splits on
    the training families and the same four on the held-out family (``heldout-iid``, ...)."""
    out = {"train": make_split(f"{seed}:train", n_train, train_rho, TRAIN_FAMILIES, exact=False, ambiguity=ambiguity),
           "val": make_split(f"{seed}:val", n_val, train_rho, TRAIN_FAMILIES, exact=False, ambiguity=ambiguity)}
    for name, rho in SPLIT_RHO.items():
        r = train_rho if name == "iid" else rho
        out[name] = make_split(f"{seed}:{name}", n_test, r, TRAIN_FAMILIES, part="test")
        out[f"heldout-{name}"] = make_split(f"{seed}:heldout-{name}", n_test, r, HELDOUT_FAMILIES, part="test")
    return out
