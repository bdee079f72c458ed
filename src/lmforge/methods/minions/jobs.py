"""MINIONS job objects and chunkers, and the prelude of the sandbox that runs remote-written code.

Narayan, Biderman, Eyuboglu et al., "Minions: Cost-efficient Collaboration Between On-device and
Cloud Language Models", ICML 2025, https://arxiv.org/abs/2502.15964 (official code
github.com/HazyResearch/minions, first commit ``minions/minions.py``).

In MINIONS the remote model writes two Python functions each round:

* ``prepare_jobs(context, prev_job_manifests, prev_job_outputs) -> list[JobManifest]``: cut the
  documents into chunks and pair chunks with atomic tasks (one :class:`JobManifest` per local call);
* ``transform_outputs(jobs) -> str``: filter and aggregate the local outputs (:class:`Job` objects)
  into the text the remote reads next.

That code runs only in :func:`lmforge.common.sandbox.run_sandboxed`, with this module as the prelude:
the child imports it (it must stay light: standard library only, no torch), puts the names of
:data:`SANDBOX_NAMES` into the fresh namespace of the remote's code, turns the JSON arguments into
objects with :func:`sandbox_decode` and the return value back into JSON with :func:`sandbox_encode`.

The official classes are pydantic models; here they are dataclasses with the same fields and
defaults (NOTE: the child needs only the standard library, and nothing in the protocol relies on
pydantic's validation: the parent checks the types of what comes back).
"""

from __future__ import annotations

import copy
import json
import re
from dataclasses import dataclass
from typing import Any, Dict, List, Optional, Tuple, Union

__all__ = [
    "Job",
    "JobManifest",
    "JobOutput",
    "JOB_OUTPUT_SCHEMA",
    "JOB_SCHEMAS",
    "BOUNDED_JOB_LIMITS",
    "BOUNDED_JOB_PARSER_OPTIONS",
    "bounded_job_schema",
    "job_schema",
    "SANDBOX_NAMES",
    "chunk_by_heading",
    "chunk_by_page",
    "chunk_by_paragraph",
    "chunk_by_section",
    "chunk_by_size",
    "manifests_from_json",
    "renumber",
    "sandbox_decode",
    "sandbox_encode",
]


# ----------------------------------------------------------------------------------------------
# Job objects
# ----------------------------------------------------------------------------------------------


@dataclass
class JobManifest:
    """One job for the local model: a chunk of the document, a task, and advice.

    ``chunk_id``, ``task_id`` and ``job_id`` are set by the protocol after ``prepare_jobs`` returns
    (see :func:`renumber`); the remote's code does not need to set them.
    """

    chunk: str
    task: str
    advice: str = ""  # NOTE: required in the official pydantic model; a default is friendlier code
    chunk_id: Optional[int] = None
    task_id: Optional[int] = None
    job_id: Optional[int] = None

    def to_dict(self) -> Dict[str, Any]:
        return {
            "chunk": self.chunk,
            "task": self.task,
            "advice": self.advice,
            "chunk_id": self.chunk_id,
            "task_id": self.task_id,
            "job_id": self.job_id,
        }

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "JobManifest":
        return cls(
            chunk=d["chunk"],
            task=d["task"],
            advice=d.get("advice") or "",
            chunk_id=d.get("chunk_id"),
            task_id=d.get("task_id"),
            job_id=d.get("job_id"),
        )


def _as_text(value: Any) -> Optional[str]:
    """A worker field as a string: None stays None, a list of strings is joined by newlines, any
    other JSON value is written as JSON (workers often answer numbers or lists)."""
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return "\n".join(value)
    if isinstance(value, (int, float, bool)):
        return json.dumps(value)
    return json.dumps(value, ensure_ascii=False)


# The official ``JobOutput`` pydantic model's JSON schema (what its local clients pass to ollama's
# ``format=``): ``explanation: str``, ``citation: str | None``, ``answer: str | None``, all required.
JOB_OUTPUT_SCHEMA: Dict[str, Any] = {
    "type": "object",
    "properties": {
        "explanation": {"type": "string"},
        "citation": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "answer": {"anyOf": [{"type": "string"}, {"type": "null"}]},
    },
    "required": ["explanation", "citation", "answer"],
}

