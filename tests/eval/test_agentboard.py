"""AgentBoard-style environments: progress rate, grounding, batching, files, expert trajectories."""

from __future__ import annotations

import json
import zlib

import pytest

from lmforge.common.errors import UserError
from lmforge.data import textworld, toolcalls
from lmforge.eval import agentboard as ab


def bw_record(init, goal, max_steps=None, id=0):
    info = {"subtask": "blockworld", "init_stacks": init, "goal_stacks": goal}
    if max_steps is not None:
        info["max_steps"] = max_steps
    return {"task": "pddl", "id": id, "difficulty": "easy", "additional_info": info}


def problem(rec):
    (p,) = ab.parse_records([("test", rec)])
    return p


def scripted(actions):
    """A single-episode policy that plays ``actions`` in order, then an invalid action."""
    queue = list(actions)

    def policy(observations):
        assert len(observations) == 1
        return [queue.pop(0) if queue else "I do not know"]

    return policy


TOOLS = [toolcalls.TOOLS_BY_NAME[n].schema() for n in ("get_weather", "send_email", "set_alarm")]
WEATHER = {"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}
EMAIL = {"name": "send_email", "arguments": {"to": "Bob", "subject": "sports"}}


def tq_record(calls=(WEATHER, EMAIL), queries=("What is the weather in Paris in celsius?", "Email Bob about sports."),
              max_steps=None):
    info = {"tool": "lmforge", "tools": TOOLS, "queries": list(queries)}
    if max_steps is not None:
        info["max_steps"] = max_steps
    return {"task": "tool-query", "id": "t0", "goal": " ".join(queries), "difficulty": "easy",
            "subgoals": [json.dumps(c) for c in calls], "additional_info": info}


# ---------------------------------------------------------------------------------------------- blocksworld


def test_goal_literals_and_texts_follow_agentboard():
    p = problem(bw_record([["C", "A"], ["B"]], [["A", "B"], ["C"]]))
    assert ab.goal_literals(p.goal_stacks) == [("A", "table"), ("B", "A"), ("C", "table")]
    assert sorted(p.subgoals) == ["A is on the table.", "B is on A.", "C is on the table."]
    assert p.goal == ("The goal is to satisfy the following conditions: "
                      "A is on the table., B is on A., C is on the table.")
    assert p.max_steps == 30
    env = p.make_env()
    assert env.observation() == "Goal: [A B] [C]\nState: [B] [C A]\nAction:"
    assert env.observation() == textworld.step_prompt([["A", "B"], ["C"]], [["C", "A"], ["B"]])
    # Start [C A] [B]: A is on C (not the table), B is on the table (not on A), C is on the table.
    assert env.subgoals_met() == 1 and env.n_subgoals == 3


def test_invalid_policy_scores_zero_and_stops_at_cap():
    # Start [A B] [C], goal [A B C]: 2/3 of the literals hold, but as in AgentBoard's pddl_env the
    # progress only counts states reached by a valid action.
    calls = []

    def policy(observations):
        calls.append(list(observations))
        return ["I do not know"] * len(observations)

    (res,) = ab.run_episodes(policy, [problem(bw_record([["A", "B"], ["C"]], [["A", "B", "C"]]))], max_steps=5)
    assert res["progress_rate"] == 0.0
    assert res["success"] == 0 and res["grounding_accuracy"] == 0.0
    assert res["steps"] == 5 and len(calls) == 5
    assert [t["valid"] for t in res["trajectory"]] == [False] * 5
    assert all(t["observation"] == "Goal: [A B C]\nState: [A B] [C]\nAction:" for t in res["trajectory"])


def test_record_and_caller_caps_take_the_smaller():
    rec = bw_record([["A", "B"], ["C"]], [["A", "B", "C"]], max_steps=3)
    bad = ["nope"]
    (r1,) = ab.run_episodes(lambda o: bad * len(o), [problem(rec)])
    (r2,) = ab.run_episodes(lambda o: bad * len(o), [problem(rec)], max_steps=2)
    (r3,) = ab.run_episodes(lambda o: bad * len(o), [problem(rec)], max_steps=10)
    assert (r1["steps"], r2["steps"], r3["steps"]) == (3, 2, 3)
    (r4,) = ab.run_episodes(lambda o: bad * len(o), [problem(bw_record([["A", "B"], ["C"]], [["A", "B", "C"]]))])
    assert r4["steps"] == ab.MAX_STEPS == 30
    with pytest.raises(ValueError):
        ab.run_episodes(lambda o: bad * len(o), [problem(rec)], max_steps=31)


def test_one_correct_move_raises_progress_by_one_literal():
    # Start [A] [B] [C], goal [A B C]: only "A on table" holds -> 1/3; "move B onto A" -> 2/3.
    p = problem(bw_record([["A"], ["B"], ["C"]], [["A", "B", "C"]]))
    assert p.make_env().subgoals_met() == 1
    (res,) = ab.run_episodes(scripted(["move B onto A"]), [p], max_steps=2)
    assert [t["progress"] for t in res["trajectory"]] == [pytest.approx(2 / 3), pytest.approx(2 / 3)]
    assert [t["valid"] for t in res["trajectory"]] == [True, False]
    assert res["progress_rate"] == pytest.approx(2 / 3) and res["success"] == 0
    assert res["grounding_accuracy"] == 0.5

    (done,) = ab.run_episodes(scripted(["move B onto A", "move C onto B"]), [p], max_steps=10)
    assert done["progress_rate"] == 1.0 and done["success"] == 1.0
    assert done["steps"] == 2 and done["grounding_accuracy"] == 1.0  # stops on success


def test_progress_rate_is_the_max_over_the_episode():
    # 1/3 -> B onto A: 2/3 -> B back to the table: 1/3 -> invalid: 1/3.
    p = problem(bw_record([["A"], ["B"], ["C"]], [["A", "B", "C"]]))
    (res,) = ab.run_episodes(scripted(["move B onto A", "move B to table"]), [p], max_steps=3)
    assert [t["progress"] for t in res["trajectory"]] == pytest.approx([2 / 3, 1 / 3, 1 / 3])
    assert res["progress_rate"] == pytest.approx(2 / 3)
    assert res["success"] == 0 and res["grounding_accuracy"] == pytest.approx(2 / 3)


def test_start_state_does_not_count_when_the_first_move_undoes_a_literal():
    # Start [A B] [C] has 2/3; "move B to table" gives [A] [B] [C]: only "A on table" holds, 1/3,
    # and (as in AgentBoard) the start's share is never credited by itself.
    p = problem(bw_record([["A", "B"], ["C"]], [["A", "B", "C"]]))
    (res,) = ab.run_episodes(scripted(["move B to table"]), [p], max_steps=2)
    assert res["trajectory"][0]["progress"] == pytest.approx(1 / 3)
    assert res["progress_rate"] == pytest.approx(1 / 3)


def test_invalid_moves_are_those_the_game_rejects():
    p = problem(bw_record([["A", "B"], ["C"]], [["A", "B", "C"]]))
    # A is under B (not clear); C alone cannot go "to table"; D does not exist; then a legal move.
    (res,) = ab.run_episodes(scripted(["move A onto C", "move C to table", "move D onto B", "move C onto B"]),
                             [p], max_steps=10)
    assert [t["valid"] for t in res["trajectory"]] == [False, False, False, True]
    assert res["success"] == 1.0 and res["grounding_accuracy"] == 0.25


# ---------------------------------------------------------------------------------------------- toolquery


def test_toolquery_wrong_call_is_valid_but_does_not_advance():
    p = problem(tq_record())
    first = ("Tools:\n- get_weather(city, unit)\n- send_email(to, subject)\n- set_alarm(hour, minute)\n"
             "User: What is the weather in Paris in celsius?\nCall:")
    second = first.replace("What is the weather in Paris in celsius?", "Email Bob about sports.")
    actions = [
        ' {"name": "get_weather", "arguments": {"city": "Rome", "unit": "celsius"}}',  # valid, wrong city
        ' {"name": "get_weather", "arguments": {"city": "Paris"}}',  # a parameter missing: invalid
        ' {"name": "play_music", "arguments": {"artist": "Bob", "volume": 3}}',  # not offered: invalid
        " get the weather",  # not JSON: invalid
        " " + json.dumps(WEATHER),  # right: advances
        ' {"name": "send_email", "arguments": {"subject": "sports", "to": "Bob"}}',  # right (key order free)
    ]
    (res,) = ab.run_episodes(scripted(actions), [p], max_steps=10)
    traj = res["trajectory"]
    assert [t["valid"] for t in traj] == [True, False, False, False, True, True]
    assert [t["progress"] for t in traj] == [0, 0, 0, 0, 0.5, 1.0]
    assert [t["observation"] for t in traj] == [first] * 5 + [second]
    assert res["success"] == 1.0 and res["progress_rate"] == 1.0
    assert res["steps"] == 6 and res["grounding_accuracy"] == 0.5


def test_toolquery_partial_progress_and_cap():
    (res,) = ab.run_episodes(scripted([" " + json.dumps(WEATHER)]), [problem(tq_record(max_steps=4))])
    assert res["progress_rate"] == 0.5 and res["success"] == 0 and res["steps"] == 4
    assert res["grounding_accuracy"] == 0.25
    (none,) = ab.run_episodes(scripted([]), [problem(tq_record())], max_steps=3)
    assert none["progress_rate"] == 0.0 and none["grounding_accuracy"] == 0.0 and none["steps"] == 3


def test_toolquery_calls_compare_as_json():
    alarm = {"name": "set_alarm", "arguments": {"hour": 7, "minute": 30}}
    rec = tq_record(calls=(alarm,), queries=("Set an alarm for hour 7 minute 30.",))
    as_float = ' {"name": "set_alarm", "arguments": {"hour": 7.0, "minute": 30}}'
    as_bool = ' {"name": "set_alarm", "arguments": {"hour": true, "minute": 30}}'
    assert ab.run_episodes(scripted([as_float]), [problem(rec)], max_steps=1)[0]["success"] == 1.0
    (r,) = ab.run_episodes(scripted([as_bool]), [problem(rec)], max_steps=1)
    assert r["success"] == 0 and r["grounding_accuracy"] == 1.0


# ---------------------------------------------------------------------------------------------- both


@pytest.mark.parametrize("env", ab.ENVS)
def test_expert_solves_generated_problems(env, tmp_path):
    problems = ab.load(ab.write(ab.generate(env, 3, 12, max_steps=20), tmp_path / f"{env}.jsonl"))
    results = ab.run_episodes(ab.expert_policy(problems), problems)
    for p, r in zip(problems, results):
        traj = ab.expert_trajectory(p)
        assert r["progress_rate"] == 1.0 and r["success"] == 1.0 and r["grounding_accuracy"] == 1.0
        assert r["steps"] == len(traj) >= (1 if env == "blocksworld" else 2)
        assert [(t["observation"], t["action"]) for t in r["trajectory"]] == traj
        for obs, completion in traj:
            if env == "blocksworld":
                assert obs.startswith("Goal: [") and obs.endswith("]\nAction:")
                assert completion.startswith(" move ") and textworld.parse_action(completion) is not None
            else:
                assert obs.startswith("Tools:\n- ") and "\nUser: " in obs and obs.endswith("\nCall:")
        if env == "toolquery":
            # Exactly the zoo's prompt and completion for each sub-request.
            for (obs, completion), query, call in zip(traj, p.queries, p.calls):
                rec = {"tools": p.tools, "query": query, "answers": [call]}
                assert obs == toolcalls.prompt(rec) and completion == toolcalls.answer(rec)
            assert 3 <= len(p.tools) <= 5 and 2 <= len(p.calls) <= 3
            assert {c["name"] for c in p.calls} <= {t["name"] for t in p.tools}


def test_batched_rollout_equals_one_by_one():
    recs = ab.generate("blocksworld", 5, 8) + ab.generate("toolquery", 5, 8)
    problems = ab.parse_records([(f"r{i}", r) for i, r in enumerate(recs)])
    expert = ab.expert_policy(problems)

    def noisy(observations):  # a function of the observation only
        out = []
        for obs in observations:
            h = zlib.crc32(obs.encode()) % 4
            out.append(expert([obs])[0] if h < 2 else ("move A to table" if h == 2 else "???"))
        return out

    calls = []

    def counting(observations):
        calls.append(len(observations))
        return noisy(observations)

    batched = ab.run_episodes(counting, problems, max_steps=12)
    single = [ab.run_episodes(noisy, [p], max_steps=12)[0] for p in problems]
    assert batched == single
    assert len(calls) == max(r["steps"] for r in batched) and calls[0] == len(problems)
    # The comparison is not vacuous: the episodes differ in outcome.
    assert 0 < sum(r["success"] for r in batched) < len(batched)
    assert any(0 < r["grounding_accuracy"] < 1 for r in batched)


def test_generation_is_deterministic_and_round_trips(tmp_path):
    for env in ab.ENVS:
        recs = ab.generate(env, 7, 6)
        assert recs == ab.generate(env, 7, 6) and recs != ab.generate(env, 8, 6)
        path = ab.write(recs, tmp_path / f"{env}.jsonl")
        assert len(path.read_text().splitlines()) == 6
        problems = ab.load(path)
        assert [p.record for p in problems] == recs
        assert [p.id for p in problems] == [str(i) for i in range(6)] and {p.env for p in problems} == {env}
        assert [list(p.subgoals) for p in problems] == [r["subgoals"] for r in recs]
        again = ab.write([p.record for p in problems], tmp_path / f"{env}2.jsonl")
        assert again.read_text() == path.read_text()


def test_summary_means():
    rs = [{"progress_rate": 1.0, "success": 1.0, "grounding_accuracy": 1.0, "difficulty": "easy"},
          {"progress_rate": 0.5, "success": 0.0, "grounding_accuracy": 0.5, "difficulty": "hard"}]
    s = ab.summarize(rs)
    assert s["progress_rate"] == 0.75 and s["success_rate"] == 0.5 and s["grounding_accuracy"] == 0.75
    assert s["easy_progress_rate"] == 1.0 and s["hard_progress_rate"] == 0.5


# ---------------------------------------------------------------------------------------------- errors


def test_malformed_line_names_file_and_line(tmp_path):
    good = json.dumps(ab.generate("blocksworld", 0, 1)[0])
    path = tmp_path / "bad.jsonl"
    path.write_text(good + "\n\n{not json\n")
    with pytest.raises(UserError) as exc:
        ab.load(path)
    assert f"{path}:3" in str(exc.value) and "\n" not in str(exc.value)

    rec = bw_record([["A"], ["B"]], [["A", "B"]])
    del rec["additional_info"]["goal_stacks"]
    path.write_text(good + "\n" + json.dumps(rec) + "\n")
    with pytest.raises(UserError, match=rf"{path}:2: additional_info.goal_stacks"):
        ab.load(path)


@pytest.mark.parametrize("mutate, message", [
    (lambda r: r.update(task="alfworld"), "known environments: blocksworld, toolquery"),
    (lambda r: r["additional_info"].update(subtask="barman"), "known environments: blocksworld, toolquery"),
    (lambda r: r.update(subgoals=["B is on A."]), "'subgoals' must be"),
    (lambda r: r["additional_info"].update(max_steps=31), "max_steps must be an integer in 1..30"),
    (lambda r: r["additional_info"].update(init_stacks=[["A", "B"]]), "the start state already satisfies"),
    (lambda r: r["additional_info"].update(init_stacks=[["A"], ["C"]]), "different blocks"),
    (lambda r: r.update(difficulty="medium"), "'difficulty'"),
])
def test_bad_blocksworld_records(mutate, message):
    rec = bw_record([["A"], ["B"]], [["A", "B"]])
    mutate(rec)
    with pytest.raises(UserError, match=message):
        ab.parse_records([("f.jsonl:4", rec)])


@pytest.mark.parametrize("mutate, message", [
    (lambda r: r.update(subgoals=[json.dumps(WEATHER)]), "one request string per subgoal"),
    (lambda r: r.update(subgoals=["{oops", json.dumps(EMAIL)]), "subgoal 0 is not a JSON call"),
    (lambda r: r.update(subgoals=[json.dumps({"name": "get_weather", "arguments": {"city": "Paris"}}),
                                  json.dumps(EMAIL)]), "subgoal 0 must be"),
    (lambda r: r.update(subgoals=[json.dumps({"name": "play_music", "arguments": {"artist": "A", "volume": 1}}),
                                  json.dumps(EMAIL)]), "subgoal 0 must be"),
])
def test_bad_toolquery_records(mutate, message):
    rec = tq_record()
    mutate(rec)
    with pytest.raises(UserError, match=f"f.jsonl:4: .*{message}"):
        ab.parse_records([("f.jsonl:4", rec)])


def test_unknown_environment_and_missing_file(tmp_path):
    with pytest.raises(UserError, match="unknown AgentBoard environment 'webshop'; known: blocksworld, toolquery"):
        ab.generate("webshop", 0, 1)
    with pytest.raises(UserError, match="not found"):
        ab.load(tmp_path / "missing.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(UserError, match="no AgentBoard records"):
        ab.load(tmp_path / "empty.jsonl")
