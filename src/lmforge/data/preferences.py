"""Preference pairs: a JSON-lines loader/writer and a seeded synthetic task with planted hard pairs.

File format: one JSON object per line with string fields ``prompt``, ``chosen`` and ``rejected``
(TRL's "standard" explicit-prompt preference format, the one ``trl.DPOTrainer`` reads); any other
field (``id``, ``kind``, ...) is kept as is. :func:`load_preferences` turns every fault a user can
make into a one-line :class:`~lmforge.common.errors.UserError` naming the file and the line.

Synthetic task (:func:`max_digit_pairs`), built for Selective DPO (Gao et al., ICML 2025,
arXiv 2502.09650), whose CPU check needs pairs of controllable difficulty:

* prompt ``"max: 3 8 1 5 6 ->"`` (distinct digits; the rule is one of ``max``, ``min``, ``first``,
  ``last``), the checkable correct answer is the digit the rule picks (`` 8``);
* ``clean`` pairs: chosen = the correct answer, rejected = another digit of the prompt (a
  plausible, hard negative: the SFT model gives every prompt digit about the same probability);
* planted too-hard pairs, ``hard_fraction`` of the set, of two kinds:
  ``flipped`` (label noise: the correct answer rejected in favour of a random other prompt digit,
  or with ``flip="runner_up"`` of the near miss, e.g. the second largest for ``max``: a systematic
  labelling error) and ``arbitrary`` (two wrong digits, ordered by a coin that depends on nothing
  in the prompt: a preference no model can learn, only memorise).

:func:`max_digit_sft` gives the matching SFT data: the same prompts answered by a *random* digit of
the prompt (or, with ``p_correct``, sometimes the correct one), so that a model trained on it knows
the format and the candidate set but not the rule; DPO then has something to teach.
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

from lmforge.common.errors import UserError
from lmforge.common.io import atomic_write_text, parse_json_lines, read_user_text

FIELDS = ("prompt", "chosen", "rejected")
KINDS = ("clean", "flipped", "arbitrary")
HARD_KINDS = ("flipped", "arbitrary")
#: The key :func:`load_preferences` adds to each record: its line in the file.
LINE_KEY = "_line"


def load_preferences(path: str | Path) -> list[dict[str, Any]]:
    """Read a preference JSON-lines file.

    Args:
        path: file with one ``{"prompt", "chosen", "rejected", ...}`` object per line; blank lines
            are skipped.

    Returns:
        The records, in file order, each with an added ``_line`` (its 1-based line number, for
        messages; :func:`write_preferences` drops it). A record's own fields, ``line`` included,
        are kept as they are.

    Raises:
        UserError: missing or unreadable file, invalid JSON, a line that is not an object, a
            missing or non-string ``prompt``/``chosen``/``rejected`` (naming the line), or no
            records at all.
    """
    raw = read_user_text(path, "preference data")
    records: list[dict[str, Any]] = []
    for line, obj in parse_json_lines(path, raw):
        if not isinstance(obj, dict):
            raise UserError(f"{path}:{line}: expected a JSON object with prompt/chosen/rejected")
        for key in FIELDS:
            if key not in obj:
                raise UserError(f"{path}:{line}: missing field '{key}'")
            if not isinstance(obj[key], str):
                raise UserError(f"{path}:{line}: field '{key}' must be a string")
        rec = dict(obj)
        rec[LINE_KEY] = line
        records.append(rec)
    if not records:
        raise UserError(f"{path}: no preference pairs")
    return records


def write_preferences(path: str | Path, pairs: list[dict[str, Any]]) -> Path:
    """Write ``pairs`` as JSON lines (atomically); the inverse of :func:`load_preferences` (the
    ``_line`` it adds is left out)."""
    return atomic_write_text(path, "".join(json.dumps({k: v for k, v in p.items() if k != LINE_KEY}) + "\n"
                                           for p in pairs))


RULES = ("max", "min", "first", "last")


def _prompt(rule: str, digits: list[int]) -> str:
    return f"{rule}: " + " ".join(str(d) for d in digits) + " ->"


def _correct(rule: str, digits: list[int]) -> int:
    return {"max": max, "min": min, "first": lambda d: d[0], "last": lambda d: d[-1]}[rule](digits)


def _runner_up(rule: str, digits: list[int]) -> int:
    """The near-miss answer: second largest (max), second smallest (min), second (first), second to last (last)."""
    return {"max": lambda d: sorted(d)[-2], "min": lambda d: sorted(d)[1], "first": lambda d: d[1],
            "last": lambda d: d[-2]}[rule](digits)


def _answer(d: int) -> str:
    # A leading space: the zoo tokenizer keeps it attached to the digit (one token, " 8").
    return f" {d}"


def max_digit_pairs(n: int, seed: int, hard_fraction: float = 0.2, flipped_share: float = 0.5,
                    n_digits: int = 5, rules: tuple[str, ...] = RULES, flip: str = "random") -> list[dict[str, Any]]:
    """``n`` preference pairs for the digit task, ``hard_fraction`` of them planted too-hard.

    Args:
        n: number of pairs.
        seed: the whole set is a function of it.
        hard_fraction: share of planted pairs (rounded to a count, placed at random positions).
        flipped_share: of the planted pairs, the share that is label noise (the rest arbitrary).
        n_digits: distinct digits per prompt (3..10; ``arbitrary`` pairs need at least 3).
        rules: the rules prompts are drawn from (uniformly), a subset of :data:`RULES`.
        flip: the wrong answer a ``flipped`` pair prefers: ``"random"`` (any other prompt digit) or
            ``"runner_up"`` (the near miss: second largest for ``max``, ...; a systematic labelling
            error that a tie-level share of such pairs can teach).

    Returns:
        Records with ``id``, ``prompt``, ``chosen``, ``rejected``, ``kind`` (one of :data:`KINDS`)
        and ``answer`` (the correct completion).
    """
    if n < 1:
        raise ValueError("n must be at least 1")
    if not 0.0 <= hard_fraction <= 1.0 or not 0.0 <= flipped_share <= 1.0:
        raise ValueError("hard_fraction and flipped_share must lie in [0, 1]")
    if not 3 <= n_digits <= 10:
        raise ValueError("n_digits must lie in 3..10")
    if not rules or any(r not in RULES for r in rules):
        raise ValueError(f"rules must be a non-empty subset of {RULES}")
    if flip not in ("random", "runner_up"):
        raise ValueError("flip must be 'random' or 'runner_up'")
    rng = random.Random(f"max-digit-pairs:{seed}")
    n_hard = round(n * hard_fraction)
    n_flip = round(n_hard * flipped_share)
    kinds = ["flipped"] * n_flip + ["arbitrary"] * (n_hard - n_flip) + ["clean"] * (n - n_hard)
    rng.shuffle(kinds)
    out = []
    for i, kind in enumerate(kinds):
        rule = rng.choice(rules)
        digits = rng.sample(range(10), n_digits)
        best = _correct(rule, digits)
        wrong = [d for d in digits if d != best]
        if kind == "arbitrary":
            a, b = rng.sample(wrong, 2)  # the coin: which wrong digit is "preferred" is random
            chosen, rejected = a, b
        else:
            chosen, rejected = best, rng.choice(wrong)
            if kind == "flipped":
                chosen, rejected = (_runner_up(rule, digits) if flip == "runner_up" else rejected), best
        out.append({"id": i, "prompt": _prompt(rule, digits), "chosen": _answer(chosen), "rejected": _answer(rejected),
                    "kind": kind, "answer": _answer(best), "rule": rule})
    return out


def max_digit_sft(n: int, seed: int, n_digits: int = 5, rules: tuple[str, ...] = RULES,
                  p_correct: float = 0.0) -> list[tuple[str, str]]:
    """``n`` SFT (prompt, answer) pairs: the task's prompts answered by the correct digit with
    probability ``p_correct``, else by a uniformly random prompt digit (which may be the correct one)."""
    rng = random.Random(f"max-digit-sft:{seed}")
    out = []
    for _ in range(n):
        rule = rng.choice(rules)
        digits = rng.sample(range(10), n_digits)
        ans = _correct(rule, digits) if rng.random() < p_correct else rng.choice(digits)
        out.append((_prompt(rule, digits), _answer(ans)))
    return out


def max_digit_texts() -> list[str]:
    """Texts covering the task's vocabulary, for training a tokenizer (deterministic)."""
    return [*(_prompt(r, list(range(10))) for r in RULES), *(_answer(d) for d in range(10)), " 0 1 2 3 4 5 6 7 8 9"]