# The worker reply schemas an in-process local model can decode under (``--job-schema``).
JOB_SCHEMAS: Tuple[str, ...] = ("official", "bounded")

# :func:`bounded_job_schema`'s string limits (characters) and the lm-format-enforcer parser options
# that go with it (:class:`~lmforge.methods.minions.clients.HFChatClient`'s ``json_parser_options``).
BOUNDED_JOB_LIMITS: Dict[str, int] = {"explanation": 60, "citation": 120, "answer": 20}
BOUNDED_JOB_PARSER_OPTIONS: Dict[str, Any] = {"max_consecutive_whitespaces": 2, "force_json_field_order": True}


def bounded_job_schema(explanation: int = BOUNDED_JOB_LIMITS["explanation"],
                       citation: int = BOUNDED_JOB_LIMITS["citation"],
                       answer: int = BOUNDED_JOB_LIMITS["answer"]) -> Dict[str, Any]:
    """The ``JobOutput`` schema with bounded strings, for a small (~100M) in-process worker.

    NOTE: the official worker schema is :data:`JOB_OUTPUT_SCHEMA`, free strings (explanation,
    citation, answer, in that order). Decoded under it, SmolLM2-135M never closes its explanation
    (measured: 4 of 4 replies ran to the token limit repeating a sentence, and MINIONS drops a
    cut-off job output, so none survived), so the strings are bounded: by default explanation 60
    characters, citation 120 (the synthetic reports' fact sentences are 70-95), answer 20. Use it
    with :data:`BOUNDED_JOB_PARSER_OPTIONS`: the key order is the official one, enforced
    (lm-format-enforcer's ``force_json_field_order``), and the library's whitespace allowance is
    lowered from 12 consecutive characters to 2 (with 12, replies ended in a dozen newlines, each
    a decode step). ``citation`` and ``answer`` stay nullable, all three stay required.

    Args:
        explanation, citation, answer: the most characters of each string.
    """
    for name, value in (("explanation", explanation), ("citation", citation), ("answer", answer)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"the {name} bound must be an integer >= 1, got {value!r}")
    schema = copy.deepcopy(JOB_OUTPUT_SCHEMA)
    schema["properties"]["explanation"] = {"type": "string", "maxLength": explanation}
    schema["properties"]["citation"] = {"anyOf": [{"type": "string", "maxLength": citation}, {"type": "null"}]}
    schema["properties"]["answer"] = {"anyOf": [{"type": "string", "maxLength": answer}, {"type": "null"}]}
    return schema


def job_schema(name: str) -> Tuple[Dict[str, Any], Optional[Dict[str, Any]]]:
    """``(json_schema, json_parser_options)`` of the worker reply schema ``name`` (:data:`JOB_SCHEMAS`).

    ``official``: :data:`JOB_OUTPUT_SCHEMA` (the paper's and the official code's free strings) and no
    parser options (the library's defaults); ``bounded``: :func:`bounded_job_schema` and
    :data:`BOUNDED_JOB_PARSER_OPTIONS`. Both are fresh copies.

    Raises:
        ValueError: an unknown name.
    """
    if name == "official":
        return copy.deepcopy(JOB_OUTPUT_SCHEMA), None
    if name == "bounded":
        return bounded_job_schema(), dict(BOUNDED_JOB_PARSER_OPTIONS)
    raise ValueError(f"unknown job schema {name!r}; use one of {', '.join(JOB_SCHEMAS)}")


@dataclass
class JobOutput:
    """What the local model returns for one job (the official ``JobOutput``)."""

    explanation: Optional[str] = None
    citation: Optional[str] = None
    answer: Optional[str] = None

    def to_dict(self) -> Dict[str, Any]:
        return {"explanation": self.explanation, "citation": self.citation, "answer": self.answer}

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "JobOutput":
        # NOTE: the official model is strict (``str``-typed fields, parse errors crash the run); small
        # local models often answer a list or a number, so values are coerced to text instead.
        return cls(
            explanation=_as_text(d.get("explanation")),
            citation=_as_text(d.get("citation")),
            answer=_as_text(d.get("answer")),
        )


