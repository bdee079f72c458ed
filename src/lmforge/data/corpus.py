"""The zoo's agentic corpus: render generator records as (prompt, answer) text pairs.

One entry point per task returns ``(prompt, answer)``: the model sees ``BOS prompt answer EOS`` and
is trained on the answer tokens only (plain text is trained on every token, with an empty prompt).
"""

from __future__ import annotations

import random
from collections.abc import Callable

from lmforge.data import needle, text, textworld, toolcalls, workflow

TASKS = ("toolcall", "workflow", "needle", "textworld", "text")

Pair = tuple[str, str]


def toolcall_pair(rng: random.Random) -> Pair:
    rec = toolcalls.example(rng)
    return toolcalls.prompt(rec), toolcalls.answer(rec)


def workflow_pair(rng: random.Random) -> Pair:
    rec = workflow.example(rng)
    return workflow.prompt(rec), workflow.answer(rec)


def needle_pair(rng: random.Random, n_sentences: int, n_needles: int | None = None) -> Pair:
    k = n_needles if n_needles is not None else rng.randint(1, min(8, max(1, n_sentences // 3 + 1)))
    rec = needle.example(rng, n_sentences=n_sentences, n_needles=k)
    return needle.prompt(rec), needle.answer(rec)


def needle_segments(rng: random.Random, n_sentences: int) -> list[tuple[str, bool]]:
    """A haystack followed by one question per needle, as (text, is_answer) segments.

    Training asks every needle (dense queries: the probe in ``zoo-learnability.md`` found them
    better at long contexts than one query per haystack); evaluation asks one, whose prompt is
    exactly the first segment here.
    """
    k = rng.randint(1, min(12, max(1, n_sentences // 3 + 1)))
    rec = needle.example(rng, n_sentences=n_sentences, n_needles=k)
    values = dict(rec["needles"])
    keys = sorted(values)
    rng.shuffle(keys)
    def ask(key: str) -> str:
        return f"\nQuestion: What is the code for {key}?\nAnswer: {needle.answer_prefix(key)}"

    segs: list[tuple[str, bool]] = [(rec["context"] + ask(keys[0]), False)]
    for i, key in enumerate(keys):
        if i:
            segs.append((ask(key), False))
        segs.append((" " + values[key], True))
    return segs


def textworld_pair(rng: random.Random) -> Pair:
    """One step of an expert episode (a uniformly chosen step of a random episode)."""
    ep = textworld.episode(rng)
    step = rng.choice(ep["steps"])
    return textworld.step_prompt(ep["goal"], step["state"]), " " + step["action"]


def text_pair(rng: random.Random) -> Pair:
    return "", text.paragraph(rng, rng.randint(3, 8))


PAIR_FNS: dict[str, Callable[[random.Random], Pair]] = {
    "toolcall": toolcall_pair,
    "workflow": workflow_pair,
    "textworld": textworld_pair,
    "text": text_pair,
    "needle": lambda rng: needle_pair(rng, rng.randint(2, 40)),
}


def tokenizer_training_texts(seed: int = 0, n_per_task: int = 600) -> list[str]:
    """A fixed sample of every task's text for training the BPE tokenizer.

    Needle keys are repeated so that BPE merges each one into a single token (retrieval then needs
    one key token match, the representation that made key-value retrieval learnable here).
    """
    rng = random.Random(seed)
    texts: list[str] = []
    for task in TASKS:
        for _ in range(n_per_task):
            p, a = PAIR_FNS[task](rng)
            texts.append(p + a)
    for _ in range(40):
        keys = needle.KEYS[:]
        rng.shuffle(keys)
        texts.append(" ".join(f"The code for {k} is" for k in keys))
    return texts
