"""MINIONS: the remote model decomposes the task into chunk-local jobs that the local model runs.

Narayan, Biderman, Eyuboglu et al., "Minions: Cost-efficient Collaboration Between On-device and
Cloud Language Models", ICML 2025, https://arxiv.org/abs/2502.15964 (official code
github.com/HazyResearch/minions, first commit ``minions/minions.py``). Paper: 5.7x lower remote cost
at 97.9% of the remote-only quality.

How it works (the official loop)::

    S = [user: ADVICE(task, doc_metadata), assistant: remote(...)]
    for round in 1..max_rounds (default 5):
        S += user: DECOMPOSE (first round) | DECOMPOSE_LATER(feedback, scratchpad)
        up to max_code_attempts times (default 10):
            code = first python block of remote(S)
            manifests = prepare_jobs(context, prev_job_manifests, prev_job_outputs)   # sandboxed
            on an error, no code block or more than 2048 jobs: S += the complaint; try again
        renumber chunk_id / task_id (by string, first appearance) and job_id (position)
        local: one single-message chat per job -> JobOutput JSON; jobs cut off ("length") dropped
        text = transform_outputs(jobs)   # sandboxed; on failure the official fallback aggregation
        last round: S += SYNTHESIS_FINAL -> JSON
        otherwise:  S += SYNTHESIS_COT -> free text; S += SYNTHESIS_JSON -> JSON (<= 5 tries)
        decision != "request_additional_info": return answer
        else: feedback, scratchpad carried on; S = S[:2] (the advice turns) before the next round
    return "No answer found."

The remote's code runs only through :func:`lmforge.common.sandbox.run_sandboxed` (a separate
process, limits, only the whitelisted names of :mod:`lmforge.methods.minions.jobs` in scope).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from lmforge.common.sandbox import SandboxLimits, run_sandboxed
from lmforge.methods.minions import prompts
from lmforge.methods.minions.clients import ChatClient, chat_json, extract_json
from lmforge.methods.minions.jobs import CHUNK_SIZE_ARG, Job, JobManifest, JobOutput, manifests_from_json
from lmforge.methods.minions.ledger import CostLedger, LedgeredClient
from lmforge.methods.minions.minion import NO_ANSWER, _LastReply, check_documents

__all__ = ["MinionsResult", "extract_code", "fallback_aggregate", "run_minions"]

logger = logging.getLogger(__name__)

MORE = "request_additional_info"
PRELUDE = "lmforge.methods.minions.jobs"

Log = Callable[[str], None]


@dataclass
class MinionsResult:
    """The outcome of one MINIONS run.

    Attributes:
        answer: the remote's final answer, or ``"No answer found."`` (the official fallback).
        rounds: rounds started (1..max_rounds).
        jobs_per_round: job manifests prepared in each round (local calls made, truncated or not).
        local_calls: local calls in all rounds (the sum of ``jobs_per_round``).
        code: the remote-written code that ran in each round.
        ledger: tokens and dollars per side.
        ended_by: ``"answer"`` (a final decision), ``"max_rounds"`` (the rounds ran out) or
            ``"code_attempts"`` (no working code within ``max_code_attempts``: the official stops).
        advice: the remote's advice (round 0).
        round_logs: per round: code attempts and errors, job counts, aggregation, synthesis.
        supervisor_messages: every message the remote was sent or wrote, in order, with its round
            (the working history is reset between rounds; this log is not).
    """

    answer: str
    rounds: int
    jobs_per_round: list[int]
    local_calls: int
    code: list[str]
    ledger: CostLedger
    ended_by: str
    advice: str = ""
    round_logs: list[dict[str, Any]] = field(default_factory=list)
    supervisor_messages: list[dict[str, Any]] = field(default_factory=list)

    @property
    def hit_max_rounds(self) -> bool:
        return self.ended_by == "max_rounds"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able record of the run."""
        return {
            "protocol": "minions",
            "answer": self.answer,
            "rounds": self.rounds,
            "ended_by": self.ended_by,
            "jobs_per_round": self.jobs_per_round,
            "local_calls": self.local_calls,
            "code": self.code,
            "advice": self.advice,
            "round_logs": self.round_logs,
            "supervisor_messages": self.supervisor_messages,
            "ledger": self.ledger.to_dict(),
        }


