"""MINIONS job objects, chunkers and sandbox hooks (pure Python, no sandbox process here)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from lmforge.methods.minions import jobs
from lmforge.methods.minions.jobs import (
    Job,
    JobManifest,
    JobOutput,
    chunk_by_heading,
    chunk_by_page,
    chunk_by_paragraph,
    chunk_by_section,
    chunk_by_size,
    manifests_from_json,
    renumber,
    sandbox_decode,
    sandbox_encode,
)


def _official_chunk_by_section(doc: str, max_chunk_size: int = 5000, overlap: int = 0) -> list[str]:
    """The official first-commit loop, for reference."""
    sections, start = [], 0
    while start < len(doc):
        sections.append(doc[start : start + max_chunk_size])
        start += max_chunk_size - overlap
    return sections


@pytest.mark.parametrize("n,size,overlap", [(0, 10, 0), (25, 10, 0), (30, 10, 0), (31, 10, 3), (12000, 5000, 0), (7, 100, 99)])
def test_chunk_by_section_matches_official(n: int, size: int, overlap: int) -> None:
    doc = "".join(chr(97 + i % 26) for i in range(n))
    got = chunk_by_section(doc, size, overlap)
    assert got == _official_chunk_by_section(doc, size, overlap)
    assert chunk_by_size(doc, size, overlap) == got
    if overlap == 0:
        assert "".join(got) == doc
    assert all(len(c) <= size for c in got)


def test_chunk_by_section_defaults_and_bad_overlap() -> None:
    doc = "x" * 12001
    assert [len(c) for c in chunk_by_section(doc)] == [5000, 5000, 2001]
    with pytest.raises(ValueError, match="overlap"):
        chunk_by_section(doc, 10, 10)  # the official would loop forever
    with pytest.raises(ValueError, match="max_chunk_size"):
        chunk_by_section(doc, 0)


def test_chunk_by_heading_cuts_at_sections_and_long_sections_by_size() -> None:
    doc = "Preface line.\n# Title\nintro\n## Revenue\n" + "r" * 25 + "\n## Costs\ncosts here\n### Detail\nd\n"
    chunks = chunk_by_heading(doc, max_chunk_size=20)
    assert "".join(chunks) == doc  # nothing lost, order kept
    assert chunks[:2] == ["Preface line.\n", "# Title\nintro\n"]
    assert chunks[2].startswith("## Revenue") and len(chunks[2]) == 20  # the long section, cut by size
    assert chunks[-2:] == ["## Costs\ncosts here\n", "### Detail\nd\n"]
    assert all(len(c) <= 20 for c in chunks)
    assert chunk_by_heading("#hashtag is not a heading\n") == ["#hashtag is not a heading\n"]
    with pytest.raises(ValueError):
        chunk_by_heading(doc, 0)


def test_chunk_by_page() -> None:
    doc = "intro\fPage one text\nPage 2 of 3\nsecond page\n- 3 -\nthird page"
    assert [p.strip() for p in chunk_by_page(doc)] == ["intro", "Page one text", "second page", "third page"]
    assert chunk_by_page("no markers here") == ["no markers here"]
    assert chunk_by_page("") == []


def test_chunk_by_paragraph_packs_whole_paragraphs() -> None:
    paras = [f"Paragraph {i} " + "w" * 30 + "." for i in range(6)]  # 43-44 chars each
    chunks = chunk_by_paragraph("\n\n".join(paras), max_chunk_size=100)
    assert all(len(c) <= 100 for c in chunks)
    assert [p for c in chunks for p in c.split("\n\n")] == paras  # no paragraph cut, order kept
    assert len(chunks) == 3
    long = "A sentence here. " * 20
    pieces = chunk_by_paragraph(long, max_chunk_size=40)
    assert all(len(c) <= 40 for c in pieces) and "".join(pieces).replace(" ", "") == long.replace(" ", "")


def test_renumber_dedupes_by_string_as_official() -> None:
    ms = [JobManifest("c0", "t0"), JobManifest("c1", "t0"), JobManifest("c0", "t1"), JobManifest("c1", "t1"),
          JobManifest("c0", "t0")]  # a second sample of job 0
    out = renumber(ms)
    assert [(m.chunk_id, m.task_id, m.job_id) for m in out] == [(0, 0, 0), (1, 0, 1), (0, 1, 2), (1, 1, 3), (0, 0, 4)]
    assert ms[0].job_id is None  # fresh objects, the input is untouched


def test_prepare_jobs_encoding_round_trip_and_foreign_objects() -> None:
    class Foreign:  # the remote defined its own class with the same fields
        def __init__(self, chunk: str, task: str) -> None:
            self.chunk, self.task, self.advice = chunk, task, None

    value = [JobManifest("aa", "t", "adv"), {"chunk": "bb", "task": "t"}, Foreign("aa", "u")]
    encoded = sandbox_encode("prepare_jobs", value)
    json.dumps(encoded)
    assert encoded["chunks"] == ["aa", "bb"] and encoded["tasks"] == ["t", "u"]
    ms = manifests_from_json(json.loads(json.dumps(encoded)))
    assert [(m.chunk, m.task, m.advice, m.chunk_id, m.task_id, m.job_id) for m in ms] == [
        ("aa", "t", "adv", 0, 0, 0), ("bb", "t", "", 1, 0, 1), ("aa", "u", "", 0, 1, 2)]


@pytest.mark.parametrize("bad", [None, "text", {"chunk": "c"}, [1, 2], [JobManifest(chunk=3, task="t")]])  # type: ignore[arg-type]
def test_prepare_jobs_encoding_rejects_wrong_types(bad: object) -> None:
    with pytest.raises(TypeError, match="prepare_jobs|JobManifest"):
        sandbox_encode("prepare_jobs", bad)


def test_manifests_from_json_rejects_malformed() -> None:
    with pytest.raises(ValueError, match="malformed"):
        manifests_from_json({"chunks": ["a"], "tasks": ["t"], "jobs": [[1, 0, ""]]})
    with pytest.raises(ValueError, match="malformed"):
        manifests_from_json([1, 2])


def test_transform_outputs_hooks() -> None:
    job = Job(JobManifest("c", "t", "a", 0, 0, 0), JobOutput("e", None, "42"), "raw", None)
    args = sandbox_decode("transform_outputs", {"jobs": [json.loads(json.dumps(job.to_dict()))]})
    assert args["jobs"] == [job]
    assert sandbox_encode("transform_outputs", "s") == "s"
    assert sandbox_encode("transform_outputs", 12) == "12"
    prev = sandbox_decode("prepare_jobs", {"context": ["d"], "prev_job_manifests": [job.manifest.to_dict()],
                                           "prev_job_outputs": [job.output.to_dict()]})
    assert prev["prev_job_manifests"] == [job.manifest] and prev["prev_job_outputs"] == [job.output]
    first = sandbox_decode("prepare_jobs", {"context": ["d"], "prev_job_manifests": None, "prev_job_outputs": None})
    assert first["prev_job_manifests"] is None and first["prev_job_outputs"] is None


def test_job_output_coerces_worker_values() -> None:
    out = JobOutput.from_dict({"explanation": "x", "citation": ["a", "b"], "answer": 12.5})
    assert out == JobOutput("x", "a\nb", "12.5")
    assert JobOutput.from_dict({}) == JobOutput(None, None, None)


def test_sandbox_names_exist_and_module_is_light() -> None:
    for name in jobs.SANDBOX_NAMES:
        assert hasattr(jobs, name), name
    code = "import sys, lmforge.methods.minions.jobs; print(sorted(m for m in ('torch', 'transformers', 'numpy') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
