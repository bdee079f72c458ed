"""Plain English text from a small grammar: the haystack filler and the zoo's language-modelling data.

Sentences are simple subject-verb-object clauses about a fixed cast of people, places and things,
so a tiny model can learn the language quickly while it still has real word statistics.
"""

from __future__ import annotations

import random

PEOPLE = ["Anna", "Ben", "Clara", "David", "Emma", "Felix", "Grace", "Hugo", "Iris", "Jonas",
          "Kira", "Liam", "Mia", "Noah", "Olga", "Paul", "Rosa", "Sam", "Tara", "Victor"]
PLACES = ["Paris", "Berlin", "Madrid", "Rome", "Vienna", "Oslo", "Lisbon", "Prague", "Dublin",
          "Warsaw", "Athens", "Zurich", "London", "Tokyo", "Boston", "Denver", "Austin", "Seattle"]
THINGS = ["a book", "the garden", "a letter", "the river", "a song", "the market", "a map",
          "the bridge", "a cake", "the train", "a lamp", "the museum", "a bike", "the harbor"]
VERBS = ["visited", "painted", "found", "watched", "cleaned", "described", "remembered",
         "carried", "opened", "photographed", "liked", "repaired"]
ADVERBS = ["quietly", "early", "again", "slowly", "happily", "carefully", "later", "often"]
WEATHER = ["sunny", "rainy", "cold", "warm", "windy", "cloudy", "foggy", "bright"]
TIMES = ["on Monday", "in the morning", "after lunch", "in the evening", "last week",
         "on Sunday", "at noon", "in spring", "before dinner", "in winter"]


def sentence(rng: random.Random) -> str:
    """One sentence from the grammar."""
    kind = rng.randrange(5)
    p, q = rng.sample(PEOPLE, 2)
    if kind == 0:
        return f"{p} {rng.choice(VERBS)} {rng.choice(THINGS)} {rng.choice(TIMES)}."
    if kind == 1:
        return f"The weather in {rng.choice(PLACES)} was {rng.choice(WEATHER)} {rng.choice(TIMES)}."
    if kind == 2:
        return f"{p} and {q} {rng.choice(ADVERBS)} {rng.choice(VERBS)} {rng.choice(THINGS)}."
    if kind == 3:
        return f"{p} travelled to {rng.choice(PLACES)} {rng.choice(TIMES)}."
    return f"In {rng.choice(PLACES)}, {p} {rng.choice(VERBS)} {rng.choice(THINGS)} {rng.choice(ADVERBS)}."


def paragraph(rng: random.Random, n_sentences: int) -> str:
    """``n_sentences`` sentences joined by spaces."""
    return " ".join(sentence(rng) for _ in range(n_sentences))


def generate(rng: random.Random, n: int, sentences: tuple[int, int] = (3, 8)) -> list[dict[str, str]]:
    """``n`` records ``{"text": ...}`` (the Hugging Face ``text`` dataset format)."""
    return [{"text": paragraph(rng, rng.randint(*sentences))} for _ in range(n)]
