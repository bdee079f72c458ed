"""MoRAgent's three-role agent loop: reasoner -> executor -> observation -> ... -> summarizer.

Han et al., "MoRAgent" (ICML 2025), §3: one model plays three roles; the reasoner thinks and hands
over to the next role, the executor writes the function call, the tool's reply comes back as an
observation, and the summarizer answers the user. With a MoR adapter
(:mod:`lmforge.methods.moragent.adapter`) each role's tokens go through its own expert group.

The loop (:func:`run_agent`) is the trajectory format of :mod:`lmforge.methods.moragent.data`
generated segment by segment, batched over episodes on lmforge's engine
(:func:`lmforge.common.generation.generate` with token-id prompts):

* the context is the segments so far, each tokenised on its own exactly as
  :func:`~lmforge.methods.moragent.data.encode_trajectory` does for training, followed by the next
  role's header ``"{role}:"``; the model writes the rest of the segment;
* the role of every fed token is set through the engine's ``position_hook``: a context token keeps
  its segment's role id (-1 for user and observation), the header and every generated token get the
  role being played. A model without MoR layers (the base model, a LoRA baseline) runs the same
  loop without roles;
* a reasoner segment ends at the newline after its ``Next role: X`` line, which picks the next role
  (no such line within its token budget ends the episode as ``no_next_role``); an executor segment
  is one line, parsed as a JSON call and run against the deterministic tool stub
  (:func:`~lmforge.methods.moragent.data.execute_call`), whose reply becomes an ``observation``
  segment followed by the reasoner's turn; the summarizer's line (or EOS) ends the episode;
* ``max_steps`` bounds the generated segments per episode (``step_limit``).

NOTE: the official agent loop is not released; the hand-over by a "Next role:" line and the
per-segment role switch are the paper's description (§3.2, Fig. 2) in this module's format.
Checked: transformers' ``generate`` and TRL have no multi-role loop with per-token adapter routing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from lmforge.common.errors import UserError
from lmforge.common.generation import generate
from lmforge.data.toolcalls import parse_call
from lmforge.methods.moragent.adapter import mor_layers, set_roles
from lmforge.methods.moragent.data import (
    AGENT_ROLES,
    ROLE_IDS,
    Segment,
    execute_call,
    render_segment,
    user_segment,
    validate_function_call_record,
)

__all__ = ["DEFAULT_MAX_NEW_TOKENS", "Episode", "bfcl_calls", "format_episode", "run_agent"]

EndReason = Literal["answered", "no_next_role", "step_limit", "length"]
# Per-segment token budgets: a reasoner thought and its hand-over line, a call, a one-line answer.
DEFAULT_MAX_NEW_TOKENS = {"reasoner": 96, "executor": 96, "summarizer": 96}
# the hand-over line ends at its newline, or at the end of the text when the model stopped there (EOS)
_HANDOVER = re.compile(r"next\s+role\s*:\s*(reasoner|executor|summarizer)[ \t]*(?:\n|$)", re.IGNORECASE)
_STOPS = {"reasoner": [f"role: {r}\n" for r in AGENT_ROLES] + [f"Role: {r}\n" for r in AGENT_ROLES],
          "executor": ["\n"], "summarizer": ["\n"]}


@dataclass
class Episode:
    """One run of the agent on a record.

    ``segments`` is the trajectory so far (the user segment first); ``calls`` holds each executor
    segment's parsed call (None where its text was no JSON object); ``ended`` says why the loop
    stopped: ``answered`` (the summarizer spoke), ``no_next_role`` (a reasoner named no next role),
    ``step_limit`` or ``length`` (a segment hit its token budget without finishing its line).
    """

    record: dict[str, Any]
    segments: list[Segment]
    calls: list[dict[str, Any] | None] = field(default_factory=list)
    ended: EndReason | None = None
    next_role: str = "reasoner"

    @property
    def steps(self) -> int:
        return sum(1 for s in self.segments if s.role in AGENT_ROLES)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.record.get("id"), "ended": self.ended, "calls": self.calls,
                "segments": [{"role": s.role, "text": s.text} for s in self.segments]}


def _segment_ids(tokenizer: Any, seg: Segment, cache: dict[tuple[str, str], list[int]]) -> list[int]:
    key = (seg.role, seg.text)
    if key not in cache:
        cache[key] = tokenizer(render_segment(seg), add_special_tokens=False)["input_ids"]
    return cache[key]


def _context(tokenizer: Any, ep: Episode, role: str, cache: dict[tuple[str, str], list[int]]
             ) -> tuple[list[int], list[int]]:
    ids: list[int] = []
    tags: list[int] = []
    for seg in ep.segments:
        piece = _segment_ids(tokenizer, seg, cache)
        ids += piece
        tags += [ROLE_IDS[seg.role]] * len(piece)
    # NOTE: the header without its trailing space: training tokenises "role: text" as one piece, in
    # which a byte-level BPE keeps the space with the next word (" Thought"), so "role:" is the
    # prefix the model saw and the space is the model's to write.
    header = tokenizer(f"{role}:", add_special_tokens=False)["input_ids"]
    return ids + header, tags + [ROLE_IDS[role]] * len(header)


def _finish_segment(ep: Episode, role: str, text: str, finished_by: str) -> None:
    """Append the generated segment to ``ep`` and decide what comes next."""
    body = text[1:] if text.startswith(" ") else text
    if role == "reasoner":
        m = _HANDOVER.search(body)
        if m is None:
            ep.segments.append(Segment("reasoner", body.rstrip("\n")))
            ep.ended = "length" if finished_by == "length" else "no_next_role"
            return
        ep.segments.append(Segment("reasoner", body[: m.end()].rstrip("\n")))
        ep.next_role = m.group(1).lower()
        return
    line = body.split("\n", 1)[0]
    ep.segments.append(Segment(role, line))
    if role == "executor":
        call = parse_call(line)
        if call is not None and not (isinstance(call.get("name"), str) and isinstance(call.get("arguments"), dict)):
            call = None
        ep.calls.append(call)
        observation = execute_call(call if call is not None else {}, ep.record["tools"])
        ep.segments.append(Segment("observation", observation))
        ep.next_role = "reasoner"
        return
    ep.ended = "answered"


def run_agent(model: nn.Module, tokenizer: Any, records: list[dict[str, Any]], *, max_steps: int = 8,
              max_new_tokens: dict[str, int] | None = None, batch_size: int = 16,
              progress: bool = False) -> list[Episode]:
    """Run the three-role loop on each xLAM-style record (``query``, ``tools``; ``answers`` unused).

    Episodes advance together: each round takes every unfinished episode, groups them by the role
    that speaks next and generates that role's segment for the whole group in batches (greedy). A
    model with MoR layers gets each fed token's role through the engine's position hook; the roles
    are cleared when the loop returns.
    """
    if max_steps < 1:
        raise UserError(f"max_steps must be at least 1, got {max_steps}")
    budgets = {**DEFAULT_MAX_NEW_TOKENS, **(max_new_tokens or {})}
    bad = [k for k, v in budgets.items() if k not in AGENT_ROLES or int(v) < 1]
    if bad:
        raise UserError(f"max_new_tokens takes a positive budget per role ({', '.join(AGENT_ROLES)}); got {bad}")
    episodes = []
    for i, rec in enumerate(records):
        # the canonical record (an xLAM dump's JSON-string tools parsed); no answers -> a placeholder
        rec = validate_function_call_record({**rec, "answers": rec.get("answers") or [{"name": "_", "arguments": {}}]},
                                            f"record {i}")
        episodes.append(Episode(record=rec, segments=[user_segment(rec)]))
    has_mor = bool(mor_layers(model))
    cache: dict[tuple[str, str], list[int]] = {}
    try:
        while True:
            active = [ep for ep in episodes if ep.ended is None]
            if not active:
                break
            for role in AGENT_ROLES:
                for ep in active:
                    if ep.ended is None and ep.steps >= max_steps:
                        ep.ended = "step_limit"
                group = [ep for ep in active if ep.ended is None and ep.next_role == role]
                if not group:
                    continue
                contexts = [_context(tokenizer, ep, role, cache) for ep in group]
                role_id = ROLE_IDS[role]

                def hook(rows: list[int], positions: torch.Tensor, contexts=contexts, role_id=role_id) -> None:
                    tags = torch.full(positions.shape, -1, dtype=torch.long)
                    for j, r in enumerate(rows):
                        row_tags = contexts[r][1]
                        pos = positions[j].tolist()
                        tags[j] = torch.tensor([row_tags[p] if 0 <= p < len(row_tags) else
                                                (role_id if p >= 0 else -1) for p in pos])
                    set_roles(model, tags.to(positions.device))

                outs = generate(model, tokenizer, prompt_ids=[c[0] for c in contexts],
                                max_new_tokens=int(budgets[role]), stop=_STOPS[role], batch_size=batch_size,
                                position_hook=hook if has_mor else None, progress=progress)
                for ep, out in zip(group, outs):
                    # the engine cuts the text before a stop string; the full decode keeps the hand-over
                    text = tokenizer.decode(out.token_ids, skip_special_tokens=True)
                    finished = out.finished_by
                    if role != "reasoner" and finished == "length" and "\n" not in text:
                        ep.segments.append(Segment(role, text[1:] if text.startswith(" ") else text))
                        if role == "executor":
                            ep.calls.append(None)
                        ep.ended = "length"
                        continue
                    _finish_segment(ep, role, text, finished)
    finally:
        if has_mor:
            set_roles(model, None)
    return episodes


def bfcl_calls(episode: Episode) -> list[dict[str, dict[str, Any]]]:
    """The episode's executor calls in BFCL's decoded form (``[{name: {arg: value}}]``), unparsable
    ones left out (BFCL's checker then counts the calls and fails the entry)."""
    return [{c["name"]: dict(c["arguments"])} for c in episode.calls if c is not None]


def format_episode(episode: Episode) -> str:
    """The episode as the model saw it (rendered segments), for reports."""
    return "".join(render_segment(s) for s in episode.segments)

