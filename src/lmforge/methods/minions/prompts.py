"""Prompts of the MINION and MINIONS protocols.

The wording is lmforge's own; the structure and the information each prompt carries follow the
official first commit (github.com/HazyResearch/minions, ``minions/prompts/minion.py`` and
``minions/prompts/minions.py``): which sections each prompt has, which fields the JSON replies hold,
which rules the remote is given for writing ``prepare_jobs`` / ``transform_outputs``.

Every prompt is a function that returns the message text, so callers never touch format strings.
"""

from __future__ import annotations

import inspect

from lmforge.data.worker_prompt import minions_worker
from lmforge.methods.minions import jobs

__all__ = [
    "minion_supervisor_conversation",
    "minion_supervisor_final",
    "minion_supervisor_initial",
    "minion_worker_system",
    "minions_advice",
    "minions_code_error",
    "minions_decompose",
    "minions_decompose_later",
    "minions_no_code_block",
    "minions_synthesis_cot",
    "minions_synthesis_final",
    "minions_synthesis_json",
    "minions_too_many_jobs",
    "minions_worker",
]


# ==============================================================================================
# MINION: a chat between the remote supervisor (no context) and the local worker (the context)
# ==============================================================================================


def minion_supervisor_initial(task: str) -> str:
    """The remote's first message: the task, and a request for a first message to the worker."""
    return f"""\
Our goal is to complete the task below.

### Task
{task}

### How we work
You cannot read the context yourself. A small language model has read all of it, and you can talk \
to it. Think step by step if it helps, then end your reply with a JSON block in this format:

<step-by-step thinking>
```json
{{
    "message": "<what you say to the small model; if you give it work, give it exactly one task>"
}}
```
"""


_MINION_DECISION_FORMAT = """\
<step-by-step thinking>
```json
{
    "decision": "provide_final_answer",
    "answer": "<the answer>"
}
```"""


def minion_supervisor_conversation(response: str) -> str:
    """A middle round: the worker's reply; the remote answers or asks for more."""
    return f"""\
The small language model replied:

### Reply
{response}

### Instructions
Think step by step about the reply and decide whether you now know enough to answer.

If you do (or the task is done), give the final answer in this format:

{_MINION_DECISION_FORMAT}

If you do not, ask the small model for more work in this format:

<step-by-step thinking>
```json
{{
    "decision": "request_additional_info",
    "message": "<your next message to the small model>"
}}
```
"""


def minion_supervisor_final(response: str) -> str:
    """The last round: the worker's reply; the remote must answer now."""
    return f"""\
The small language model replied:

### Reply
{response}

### Instructions
This was the last round: no further questions are possible. Think step by step about the reply \
and answer in this format:

{_MINION_DECISION_FORMAT}

Give the final answer now; do not ask for more information.
"""


def minion_worker_system(context: str, task: str) -> str:
    """The local model's system message: the whole context and the task."""
    return f"""\
You are assisting a user with the task below.

Read the context and get ready to answer the questions an expert will ask you about it.
### Context
{context}

### Task
{task}
"""


# ==============================================================================================
# MINIONS: the remote decomposes the task into chunk-local jobs that the local model runs
# ==============================================================================================


def minions_advice(query: str, metadata: str) -> str:
    """Round 0: the remote reads only the question and says what to look for."""
    return f"""\
A question has to be answered from {metadata}:

## Question
{query}

---

Briefly advise us on the key information to pull out of {metadata} to answer it.

Constraints on your reply:
- no numbered lists;
- do not write it as a sequence of steps.
"""


