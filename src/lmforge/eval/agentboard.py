"""AgentBoard-style real-world tasks: goal files, environments, batched rollouts, expert trajectories.

ACBench's "real-world" capability runs AgentBoard (Ma et al., 2024; github.com/hkust-nlp/AgentBoard).
This module reproduces two of its environments at the zoo's scale, in AgentBoard's file format and
with its metrics, so the built-in miniature and a user's file go through the same loader.

**File format** (AgentBoard README §6.3 "Data Fields"; ``agentboard/utils/tool/data_utils.py``):
JSON lines, one problem per line, with the official fields ``task``, ``id``, ``goal``, ``subgoals``,
``difficulty`` ("easy"/"hard") and ``additional_info`` (per-task extras)::

    {"task": "pddl", "id": 0,
     "goal": "The goal is to satisfy the following conditions: A is on the table., B is on A., C is on the table.",
     "subgoals": ["A is on the table.", "B is on A.", "C is on the table."], "difficulty": "easy",
     "additional_info": {"subtask": "blockworld", "init_stacks": [["C", "A"], ["B"]],
                         "goal_stacks": [["A", "B"], ["C"]], "max_steps": 30}}

    {"task": "tool-query", "id": 0, "goal": "<the sub-requests, joined>",
     "subgoals": ["{\\"name\\": \\"get_weather\\", \\"arguments\\": {...}}", ...], "difficulty": "easy",
     "additional_info": {"tool": "lmforge", "tools": [<toolcalls schema>, ...],
                         "queries": [<one request per subgoal>], "max_steps": 30}}

(``max_steps`` is optional, 1..30.) NOTE: official pddl records carry no start or goal state (the env
loads ``pddlgym/pddl/<game>/problem<i>.pddl`` by index, the label file supplies ``difficulty``), so
``init_stacks``/``goal_stacks`` are lmforge's additions to ``additional_info``; the official data files
(``data/pddl/test.jsonl``, ``data/tool-query/test.jsonl``) are on the Hugging Face hub, not in the
repository, so their ``subgoals`` strings were not seen here: the pddl ones are written as AgentBoard
renders goal literals (``literal_to_text``).

**blocksworld** (AgentBoard ``task: pddl``, ``subtask``/``game_name: blockworld``;
``agentboard/environment/pddl_env/pddl_env.py``): the progress after a step is the share of the goal's
literals that hold (``constraint_satisfaction_metric``), the episode's progress rate the largest one
seen, success all literals true. Literals read as in AgentBoard's ``predicate_map`` ("B is on A.",
"A is on the table."), the goal text is "The goal is to satisfy the following conditions: " plus the
sorted literals joined by ", " (``get_goal_and_obs``). The game itself is
:class:`lmforge.data.textworld.BlocksWorld`: the agent sees exactly its observation
(``Goal: [...]\\nState: [...]\\nAction:``, the format the zoo model was trained on) and a valid action is a
move the game accepts. NOTE: AgentBoard's blockworld domain has an arm and four operators (pickup,
putdown, stack, unstack) and shows states as literal sentences; the zoo game has two (``move X onto Y``,
``move X to table``) and shows stacks, which is what the zoo model was trained on.

**toolquery** (AgentBoard ``task: tool-query``; ``agentboard/tasks/tool.py``,
``agentboard/environment/academia_env.py``): a multi-part request whose subgoals are 2-3 single
tool calls of :data:`lmforge.data.toolcalls.TOOLS`, offered among 3-5 tools. Each step the agent sees
the zoo's tool-call prompt of the pending sub-request (``Tools:\\n- name(arg, ...)\\nUser: <query>\\nCall:``,
exactly :func:`lmforge.data.toolcalls.prompt`); an action is valid when it parses as a JSON call
``{"name", "arguments"}`` of an offered tool with exactly that tool's parameter names; it meets the
subgoal when it equals the gold call (JSON equality), and the next sub-request becomes pending. An
invalid or wrong call uses a step and leaves the same sub-request pending. Progress is subgoals met /
subgoals (``AcademiaEnv.update``), the rate its maximum over the episode.

**Both**: at most ``MAX_STEPS`` = 30 steps (``eval_configs/main_results_all_tasks.yaml``:
``max_num_steps: 30``); a record's ``additional_info.max_steps`` or the caller may lower it. Grounding
accuracy is valid actions / steps (``grounding_acc_count / (step_id + 1)`` in ``tasks/pddl.py`` and
``tasks/tool.py``). The scores come from :func:`lmforge.eval.longctx.episode_scores`.

Checked in the official repository (commit 2429689d): ``agentboard/environment/pddl_env/pddl_env.py``
(goal literals, ``constraint_satisfaction_metric``, ``reward = max(self.reward, ...)``, invalid actions
count as steps and leave the state), ``agentboard/environment/pddl_env/pddlgym/pddl/blockworld/problem*.pddl``
(the goals list ``on`` literals only, no ``clear``), ``agentboard/environment/pddl_env/pddlgym/__init__.py``
(the game is registered as ``blockworld``), ``agentboard/tasks/pddl.py`` and ``agentboard/tasks/tool.py``
(the step loop, grounding accuracy, success), ``agentboard/environment/academia_env.py`` (subgoal
counting), ``agentboard/utils/tool/data_utils.py`` and README §6.3 (record fields),
``eval_configs/main_results_all_tasks.yaml`` (30 steps).

Deviations are marked ``NOTE:`` where they are made; in short: ``ontable`` literals are counted (as in
AgentBoard, the start state alone never counts towards the progress rate); tool-query subgoals are gold calls met in order and the
agent sees only the pending sub-request (no tool results, no history); the episode stops by itself on
success (AgentBoard's tool tasks also need a ``finish`` action); there is no "check valid actions"
helper action and no in-context examples (the zoo model is prompted zero-shot in its trained format);
difficulty labels are computed, not human-assigned. The loader also accepts ``task`` equal to
``blocksworld``/``toolquery`` and ``additional_info.game_name`` for ``subtask``.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmforge.common.errors import UserError
from lmforge.common.io import atomic_write_text, parse_json_lines, read_user_text
from lmforge.data import textworld, toolcalls
from lmforge.eval.longctx import MAX_STEPS, episode_scores

__all__ = [
    "ENVS",
    "MAX_STEPS",
    "BlocksworldEnv",
    "Problem",
    "ToolQueryEnv",
    "expert_policy",
    "expert_trajectory",
    "generate",
    "goal_literals",
    "load",
    "parse_records",
    "run_episodes",
    "summarize",
    "write",
]

ENVS = ("blocksworld", "toolquery")
# AgentBoard's ``task`` field for each environment.
TASK_OF = {"blocksworld": "pddl", "toolquery": "tool-query"}
# AgentBoard names the game "blockworld" (pddlgym registration); lmforge's name is accepted too.
_BLOCKS_SUBTASKS = ("blockworld", "blocksworld")
GOAL_PREFIX = "The goal is to satisfy the following conditions: "
Policy = Callable[[list[str]], list[str]]


# --------------------------------------------------------------------------------------------------
# Problems


@dataclass(frozen=True)
class Problem:
    """One AgentBoard-style problem, validated.

    ``init_stacks``/``goal_stacks`` are set for blocksworld; ``tools``/``queries``/``calls`` (the gold
    call of each subgoal, in order) for toolquery. ``record`` is the record as read.
    """

    id: str
    env: str
    goal: str
    subgoals: tuple[str, ...]
    difficulty: str
    max_steps: int
    init_stacks: list[list[str]] | None = None
    goal_stacks: list[list[str]] | None = None
    tools: list[dict[str, Any]] | None = None
    queries: list[str] | None = None
    calls: list[dict[str, Any]] | None = None
    record: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)

    def make_env(self, max_steps: int | None = None) -> BlocksworldEnv | ToolQueryEnv:
        """A fresh environment; ``max_steps`` may lower the problem's own cap."""
        cap = self.max_steps if max_steps is None else min(self.max_steps, _check_cap(max_steps))
        if self.env == "blocksworld":
            return BlocksworldEnv(self, cap)
        return ToolQueryEnv(self, cap)


