"""The message of one MINIONS local job: a document chunk, a task, advice, and the reply format.

MINIONS (Narayan et al., ICML 2025, arXiv 2502.15964) sends the local worker one such message per
(chunk, task). It lives in data, not in :mod:`lmforge.methods.minions.prompts` (which re-exports it),
because it is also the data format of the zoo's reader (:mod:`lmforge.data.docjobs` renders it
exactly as the method sends it) and data never imports a method. The wording is lmforge's own; the
sections and the ``JobOutput`` fields follow the official first commit
(github.com/HazyResearch/minions, ``minions/prompts/minions.py``).
"""

from __future__ import annotations

__all__ = ["minions_worker"]


def minions_worker(chunk: str, task: str, advice: str) -> str:
    """One local job: a chunk, a task, advice, and the JobOutput JSON to return."""
    return f"""\
Here is an excerpt from a document:

{chunk}

--------------------------------
Your task:

{task}

--------------------------------
Advice on how to approach it:

{advice}

--------------------------------

Reply with one JSON object (a `JobOutput`) with these keys:
```json
{{
  "explanation": "<your reasoning in a sentence or two>",
  "citation": "<the words from the excerpt that support your answer, or null>",
  "answer": "<your answer, or null if the excerpt has nothing relevant>"
}}
```
Your reply:"""
