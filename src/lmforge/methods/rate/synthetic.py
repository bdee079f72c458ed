"""A semi-synthetic RATE task with known effects: a confounder, a rewrite artifact, rewrite noise.

The CPU test of the RATE notes (and the paper's Section 5 IMDB set-up in miniature). Each response
is a small text carrying its attributes, e.g. ``"w=1 l=0 art=0 z=+0.1234 q=-0.5321"``:

* ``w``: the attribute of interest; ``l``: an attribute correlated with it
  (P(l=1 | w=1) = ``p_l_given_w1``, P(l=1 | w=0) = 1 − that); ``q``: the response's content;
* ``art``: 1 once the text has been rewritten by an LLM-like rewriter (its off-target "style");
* ``z``: details a rewrite changes at random (each rewrite adds N(0, ``rewrite_noise``²)).

Reward R = a·w + b·l + c·art + q + z. The rewriter sets w, sets art = 1 and perturbs z (and with
probability ``p_fail`` leaves w unchanged: a failed rewrite). Then, in expectation:

* naive = a + b·(2·p_l_given_w1 − 1)              (confounded by l),
* single-rewrite ATT = a − c, ATU = a + c           (the artifact is on one side only),
* RATE ATT = ATU = ATE = a                          (both sides rewritten; art cancels).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

from lmforge.methods.rate.rewriters import ProgrammaticRewriter

_FIELDS = re.compile(r"w=(\d) l=(\d) art=(\d) z=([-+0-9.e]+) q=([-+0-9.e]+)")


@dataclass
class SyntheticRateTask:
    """Parameters of the task (see the module docstring)."""

    a: float = 1.0
    b: float = 2.0
    c: float = 0.8
    p_w1: float = 0.5
    p_l_given_w1: float = 0.8
    q_sd: float = 1.0
    rewrite_noise: float = 0.5
    p_fail: float = 0.0

    @property
    def naive_expected(self) -> float:
        return self.a + self.b * (2 * self.p_l_given_w1 - 1)


def _parse(text: str) -> tuple[int, int, int, float, float]:
    m = _FIELDS.search(text)
    if m is None:
        raise ValueError(f"not a synthetic response: {text!r:.60}")
    return int(m.group(1)), int(m.group(2)), int(m.group(3)), float(m.group(4)), float(m.group(5))


def _fmt(w: int, l: int, art: int, z: float, q: float) -> str:  # noqa: E741
    return f"w={w} l={l} art={art} z={z:+.6f} q={q:+.6f}"


def sample(task: SyntheticRateTask, n: int, seed: int) -> tuple[list[str], list[str], list[int]]:
    """(prompts, responses, w) of ``n`` units."""
    rng = np.random.default_rng(seed)
    w = (rng.random(n) < task.p_w1).astype(int)
    p_l = np.where(w == 1, task.p_l_given_w1, 1 - task.p_l_given_w1)
    l = (rng.random(n) < p_l).astype(int)  # noqa: E741
    q = rng.normal(scale=task.q_sd, size=n)
    texts = [_fmt(int(w[i]), int(l[i]), 0, 0.0, float(q[i])) for i in range(n)]
    return [f"prompt {i}" for i in range(n)], texts, w.tolist()


def reward(task: SyntheticRateTask):  # noqa: ANN201
    """The reward function R(prompts, responses) of ``task``."""

    def score(prompts: list[str], responses: list[str]) -> np.ndarray:
        out = []
        for t in responses:
            w, l, art, z, q = _parse(t)  # noqa: E741
            out.append(task.a * w + task.b * l + task.c * art + q + z)
        return np.asarray(out)

    return score


def classifier(text: str) -> int:
    """W(y) read off the text."""
    return _parse(text)[0]


def rewriter(task: SyntheticRateTask, seed: int) -> ProgrammaticRewriter:
    """Sets w (unless it fails, with probability ``p_fail``), sets art = 1, adds noise to z."""
    rng = np.random.default_rng(seed)

    def fn(text: str, target: int) -> str:
        w, l, _, z, q = _parse(text)  # noqa: E741
        new_w = w if rng.random() < task.p_fail else target
        return _fmt(new_w, l, 1, z + float(rng.normal(scale=task.rewrite_noise)), q)

    return ProgrammaticRewriter(fn, name="programmatic:synthetic-artifact")