def _check_cap(max_steps: int) -> int:
    if isinstance(max_steps, bool) or not isinstance(max_steps, int) or not 1 <= max_steps <= MAX_STEPS:
        raise ValueError(f"max_steps must be an integer in 1..{MAX_STEPS} (AgentBoard's cap), got {max_steps!r}")
    return max_steps


def goal_literals(goal_stacks: Sequence[Sequence[str]]) -> list[tuple[str, str]]:
    """The goal's literals as ``(block, support)`` pairs, ``support`` a block or ``"table"``.

    NOTE: AgentBoard's blockworld goals list only ``on`` literals (``pddl/blockworld/problem*.pddl``);
    here the goal is a complete configuration (the agent is shown full goal stacks), so the
    ``ontable`` literal of every stack's bottom block is counted too; without it a goal like
    ``[A] [B]`` would have no literal and "all literals true" would not mean the shown goal is
    reached. ``clear`` is not counted (AgentBoard's goals never contain it, and it follows from the
    others).
    """
    return sorted(textworld.support([list(s) for s in goal_stacks]).items())


def _literal_text(block: str, under: str) -> str:
    # AgentBoard's predicate_map: "on": "{} is on {}.", "on-table": "{} is on the table."
    return f"{block} is on the table." if under == "table" else f"{block} is on {under}."


