"""Sentiment-like classification with a spurious keyword at a controlled co-occurrence rate.

The synthetic stand-in for the SS dataset of Focus Instruction Tuning (Lamb et al., "Focus On This,
Not That! Steering LLMs with Adaptive Feature Specification", ICML 2025, arXiv 2410.22944): SS is
binary SST-5 with the keywords "Pineapple" and "Bayesian" inserted, each tied to one label, at a
controlled co-occurrence rate. Here the text is made of filler words around one sentiment phrase
(the core feature C) and one keyword from a named *feature family* (the spurious feature S).

Data-generating process (the paper's SMNLI DGP, Figure 4 of the ICML version: ``S ~ Unif``,
``U_C ~ Ber(ρ)``, ``C = U_C·y_S + (1 − U_C)·Unif(Val(C) \\ {y_S})``, ``X ~ p(·|C, S)``, ``Y = C``):

* a family ``f`` is drawn uniformly from the split's families, then its keyword ``S`` uniformly
  from the family's two keywords; ``y_S`` is the label that keyword is tied to;
* with probability ``ρ`` the core label ``C`` equals ``y_S``, otherwise it is the other label;
* the text puts one sentiment phrase of polarity ``C`` and the keyword at random places among
  filler words; ``Y = C``.

The core phrase is a sentiment word, negated by "not" half of the time (``"not good"`` is
negative), so the core label is the XOR of two tokens (word polarity, negation): harder for a tiny
model than the keyword, which is one token away from the label. That asymmetry is what makes the
keyword a shortcut, as the notes' CPU test asks. ``negation=0`` gives the easy variant (the core is
one sentiment word), used as a control.

Ambiguous texts (``ambiguity``, training and validation data only): with that probability the
written sentiment word has the polarity opposite to the one the label implies (a sarcastic or mixed
review whose gold label the surface phrase contradicts), so the text's core reads the label correctly
only ``1 − ambiguity`` of the time while ``Y`` stays the gold label. Test splits are never
ambiguous. The paper's SS data is binarised SST-5, whose sentiment is not perfectly readable from
the text; ``ambiguity = 0`` (the default) is the DGP above exactly.

Splits, by co-occurrence ``ρ = P(Y = y_S)`` (``y_S`` always from the *training* ties):
``iid`` ρ = the training ρ (0.9), ``high`` ρ = 1, ``low`` ρ = 0.5 (independent), ``flipped``
ρ = 0 (every keyword appears with the label it was *not* tied to in training).

# NOTE: the paper's exact test-split rates are unverified here (the official code had no snapshot,
# see methods/fit/data.py); the notes name the four splits only, and "high" = 1, "low" as
# independence and "flipped" as the reversed tie are this project's reading of those names. Each
# rate is a parameter of :func:`make_split`.

Families: ``fruit``, ``animal`` and ``colour`` are seen in training; ``tool`` is held out (its name
and keywords never appear in training), to test focus instructions on an unseen feature. Records::

    {"text": str, "label": "positive"|"negative", "sentiment": str, "keyword": str, "family": str,
     "keyword_label": str, "negated": bool, "ambiguous": bool}

Checked first: no dataset library ships a spurious-keyword generator (``datasets`` loads SS from
the Hub, which is out of reach here), so the generator is written here.
"""

from __future__ import annotations

import random
from typing import Any

LABELS: tuple[str, str] = ("positive", "negative")
POSITIVE_WORDS = ("good", "great", "lovely", "superb", "fine", "nice")
NEGATIVE_WORDS = ("bad", "awful", "dull", "poor", "weak", "nasty")
FILLERS = ("the", "film", "was", "plot", "and", "cast", "story", "really", "quite", "acting", "music",
           "ending", "scenes", "overall", "so", "felt")
NEGATOR = "not"
# family name -> (keyword tied to "positive", keyword tied to "negative")
FAMILIES: dict[str, tuple[str, str]] = {
    "fruit": ("pineapple", "lemon"),
    "animal": ("otter", "wasp"),
    "colour": ("golden", "grey"),
    "tool": ("hammer", "spanner"),
}
TRAIN_FAMILIES: tuple[str, ...] = ("fruit", "animal", "colour")
HELDOUT_FAMILIES: tuple[str, ...] = ("tool",)
TRAIN_RHO = 0.9
SPLIT_RHO: dict[str, float] = {"iid": TRAIN_RHO, "high": 1.0, "low": 0.5, "flipped": 0.0}
CORE_NAME = "the sentiment"
NEGATION = 0.5  # "not" before half the sentiment words: the core label is an XOR of two tokens


def feature_name(family: str) -> str:
    """How a focus instruction names a family's spurious feature, e.g. ``"the fruit"``."""
    return f"the {family}"


def keyword_label(keyword: str) -> str:
    """The label a keyword is tied to (its ``y_S``)."""
    for pos, neg in FAMILIES.values():
        if keyword == pos:
            return LABELS[0]
        if keyword == neg:
            return LABELS[1]
    raise ValueError(f"unknown keyword {keyword!r}")


def other(label: str) -> str:
    """The other binary label."""
    return LABELS[1] if label == LABELS[0] else LABELS[0]


