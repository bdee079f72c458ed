"""Chat-text helpers shared by chat clients and by the data that imitates them.

* :func:`render_plain`: the prompt for a tokenizer without a chat template, one ``"role: content"``
  line per message, then ``"assistant:"`` (what MINIONS' local Hugging Face client sends a zoo model,
  and so what :mod:`lmforge.data.docjobs` trains the zoo's reader on). T-Eval's plain rendering is
  another format (:func:`lmforge.eval.teval_data.render_plain`: the contents alone).
* :func:`extract_json`: the JSON object a model's reply carries (the last fenced block holding one,
  else the last balanced ``{...}`` object), as chat clients and reply scorers read it.

Both moved here unchanged from :mod:`lmforge.methods.minions.clients` (which re-exports them), so
that data generators use them without importing a method; the parsing itself is the standard
library's ``json.JSONDecoder.raw_decode``, tried at each ``{``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

__all__ = ["extract_json", "render_plain"]


def render_plain(messages: Sequence[dict[str, str]]) -> str:
    """``"role: content"`` lines followed by ``"assistant:"``, for tokenizers without a chat template."""
    return "".join(f"{m['role']}: {m['content']}\n" for m in messages) + "assistant:"


_FENCE = re.compile(r"```[ \t]*(?:json|JSON)?[ \t]*\n?(.*?)```", re.DOTALL)


def _last_object(text: str) -> dict[str, Any] | None:
    """The last top-level JSON object in ``text`` (objects nested in it are part of it)."""
    decoder = json.JSONDecoder()
    found: dict[str, Any] | None = None
    i = text.find("{")
    while i != -1:
        try:
            obj, end = decoder.raw_decode(text, i)
        except json.JSONDecodeError:
            i = text.find("{", i + 1)
            continue
        if isinstance(obj, dict):
            found = obj
        i = text.find("{", end)
    return found


def extract_json(text: str) -> dict[str, Any] | None:
    """The JSON object a model's reply carries, or None.

    The last fenced block (```` ```json ... ``` ```` or a bare ```` ``` ````) that holds a JSON
    object wins; else the last balanced ``{...}`` object anywhere in the text. Arrays and scalars
    are not objects and are ignored.
    """
    if not isinstance(text, str):
        return None
    for block in reversed(_FENCE.findall(text)):
        obj = _last_object(block)
        if obj is not None:
            return obj
    return _last_object(text)