def _goal_text(subgoals: Iterable[str]) -> str:
    return GOAL_PREFIX + ", ".join(sorted(subgoals))


def _call_text(call: dict[str, Any]) -> str:
    """A call as one line of JSON, the zoo's completion format without its leading space."""
    return json.dumps(call, separators=(", ", ": "))  # as toolcalls.answer (ASCII-escaped)


def _json_equal(a: Any, b: Any) -> bool:
    """Equality of parsed JSON values (``true`` is not ``1``; ``1`` equals ``1.0``)."""
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return a == b
    return type(a) is type(b) and a == b


def _env_of(rec: dict[str, Any], where: str) -> str:
    task = rec.get("task")
    info = rec.get("additional_info")
    if task == "pddl":
        sub = info.get("subtask", info.get("game_name")) if isinstance(info, dict) else None
        if sub in _BLOCKS_SUBTASKS:
            return "blocksworld"
        raise UserError(f"{where}: unknown pddl subtask {sub!r}; known environments: {', '.join(ENVS)} "
                        f"(pddl subtask 'blockworld', or task 'tool-query')")
    if task == "tool-query":
        return "toolquery"
    if task in ENVS:
        return str(task)
    raise UserError(f"{where}: unknown task {task!r}; known environments: {', '.join(ENVS)} "
                    f"(AgentBoard task 'pddl' with subtask 'blockworld', or 'tool-query')")


def _stacks(value: Any, what: str, where: str) -> list[list[str]]:
    if not (isinstance(value, list) and value and all(isinstance(s, list) and s for s in value)
            and all(isinstance(b, str) and len(b) == 1 and "A" <= b <= "Z" for s in value for b in s)):
        raise UserError(f"{where}: additional_info.{what} must be a non-empty list of non-empty stacks "
                        f"of single capital-letter blocks, e.g. [[\"A\", \"B\"], [\"C\"]]")
    blocks = [b for s in value for b in s]
    if len(set(blocks)) != len(blocks):
        raise UserError(f"{where}: additional_info.{what} names a block twice")
    return [list(s) for s in value]


def _max_steps(info: dict[str, Any], where: str) -> int:
    cap = info.get("max_steps", MAX_STEPS)
    if isinstance(cap, bool) or not isinstance(cap, int) or not 1 <= cap <= MAX_STEPS:
        raise UserError(f"{where}: additional_info.max_steps must be an integer in 1..{MAX_STEPS}, got {cap!r}")
    return cap


