"""Blocksworld text-world episodes: observation -> action, with a programmatic success check.

This is the PDDL blocksworld that AgentBoard uses, as a text game. A state is a list of stacks
(bottom to top). Actions are ``move X to table`` and ``move X onto Y``; a move is valid when X is
clear and Y is clear. The episode succeeds when the stacks equal the goal's (stack order ignored).
The observation the agent sees each step is::

    Goal: [A B] [C]
    State: [C A] [B]
    Action:

Expert trajectories come from the classic "well-placed block" policy (a block is well placed when
it rests on its goal support and that support is well placed): put a clear block straight onto its
goal support when that support is ready, otherwise move a clear misplaced block to the table. It
always terminates and is near-optimal (Gupta & Nau, 1992). Records::

    {"goal": [[...]], "init": [[...]], "steps": [{"state": [[...]], "action": str}, ...]}
"""

from __future__ import annotations

import random
import re
from typing import Any

BLOCKS = "ABCDEF"
Stacks = list[list[str]]


def canonical(stacks: Stacks) -> Stacks:
    """Stacks without empties, sorted by their bottom block (the order shown to the agent)."""
    return sorted(([*s] for s in stacks if s), key=lambda s: s[0])


def render(stacks: Stacks) -> str:
    return " ".join("[" + " ".join(s) + "]" for s in canonical(stacks))


def random_state(rng: random.Random, blocks: list[str]) -> Stacks:
    """A uniformly shuffled assignment of blocks to stacks."""
    order = blocks[:]
    rng.shuffle(order)
    stacks: Stacks = []
    for b in order:
        if stacks and rng.random() < 0.5:
            rng.choice(stacks).append(b)
        else:
            stacks.append([b])
    return canonical(stacks)


def support(stacks: Stacks) -> dict[str, str]:
    """Block -> the block it rests on, or "table"."""
    out = {}
    for s in stacks:
        for i, b in enumerate(s):
            out[b] = "table" if i == 0 else s[i - 1]
    return out


class BlocksWorld:
    """A blocksworld episode environment."""

    def __init__(self, init: Stacks, goal: Stacks, max_steps: int = 12) -> None:
        self.state = canonical(init)
        self.goal = canonical(goal)
        self.max_steps = max_steps
        self.steps = 0
        self.invalid = 0

    def observation(self) -> str:
        return f"Goal: {render(self.goal)}\nState: {render(self.state)}\nAction:"

    def success(self) -> bool:
        return canonical(self.state) == self.goal

    def done(self) -> bool:
        return self.success() or self.steps >= self.max_steps

    def step(self, action: str) -> bool:
        """Apply ``action``; returns whether it was valid. Invalid actions still use a step."""
        self.steps += 1
        parsed = parse_action(action)
        if parsed is None:
            self.invalid += 1
            return False
        x, y = parsed
        tops = {s[-1]: s for s in self.state}
        if x not in tops or x == y or (y != "table" and y not in tops):
            self.invalid += 1
            return False
        src = tops[x]
        if y == "table":
            if len(src) == 1:
                self.invalid += 1
                return False
            src.pop()
            self.state.append([x])
        else:
            src.pop()
            tops[y].append(x)
        self.state = canonical(self.state)
        return True


_ACTION_RE = re.compile(r"move\s+([A-Z])\s+(?:to\s+(table)|onto\s+([A-Z]))")


def parse_action(text: str) -> tuple[str, str] | None:
    m = _ACTION_RE.search(text)
    if not m:
        return None
    return m.group(1), (m.group(2) or m.group(3))


def expert_action(state: Stacks, goal: Stacks) -> str | None:
    """The well-placed-block policy's action, or None when the goal is reached."""
    if canonical(state) == canonical(goal):
        return None
    cur, want = support(state), support(goal)
    memo: dict[str, bool] = {}

    def well(b: str) -> bool:
        if b not in memo:
            memo[b] = cur[b] == want[b] and (cur[b] == "table" or well(cur[b]))
        return memo[b]

    clear = sorted(s[-1] for s in state)
    for x in clear:
        if well(x):
            continue
        y = want[x]
        if y == "table" or (y in clear and well(y)):
            return f"move {x} to table" if y == "table" else f"move {x} onto {y}"
    for x in clear:
        if not well(x) and cur[x] != "table":
            return f"move {x} to table"
    raise AssertionError("the well-placed policy has no move: unreachable for valid states")


def episode(rng: random.Random, n_blocks: tuple[int, int] = (3, 4)) -> dict[str, Any]:
    """A random start and goal with the expert trajectory (start != goal)."""
    blocks = list(BLOCKS[: rng.randint(*n_blocks)])
    goal = random_state(rng, blocks)
    init = random_state(rng, blocks)
    while init == goal:
        init = random_state(rng, blocks)
    env = BlocksWorld(init, goal, max_steps=4 * len(blocks))
    steps = []
    while not env.success():
        act = expert_action(env.state, env.goal)
        assert act is not None
        steps.append({"state": canonical(env.state), "action": act})
        assert env.step(act)
    return {"goal": goal, "init": init, "steps": steps}


def generate(rng: random.Random, n: int) -> list[dict[str, Any]]:
    return [episode(rng) for _ in range(n)]


def step_prompt(goal: Stacks, state: Stacks) -> str:
    return BlocksWorld(state, goal).observation()


def run_episode(policy, record: dict[str, Any], max_steps: int | None = None) -> dict[str, Any]:
    """Roll out ``policy(observation) -> action`` on a record's start; success, steps, invalid moves."""
    n = len({b for s in record["init"] for b in s})
    env = BlocksWorld(record["init"], record["goal"], max_steps=max_steps or 3 * n)
    while not env.done():
        env.step(policy(env.observation()))
    return {"success": env.success(), "steps": env.steps, "invalid": env.invalid}