@dataclass
class Job:
    """A manifest with its local output: what ``transform_outputs`` receives.

    ``sample`` is the local model's raw reply; ``include`` is a flag the aggregation may set.
    """

    manifest: JobManifest
    output: JobOutput
    sample: str
    include: Optional[bool] = None

    def to_dict(self) -> Dict[str, Any]:
        return {
            "manifest": self.manifest.to_dict(),
            "output": self.output.to_dict(),
            "sample": self.sample,
            "include": self.include,
        }

    @classmethod
    def from_dict(cls, d: Dict[str, Any]) -> "Job":
        return cls(
            manifest=JobManifest.from_dict(d["manifest"]),
            output=JobOutput.from_dict(d["output"]),
            sample=d.get("sample") or "",
            include=d.get("include"),
        )


# ----------------------------------------------------------------------------------------------
# Chunkers (the remote's code calls them; their source is shown to the remote)
# ----------------------------------------------------------------------------------------------


# The official chunk size (characters); run_minions(chunk_size=...) changes it in the sandbox child.
DEFAULT_CHUNK_SIZE = 5000


def chunk_by_section(doc: str, max_chunk_size: int = 5000, overlap: int = 0) -> List[str]:
    """Cut ``doc`` into consecutive windows of ``max_chunk_size`` characters; each window starts
    ``max_chunk_size - overlap`` characters after the previous one."""
    # NOTE: this is the official first-commit ``chunk_by_section`` (a fixed-size character window,
    # despite its name: the remote's code and the paper's numbers rely on it); the official loops
    # forever when overlap >= max_chunk_size, here that is an error the remote gets to read.
    if max_chunk_size < 1:
        raise ValueError(f"max_chunk_size must be >= 1, got {max_chunk_size}")
    if not 0 <= overlap < max_chunk_size:
        raise ValueError(f"overlap must be in [0, max_chunk_size), got {overlap}")
    chunks = []
    start = 0
    while start < len(doc):
        chunks.append(doc[start : start + max_chunk_size])
        start += max_chunk_size - overlap
    return chunks


def chunk_by_size(doc: str, max_chunk_size: int = 5000, overlap: int = 0) -> List[str]:
    """The same fixed-size character windows as :func:`chunk_by_section`, under an honest name."""
    return chunk_by_section(doc, max_chunk_size, overlap)


_HEADING = re.compile(r"^#{1,6}\s", re.MULTILINE)


def chunk_by_heading(doc: str, max_chunk_size: int = 5000) -> List[str]:
    """Split ``doc`` at Markdown headings (lines starting with ``#`` .. ``######`` and a space):
    each chunk is one section, its heading first; a section longer than ``max_chunk_size`` is cut
    into fixed windows of that size. Text before the first heading is a chunk of its own.

    Sections by their real boundaries, for documents with headings (the synthetic reports,
    QASPER's sections, LongHealth's texts); :func:`chunk_by_section` cuts by size only.
    """
    if max_chunk_size < 1:
        raise ValueError(f"max_chunk_size must be >= 1, got {max_chunk_size}")
    starts = [m.start() for m in _HEADING.finditer(doc)]
    bounds = ([0] if not starts or starts[0] > 0 else []) + starts + [len(doc)]
    chunks: List[str] = []
    for a, b in zip(bounds, bounds[1:]):
        section = doc[a:b]
        if section.strip():
            chunks.extend(chunk_by_section(section, max_chunk_size))
    return chunks


# Page breaks as later official versions (``minions/utils/chunking.py``) recognise them.
_PAGE_MARKERS = (
    r"\f",
    r"^page\s+\d+(\s+of\s+\d+)?\s*$",
    r"^[\s_\-()]*\d+[\s_\-()]*$",
    r"^[-=#]{3,}\s*.*page.*[-=#]{3,}\s*$",
    r"^\s*[\[<(]\s*page(?:\s+\d+)?\s*[\]>)]\s*$",
)