# What the remote's code can use, described (the official shows the pydantic sources).
_MODELS = '''\
class JobManifest:          # a dataclass
    chunk: str              # the text the worker reads (one chunk of a document)
    task: str               # the instruction the worker carries out on that chunk
    advice: str = ""        # optional hints on how to do the task or format the answer
    chunk_id: int | None = None   # filled in for you (equal chunk texts share an id): do not set
    task_id: int | None = None    # filled in for you (equal task texts share an id): do not set
    job_id: int | None = None     # filled in for you: do not set

class JobOutput:            # a dataclass: what one worker returned
    explanation: str | None # the worker's reasoning
    citation: str | None    # text copied from the chunk that supports the answer
    answer: str | None      # the worker's answer; None when the chunk had nothing relevant

class Job:                  # a dataclass: one finished job
    manifest: JobManifest
    output: JobOutput
    sample: str             # the worker's raw reply
    include: bool | None = None   # free for your filtering'''

_SIGNATURES = '''\
def prepare_jobs(
    context: List[str],
    prev_job_manifests: Optional[List[JobManifest]] = None,
    prev_job_outputs: Optional[List[JobOutput]] = None,
) -> List[JobManifest]:
    """
    context: the documents; assume each one is far too long for a worker (100k+ tokens), so cut
        it into chunks with the chunking function.
    prev_job_manifests / prev_job_outputs: last round's manifests and the outputs in the same
        order (jobs whose reply was cut off are left out); None in the first round.
    Returns the job manifests of this round.
    """

def transform_outputs(jobs: List[Job]) -> str:
    """
    jobs: this round's finished jobs (job.manifest, job.output, job.sample).
    Returns one string that the supervisor reads next: use as much of the outputs as is useful
    (answer, explanation, citation, the raw sample).
    """'''


def _source_without_comments(fn: object) -> str:
    """A function's source with comment lines dropped (they are notes for lmforge's readers)."""
    lines = inspect.getsource(fn).splitlines()  # type: ignore[arg-type]
    return "\n".join(line for line in lines if not line.strip().startswith("#"))


def _chunking_source(chunk_size: int) -> str:
    # NOTE: the official first commit shows only chunk_by_section ("removed other chunking
    # functions for now"); the other chunkers are in scope but not advertised, which keeps the
    # remote's prompt tokens comparable with the paper's.
    source = _source_without_comments(jobs.chunk_by_section)
    # The default the protocol runs with (run_minions(chunk_size=...) sets it in the sandbox too).
    return source.replace(
        f"max_chunk_size: int = {jobs.DEFAULT_CHUNK_SIZE}", f"max_chunk_size: int = {chunk_size}", 1
    )


def _code_reference(chunk_size: int) -> str:
    """What the remote's code may use, shown in both decompose prompts."""
    return f"""## Objects already in scope
These classes (and `List`, `Optional`, `Dict`, `Any`, `Union`, `Tuple`) exist when your code \
runs. **Do not redefine or import them.**
```python
{_MODELS}
```

## Signatures
```python
{_SIGNATURES}
```

## Chunking function (in scope; call it, do not rewrite it)
```python
{_chunking_source(chunk_size)}
```"""


def _samples_line(num_samples_per_task: int, indent: str = "") -> str:
    # NOTE: the official passes num_samples_per_task to its decompose template, but the template it
    # uses has no slot for it (only an earlier draft had); here the number is stated.
    if num_samples_per_task <= 1:
        return indent + (
            "- One sample per job is the default. If a task needs several samples, repeat its "
            "`JobManifest` that many times (e.g. `job_manifests.extend([manifest] * n)`)."
        )
    return indent + (
        f"- Take {num_samples_per_task} samples per job: repeat each `JobManifest` "
        f"{num_samples_per_task} times (e.g. `job_manifests.extend([manifest] * {num_samples_per_task})`)."
    )