_FENCE = re.compile(r"```([A-Za-z0-9_+-]*)[^\n]*\n(.*?)```", re.DOTALL)


def extract_code(text: str) -> str | None:
    """The code of the first ```python block of a reply, else of its first unlabelled block."""
    # NOTE: the official takes the first ``` block whatever its label; a ```json or ```text block
    # before the code (a remote restating the formats) would then be run as code.
    blocks = [(m.group(1).lower(), m.group(2).strip()) for m in _FENCE.finditer(text)]
    for lang, body in blocks:
        if lang in ("python", "py", "python3") and body:
            return body
    for lang, body in blocks:
        if not lang and body:
            return body
    return None


def _is_empty_answer(answer: str | None) -> bool:
    return answer is None or str(answer).lower().strip() == "none"


def fallback_aggregate(jobs: Sequence[Job]) -> str:
    """The official aggregation when ``transform_outputs`` fails: jobs with an answer None/"none"
    are excluded, the rest grouped by task (in first-appearance order) and then chunk, each job shown
    by its raw reply."""
    for job in jobs:
        job.include = not _is_empty_answer(job.output.answer)
    tasks: dict[Any, tuple[str, dict[Any, list[Job]]]] = {}
    for job in jobs:
        _, chunks = tasks.setdefault(job.manifest.task_id, (job.manifest.task, {}))
        chunks.setdefault(job.manifest.chunk_id, []).append(job)
    parts: list[str] = []
    for task_id, (task, chunks) in tasks.items():
        parts.append(f"## Task (task_id=`{task_id}`): {task}\n\n")
        for chunk_id, chunk_jobs in chunks.items():
            parts.append(f"### Chunk # {chunk_id}\n")
            kept = [j for j in chunk_jobs if j.include]
            if not kept:
                parts.append("   No jobs returned successfully for this chunk.\n\n")
            for idx, job in enumerate(kept, start=1):
                parts.append(f"   -- Job {idx} (job_id=`{job.manifest.job_id}`):\n   {job.sample}\n\n")
        parts.append("\n-----------------------\n\n")
    return "".join(parts)


def _parse_job_output(text: str) -> tuple[JobOutput, bool]:
    """(output, parsed): the worker's JobOutput JSON, or an empty output when there is none."""
    # NOTE: the official validates with pydantic and an invalid reply crashes the whole run; here it
    # becomes an output with answer None, which the fallback aggregation then leaves out.
    obj = extract_json(text)
    if not isinstance(obj, dict):
        return JobOutput(), False
    return JobOutput.from_dict(obj), True


def _synthesis(obj: dict[str, Any]) -> dict[str, Any]:
    # As the official: the reply must be a JSON object with a "decision" (a string here).
    if not isinstance(obj.get("decision"), str):
        raise ValueError('the JSON needs a "decision": "provide_final_answer" or "request_additional_info"')
    return obj


