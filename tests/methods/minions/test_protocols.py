"""MINION and MINIONS protocols with scripted clients (and one end-to-end run with agent-nano).

The scripted remote answers by the kind of prompt it is sent; the scripted local worker reads the
chunk it is given with a regex. Every test counts calls, reads the messages each side received and
checks the ledger against the clients' own token counts.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable

import pytest

from lmforge.common.errors import UserError
from lmforge.common.sandbox import SandboxLimits
from lmforge.methods.minions.clients import (
    ChatResponse,
    HFChatClient,
    ScriptedClient,
    StructuredOutputError,
    count_tokens,
)
from lmforge.methods.minions.jobs import Job, JobManifest, JobOutput
from lmforge.methods.minions.ledger import CostLedger
from lmforge.methods.minions.minion import NO_ANSWER, run_minion
from lmforge.methods.minions.minions import extract_code, fallback_aggregate, run_minions

# ----------------------------------------------------------------------------------------------
# A document with two facts in different 200-character chunks
# ----------------------------------------------------------------------------------------------

CHUNK = 200
FACTS = {1: "Alpha revenue was 120 million.", 3: "Beta revenue was 80 million."}


def _block(i: int) -> str:
    text = f"Section {i}. " + FACTS.get(i, "Nothing of note happened here.") + " "
    return (text + "filler " * 40)[:CHUNK]


DOC = "".join(_block(i) for i in range(5))
N_CHUNKS = 5
TASKS = ["Extract the Alpha revenue.", "Extract the Beta revenue."]
QUESTION = "What is the total revenue of Alpha and Beta, in millions?"


def _code(tasks: list[str] = TASKS, *, chunk: int | None = CHUNK, prepare_extra: str = "", transform: bool = True) -> str:
    size = "" if chunk is None else f", {chunk}"
    body = f'''\
Here is my plan.

```python
TASKS = {tasks!r}

def prepare_jobs(context, prev_job_manifests=None, prev_job_outputs=None):
{prepare_extra}    jobs = []
    for doc in context:
        for chunk in chunk_by_section(doc{size}):
            for task in TASKS:
                jobs.append(JobManifest(chunk=chunk, task=task, advice="Quote the sentence."))
    return jobs
'''
    if transform:
        body += '''
def transform_outputs(jobs):
    lines = []
    for job in jobs:
        if job.output.answer:
            lines.append(f"task {job.manifest.task_id} chunk {job.manifest.chunk_id}: {job.output.answer}")
    return "FOUND\\n" + "\\n".join(lines)
'''
    return body + "```\n"


def _worker_reply(messages: list[dict[str, str]]) -> str:
    """The scripted local model: finds the asked-for revenue in its excerpt."""
    prompt = messages[-1]["content"]
    excerpt = prompt.split("Here is an excerpt from a document:")[1].split("Your task:")[0]
    task = prompt.split("Your task:")[1].split("Advice")[0]
    name = "Alpha" if "Alpha" in task else "Beta"
    m = re.search(name + r" revenue was (\d+)", excerpt)
    if m is None:
        return json.dumps({"explanation": "not in this excerpt", "citation": None, "answer": None})
    return "```json\n" + json.dumps({"explanation": "stated", "citation": m.group(0), "answer": m.group(1)}) + "\n```"


def _numbers_found(messages: list[dict[str, str]]) -> dict[int, str]:
    """task_id -> answer, read from the aggregated text the remote has been shown."""
    text = "\n".join(m["content"] for m in messages if m["role"] == "user")
    return {int(t): a for t, a in re.findall(r"task (\d+) chunk \d+: (\d+)", text)}


class Remote:
    """The scripted remote: replies by the kind of the last user message.

    Args:
        codes: the replies to successive code requests (the last is repeated).
        decide: ``(round, messages) -> dict`` the synthesis JSON; by default it answers the sum once
            both revenues were reported.
    """

    def __init__(self, codes: list[str], decide: Callable[[int, list[dict[str, str]]], dict] | None = None):
        self.codes = codes
        self.code_requests = 0
        self.round = 0
        self.decide = decide or self._sum
        self.client = ScriptedClient(self, name="gpt-4o")
        self.replies: list[str] = []

    @staticmethod
    def _sum(round_no: int, messages: list[dict[str, str]]) -> dict:
        found = _numbers_found(messages)
        if len(found) == 2:
            return {"explanation": "both found", "feedback": None, "decision": "provide_final_answer",
                    "answer": str(sum(int(v) for v in found.values())), "scratchpad": ""}
        return {"explanation": "missing", "feedback": "look again", "decision": "request_additional_info",
                "answer": None, "scratchpad": f"round {round_no}: {found}"}

    def __call__(self, messages: list[dict[str, str]]) -> str:
        last = messages[-1]["content"]
        if "Briefly advise us" in last:
            reply = "Look for the revenue of each company."
        elif last.startswith("# Decomposition round") or "Please try again" in last or "allowed in one round" in last:
            if last.startswith("# Decomposition round"):
                self.round += 1
            reply = self.codes[min(self.code_requests, len(self.codes) - 1)]
            self.code_requests += 1
        elif "Think, step by step, about" in last:
            reply = "Let me think about the outputs."
        elif "From your analysis, return one JSON object" in last or "Now give the final answer" in last:
            reply = json.dumps(self.decide(self.round, messages))
        else:  # pragma: no cover - a prompt the protocol should not send
            raise AssertionError(f"unexpected prompt: {last[:80]!r}")
        self.replies.append(reply)
        return reply


def _local(done_reasons: Callable[[list[dict[str, str]]], str] | None = None) -> ScriptedClient:
    return ScriptedClient(_worker_reply, name="local-scripted", done_reasons=done_reasons)


def _expected_usage(client: ScriptedClient, reply: Callable[[list[dict[str, str]]], str]) -> tuple[int, int]:
    """Prompt and completion tokens recomputed from the recorded calls (replies are deterministic)."""
    prompt = sum(count_tokens(m["content"]) for call in client.calls for m in call)
    completion = sum(count_tokens(reply(call)) for call in client.calls)
    return prompt, completion


# ----------------------------------------------------------------------------------------------
# MINIONS
# ----------------------------------------------------------------------------------------------


def test_minions_answers_with_tasks_times_chunks_local_calls_and_exact_ledger() -> None:
    remote, local = Remote([_code()]), _local()
    result = run_minions(local, remote.client, DOC, QUESTION, doc_metadata="a company report")

    assert result.answer == "200"
    assert result.ended_by == "answer" and result.rounds == 1
    # one single-user-message call per (task, chunk)
    assert len(local.calls) == len(TASKS) * N_CHUNKS == result.local_calls == result.jobs_per_round[0]
    assert all(len(c) == 1 and c[0]["role"] == "user" for c in local.calls)
    assert local.options[0]["json_mode"] is True
    # the remote's transform_outputs ran in the sandbox and its text reached the remote
    log = result.round_logs[0]
    assert log["aggregation"] == "transform_outputs" and log["aggregated"].startswith("FOUND")
    assert log["chunks"] == N_CHUNKS and log["tasks"] == len(TASKS)
    assert result.code and "def prepare_jobs" in result.code[0]
    # advice, code, CoT, JSON: four remote calls; the JSON call alone in JSON mode
    assert len(remote.client.calls) == 4
    assert [o["json_mode"] for o in remote.client.options] == [False, False, False, True]
    # no remote message holds a chunk of the document
    for call in remote.client.calls:
        for m in call:
            assert all(_block(i)[:60] not in m["content"] for i in range(5))

    # ledger = sum of the clients' own per-call counts; dollars at GPT-4o's price, local free
    ledger = result.ledger
    lp, lc = _expected_usage(local, _worker_reply)
    assert (ledger.usage("local").prompt_tokens, ledger.usage("local").completion_tokens) == (lp, lc)
    assert ledger.calls("local") == len(local.calls) and ledger.calls("remote") == 4
    rp = sum(count_tokens(m["content"]) for call in remote.client.calls for m in call)
    rc = sum(count_tokens(r) for r in remote.replies)
    assert (ledger.usage("remote").prompt_tokens, ledger.usage("remote").completion_tokens) == (rp, rc)
    assert ledger.dollars("remote") == pytest.approx((rp * 2.50 + rc * 10.00) / 1e6)
    assert ledger.dollars("local") == 0.0
    d = result.to_dict()
    json.dumps(d)
    assert d["ledger"]["sides"]["remote"]["prompt_tokens"] == rp


def test_minions_code_error_is_fed_back_and_retried() -> None:
    broken = _code(prepare_extra='    raise RuntimeError("boom-1234: bad chunk size")\n')
    remote, local = Remote([broken, _code()]), _local()
    result = run_minions(local, remote.client, DOC, QUESTION)

    assert result.answer == "200"
    assert remote.code_requests == 2
    # the remote's second code request carries the error text of the first
    retry = [c for c in remote.client.calls if "Please try again" in c[-1]["content"]]
    assert len(retry) == 1 and "boom-1234" in retry[0][-1]["content"]
    assert retry[0][-2]["content"] == broken  # after its own failed reply
    assert len(result.round_logs[0]["code_errors"]) == 1 and result.round_logs[0]["code_attempts"] == 2
    assert result.code == [extract_code(_code())]
    assert len(local.calls) == len(TASKS) * N_CHUNKS  # the broken code ran no jobs


@pytest.mark.parametrize(
    "attack",
    ['    open("/etc/passwd").read()\n', "    import socket\n", "    while True:\n        pass\n"],
    ids=["read-outside", "socket", "endless-loop"],
)
def test_minions_sandbox_stops_hostile_code_and_the_run_goes_on(attack: str) -> None:
    remote, local = Remote([_code(prepare_extra=attack), _code()]), _local()
    limits = SandboxLimits(cpu_seconds=1, wall_seconds=5)
    result = run_minions(local, remote.client, DOC, QUESTION, sandbox_limits=limits)
    assert result.answer == "200" and remote.code_requests == 2
    error = result.round_logs[0]["code_errors"][0]
    assert re.search(r"refused|not allowed|time limit", error), error
    retry = [c for c in remote.client.calls if "Please try again" in c[-1]["content"]]
    assert len(retry) == 1 and error in retry[0][-1]["content"]


def test_minions_chunk_size_is_the_chunkers_default_in_prompt_and_sandbox() -> None:
    remote, local = Remote([_code(chunk=None)]), _local()  # the code relies on the default size
    result = run_minions(local, remote.client, DOC, QUESTION, chunk_size=100)
    assert result.answer == "200"
    assert len(local.calls) == len(TASKS) * len(DOC) // 100  # 10 chunks of 100 characters
    decompose = remote.client.calls[1][-1]["content"]
    assert "def chunk_by_section(doc: str, max_chunk_size: int = 100, overlap: int = 0)" in decompose
    # the parent's chunker keeps the official default
    from lmforge.methods.minions.jobs import DEFAULT_CHUNK_SIZE, chunk_by_section

    assert chunk_by_section.__defaults__ == (DEFAULT_CHUNK_SIZE, 0) == (5000, 0)


def test_minions_gives_up_after_max_code_attempts() -> None:
    broken = _code(prepare_extra="    return 7\n")
    no_code = "I would rather not write code."
    remote, local = Remote([no_code, broken]), _local()
    result = run_minions(local, remote.client, DOC, QUESTION, max_code_attempts=3)
    assert result.answer == NO_ANSWER and result.ended_by == "code_attempts"
    assert remote.code_requests == 3 and local.calls == [] and result.local_calls == 0
    errors = result.round_logs[0]["code_errors"]
    assert errors[0] == "no code block" and "list of JobManifest" in errors[1]


def test_minions_rejects_more_than_max_jobs() -> None:
    too_many = _code(TASKS + ["Extract the Gamma revenue.", "Extract the CEO's name."])  # 4 x 5 = 20 jobs
    remote, local = Remote([too_many, _code()]), _local()
    result = run_minions(local, remote.client, DOC, QUESTION, max_jobs=10)
    assert result.answer == "200"
    complaint = [c[-1]["content"] for c in remote.client.calls if "allowed in one round" in c[-1]["content"]]
    assert len(complaint) == 1 and "20 jobs" in complaint[0] and "10" in complaint[0]
    assert len(local.calls) == 10 == result.jobs_per_round[0]


def test_minions_skips_truncated_jobs() -> None:
    # the worker's reply about chunk 3 (Beta's) is cut off: the job is dropped, not parsed
    def reasons(messages: list[dict[str, str]]) -> str:
        return "length" if "Section 3." in messages[-1]["content"] else "stop"

    seen: list[dict[int, str]] = []

    def decide(round_no: int, messages: list[dict[str, str]]) -> dict:
        seen.append(_numbers_found(messages))
        return {"explanation": "", "feedback": None, "decision": "provide_final_answer",
                "answer": str(sum(int(v) for v in seen[-1].values())), "scratchpad": ""}

    remote, local = Remote([_code()], decide), _local(reasons)
    result = run_minions(local, remote.client, DOC, QUESTION)
    assert len(local.calls) == len(TASKS) * N_CHUNKS  # the calls were made ...
    log = result.round_logs[0]
    assert log["truncated"] == len(TASKS) and log["kept"] == len(TASKS) * (N_CHUNKS - 1)  # ... and 2 dropped
    assert "80" not in log["aggregated"] and "120" in log["aggregated"]
    assert seen == [{0: "120"}] and result.answer == "120"


def test_minions_later_rounds_reset_history_and_carry_feedback() -> None:
    # round 1 asks only for Alpha; the synthesis asks for more; round 2 asks for Beta too
    first = _code(TASKS[:1], prepare_extra="    assert prev_job_manifests is None and prev_job_outputs is None\n")
    # round 2's code sees round 1's jobs (as objects, numbered) in prev_job_manifests / prev_job_outputs
    second = _code(prepare_extra=(
        "    assert len(prev_job_outputs) == len(prev_job_manifests) == 5\n"
        "    assert [o.answer for o in prev_job_outputs] == [None, '120', None, None, None]\n"
        "    assert isinstance(prev_job_manifests[1], JobManifest) and prev_job_manifests[1].chunk_id == 1\n"
    ))
    remote, local = Remote([first, second]), _local()
    result = run_minions(local, remote.client, DOC, QUESTION, max_rounds=3)
    assert [log["code_errors"] for log in result.round_logs] == [[], []]
    assert result.answer == "200" and result.rounds == 2 and result.ended_by == "answer"
    assert result.jobs_per_round == [N_CHUNKS, 2 * N_CHUNKS] == [len(TASKS[:1]) * 5, len(TASKS) * 5]
    round2 = [c for c in remote.client.calls if c[-1]["content"].startswith("# Decomposition round 2")]
    assert len(round2) == 1
    msgs = round2[0]
    # history = the advice turns + the abbreviated prompt, carrying the scratchpad and feedback
    assert len(msgs) == 3 and "Briefly advise us" in msgs[0]["content"] and msgs[1]["role"] == "assistant"
    assert "round 1: {0: '120'}" in msgs[2]["content"] and "look again" in msgs[2]["content"]
    # the full transcript keeps every round, though the working history was reset
    assert sorted({m["round"] for m in result.supervisor_messages}) == [0, 1, 2]


def test_minions_max_rounds_final_prompt_answers_and_fallback() -> None:
    # never satisfied before the last round, which gets the final-answer prompt (no CoT step)
    def stubborn(round_no: int, messages: list[dict[str, str]]) -> dict:
        if "Now give the final answer" in messages[-1]["content"]:
            return {"explanation": "", "feedback": None, "decision": "provide_final_answer",
                    "answer": "200", "scratchpad": ""}
        return {"explanation": "unsure", "feedback": "more", "decision": "request_additional_info",
                "answer": None, "scratchpad": "x"}

    remote, local = Remote([_code()], stubborn), _local()
    result = run_minions(local, remote.client, DOC, QUESTION, max_rounds=2)
    assert result.answer == "200" and result.rounds == 2 and result.ended_by == "answer"
    cot = [c for c in remote.client.calls if "Think, step by step, about" in c[-1]["content"]]
    final = [c for c in remote.client.calls if "Now give the final answer" in c[-1]["content"]]
    assert len(cot) == 1 and len(final) == 1  # CoT in round 1 only; round 2 answers directly

    # a remote that still asks for more in the last round: the official fallback answer
    def never(round_no: int, messages: list[dict[str, str]]) -> dict:
        return {"explanation": "no", "feedback": "more", "decision": "request_additional_info",
                "answer": None, "scratchpad": ""}

    remote, local = Remote([_code()], never), _local()
    result = run_minions(local, remote.client, DOC, QUESTION, max_rounds=2)
    assert result.answer == NO_ANSWER and result.ended_by == "max_rounds" and result.hit_max_rounds
    assert result.rounds == 2 and result.local_calls == 2 * len(TASKS) * N_CHUNKS


def test_minions_transform_failure_uses_official_fallback_and_invalid_worker_json() -> None:
    code = _code(transform=False)  # no transform_outputs: the official fallback aggregation

    def worker(messages: list[dict[str, str]]) -> str:
        return "not json at all" if "Section 1." in messages[-1]["content"] else _worker_reply(messages)

    seen: list[str] = []

    def decide(round_no: int, messages: list[dict[str, str]]) -> dict:
        seen.append(next(m["content"] for m in reversed(messages) if "Think, step by step" in m["content"]))
        return {"explanation": "", "feedback": None, "decision": "provide_final_answer", "answer": "80",
                "scratchpad": ""}

    remote = Remote([code], decide)
    local = ScriptedClient(worker, name="local")
    result = run_minions(local, remote.client, DOC, QUESTION)
    log = result.round_logs[0]
    assert log["aggregation"] == "fallback" and log["invalid_json"] == len(TASKS)
    text = seen[0]
    assert "## Task (task_id=`0`): Extract the Alpha revenue." in text
    assert "## Task (task_id=`1`): Extract the Beta revenue." in text
    assert '"citation": "Beta revenue was 80"' in text  # the raw sample of the kept job
    assert "Alpha revenue was 120" not in text  # invalid JSON -> answer None -> excluded
    assert text.count("No jobs returned successfully for this chunk.") == 2 * N_CHUNKS - 1


def test_minions_synthesis_json_retries_then_raises_with_ledger_kept() -> None:
    remote = Remote([_code()])

    def junk(messages: list[dict[str, str]]) -> str:
        last = messages[-1]["content"]
        if "could not be used" in last or "From your analysis" in last:
            return "no json here"
        return remote(messages)

    client = ScriptedClient(junk, name="gpt-4o")
    ledger = CostLedger()
    with pytest.raises(StructuredOutputError):
        run_minions(_local(), client, DOC, QUESTION, json_retries=3, ledger=ledger)
    assert ledger.calls("remote") == 3 + 3  # advice, code, CoT, then 3 JSON attempts
    assert ledger.calls("local") == len(TASKS) * N_CHUNKS
    assert ledger.usage("remote").prompt_tokens == sum(
        count_tokens(m["content"]) for call in client.calls for m in call)


@pytest.mark.parametrize("bad", [b"bytes", ["text", 3], 42])
def test_documents_that_are_not_text_are_one_line_user_errors(bad: object) -> None:
    remote = ScriptedClient(["unused"], name="gpt-4o")
    for run in (run_minions, run_minion):
        with pytest.raises(UserError, match="not text|must be text"):
            run(_local(), remote, bad, QUESTION)  # type: ignore[arg-type]
    assert remote.calls == []  # nothing was sent


def test_fallback_aggregate_groups_by_task_then_chunk() -> None:
    def job(c: int, t: int, j: int, answer: str | None) -> Job:
        return Job(JobManifest(f"c{c}", f"t{t}", "", c, t, j), JobOutput("e", None, answer), f"raw{j}")

    jobs = [job(0, 0, 0, "a"), job(1, 1, 1, "None"), job(1, 0, 2, None), job(0, 0, 3, "b")]
    text = fallback_aggregate(jobs)
    assert [j.include for j in jobs] == [True, False, False, True]
    assert text.index("task_id=`0`") < text.index("task_id=`1`")
    t0 = text.split("task_id=`1`")[0]
    assert "raw0" in t0 and "raw3" in t0 and "raw2" not in text and "raw1" not in text
    assert t0.index("### Chunk # 0") < t0.index("### Chunk # 1")


def test_extract_code_prefers_python_block() -> None:
    assert extract_code("```json\n{}\n```\n```python\nx = 1\n```") == "x = 1"
    assert extract_code("```\ny = 2\n```") == "y = 2"
    assert extract_code("no code") is None


# ----------------------------------------------------------------------------------------------
# MINION
# ----------------------------------------------------------------------------------------------

SECRET = "The vault code is 7319-ZEBRA-PLUM, known only to the archivist."


def _minion_remote(decisions: list[dict]) -> tuple[ScriptedClient, list[str]]:
    replies: list[str] = []

    def respond(messages: list[dict[str, str]]) -> str:
        if len(messages) == 1:
            reply = 'I need the facts.\n```json\n{"message": "What does the document say about the vault?"}\n```'
        else:
            reply = "Thinking...\n```json\n" + json.dumps(decisions[min(len(replies) - 1, len(decisions) - 1)]) + "\n```"
        replies.append(reply)
        return reply

    return ScriptedClient(respond, name="gpt-4o"), replies


def _minion_worker(messages: list[dict[str, str]]) -> str:
    assert messages[0]["role"] == "system"
    return f"There is a vault code with {len(messages)} digits of context; I will not repeat it."


MORE = {"decision": "request_additional_info", "message": "Tell me more."}


def test_minion_privacy_no_remote_message_contains_the_document() -> None:
    doc = "Preface.\n" + "Background text. " * 50 + SECRET + " More text." * 20
    remote, _ = _minion_remote([MORE, {"decision": "provide_final_answer", "answer": "vault"}])
    local = ScriptedClient(_minion_worker, name="local")
    result = run_minion(local, remote, doc, "What is the vault code?")
    assert result.answer == "vault"
    assert SECRET in local.calls[0][0]["content"]  # the worker reads the document ...
    assert remote.calls  # ... the remote never does
    for call in remote.calls:
        for m in call:
            assert SECRET not in m["content"] and "Background text." not in m["content"]
    for m in result.supervisor_messages:
        assert SECRET not in m["content"]


def test_minion_ends_on_final_answer() -> None:
    remote, replies = _minion_remote([MORE, {"decision": "provide_final_answer", "answer": 42}])
    local = ScriptedClient(_minion_worker, name="local")
    result = run_minion(local, remote, "doc text", "q?", max_rounds=3)
    assert result.answer == "42" and result.rounds == 2 and not result.hit_max_rounds
    assert len(local.calls) == 2 and len(remote.calls) == 3
    # round 1 used the conversation prompt, not the final one; the worker got the remote's messages
    assert "This was the last round" not in remote.calls[1][-1]["content"]
    assert local.calls[0][1]["content"] == "What does the document say about the vault?"
    assert local.calls[1][-1]["content"] == "Tell me more."
    # the supervisor's history holds its own full replies (thinking included)
    assert [m["content"] for m in result.supervisor_messages if m["role"] == "assistant"] == replies
    # ledger: per-call usage summed
    rp = sum(count_tokens(m["content"]) for call in remote.calls for m in call)
    assert result.ledger.usage("remote").prompt_tokens == rp
    assert result.ledger.usage("remote").completion_tokens == sum(count_tokens(r) for r in replies)
    assert result.ledger.calls("local") == 2
    json.dumps(result.to_dict())


def test_minion_ends_by_max_rounds_with_official_fallback() -> None:
    remote, _ = _minion_remote([MORE])
    local = ScriptedClient(_minion_worker, name="local")
    result = run_minion(local, remote, "doc text", "q?", max_rounds=3)
    assert result.answer == NO_ANSWER == "No answer found."
    assert result.rounds == 3 and result.hit_max_rounds
    assert len(local.calls) == 3 and len(remote.calls) == 4
    assert "This was the last round" in remote.calls[-1][-1]["content"]
    assert all("This was the last round" not in c[-1]["content"] for c in remote.calls[:-1])
    assert result.worker_messages[-1] == {"role": "user", "content": "Tell me more."}  # as the official


def test_minion_retries_invalid_json() -> None:
    replies = iter(['no json', '```json\n{"message": "hi"}\n```',
                    '```json\n{"decision": "maybe"}\n```', '```json\n{"decision": "provide_final_answer", "answer": "x"}\n```'])
    remote = ScriptedClient(lambda m: next(replies), name="gpt-4o")
    local = ScriptedClient(lambda m: "ok", name="local")
    result = run_minion(local, remote, "doc", "q?")
    assert result.answer == "x" and len(remote.calls) == 4
    assert all(o["json_mode"] is False for o in remote.options)  # the remote thinks before its JSON
    assert "could not be used" in remote.calls[1][-1]["content"]


# ----------------------------------------------------------------------------------------------
# End to end with a real local model
# ----------------------------------------------------------------------------------------------


def test_minions_end_to_end_with_agent_nano(nano) -> None:
    from lmforge.common.generation import encode_prompt

    model, tokenizer = nano
    hf = HFChatClient(model, tokenizer, max_tokens=12, batch_size=8, name="zoo:agent-nano")
    responses: list[ChatResponse] = []

    class Recording:
        name = hf.name

        def chat(self, messages, **kw):  # pragma: no cover - MINIONS batches
            return self.chat_batch([messages], **kw)[0]

        def chat_batch(self, conversations, **kw):
            out = hf.chat_batch(conversations, **kw)
            responses.extend(out)
            self.conversations.extend(conversations)
            return out

    local = Recording()
    local.conversations = []  # type: ignore[attr-defined]
    doc = DOC[: 2 * CHUNK]  # 2 chunks x 1 task = 2 local calls

    def decide(round_no: int, messages: list[dict[str, str]]) -> dict:
        return {"explanation": "", "feedback": None, "decision": "provide_final_answer", "answer": "done",
                "scratchpad": ""}

    remote = Remote([_code(TASKS[:1])], decide)
    result = run_minions(local, remote.client, doc, QUESTION, max_rounds=2)
    assert result.answer == "done" and result.local_calls == 2 == len(responses)
    assert result.round_logs[0]["aggregation"] in ("transform_outputs", "fallback")
    # the ledger's local tokens are the tokenizer's counts of the rendered prompts and the generations
    prompt_tokens = sum(len(encode_prompt(tokenizer, hf.render(c))) for c in local.conversations)
    usage = result.ledger.usage("local")
    assert usage.prompt_tokens == prompt_tokens
    assert usage.completion_tokens == sum(r.usage.completion_tokens for r in responses)
    assert all(0 < r.usage.completion_tokens <= 12 for r in responses)
    assert all(r.usage.completion_tokens == 12 for r in responses if r.done_reason == "length")
    # agent-nano never stops within 12 tokens here: every job is cut off and dropped, and the round
    # still ends in a synthesis over what is left
    assert result.round_logs[0]["truncated"] == sum(r.done_reason == "length" for r in responses)
    assert result.round_logs[0]["kept"] == 2 - result.round_logs[0]["truncated"]
    json.dumps(result.to_dict())

    # MINION with the same local model: the chat runs, the ledger holds the tokenizer's prompt counts
    remote_minion, _ = _minion_remote([MORE, {"decision": "provide_final_answer", "answer": "ok"}])
    seen: list[list[dict[str, str]]] = []

    class Seen:
        name = hf.name

        def chat(self, messages, **kw):
            seen.append(list(messages))
            return hf.chat(messages, **kw)

        def chat_batch(self, conversations, **kw):  # pragma: no cover - MINION chats one at a time
            raise AssertionError

    out = run_minion(Seen(), remote_minion, doc + SECRET, QUESTION)
    assert out.answer == "ok" and out.rounds == 2 and len(seen) == 2
    assert out.ledger.usage("local").prompt_tokens == sum(len(encode_prompt(tokenizer, hf.render(c))) for c in seen)
    assert all(SECRET not in m["content"] for c in remote_minion.calls for m in c)
    json.dumps(out.to_dict())