def chunk_by_page(doc: str, page_markers: Optional[List[str]] = None) -> List[str]:
    """Split ``doc`` at page breaks: form feeds, lines like ``Page 3`` / ``Page 3 of 9``, lone page
    numbers, ``--- page ---`` or ``[page 3]``. The markers themselves are dropped; a document
    without any marker is one chunk."""
    # From later official versions (not in the first commit); regexes are line-anchored.
    pattern = re.compile("|".join(page_markers or _PAGE_MARKERS), re.IGNORECASE | re.MULTILINE)
    pages: List[str] = []
    start = 0
    for m in pattern.finditer(doc):
        if doc[start : m.start()]:
            pages.append(doc[start : m.start()])
        start = m.end()
    if doc[start:]:
        pages.append(doc[start:])
    return pages or ([doc] if doc else [])


def chunk_by_paragraph(doc: str, max_chunk_size: int = 1500) -> List[str]:
    """Pack whole paragraphs (blocks separated by blank lines) into chunks of at most
    ``max_chunk_size`` characters; a paragraph longer than that is split between sentences, and a
    sentence longer than that into fixed windows."""
    # From later official versions (``chunk_by_paragraph``), without sentence overlap.
    if max_chunk_size < 1:
        raise ValueError(f"max_chunk_size must be >= 1, got {max_chunk_size}")
    # (text, separator from the previous piece): sentences of one paragraph join with a space,
    # paragraphs with a blank line.
    pieces: List[Tuple[str, str]] = []
    for para in re.split(r"\n\s*\n", doc):
        para = para.strip()
        if not para:
            continue
        if len(para) <= max_chunk_size:
            pieces.append((para, "\n\n"))
            continue
        sep = "\n\n"
        for sent in re.split(r"(?<=[.!?])\s+", para):
            for part in chunk_by_section(sent, max_chunk_size) if len(sent) > max_chunk_size else [sent]:
                pieces.append((part, sep))
                sep = " "
    chunks: List[str] = []
    current = ""
    for piece, sep in pieces:
        if current and len(current) + len(sep) + len(piece) > max_chunk_size:
            chunks.append(current)
            current = piece
        else:
            current = f"{current}{sep}{piece}" if current else piece
    if current:
        chunks.append(current)
    return chunks


# ----------------------------------------------------------------------------------------------
# Sandbox prelude hooks
# ----------------------------------------------------------------------------------------------

# Names the remote's code may use without importing them: the job classes, the chunkers and the
# typing names the official puts in its ``exec`` globals (``USEFUL_IMPORTS``).
# NOTE: the official also passes pydantic's ``BaseModel`` and ``field_validator``; the sandbox keeps
# to the standard library, and the prompts ask the remote not to define models of its own.
SANDBOX_NAMES = [
    "JobManifest",
    "JobOutput",
    "Job",
    "chunk_by_section",
    "chunk_by_size",
    "chunk_by_heading",
    "chunk_by_page",
    "chunk_by_paragraph",
    "List",
    "Optional",
    "Dict",
    "Any",
    "Union",
    "Tuple",
]


CHUNK_SIZE_ARG = "_chunk_size"


def sandbox_decode(entry: str, args: Dict[str, Any]) -> Dict[str, Any]:
    """Turn the JSON arguments of ``prepare_jobs`` / ``transform_outputs`` into job objects.

    The protocol's own argument ``_chunk_size`` (removed here) becomes the default chunk size of
    :func:`chunk_by_section`, :func:`chunk_by_size` and :func:`chunk_by_heading` in this child
    process.
    """
    args = dict(args)
    size = args.pop(CHUNK_SIZE_ARG, None)
    if size is not None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise ValueError(f"chunk size must be a positive integer, got {size!r}")
        chunk_by_section.__defaults__ = (size, 0)
        chunk_by_size.__defaults__ = (size, 0)
        chunk_by_heading.__defaults__ = (size,)
    if entry == "prepare_jobs":
        for key, cls in (("prev_job_manifests", JobManifest), ("prev_job_outputs", JobOutput)):
            if args.get(key) is not None:
                args[key] = [cls.from_dict(d) for d in args[key]]
    elif entry == "transform_outputs":
        args["jobs"] = [Job.from_dict(d) for d in args.get("jobs") or []]
    return args