def minions_decompose(
    step_number: int, num_tasks_per_round: int, num_samples_per_task: int = 1, chunk_size: int = 5000
) -> str:
    """The first round's request for ``prepare_jobs`` and ``transform_outputs``."""
    # NOTE: "both in one ```python code block" is lmforge's addition: the official runs only the
    # first code block of the reply, so a second block holding transform_outputs would be lost.
    return f"""\
# Decomposition round {step_number}

You, the supervisor, cannot read the document(s). You can hand small, self-contained tasks to a \
weaker worker model that only ever sees one chunk of text. Whatever needs more than one chunk, \
or more than one document, is your job.

## Write two Python functions

### 1. `prepare_jobs(context, prev_job_manifests, prev_job_outputs) -> List[JobManifest]`
- Cut the document(s) into chunks with the chunking function below. Pick the chunk size for the \
task: small chunks suit pinpoint extraction, larger ones suit summaries.
- Every job must be **atomic** and answerable from its **one chunk** alone.
- Run the same task over many chunks with the **same task text**: it then gets one `task_id`. \
Do not make a new task per chunk.
- Steps that depend on each other go to **later rounds**, not all into this one.
- Use **at most {num_tasks_per_round} distinct tasks** in this round.
{_samples_line(num_samples_per_task)}

### 2. `transform_outputs(jobs) -> str`
- Receives the workers' results for the jobs you prepared.
- First **filter** (drop empty or irrelevant results), then **aggregate** by `task_id` and \
`chunk_id`. Combining chunks and any global reasoning happen here, in your code.
- Return **one string** for you to read next.

{_code_reference(chunk_size)}

## Reminders
- **No** task may need several chunks or a whole document.
- Keep jobs **chunk-local and atomic**.
- Aggregating and interpreting the outputs is **your** work, in `transform_outputs()`.

Write `prepare_jobs()` and `transform_outputs()` now, both in one ```python code block.
"""


_LATER_EXAMPLE = '''\
def prepare_jobs(
    context: List[str],
    prev_job_manifests: Optional[List[JobManifest]] = None,
    prev_job_outputs: Optional[List[JobOutput]] = None,
) -> List[JobManifest]:
    # The scratchpad says the previous answers hold the raw figures: work on those, not the documents.
    job_manifests = []
    for manifest, output in zip(prev_job_manifests or [], prev_job_outputs or []):
        if output.answer is None:
            continue
        job_manifests.append(JobManifest(
            chunk=output.answer,
            task="Convert every amount in the text to millions of US dollars.",
            advice="Answer with a comma-separated list of numbers.",
        ))
    return job_manifests

def transform_outputs(jobs: List[Job]) -> str:
    kept = [j for j in jobs if j.output.answer and j.output.answer.strip().lower() not in ("none", "null")]
    by_task = {}
    for job in kept:
        by_task.setdefault((job.manifest.task_id, job.manifest.task), {}).setdefault(
            job.manifest.chunk_id, []).append(job)
    lines = []
    for (task_id, task), chunks in by_task.items():
        lines.append(f"## Task {task_id}: {task}")
        for chunk_id, chunk_jobs in chunks.items():
            for job in chunk_jobs:
                lines.append(f"- chunk {chunk_id}, job {job.manifest.job_id}: {job.output.answer} "
                             f"(because: {job.output.explanation}; quote: {job.output.citation})")
    return "\\n".join(lines) or "No worker found anything relevant."'''


def minions_decompose_later(
    step_number: int,
    explanation: str | None,
    feedback: str | None,
    scratchpad: str | None,
    num_tasks_per_round: int,
    num_samples_per_task: int = 1,
    chunk_size: int = 5000,
) -> str:
    """A later round's (abbreviated) request for new code, with what the last synthesis found:
    its ``explanation`` (what the official calls feedback), ``feedback`` and ``scratchpad``."""
    # NOTE: the official passes `feedback` (the synthesis' "explanation") and `scratchpad` to this
    # prompt's .format(), but its template has no slot for them, so they never reach the remote (and
    # the supervisor history is reset, so the last synthesis is gone too). Here they are shown, with
    # the synthesis' own "feedback" field: carrying them into the next round is the protocol's intent.
    return f"""\
# Decomposition round {step_number}

You cannot read the document(s). You can give tasks to small, weaker language models that read \
the document(s) one short chunk at a time.

## Where the last round left off
Notes so far: {scratchpad or "none"}
Why more is needed: {explanation or "not stated"}
What to look for: {feedback or "not stated"}

## Write two Python functions

1. `prepare_jobs`: the tasks for the small models.
   - Every task is a single step: atomic, no multi-step work.
   - Nested loops (tasks × chunks) are a good way to spread tasks over chunks.
   - Use the same task text (so the same `task_id`) across chunks; not one task per chunk.
   - The conversation shows which chunking you used before; build on it.
   - `prev_job_outputs` holds the previous round's outputs; you may work on those instead of, or \
beside, the documents.
   - Steps that depend on each other go to later rounds.
   - At most {num_tasks_per_round} distinct tasks.
{_samples_line(num_samples_per_task, "   ")}

2. `transform_outputs`: turns the workers' outputs into one string for you to read.
   - Filter the jobs with a filter of your own (keep only what helps; it may keep nothing).
   - Aggregate by `task_id` and `chunk_id`.

{_code_reference(chunk_size)}

## An example
```python
{_LATER_EXAMPLE}
```

Write `prepare_jobs()` and `transform_outputs()` now, both in one ```python code block.
"""