def _blocksworld(rec: dict[str, Any], info: dict[str, Any], where: str) -> dict[str, Any]:
    init = _stacks(info.get("init_stacks"), "init_stacks", where)
    goal = _stacks(info.get("goal_stacks"), "goal_stacks", where)
    if sorted(b for s in init for b in s) != sorted(b for s in goal for b in s):
        raise UserError(f"{where}: init_stacks and goal_stacks hold different blocks")
    if textworld.canonical(init) == textworld.canonical(goal):
        raise UserError(f"{where}: the start state already satisfies the goal")
    texts = [_literal_text(b, u) for b, u in goal_literals(goal)]
    subgoals = rec.get("subgoals", texts)
    if not (isinstance(subgoals, list) and all(isinstance(s, str) for s in subgoals)
            and sorted(subgoals) == sorted(texts)):
        raise UserError(f"{where}: 'subgoals' must be the goal stacks' literals {sorted(texts)}")
    return {"init_stacks": init, "goal_stacks": goal, "subgoals": tuple(subgoals),
            "goal": rec.get("goal", _goal_text(texts))}


def _toolquery(rec: dict[str, Any], info: dict[str, Any], where: str) -> dict[str, Any]:
    tools = info.get("tools")
    if not (isinstance(tools, list) and tools and all(
            isinstance(t, dict) and isinstance(t.get("name"), str) and isinstance(t.get("parameters"), dict)
            for t in tools)):
        raise UserError(f"{where}: additional_info.tools must be a non-empty list of tool schemas "
                        f"with 'name' and a 'parameters' object")
    params = {t["name"]: set(t["parameters"]) for t in tools}
    subgoals, queries = rec.get("subgoals"), info.get("queries")
    if not (isinstance(subgoals, list) and subgoals and all(isinstance(s, str) for s in subgoals)):
        raise UserError(f"{where}: 'subgoals' must be a non-empty list of gold calls as JSON strings")
    if not (isinstance(queries, list) and len(queries) == len(subgoals) and all(isinstance(q, str) for q in queries)):
        raise UserError(f"{where}: additional_info.queries must hold one request string per subgoal")
    calls = []
    for i, text in enumerate(subgoals):
        try:
            call = json.loads(text)
        except json.JSONDecodeError:
            raise UserError(f"{where}: subgoal {i} is not a JSON call: {text!r}") from None
        if not (isinstance(call, dict) and set(call) == {"name", "arguments"} and isinstance(call["arguments"], dict)
                and params.get(call["name"]) == set(call["arguments"])):
            raise UserError(f"{where}: subgoal {i} must be {{\"name\", \"arguments\"}} of an offered tool "
                            f"with exactly its parameters: {text!r}")
        calls.append(call)
    return {"tools": tools, "queries": list(queries), "calls": calls, "subgoals": tuple(subgoals),
            "goal": rec.get("goal", " ".join(queries))}


def parse_records(records: Iterable[tuple[str, Any]]) -> list[Problem]:
    """Validate ``(where, record)`` pairs into problems; errors are one line naming ``where``."""
    out = []
    for where, rec in records:
        if not isinstance(rec, dict):
            raise UserError(f"{where}: an AgentBoard record must be a JSON object")
        info = rec.get("additional_info")
        if not isinstance(info, dict):
            raise UserError(f"{where}: an AgentBoard record needs an 'additional_info' object")
        env = _env_of(rec, where)
        parts = _blocksworld(rec, info, where) if env == "blocksworld" else _toolquery(rec, info, where)
        if not isinstance(parts["goal"], str):
            raise UserError(f"{where}: 'goal' must be a string")
        difficulty = rec.get("difficulty", "easy")
        if difficulty not in ("easy", "hard"):
            raise UserError(f"{where}: 'difficulty' must be 'easy' or 'hard', got {difficulty!r}")
        out.append(Problem(id=str(rec.get("id", where)), env=env, difficulty=difficulty,
                           max_steps=_max_steps(info, where), record=rec, **parts))
    return out