def run_minions(
    local: ChatClient,
    remote: ChatClient,
    context: list[str] | str,
    task: str,
    *,
    doc_metadata: str = "",
    max_rounds: int = 5,
    num_tasks_per_round: int = 3,
    num_samples_per_task: int = 1,
    chunk_size: int = 5000,
    max_jobs: int = 2048,
    max_code_attempts: int = 10,
    json_retries: int = 5,
    sandbox_limits: SandboxLimits | None = None,
    ledger: CostLedger | None = None,
    log: Log | None = None,
) -> MinionsResult:
    """Run the MINIONS protocol.

    Args:
        local: the local worker model (runs the jobs).
        remote: the remote supervisor model (sees the task, the workers' outputs, never the document).
        context: the document(s).
        task: the question or task.
        doc_metadata: what the documents are ("a 10-K filing"), for the advice prompt.
        max_rounds: rounds at most (official default 5).
        num_tasks_per_round: distinct tasks the remote may use per round (official 3).
        num_samples_per_task: samples per job asked of the remote's code (official 1).
        chunk_size: the default ``max_chunk_size`` of the chunking function, in characters, as
            the remote's prompt shows it and as its code runs (official 5000); the remote's code
            may pass another size.
        max_jobs: more jobs than this in one round are rejected (official 2048).
        max_code_attempts: tries at working code per round (official 10).
        json_retries: tries at a valid synthesis JSON (official 5).
        sandbox_limits: limits for the remote's code; :class:`SandboxLimits` defaults when None.
        ledger: where usage is recorded; a fresh :class:`CostLedger` when None.
        log: called with one line per step, optional.

    Returns:
        A :class:`MinionsResult`.

    Raises:
        StructuredOutputError: the synthesis JSON never validated (the ledger keeps every attempt).
    """
    counts = {
        "max_rounds": max_rounds, "num_tasks_per_round": num_tasks_per_round,
        "num_samples_per_task": num_samples_per_task, "chunk_size": chunk_size, "max_jobs": max_jobs,
        "max_code_attempts": max_code_attempts, "json_retries": json_retries,
    }  # fmt: skip
    for name, value in counts.items():
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    documents = check_documents(context)
    ledger = ledger if ledger is not None else CostLedger()
    limits = sandbox_limits if sandbox_limits is not None else SandboxLimits()
    say = log or (lambda line: logger.info("%s", line))

    worker = LedgeredClient(local, ledger, "local")
    # Plain chat except for the synthesis JSON, which chat_json asks in JSON mode (the official's
    # response_format={"type": "json_object"} for that call only).
    supervisor = _LastReply(LedgeredClient(remote, ledger, "remote"))
    transcript: list[dict[str, Any]] = []
    history: list[dict[str, str]] = []

    def add(role: str, content: str, round_no: int) -> None:
        history.append({"role": role, "content": content})
        transcript.append({"round": round_no, "role": role, "content": content})

    def ask(round_no: int) -> str:
        text = supervisor.chat(list(history)).text
        add("assistant", text, round_no)
        return text

    def ask_json(round_no: int) -> dict[str, Any]:
        obj = chat_json(supervisor, list(history), _synthesis, retries=json_retries)
        assert supervisor.last is not None
        add("assistant", supervisor.last.text, round_no)
        return obj

    # 1. Advice: the remote reads the question (never the document) and says what to look for.
    # NOTE: the official requires doc_metadata; an empty one reads "the document(s)" here.
    metadata = doc_metadata.strip() or "the document(s)"
    add("user", prompts.minions_advice(task, metadata), 0)
    advice = ask(0)

    answer: str | None = None
    ended_by = "max_rounds"
    last_jobs: list[Job] | None = None
    explanation: str | None = None
    feedback: str | None = None
    scratchpad: str | None = None
    jobs_per_round: list[int] = []
    code_per_round: list[str] = []
    round_logs: list[dict[str, Any]] = []
    rounds = 0

    for round_idx in range(max_rounds):
        round_no = rounds = round_idx + 1
        rlog: dict[str, Any] = {"round": round_no, "code_errors": []}
        round_logs.append(rlog)
        say(f"minions: round {round_no}/{max_rounds}")

        # 2. Decomposition: the supervisor's history restarts from the advice turns each round.
        del history[2:]
        if round_idx == 0:
            content = prompts.minions_decompose(1, num_tasks_per_round, num_samples_per_task, chunk_size)
        else:
            # NOTE: the official falls back to the first-round prompt (numbered 1) when the last
            # synthesis had no explanation; here later rounds always get the abbreviated prompt.
            content = prompts.minions_decompose_later(
                round_no, explanation, feedback, scratchpad, num_tasks_per_round, num_samples_per_task, chunk_size
            )
        add("user", content, round_no)

        prev_manifests = None if last_jobs is None else [j.manifest.to_dict() for j in last_jobs]
        prev_outputs = None if last_jobs is None else [j.output.to_dict() for j in last_jobs]
        manifests: list[JobManifest] | None = None
        code = ""
        for attempt in range(max_code_attempts):
            reply = ask(round_no)
            code_or_none = extract_code(reply)
            if code_or_none is None:
                rlog["code_errors"].append("no code block")
                add("user", prompts.minions_no_code_block(), round_no)
                continue
            code = code_or_none
            result = run_sandboxed(
                code,
                "prepare_jobs",
                {
                    "context": documents,
                    "prev_job_manifests": prev_manifests,
                    "prev_job_outputs": prev_outputs,
                    CHUNK_SIZE_ARG: chunk_size,
                },
                prelude=PRELUDE,
                limits=limits,
            )
            error = ""
            if not result.ok:
                error = result.error or f"the code failed ({result.kind})"
            else:
                try:
                    candidate = manifests_from_json(result.value)
                except ValueError as exc:
                    error = str(exc)
                else:
                    if len(candidate) > max_jobs:
                        rlog["code_errors"].append(f"{len(candidate)} jobs > {max_jobs}")
                        add("user", prompts.minions_too_many_jobs(len(candidate), max_jobs), round_no)
                        say(f"minions: attempt {attempt + 1}: {len(candidate)} jobs rejected (max {max_jobs})")
                        continue
                    manifests = candidate
                    break
            rlog["code_errors"].append(error)
            add("user", prompts.minions_code_error(error), round_no)
            say(f"minions: attempt {attempt + 1}/{max_code_attempts}: code failed: {error}")
        rlog["code_attempts"] = len(rlog["code_errors"]) + (manifests is not None)
        if manifests is None:
            # The official stops the whole run here and answers "No answer found.".
            ended_by = "code_attempts"
            say(f"minions: no working code in {max_code_attempts} attempts; stopping")
            break
        code_per_round.append(code)
        n_chunks = len({m.chunk_id for m in manifests})
        n_tasks = len({m.task_id for m in manifests})
        jobs_per_round.append(len(manifests))
        rlog.update(jobs=len(manifests), chunks=n_chunks, tasks=n_tasks)
        say(f"minions: {len(manifests)} jobs ({n_tasks} tasks x {n_chunks} chunks)")

        # 3. Local jobs: one single-user-message conversation each, batched.
        conversations = [
            [{"role": "user", "content": prompts.minions_worker(m.chunk, m.task, m.advice)}] for m in manifests
        ]
        responses = worker.chat_batch(conversations, json_mode=True) if conversations else []
        jobs: list[Job] = []
        truncated = invalid = 0
        for manifest, response in zip(manifests, responses):
            if response.done_reason == "length":
                truncated += 1  # cut off mid-answer: dropped, as the official does
                continue
            output, parsed = _parse_job_output(response.text)
            invalid += not parsed
            jobs.append(Job(manifest=manifest, output=output, sample=response.text))
        rlog.update(truncated=truncated, invalid_json=invalid, kept=len(jobs))

        # 4. Aggregation: the remote's transform_outputs, else the official fallback.
        agg = run_sandboxed(
            code,
            "transform_outputs",
            {"jobs": [j.to_dict() for j in jobs], CHUNK_SIZE_ARG: chunk_size},
            prelude=PRELUDE,
            limits=limits,
        )
        if agg.ok and isinstance(agg.value, str):
            aggregated, rlog["aggregation"] = agg.value, "transform_outputs"
        else:
            aggregated, rlog["aggregation"] = fallback_aggregate(jobs), "fallback"
            rlog["transform_error"] = agg.error
        rlog["aggregated"] = aggregated

        # 5. Synthesis.
        progress = scratchpad or "No previous progress."
        if round_idx == max_rounds - 1:
            add("user", prompts.minions_synthesis_final(task, aggregated, progress), round_no)
        else:
            add("user", prompts.minions_synthesis_cot(task, aggregated, progress), round_no)
            ask(round_no)
            add("user", prompts.minions_synthesis_json(), round_no)
        obj = ask_json(round_no)
        rlog["synthesis"] = obj
        last_jobs = jobs
        say(f"minions: round {round_no}: {obj['decision']}")
        if obj["decision"] != MORE:
            raw = obj.get("answer")
            answer = None if raw is None else raw if isinstance(raw, str) else str(raw)
            ended_by = "answer"
            break
        explanation = _text_or_none(obj.get("explanation"))
        feedback = _text_or_none(obj.get("feedback"))
        scratchpad = _text_or_none(obj.get("scratchpad"))

    return MinionsResult(
        answer=NO_ANSWER if answer is None else answer,
        rounds=rounds,
        jobs_per_round=jobs_per_round,
        local_calls=sum(jobs_per_round),
        code=code_per_round,
        ledger=ledger,
        ended_by=ended_by,
        advice=advice,
        round_logs=round_logs,
        supervisor_messages=transcript,
    )


def _text_or_none(value: Any) -> str | None:
    if value is None:
        return None
    return value if isinstance(value, str) else str(value)