def minions_no_code_block() -> str:
    """The reply to a code request that held no code block."""
    return "Please try again: your reply had no ```python code block with the two functions."


def minions_code_error(error: str) -> str:
    """The reply to code that failed: the error text, for the remote to fix."""
    return f"Please try again. Running your code failed with this error:\n\n```\n{error}\n```"


def minions_too_many_jobs(n_jobs: int, max_jobs: int) -> str:
    """The reply to code that prepared more jobs than a round allows."""
    return (
        f"Your code produced {n_jobs} jobs, more than the {max_jobs} allowed in one round. "
        "Please try again with fewer jobs (larger chunks or fewer tasks)."
    )


# minions_worker, one local job's message, is lmforge.data.worker_prompt's (imported above): the zoo
# reader's training data (lmforge.data.docjobs) renders it too, and data never imports a method.


_SYNTH_FIELDS = """\
{
  "explanation": "",
  "feedback": null,
  "decision": "",
  "answer": null,
  "scratchpad": ""
}"""


def minions_synthesis_cot(question: str, extractions: str, scratchpad: str) -> str:
    """Synthesis, step 1 (rounds before the last): think about the workers' outputs, free text."""
    return f"""\
Now bring together what the junior workers (small language models) found. Think step by step \
about whether it lets us answer the question. Keep the analysis short.

## Progress so far
{scratchpad}

## Inputs
1. The question:
{question}

2. The workers' outputs:
{extractions}

## Instructions
Think, step by step, about:
1. which information we now have;
2. whether it is enough to answer the question;
3. if not, exactly what is still missing;
4. if so, how the answer follows (including any calculation);
5. where workers disagree: let the citations decide which answer is right.

Be short. No structured output is needed here, just the reasoning, in markdown (write a dollar \
sign as \\$).
"""


def minions_synthesis_json() -> str:
    """Synthesis, step 2: the decision as one JSON object."""
    return f"""\
From your analysis, return one JSON object, with no code fences and no other text, in exactly \
this shape:

{_SYNTH_FIELDS}

Fields:
- explanation: your reasoning, briefly.
- feedback: what information to look for next, if any; null otherwise.
- decision: "provide_final_answer" or "request_additional_info".
- answer: the final answer when you give one; null otherwise.
- scratchpad: a summary of what has been gathered and concluded so far, for later rounds.

Return only a valid JSON object.
"""


def minions_synthesis_final(question: str, extractions: str, scratchpad: str) -> str:
    """Synthesis in the last round: the final answer directly, as one JSON object."""
    return f"""\
Now give the final answer from everything gathered.

## Progress so far
{scratchpad}

## Inputs
1. The question:
{question}

2. The workers' outputs:
{extractions}

Return one JSON object, with no code fences and no other text, in exactly this shape:

{_SYNTH_FIELDS}

Fields:
- explanation: your reasoning, briefly.
- feedback: what information is still lacking, in words (no code); null if nothing.
- decision: must be "provide_final_answer".
- answer: the final answer.
- scratchpad: a summary of what has been gathered and concluded.
"""