def load(path: str | Path) -> list[Problem]:
    """Read an AgentBoard-style JSON-lines goal file (blank lines are skipped)."""
    path = Path(path)
    lines = parse_json_lines(path, read_user_text(path, "AgentBoard"))
    problems = parse_records([(f"{path}:{i}", rec) for i, rec in lines])
    if not problems:
        raise UserError(f"{path}: no AgentBoard records")
    return problems


def write(records: Sequence[dict[str, Any]], path: str | Path) -> Path:
    """Write records as JSON lines (atomically)."""
    text = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
    return atomic_write_text(path, text)


# --------------------------------------------------------------------------------------------------
# Generators


def _blocksworld_record(rng: random.Random, i: int, n_blocks: tuple[int, int]) -> dict[str, Any]:
    ep = textworld.episode(rng, n_blocks)
    texts = [_literal_text(b, u) for b, u in goal_literals(ep["goal"])]
    return {
        "task": TASK_OF["blocksworld"], "id": i, "goal": _goal_text(texts), "subgoals": texts,
        # NOTE: AgentBoard's difficulty labels are human-assigned; here a problem is "hard" when the
        # expert (well-placed-block) plan needs more than 4 moves.
        "difficulty": "easy" if len(ep["steps"]) <= 4 else "hard",
        "additional_info": {"subtask": "blockworld", "init_stacks": ep["init"], "goal_stacks": ep["goal"]},
    }


def _toolquery_record(rng: random.Random, i: int) -> dict[str, Any]:
    offered = rng.sample(toolcalls.TOOLS, rng.randint(3, 5))
    targets = rng.sample(offered, rng.randint(2, 3))
    calls, queries = [], []
    for tool in targets:
        args = tool.sample(rng)
        queries.append(rng.choice(tool.templates).format(**args))
        calls.append({"name": tool.name, "arguments": args})
    return {
        "task": TASK_OF["toolquery"], "id": i, "goal": " ".join(queries), "subgoals": [_call_text(c) for c in calls],
        # NOTE: difficulty by the number of sub-requests (AgentBoard's labels are human-assigned).
        "difficulty": "easy" if len(calls) == 2 else "hard",
        "additional_info": {"tool": "lmforge", "tools": [t.schema() for t in offered], "queries": queries},
    }


def generate(env: str, seed: int, n: int, *, max_steps: int | None = None,
             n_blocks: tuple[int, int] = (3, 4)) -> list[dict[str, Any]]:
    """``n`` records of ``env`` in the AgentBoard format, deterministic from ``seed``.

    Blocksworld problems have ``n_blocks`` blocks (the zoo's training range by default); tool-query
    problems 2-3 sub-requests over 3-5 offered tools. ``max_steps`` is written into every record.
    """
    if env not in ENVS:
        raise UserError(f"unknown AgentBoard environment {env!r}; known: {', '.join(ENVS)}")
    rng = random.Random(f"agentboard-{env}-{seed}")
    recs = [_blocksworld_record(rng, i, n_blocks) if env == "blocksworld" else _toolquery_record(rng, i)
            for i in range(n)]
    if max_steps is not None:
        _check_cap(max_steps)
        for r in recs:
            r["additional_info"]["max_steps"] = max_steps
    return recs


# --------------------------------------------------------------------------------------------------
# Environments


class BlocksworldEnv:
    """AgentBoard's blockworld progress on top of :class:`lmforge.data.textworld.BlocksWorld`."""

    def __init__(self, problem: Problem, max_steps: int) -> None:
        assert problem.init_stacks is not None and problem.goal_stacks is not None
        self.problem = problem
        self.max_steps = max_steps
        self.world = textworld.BlocksWorld(problem.init_stacks, problem.goal_stacks, max_steps=max_steps)
        self.literals = goal_literals(problem.goal_stacks)
        self.n_subgoals = len(self.literals)

    @property
    def steps(self) -> int:
        return self.world.steps

    def observation(self) -> str:
        return self.world.observation()

    def subgoals_met(self) -> int:
        cur = textworld.support(self.world.state)
        return sum(cur[b] == under for b, under in self.literals)

    def success(self) -> bool:
        return self.subgoals_met() == self.n_subgoals

    def step(self, action: str) -> bool:
        """Apply ``action``; whether the game accepted it (an invalid action still uses a step)."""
        return self.world.step(action)

    def expert_action(self) -> str | None:
        """The expert's completion (leading space, as the zoo was trained), None once solved."""
        act = textworld.expert_action(self.world.state, self.world.goal)
        return None if act is None else " " + act


