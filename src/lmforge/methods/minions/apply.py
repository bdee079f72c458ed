"""One entry point for the four ways of answering a question about a long document.

``minion`` and ``minions`` are the paper's protocols (:mod:`.minion`, :mod:`.minions`); the two
baselines are the paper's: ``remote-only`` (the remote model reads the whole document and answers,
the quality and cost reference) and ``local-only`` (the local model does the same alone). Every run
records both sides' tokens and the remote's dollars in a :class:`~.ledger.CostLedger`.

Clients come from model specs (:func:`make_client`): ``zoo:NAME``, ``real:NAME``, a local Hugging
Face folder or a ``.gguf`` file runs in-process on lmforge's batched engine; anything else is a model
name on an OpenAI-compatible server (``--remote-base-url`` / ``--local-base-url``: OpenAI, vLLM,
llama.cpp's server, ollama), with the key read from an environment variable only.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from lmforge.common.errors import UserError
from lmforge.methods.minions.clients import ChatClient, HFChatClient, OpenAIChatClient
from lmforge.methods.minions.ledger import CostLedger, LedgeredClient

PROTOCOLS = ("minion", "minions", "remote-only", "local-only")
DEFAULT_ROUNDS = {"minion": 3, "minions": 5}  # the official defaults
OPENAI_URL = "https://api.openai.com/v1"


@dataclass
class MinionsConfig:
    """Settings of a run; defaults are the official code's (first commit).

    Attributes:
        protocol: ``minion`` | ``minions`` | ``remote-only`` | ``local-only``.
        max_rounds: rounds at most; None: the protocol's official default (MINION 3, MINIONS 5).
        num_tasks_per_round: MINIONS: distinct tasks per round (3).
        num_samples_per_task: MINIONS: samples per job (1).
        chunk_size: MINIONS: characters per chunk of the chunking function (5000).
        max_jobs: MINIONS: jobs per round above which the remote's code is rejected (2048).
        max_code_attempts: MINIONS: tries at working code per round (10).
        json_retries: tries at a valid JSON reply from the remote (5).
        doc_metadata: what the document is ("a 10-K filing"), for MINIONS' advice prompt.
    """

    protocol: str = "minions"
    max_rounds: int | None = None
    num_tasks_per_round: int = 3
    num_samples_per_task: int = 1
    chunk_size: int = 5000
    max_jobs: int = 2048
    max_code_attempts: int = 10
    json_retries: int = 5
    doc_metadata: str = ""

    def __post_init__(self) -> None:
        if self.protocol not in PROTOCOLS:
            raise UserError(f"unknown protocol {self.protocol!r}; use one of {', '.join(PROTOCOLS)}")
        for name in ("num_tasks_per_round", "num_samples_per_task", "chunk_size", "max_jobs",
                     "max_code_attempts", "json_retries"):
            if getattr(self, name) < 1:
                raise UserError(f"{name.replace('_', '-')} must be at least 1, got {getattr(self, name)}")
        if self.max_rounds is not None and self.max_rounds < 1:
            raise UserError(f"max-rounds must be at least 1, got {self.max_rounds}")

    @property
    def rounds(self) -> int:
        return self.max_rounds if self.max_rounds is not None else DEFAULT_ROUNDS.get(self.protocol, 1)


def is_local_model(spec: str) -> bool:
    """``zoo:NAME``, ``real:NAME`` (a packaged real checkpoint), an existing folder or ``.gguf`` file (what
    :func:`lmforge.models.load.load` reads): run in-process."""
    path = Path(spec).expanduser()
    return (spec.startswith(("zoo:", "real:")) or path.is_dir()
            or (path.is_file() and path.name.endswith(".gguf")))


def make_client(spec: str, *, base_url: str | None = None, key_env: str = "OPENAI_API_KEY",
                require_key: bool = True, max_tokens: int = 256, timeout: float = 60.0,
                max_retries: int = 3, json_schema: dict[str, Any] | None = None,
                json_parser_options: dict[str, Any] | None = None, dtype: str = "float32") -> ChatClient:
    """A chat client for ``spec``.

    Args:
        spec: ``zoo:NAME``, ``real:NAME``, a local HF folder or a ``.gguf`` file (in-process), else a model
            name served at ``base_url``.
        base_url: an OpenAI-compatible ``/v1`` URL; required for a served model.
        key_env: the environment variable holding the API key (never a command-line value).
        require_key: a missing key is an error (local servers usually need none: pass False).
        max_tokens: completion tokens per call.
        timeout, max_retries: per request, for served models.
        json_schema: for an in-process model, the schema its ``json_mode`` replies are decoded under
            (the MINIONS worker: :data:`~lmforge.methods.minions.jobs.JOB_OUTPUT_SCHEMA`); None: any
            JSON object. A served model gets ``response_format={"type": "json_object"}`` and no schema.
        json_parser_options: for an in-process model, lm-format-enforcer options of that constraint
            (with :func:`~lmforge.methods.minions.jobs.bounded_job_schema`:
            :data:`~lmforge.methods.minions.jobs.BOUNDED_JOB_PARSER_OPTIONS`); a served model cannot take
            them.
        dtype: for an in-process model, the loading dtype (``auto``, ``float32``, ``bfloat16``;
            :func:`lmforge.common.runtime.resolve_dtype`).

    Raises:
        UserError: a served model without ``base_url``, a missing key, parser options for a served model.
    """
    if base_url is None and is_local_model(spec):
        return HFChatClient.from_spec(spec, max_tokens=max_tokens, json_schema=json_schema,
                                      json_parser_options=json_parser_options, dtype=dtype)
    if base_url is None:
        raise UserError(f"{spec!r} is not zoo:NAME, real:NAME, a local model folder or a .gguf file; give "
                        "the server's URL (--remote-base-url / --local-base-url) to use it as a served model")
    if json_parser_options:
        raise UserError(f"{spec!r} is served at {base_url}: its replies cannot be decoded under lm-format-enforcer "
                        "parser options (the OpenAI-compatible client sends only response_format json_object)")
    return OpenAIChatClient(base_url, spec, api_key_env=key_env, require_key=require_key, timeout=timeout,
                            max_retries=max_retries, max_tokens=max_tokens)


def read_document(path: str | Path) -> str:
    """A text document; binary files (PDF, Word, images) are a one-line error."""
    path = Path(path)
    try:
        raw = path.read_bytes()
    except FileNotFoundError:
        raise UserError(f"document not found: {path}") from None
    except OSError as exc:
        raise UserError(f"cannot read {path}: {exc.strerror or exc}") from None
    if raw.startswith(b"%PDF") or b"\x00" in raw[:65536]:
        raise UserError(f"{path} is not a text document (binary{', PDF' if raw.startswith(b'%PDF') else ''}); "
                        "convert it to text first")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise UserError(f"{path} is not UTF-8 text (byte {exc.start}); convert it to UTF-8 first") from None
    if not text.strip():
        raise UserError(f"{path} is empty")
    return text


def _direct_prompt(document: str, question: str) -> list[dict[str, str]]:
    # The baselines' single call: the whole document, then the question (the paper's remote-only
    # and local-only rows answer "with the full context").
    return [{"role": "user", "content": f"Read the document below and answer the question.\n\n"
                                        f"Document:\n{document}\n\nQuestion: {question}\n"
                                        "Give a short final answer."}]


def run_protocol(local: ChatClient | None, remote: ChatClient | None, document: str, question: str,
                 cfg: MinionsConfig, *, ledger: CostLedger | None = None,
                 log: Any = None) -> dict[str, Any]:
    """Answer ``question`` about ``document`` by ``cfg.protocol``; returns a JSON-able record.

    The record holds ``protocol``, ``answer``, ``ledger`` (both sides' tokens, the remote's dollars)
    and the protocol's own log (``details``: rounds, jobs, transcripts).
    """
    ledger = ledger if ledger is not None else CostLedger()
    if cfg.protocol != "local-only" and remote is None:
        raise UserError(f"protocol {cfg.protocol} needs a remote model")
    if cfg.protocol != "remote-only" and local is None:
        raise UserError(f"protocol {cfg.protocol} needs a local model")
    details: dict[str, Any]
    if cfg.protocol == "minion":
        from lmforge.methods.minions.minion import run_minion

        res = run_minion(local, remote, document, question, max_rounds=cfg.rounds, ledger=ledger,
                         json_retries=cfg.json_retries, log=log)
        answer, details = res.answer, res.to_dict()
    elif cfg.protocol == "minions":
        from lmforge.methods.minions.minions import run_minions

        res2 = run_minions(local, remote, document, question, doc_metadata=cfg.doc_metadata,
                           max_rounds=cfg.rounds, num_tasks_per_round=cfg.num_tasks_per_round,
                           num_samples_per_task=cfg.num_samples_per_task, chunk_size=cfg.chunk_size,
                           max_jobs=cfg.max_jobs, max_code_attempts=cfg.max_code_attempts,
                           json_retries=cfg.json_retries, ledger=ledger, log=log)
        answer, details = res2.answer, res2.to_dict()
    else:
        side, client = ("remote", remote) if cfg.protocol == "remote-only" else ("local", local)
        reply = LedgeredClient(client, ledger, side).chat(_direct_prompt(document, question))  # type: ignore[arg-type]
        answer, details = reply.text.strip(), {"done_reason": reply.done_reason}
    details.pop("ledger", None)  # one copy, below
    return {"protocol": cfg.protocol, "answer": answer, "ledger": ledger.to_dict(), "config": asdict(cfg),
            "details": details}
