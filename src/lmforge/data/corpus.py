"""The zoo's agentic corpus: render generator records as (prompt, answer) text pairs.

One entry point per task returns ``(prompt, answer)``: the model sees ``BOS prompt answer EOS`` and
is trained on the answer tokens only (plain text is trained on every token, with an empty prompt).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence

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


def needle_segments(rng: random.Random, n_sentences: int, max_needles: int = 16) -> list[tuple[str, bool]]:
    """A haystack followed by a query for every needle, as (text, is_answer) segments.

    The first query is the evaluation prompt exactly (question + RULER-style answer prefix); the
    others are the bare prefix (". KEY"), which packs several times more answer tokens into a
    sequence. Dense queries over many needles were what made key-value retrieval learnable in the
    probe of ``zoo-learnability.md``; a first run with one question per needle and few needles
    sat on the loss plateau for 900 steps.
    """
    k = rng.randint(2, max(2, min(max_needles, n_sentences + 1)))
    rec = needle.example(rng, n_sentences=n_sentences, n_needles=k)
    values = dict(rec["needles"])
    keys = sorted(values)
    rng.shuffle(keys)
    first = f"{rec['context']}\nQuestion: What is the code for {keys[0]}?\nAnswer: {needle.answer_prefix(keys[0])}"
    segs: list[tuple[str, bool]] = [(first, False), (" " + values[keys[0]], True)]
    for key in keys[1:]:
        segs.append((". " + needle.answer_prefix(key), False))  # ". KEY" then " DDDD"
        segs.append((" " + values[key], True))
    return segs


def textworld_pair(rng: random.Random) -> Pair:
    """One step of an expert episode (a uniformly chosen step of a random episode)."""
    ep = textworld.episode(rng)
    step = rng.choice(ep["steps"])
    return textworld.step_prompt(ep["goal"], step["state"]), " " + step["action"]


def text_pair(rng: random.Random) -> Pair:
    return "", text.paragraph(rng, rng.randint(3, 8))


def docjob_pair(rng: random.Random) -> Pair:
    """A MINIONS worker job on a synthetic report chunk (:mod:`lmforge.data.docjobs`)."""
    from lmforge.data import docjobs  # lazy: it pulls in the report generator and Minions' prompts

    return docjobs.pair(rng)


def docjob_segments(rng: random.Random, level: int) -> list[tuple[str, bool]]:
    """A worker job and follow-up questions on its chunk at curriculum level ``level`` (chunks of
    up to ``level`` sentences; :func:`lmforge.data.docjobs.stage`): the zoo's training batches."""
    from lmforge.data import docjobs

    return docjobs.segments(rng, level)


def injecagent_pair(rng: random.Random) -> Pair:
    """A step of an InjecAgent-format ReAct episode with benign tools (:mod:`lmforge.data.injecagent`)."""
    from lmforge.data import injecagent

    return injecagent.pair(rng)


def injecagent_segments(rng: random.Random) -> list[tuple[str, bool]]:
    """A whole episode (prompt, first step, observation, second step): the zoo's training batches."""
    from lmforge.data import injecagent

    return injecagent.segments(rng)


PAIR_FNS: dict[str, Callable[[random.Random], Pair]] = {
    "toolcall": toolcall_pair,
    "workflow": workflow_pair,
    "textworld": textworld_pair,
    "text": text_pair,
    "needle": lambda rng: needle_pair(rng, rng.randint(2, 40)),
    "docjob": docjob_pair,
    "injecagent": injecagent_pair,
}


def tokenizer_training_texts(seed: int = 0, n_per_task: int = 600,
                             tasks: Sequence[str] | None = None) -> list[str]:
    """A fixed sample of the tasks' text for training the BPE tokenizer.

    Needle keys are repeated so that BPE merges each one into a single token (retrieval then needs
    one key token match, the representation that made key-value retrieval learnable here).

    ``tasks`` is a model's training mixture (None: the agentic corpus). Any agentic task in it
    brings in the whole agentic sample exactly as before (so agent-* tokenizers never change); an
    extra task (``docjob``, ``injecagent``) adds its own sample after it.
    """
    tasks = TASKS if tasks is None else tuple(tasks)
    texts: list[str] = []
    if any(t in TASKS for t in tasks):
        texts += _agentic_texts(seed, n_per_task)
    if "docjob" in tasks:
        from lmforge.data import docjobs

        texts += docjobs.tokenizer_texts(seed, n_per_task)
    if "injecagent" in tasks:
        from lmforge.data import injecagent

        texts += injecagent.tokenizer_texts(seed, n_per_task)
    return texts


def _agentic_texts(seed: int, n_per_task: int) -> list[str]:
    rng = random.Random(seed)
    texts: list[str] = []
    for task in TASKS:
        for _ in range(n_per_task):
            p, a = PAIR_FNS[task](rng)
            texts.append(p + a)
    for _ in range(40):
        keys = needle.KEYS[:]
        rng.shuffle(keys)
        texts.append(" ".join(needle.needle_sentence(k, "1234") for k in keys))
    return texts