class ToolQueryEnv:
    """A sequence of single tool calls; the pending one is shown in the zoo's tool-call prompt."""

    def __init__(self, problem: Problem, max_steps: int) -> None:
        assert problem.tools is not None and problem.queries is not None and problem.calls is not None
        self.problem = problem
        self.max_steps = max_steps
        self.params = {t["name"]: set(t["parameters"]) for t in problem.tools}
        self.n_subgoals = len(problem.calls)
        self.pending = 0
        self.steps = 0

    def observation(self) -> str:
        # NOTE: AgentBoard's tool agents see the whole goal plus a history of calls and results; the
        # zoo model knows only single-call prompts, so the pending sub-request alone is shown, in
        # exactly that prompt (earlier results are not needed: the sub-requests are independent).
        k = min(self.pending, self.n_subgoals - 1)
        return toolcalls.prompt({"tools": self.problem.tools, "query": self.problem.queries[k]})

    def subgoals_met(self) -> int:
        return self.pending

    def success(self) -> bool:
        return self.pending == self.n_subgoals

    def valid(self, action: str) -> bool:
        """Whether ``action`` is a JSON call of an offered tool with exactly its parameter names."""
        return self._valid(toolcalls.parse_call(action))

    def _valid(self, call: dict[str, Any] | None) -> bool:
        return (call is not None and set(call) == {"name", "arguments"} and isinstance(call["name"], str)
                and isinstance(call["arguments"], dict) and self.params.get(call["name"]) == set(call["arguments"]))

    def step(self, action: str) -> bool:
        """Apply ``action``; whether it is a well-formed call of an offered tool."""
        self.steps += 1
        call = toolcalls.parse_call(action)
        if not self._valid(call):
            return False
        # NOTE: AgentBoard counts a tool-query subgoal as met when its string shows up among the
        # results of the calls made, in any order (``AcademiaEnv.update``); with no tool backend here,
        # a subgoal is the gold call itself and is met by an equal call while it is pending.
        if self.pending < self.n_subgoals and _json_equal(call, self.problem.calls[self.pending]):
            self.pending += 1
        return True

    def expert_action(self) -> str | None:
        if self.success():
            return None
        return " " + _call_text(self.problem.calls[self.pending])


Env = BlocksworldEnv | ToolQueryEnv


# --------------------------------------------------------------------------------------------------
# Rollouts