def _manifest_fields(item: Any, index: int) -> Tuple[Any, Any, Any]:
    """(chunk, task, advice) of whatever the remote's code returned as a manifest: a JobManifest,
    an object of the remote's own class with those attributes (the official re-creates manifests
    for this reason), or a dict."""
    if isinstance(item, dict):
        get = item.get
    else:
        def get(key: str, default: Any = None) -> Any:
            return getattr(item, key, default)
    chunk, task, advice = get("chunk"), get("task"), get("advice", "")
    if not isinstance(chunk, str) or not isinstance(task, str):
        raise TypeError(
            f"prepare_jobs returned an item #{index} without string fields `chunk` and `task` "
            f"(got {type(item).__name__}); return a list of JobManifest(chunk=..., task=..., advice=...)"
        )
    if advice is None:
        advice = ""
    if not isinstance(advice, str):
        raise TypeError(f"JobManifest #{index}: `advice` must be a string, got {type(advice).__name__}")
    return chunk, task, advice


def sandbox_encode(entry: str, value: Any) -> Any:
    """Turn the return value into JSON.

    ``prepare_jobs``: ``{"chunks": [...], "tasks": [...], "jobs": [[chunk_index, task_index,
    advice], ...]}``: every distinct chunk and task string is sent once (a round can hold thousands
    of jobs over the same few chunks), indexed by first appearance, which is the official numbering.
    ``transform_outputs``: the string (anything else is written with ``str``, as an f-string would).
    """
    if entry == "prepare_jobs":
        if value is None or isinstance(value, (str, bytes, dict)) or not hasattr(value, "__iter__"):
            raise TypeError(
                f"prepare_jobs must return a list of JobManifest, got {type(value).__name__}"
            )
        chunk_ids: Dict[str, int] = {}
        task_ids: Dict[str, int] = {}
        jobs = []
        for i, item in enumerate(value):
            chunk, task, advice = _manifest_fields(item, i)
            jobs.append([chunk_ids.setdefault(chunk, len(chunk_ids)), task_ids.setdefault(task, len(task_ids)), advice])
        return {"chunks": list(chunk_ids), "tasks": list(task_ids), "jobs": jobs}
    if entry == "transform_outputs":
        return value if isinstance(value, str) else str(value)
    return value


def manifests_from_json(value: Any) -> List[JobManifest]:
    """The parent's side of :func:`sandbox_encode` for ``prepare_jobs``: numbered manifests.

    Raises:
        ValueError: when the value does not have the encoded shape (it crossed a process boundary,
            so it is checked again here).
    """
    try:
        chunks, tasks, rows = value["chunks"], value["tasks"], value["jobs"]
        manifests = [
            JobManifest(chunk=chunks[c], task=tasks[t], advice=advice) for c, t, advice in rows
        ]
    except (KeyError, TypeError, IndexError, ValueError) as exc:
        raise ValueError(f"malformed prepare_jobs result from the sandbox: {exc!r}") from None
    for i, m in enumerate(manifests):
        if not (isinstance(m.chunk, str) and isinstance(m.task, str) and isinstance(m.advice, str)):
            raise ValueError(f"malformed prepare_jobs result from the sandbox: job {i} is not text")
    return renumber(manifests)


def renumber(manifests: List[JobManifest]) -> List[JobManifest]:
    """Fresh manifests numbered as the official does: ``chunk_id`` and ``task_id`` by first
    appearance of the chunk / task *string* (equal strings share an id), ``job_id`` by position."""
    chunk_ids: Dict[str, int] = {}
    task_ids: Dict[str, int] = {}
    return [
        JobManifest(
            chunk=m.chunk,
            task=m.task,
            advice=m.advice,
            chunk_id=chunk_ids.setdefault(m.chunk, len(chunk_ids)),
            task_id=task_ids.setdefault(m.task, len(task_ids)),
            job_id=job_id,
        )
        for job_id, m in enumerate(manifests)
    ]


# The typing names of SANDBOX_NAMES must exist in this module (the child looks them up here).
_TYPING_NAMES = (Any, Dict, List, Optional, Tuple, Union)
