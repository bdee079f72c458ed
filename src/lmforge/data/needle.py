"""Key-value needles in a haystack of plain text (NIAH, RULER's multi-key variant).

A context is filler sentences from :mod:`lmforge.data.text` with ``n_needles`` key-value needles
"KEY DDDD." inserted at random depths (RULER's key-value variant embeds bare pairs the same way);
the question asks for one key's code. Keys are short made-up words that the zoo tokenizer keeps as
single tokens, values are digit strings (one token per digit), so retrieval is "find the key, copy
four tokens". The prompt ends with the answer's opening (the key), as RULER's templates end with
"The special magic number for X ... is". Records::

    {"context": str, "question": str, "answer": str, "key": str, "depth": float, "n_needles": int,
     "needles": [[key, value], ...]}

``depth`` is the queried needle's position in the context as a fraction (0 = start), as NIAH
heat-maps use.
"""

from __future__ import annotations

import random
from typing import Any

from lmforge.data import text

_CONSONANTS = "bdfgklmnprstvz"
_VOWELS = "aeiou"


def _make_keys() -> list[str]:
    # 196 consonant-vowel-consonant-vowel words in a fixed order, e.g. "bako".
    rng = random.Random(1234)
    words = sorted({a + b + c + d for a in _CONSONANTS for b in _VOWELS for c in _CONSONANTS[:7] for d in "aio"})
    rng.shuffle(words)
    return words[:196]


KEYS: list[str] = _make_keys()


def needle_sentence(key: str, value: str) -> str:
    # NOTE: a bare "KEY VALUE." pair rather than RULER's sentence ("One of the special magic numbers
    # for KEY is: VALUE."): in a probe here the sentence form learned retrieval markedly slower
    # (answer loss 1.66 vs 1.44 after 800 steps), and the zoo's CPU budget is tight.
    return f"{key} {value}."


def example(rng: random.Random, n_sentences: int, n_needles: int = 4, digits: int = 4) -> dict[str, Any]:
    """One haystack with ``n_needles`` needles among ``n_sentences`` filler sentences."""
    keys = rng.sample(KEYS, n_needles)
    values = ["".join(rng.choice("0123456789") for _ in range(digits)) for _ in keys]
    sents = [text.sentence(rng) for _ in range(n_sentences)]
    slots = sorted(rng.sample(range(n_sentences + 1), n_needles)) if n_needles <= n_sentences + 1 else \
        sorted(rng.choice(range(n_sentences + 1)) for _ in range(n_needles))
    order = list(range(n_needles))
    rng.shuffle(order)
    pieces: list[str] = []
    positions: dict[int, int] = {}
    needle_iter = iter(order)
    slot_set = list(slots)
    for i in range(n_sentences + 1):
        while slot_set and slot_set[0] == i:
            slot_set.pop(0)
            j = next(needle_iter)
            positions[j] = len(pieces)
            pieces.append(needle_sentence(keys[j], values[j]))
        if i < n_sentences:
            pieces.append(sents[i])
    q = rng.randrange(n_needles)
    return {
        "context": " ".join(pieces),
        "question": f"What is the code for {keys[q]}?",
        "answer": values[q],
        "key": keys[q],
        "depth": positions[q] / max(1, len(pieces) - 1),
        "n_needles": n_needles,
        "needles": [[k, v] for k, v in zip(keys, values)],
    }


def answer_prefix(key: str) -> str:
    """The answer's opening, given in the prompt as RULER's NIAH templates do
    ("... Answer: The special magic number for X mentioned in the provided text is")."""
    return key


def prompt(record: dict[str, Any]) -> str:
    return f"{record['context']}\nQuestion: {record['question']}\nAnswer: {answer_prefix(record['key'])}"


def answer(record: dict[str, Any]) -> str:
    return " " + record["answer"]


def exact_match(text_out: str, record: dict[str, Any]) -> bool:
    """Whether the first whitespace-delimited word of the output is the code (trailing '.' allowed)."""
    words = text_out.strip().split()
    return bool(words) and words[0].rstrip(".") == record["answer"]
