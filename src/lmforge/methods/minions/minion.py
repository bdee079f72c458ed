"""MINION: a chat between a remote supervisor that never sees the document and a local worker.

Narayan, Biderman, Eyuboglu et al., "Minions: Cost-efficient Collaboration Between On-device and
Cloud Language Models", ICML 2025, https://arxiv.org/abs/2502.15964 (official code
github.com/HazyResearch/minions, first commit ``minions/minion.py``). Paper: 30.4x lower remote cost
at 87% of the remote-only quality.

How it works (the official loop)::

    S = [user: SUPERVISOR_INITIAL(task)]            # remote: the task only
    W = [system: WORKER_SYSTEM(context, task)]      # local: the whole document
    W += user: json(remote(S))["message"]
    for r in range(max_rounds):                     # default 3
        w = local(W); W += assistant: w
        S += user: (SUPERVISOR_FINAL if r is the last round else SUPERVISOR_CONVERSATION)(w)
        j = json(remote(S))
        if j["decision"] == "provide_final_answer": return j["answer"]
        W += user: j["message"]
    return "No answer found."

Privacy: the remote's messages are built from the task and the worker's replies only; the document
goes into the worker's system message and nowhere else.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from lmforge.common.errors import UserError
from lmforge.methods.minions import prompts
from lmforge.methods.minions.clients import ChatClient, ChatResponse, chat_json
from lmforge.methods.minions.ledger import CostLedger, LedgeredClient

__all__ = ["NO_ANSWER", "MinionResult", "check_documents", "run_minion"]

logger = logging.getLogger(__name__)

# What the official returns when the rounds run out without a final answer.
NO_ANSWER = "No answer found."

FINAL = "provide_final_answer"
MORE = "request_additional_info"

Log = Callable[[str], None]


@dataclass
class MinionResult:
    """The outcome of one MINION run.

    Attributes:
        answer: the remote's final answer, or ``"No answer found."`` (the official fallback) when the
            rounds ran out (or the remote answered null).
        rounds: worker turns taken (1..max_rounds).
        supervisor_messages: the remote's whole conversation (every message it was sent or wrote).
        worker_messages: the local model's whole conversation (its system message holds the document).
        ledger: tokens and dollars per side.
        hit_max_rounds: True when the loop ended without a ``provide_final_answer`` decision.
    """

    answer: str
    rounds: int
    supervisor_messages: list[dict[str, str]]
    worker_messages: list[dict[str, str]]
    ledger: CostLedger
    hit_max_rounds: bool
    decisions: list[dict[str, Any]] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able record of the run."""
        return {
            "protocol": "minion",
            "answer": self.answer,
            "rounds": self.rounds,
            "hit_max_rounds": self.hit_max_rounds,
            "decisions": self.decisions,
            "supervisor_messages": self.supervisor_messages,
            "worker_messages": self.worker_messages,
            "ledger": self.ledger.to_dict(),
        }


class _LastReply:
    """A client wrapper that keeps the last response, so that the supervisor's history holds the
    remote's own text (its step-by-step thinking included) after :func:`chat_json` validated it.

    Args:
        client: the client to wrap.
        json_mode: when not None, every call uses this ``json_mode`` whatever the caller asks
            (:func:`chat_json` always asks for JSON mode).
    """

    def __init__(self, client: ChatClient, json_mode: bool | None = None) -> None:
        self.client = client
        self.name = client.name
        self.json_mode = json_mode
        self.last: ChatResponse | None = None

    def chat(
        self, messages: list[dict[str, str]], *, json_mode: bool = False, max_tokens: int | None = None
    ) -> ChatResponse:
        mode = json_mode if self.json_mode is None else self.json_mode
        self.last = self.client.chat(messages, json_mode=mode, max_tokens=max_tokens)
        return self.last

    def chat_batch(
        self,
        conversations: list[list[dict[str, str]]],
        *,
        json_mode: bool = False,
        max_tokens: int | None = None,
    ) -> list[ChatResponse]:
        mode = json_mode if self.json_mode is None else self.json_mode
        return self.client.chat_batch(conversations, json_mode=mode, max_tokens=max_tokens)


def check_documents(context: str | Sequence[str]) -> list[str]:
    """The documents as a list of strings; a one-line UserError for anything that is not text."""
    documents = [context] if isinstance(context, str) else context
    if isinstance(documents, (bytes, bytearray)) or not isinstance(documents, Sequence):
        raise UserError(f"the document must be text, got {type(context).__name__}")
    for i, doc in enumerate(documents):
        if not isinstance(doc, str):
            raise UserError(f"document {i} is not text (got {type(doc).__name__})")
    return list(documents)