def example(rng: random.Random, rho: float, families: tuple[str, ...] = TRAIN_FAMILIES,
            n_fillers: tuple[int, int] = (3, 6), negation: float = NEGATION, ambiguity: float = 0.0,
            ambiguity_rng: random.Random | None = None) -> dict[str, Any]:
    """One record drawn from the DGP with co-occurrence ``rho`` over ``families``; with probability
    ``ambiguity`` the written phrase contradicts the label (``"ambiguous": True``). That coin is
    tossed with ``ambiguity_rng`` when given, so the rest of the record is the same whatever the
    ambiguity (only the sentiment word's polarity can change)."""
    if not 0.0 <= rho <= 1.0:
        raise ValueError(f"rho must be in [0, 1], got {rho}")
    if not 0.0 <= ambiguity <= 1.0:
        raise ValueError(f"ambiguity must be in [0, 1], got {ambiguity}")
    family = rng.choice(families)
    keyword = rng.choice(FAMILIES[family])
    y_s = keyword_label(keyword)
    label = y_s if rng.random() < rho else other(y_s)
    negated = rng.random() < negation
    # Drawn only when asked for, and from its own stream when one is given, so that ambiguity 0 leaves
    # every split as before and a split drawn at two ambiguities differs only in the ambiguous records.
    ambiguous = ambiguity > 0 and (ambiguity_rng or rng).random() < ambiguity
    # The polarity the phrase expresses: the label's, or its opposite in an ambiguous text.
    phrase_label = other(label) if ambiguous else label
    # "not <word>" has the opposite polarity of <word>.
    word_polarity = other(phrase_label) if negated else phrase_label
    word = rng.choice(POSITIVE_WORDS if word_polarity == LABELS[0] else NEGATIVE_WORDS)
    phrase = [NEGATOR, word] if negated else [word]
    words = [rng.choice(FILLERS) for _ in range(rng.randint(*n_fillers))]
    # The phrase and the keyword go at independent random places, so position carries no signal.
    i = rng.randint(0, len(words))
    words[i:i] = phrase
    j = rng.randint(0, len(words))
    # Never split "not <word>".
    if words[j - 1:j] == [NEGATOR]:
        j += 1
    words.insert(j, keyword)
    return {"text": " ".join(words), "label": label, "sentiment": " ".join(phrase), "keyword": keyword,
            "family": family, "keyword_label": y_s, "negated": negated, "ambiguous": ambiguous}


def make_split(seed: int | str, n: int, rho: float, families: tuple[str, ...] = TRAIN_FAMILIES,
               exact: bool = True, negation: float = NEGATION, ambiguity: float = 0.0) -> list[dict[str, Any]]:
    """``n`` records with co-occurrence ``rho``.

    Args:
        seed: seeds a ``random.Random``; the same seed gives the same split.
        n: number of records.
        rho: ``P(label = keyword_label)``.
        families: the families the keywords come from.
        exact: make the count of agreeing records exactly ``round(rho * n)`` (a shuffled fixed
            allocation instead of independent draws), so that test splits sit at their nominal rate.
        negation: probability that the sentiment word is negated (0 makes the core one token).
        ambiguity: probability that the written phrase contradicts the label (see the module).
    """
    rng = random.Random(f"lmforge-spurious:{seed}")
    amb_rng = random.Random(f"lmforge-spurious-ambiguity:{seed}")
    if not exact:
        return [example(rng, rho, families, negation=negation, ambiguity=ambiguity, ambiguity_rng=amb_rng)
                for _ in range(n)]
    k = round(rho * n)
    agree = [True] * k + [False] * (n - k)
    rng.shuffle(agree)
    # rho 1.0 / 0.0 per record realises the allocation exactly.
    return [example(rng, 1.0 if a else 0.0, families, negation=negation, ambiguity=ambiguity, ambiguity_rng=amb_rng)
            for a in agree]


def suite(seed: int, n_train: int, n_test: int, train_rho: float = TRAIN_RHO, n_val: int = 0,
          negation: float = NEGATION, ambiguity: float = 0.0) -> dict[str, list[dict[str, Any]]]:
    """The training set, a validation set drawn like it (``n_val`` records), the four test splits on
    the training families and the same four on the held-out family (``heldout-iid``, ...). Every
    split has its own seed stream; ``ambiguity`` applies to the training and validation sets only,
    so the test splits do not depend on it."""
    out = {"train": make_split(f"{seed}:train", n_train, train_rho, TRAIN_FAMILIES, exact=False, negation=negation,
                               ambiguity=ambiguity),
           "val": make_split(f"{seed}:val", n_val, train_rho, TRAIN_FAMILIES, exact=False, negation=negation,
                             ambiguity=ambiguity)}
    for name, rho in SPLIT_RHO.items():
        r = train_rho if name == "iid" else rho
        out[name] = make_split(f"{seed}:{name}", n_test, r, TRAIN_FAMILIES, negation=negation)
        out[f"heldout-{name}"] = make_split(f"{seed}:heldout-{name}", n_test, r, HELDOUT_FAMILIES, negation=negation)
    return out