def run_episodes(policy: Policy, envs: Sequence[Problem | Env], max_steps: int | None = None) -> list[dict[str, Any]]:
    """Roll out ``policy`` on every environment, all episodes stepping together.

    ``policy(observations) -> actions`` is called once per step with the observations of the
    episodes still running (in ``envs`` order), so the caller can batch generation. An episode stops
    on success or after its step cap: ``max_steps`` (default and at most ``MAX_STEPS``) lowered by a
    problem's own ``max_steps``. Problems get a fresh environment; environment objects are stepped in
    place.

    Returns, per episode: ``id``, ``env``, ``difficulty``, ``progress_rate``, ``success``,
    ``grounding_accuracy``, ``steps`` and ``trajectory`` (one ``{"observation", "action", "valid",
    "progress"}`` per step, ``progress`` the share of subgoals met after it).
    """
    cap = MAX_STEPS if max_steps is None else _check_cap(max_steps)
    live_envs = [e.make_env(cap) if isinstance(e, Problem) else e for e in envs]
    caps = [min(cap, e.max_steps) for e in live_envs]
    last = [0 for _ in live_envs]
    met: list[list[int]] = [[] for _ in live_envs]
    valid: list[list[bool]] = [[] for _ in live_envs]
    trajs: list[list[dict[str, Any]]] = [[] for _ in live_envs]

    def running(i: int) -> bool:
        return not live_envs[i].success() and live_envs[i].steps < caps[i]

    while True:
        live = [i for i in range(len(live_envs)) if running(i)]
        if not live:
            break
        observations = [live_envs[i].observation() for i in live]
        actions = list(policy(observations))
        if len(actions) != len(live):
            raise ValueError(f"the policy returned {len(actions)} actions for {len(live)} observations")
        for i, obs, action in zip(live, observations, actions):
            env = live_envs[i]
            ok = env.step(str(action))
            m = env.subgoals_met()
            # AgentBoard's pddl_env starts the progress at 0 and refreshes it only after a valid
            # action (every valid move changes the state here), so the start state never counts by
            # itself: an agent that never acts validly scores 0.
            last[i] = m if ok else last[i]
            met[i].append(last[i])
            valid[i].append(ok)
            trajs[i].append({"observation": obs, "action": action, "valid": ok, "progress": m / env.n_subgoals})

    out = []
    for i, env in enumerate(live_envs):
        scores = episode_scores(met[i], env.n_subgoals, valid[i])
        out.append({
            "id": env.problem.id,
            "env": env.problem.env,
            "difficulty": env.problem.difficulty,
            "progress_rate": scores["progress_rate"],
            "success": scores["success"],
            "grounding_accuracy": scores["grounding"],
            "steps": env.steps,
            "trajectory": trajs[i],
        })
    return out


def summarize(results: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Means over episodes as AgentBoard's summary: overall, and progress/success on easy and hard."""
    def mean(xs: list[float]) -> float:
        return sum(xs) / len(xs) if xs else 0.0

    out = {
        "progress_rate": mean([r["progress_rate"] for r in results]),
        "success_rate": mean([r["success"] for r in results]),
        "grounding_accuracy": mean([r["grounding_accuracy"] for r in results]),
        "n": float(len(results)),
    }
    for level in ("easy", "hard"):
        sub = [r for r in results if r.get("difficulty") == level]
        out[f"{level}_progress_rate"] = mean([r["progress_rate"] for r in sub])
        out[f"{level}_success_rate"] = mean([r["success"] for r in sub])
    return out


def expert_trajectory(problem: Problem) -> list[tuple[str, str]]:
    """``(observation, expert completion)`` for every step of the expert's solution.

    Blocksworld uses :func:`lmforge.data.textworld.expert_action` (completion ``" move X onto Y"``),
    tool-query the gold calls (completion ``" {...}"``, as :func:`lmforge.data.toolcalls.answer`).
    The expert's plan is given whole, whatever the step cap (it is meant for teacher-forced NLL).
    """
    env = problem.make_env()  # its step cap is not applied here
    pairs = []
    while not env.success():
        act = env.expert_action()
        assert act is not None
        pairs.append((env.observation(), act))
        if not env.step(act):
            raise AssertionError(f"the expert's action {act!r} was rejected in problem {problem.id}")
    return pairs


def _parse_stacks(line: str) -> list[list[str]]:
    """``"State: [A B] [C]"`` -> ``[["A", "B"], ["C"]]`` (the inverse of textworld.render)."""
    body = line.split(": ", 1)[1]
    return [s.split() for s in body[1:-1].split("] [")]


def expert_policy(problems: Iterable[Problem]) -> Policy:
    """A policy that answers every observation of the problems' expert trajectories with the expert's
    completion (and anything else with an invalid action); for checks and as an upper bound."""
    table: dict[str, str] = {}
    for p in problems:
        if p.env == "blocksworld":
            continue  # the expert's move is a function of the observation: computed on the fly
        table.update(expert_trajectory(p))

    def act(obs: str) -> str:
        if obs in table:
            return table[obs]
        lines = obs.split("\n")
        if len(lines) == 3 and lines[0].startswith("Goal: ") and lines[1].startswith("State: "):
            move = textworld.expert_action(_parse_stacks(lines[1]), _parse_stacks(lines[0]))
            if move is not None:
                return " " + move
        return " pass"

    return lambda observations: [act(o) for o in observations]