def _first_message(obj: dict[str, Any]) -> str:
    message = obj.get("message")
    if not isinstance(message, str) or not message.strip():
        raise ValueError('the JSON needs a non-empty string "message" for the small model')
    return message


def _decision(obj: dict[str, Any]) -> dict[str, Any]:
    decision = obj.get("decision")
    if decision == FINAL:
        if "answer" not in obj:
            raise ValueError('a "provide_final_answer" decision needs an "answer"')
        return obj
    if decision == MORE:
        _first_message(obj)
        return obj
    raise ValueError(f'"decision" must be "{FINAL}" or "{MORE}", got {decision!r}')


def _answer_text(answer: Any) -> str | None:
    if answer is None:
        return None
    return answer if isinstance(answer, str) else str(answer)


def run_minion(
    local: ChatClient,
    remote: ChatClient,
    context: str | Sequence[str],
    task: str,
    *,
    max_rounds: int = 3,
    ledger: CostLedger | None = None,
    json_retries: int = 5,
    log: Log | None = None,
) -> MinionResult:
    """Run the MINION chat protocol.

    Args:
        local: the local worker model (reads the document).
        remote: the remote supervisor model (never sees the document).
        context: the document, or several (joined by blank lines, as the official does).
        task: the question or task.
        max_rounds: worker turns at most (official default 3).
        ledger: where usage is recorded; a fresh :class:`CostLedger` when None.
        json_retries: attempts at a valid JSON reply per remote turn.
        log: called with one line per step (progress for a CLI), optional.

    Returns:
        A :class:`MinionResult`.

    Raises:
        StructuredOutputError: the remote's reply never held a valid JSON decision within
            ``json_retries`` attempts (the ledger passed in keeps every attempt's usage).
    """
    if max_rounds < 1:
        raise ValueError(f"max_rounds must be >= 1, got {max_rounds}")
    ledger = ledger if ledger is not None else CostLedger()
    say = log or (lambda line: logger.info("%s", line))
    # Several documents are joined by blank lines, as the official joins its context list.
    context = "\n\n".join(check_documents(context))

    worker = LedgeredClient(local, ledger, "local")
    # The remote thinks step by step before its ```json block, so its calls are plain chat, as in
    # the official (which extracts the JSON from the reply); JSON mode would forbid the thinking.
    supervisor = _LastReply(LedgeredClient(remote, ledger, "remote"), json_mode=False)

    def ask_supervisor(validate: Callable[[dict[str, Any]], Any]) -> Any:
        # NOTE: the official parses the reply once and crashes on bad JSON (or a decision without
        # its "message"); here the reply is validated and asked again, at most json_retries times.
        value = chat_json(supervisor, list(supervisor_messages), validate, retries=json_retries)
        assert supervisor.last is not None
        supervisor_messages.append({"role": "assistant", "content": supervisor.last.text})
        return value

    supervisor_messages: list[dict[str, str]] = [
        {"role": "user", "content": prompts.minion_supervisor_initial(task)}
    ]
    worker_messages: list[dict[str, str]] = [
        {"role": "system", "content": prompts.minion_worker_system(context, task)}
    ]

    first = ask_supervisor(_first_message)
    worker_messages.append({"role": "user", "content": first})
    say(f"minion: supervisor's first message ({len(first)} chars)")

    answer: str | None = None
    finished = False
    decisions: list[dict[str, Any]] = []
    rounds = 0
    for r in range(max_rounds):
        rounds = r + 1
        reply = worker.chat(worker_messages).text
        worker_messages.append({"role": "assistant", "content": reply})
        last = r == max_rounds - 1
        prompt = prompts.minion_supervisor_final(reply) if last else prompts.minion_supervisor_conversation(reply)
        supervisor_messages.append({"role": "user", "content": prompt})
        obj = ask_supervisor(_decision)
        decisions.append({"round": rounds, **obj})
        say(f"minion: round {rounds}/{max_rounds}: {obj['decision']}")
        if obj["decision"] == FINAL:
            answer = _answer_text(obj.get("answer"))
            finished = True
            break
        # As in the official, a request in the last round still goes into the worker's history,
        # but the loop ends and the answer falls back to "No answer found.".
        worker_messages.append({"role": "user", "content": obj["message"]})

    return MinionResult(
        answer=NO_ANSWER if answer is None else answer,
        rounds=rounds,
        supervisor_messages=supervisor_messages,
        worker_messages=worker_messages,
        ledger=ledger,
        hit_max_rounds=not finished,
        decisions=decisions,
    )
