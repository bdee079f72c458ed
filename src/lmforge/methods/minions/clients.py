"""Chat clients for local-remote collaboration: a protocol, three implementations, structured output.

Minions (Narayan et al., ICML 2025, arXiv 2502.15964; github.com/HazyResearch/minions) pairs a small
*local* model, which reads the long document, with a frontier *remote* model, which never does. Both
sides are reached through one interface, :class:`ChatClient`: ``chat(messages) -> ChatResponse`` with
the reply, the tokens it cost (:class:`Usage`) and whether it ended naturally or was cut at
``max_tokens`` (``done_reason``; MINIONS drops truncated local job outputs).

* :class:`HFChatClient`: a local Hugging Face model through lmforge's batched decode loop
  (:func:`lmforge.common.generation.generate`); token counts are the tokenizer's own.
* :class:`OpenAIChatClient`: any OpenAI-compatible ``/chat/completions`` endpoint (OpenAI, vLLM,
  llama.cpp server, ollama) over ``httpx``, with timeouts and retries with exponential backoff. The
  API key is read from an environment variable only and never appears in a repr, a log line or an
  error message. NOTE: the ``openai`` SDK (which the official code uses) would add a dependency for
  one POST; ``httpx`` is what that SDK itself is built on, and lets the tests inject the retry
  sleep and run against a local fake server.
* :class:`ScriptedClient`: canned replies for tests, with honest, reproducible token counts
  (:func:`count_tokens`).

Structured output: :func:`extract_json` pulls the last JSON object out of a reply (it and
:func:`render_plain` are :mod:`lmforge.common.chat`'s, re-exported here) and
:func:`chat_json` asks again, with the validation error, until a reply validates or the retry bound
is reached (then :class:`StructuredOutputError`, a one-line :class:`UserError`); every attempt's
tokens go to the ledger, the failed ones included.
"""

from __future__ import annotations

import copy
import logging
import os
import re
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, runtime_checkable

from lmforge.common.chat import extract_json, render_plain
from lmforge.common.errors import UserError

if TYPE_CHECKING:
    from lmforge.methods.minions.ledger import CostLedger

__all__ = [
    "ChatClient",
    "ChatResponse",
    "HFChatClient",
    "OpenAIChatClient",
    "ReplyCache",
    "ScriptedClient",
    "StructuredOutputError",
    "Usage",
    "chat_json",
    "count_tokens",
    "extract_json",
    "render_plain",
]

logger = logging.getLogger(__name__)

Messages = list[dict[str, str]]
T = TypeVar("T")


# ------------------------------------------------------------------------------------------ types


@dataclass
class Usage:
    """Tokens of one or more calls.

    Attributes:
        prompt_tokens: tokens read (the rendered prompt, special tokens included where the client
            knows them).
        completion_tokens: tokens generated.
    """

    prompt_tokens: int = 0
    completion_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        if not isinstance(other, Usage):
            return NotImplemented
        return Usage(self.prompt_tokens + other.prompt_tokens, self.completion_tokens + other.completion_tokens)

    def __radd__(self, other: Any) -> Usage:
        # sum(usages) starts from the integer 0.
        if other == 0:
            return Usage(self.prompt_tokens, self.completion_tokens)
        return NotImplemented

    @property
    def total_tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens

    def to_dict(self) -> dict[str, int]:
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.total_tokens,
        }


@dataclass
class ChatResponse:
    """One reply.

    Attributes:
        text: the reply's text.
        usage: the tokens this call cost.
        done_reason: ``"stop"`` (the model ended its reply) or ``"length"`` (cut at ``max_tokens``).
    """

    text: str
    usage: Usage
    done_reason: str = "stop"


@runtime_checkable
class ChatClient(Protocol):
    """Anything that answers chat messages (``[{"role": ..., "content": ...}, ...]``).

    ``json_mode`` asks for a JSON object where the backend can enforce it (OpenAI's
    ``response_format``); the prompt should ask for JSON as well, and callers validate the reply
    (:func:`chat_json`). ``max_tokens`` overrides the client's own limit for this call.
    """

    name: str

    def chat(
        self, messages: list[dict[str, str]], *, json_mode: bool = False, max_tokens: int | None = None
    ) -> ChatResponse: ...

    def chat_batch(
        self,
        conversations: list[list[dict[str, str]]],
        *,
        json_mode: bool = False,
        max_tokens: int | None = None,
    ) -> list[ChatResponse]: ...


_TOKEN = re.compile(r"\w+|[^\w\s]")


def count_tokens(text: str) -> int:
    """A reproducible token count: words (``\\w+``) and single punctuation characters.

    ``count_tokens("Hello, world!") == 4``. Used by :class:`ScriptedClient` and as the estimate for
    an OpenAI-compatible server that reports no usage.
    """
    return len(_TOKEN.findall(text))


def _check_messages(messages: Any) -> Messages:
    if isinstance(messages, (str, dict)) or not isinstance(messages, Sequence) or not messages:
        raise ValueError("messages must be a non-empty list of {'role': ..., 'content': ...} dicts")
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise ValueError(f"message {i} must be a dict with string 'role' and 'content', got {m!r:.80}")
    return list(messages)


def _one_line(text: str, limit: int = 300) -> str:
    """``text`` with its whitespace collapsed, shortened to ``limit`` characters."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _check_max_tokens(value: int | None, what: str = "max_tokens") -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise UserError(f"{what} must be an integer >= 0, got {value!r}")


# ------------------------------------------------------------------------------------- local (HF)


# A model prompted with the plain rendering tends to continue the dialogue; these end its turn.
_PLAIN_STOPS = ["\nuser:", "\nsystem:", "\nassistant:"]


class HFChatClient:
    """A local Hugging Face causal LM behind :func:`lmforge.common.generation.generate`.

    Messages are rendered with the tokenizer's chat template (with the generation prompt) when it
    has one, else with :func:`render_plain`, whose replies also stop at the next ``"\\nuser:"`` /
    ``"\\nsystem:"`` / ``"\\nassistant:"`` line. ``chat_batch`` runs the conversations through the
    batched decode loop, ``batch_size`` rows at a time; with greedy decoding (``temperature=0``) it
    gives the same replies as one ``chat`` call per conversation.

    Usage is exact: the prompt's tokens as the tokenizer encodes it (its BOS included) and the
    generated tokens (the final EOS included).

    ``json_mode`` is enforced by constrained decoding, as the official local clients do with
    ollama's JSON-schema output: every reply of a ``json_mode`` call is a JSON value valid under
    ``json_schema`` (None: any JSON object), via lm-format-enforcer
    (:func:`lmforge.common.generation.json_schema_constraint`). ``constrain_json=False`` turns it
    off (the reply is then whatever the model writes, and callers validate with :func:`chat_json`).

    Args:
        model: a causal LM.
        tokenizer: its tokenizer.
        max_tokens: the default limit on generated tokens per reply.
        batch_size: rows per forward pass in ``chat_batch``.
        temperature: 0 for greedy decoding, else the sampling temperature.
        name: the name recorded in ledgers; the model folder's name when None.
        seed: seeds sampling (ignored when greedy).
        json_schema: the JSON schema of ``json_mode`` replies (MINIONS workers: the JobOutput schema,
            :data:`lmforge.methods.minions.jobs.JOB_OUTPUT_SCHEMA`); None allows any JSON object.
        constrain_json: enforce ``json_mode`` by constrained decoding.
        json_parser_options: lm-format-enforcer ``CharacterLevelParserConfig`` fields for the
            constraint (``max_consecutive_whitespaces``, ``force_json_field_order``); None keeps the
            library's defaults (up to 12 consecutive whitespace characters, any key order).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        *,
        max_tokens: int = 256,
        batch_size: int = 8,
        temperature: float = 0.0,
        name: str | None = None,
        seed: int | None = None,
        json_schema: dict[str, Any] | None = None,
        constrain_json: bool = True,
        json_parser_options: dict[str, Any] | None = None,
    ) -> None:
        _check_max_tokens(max_tokens)
        if batch_size < 1:
            raise UserError(f"batch_size must be >= 1, got {batch_size}")
        if not temperature >= 0:
            raise UserError(f"temperature must be >= 0, got {temperature}")
        self.model = model
        self.tokenizer = tokenizer
        self.max_tokens = max_tokens
        self.batch_size = batch_size
        self.temperature = float(temperature)
        self.seed = seed
        if name is None:
            path = getattr(getattr(model, "config", None), "_name_or_path", "") or ""
            name = Path(path).name or type(model).__name__
        self.name = name
        self.json_schema = json_schema
        self.constrain_json = bool(constrain_json)
        self.json_parser_options = dict(json_parser_options) if json_parser_options else None
        self._enforcer_data: Any = None  # lm-format-enforcer's vocabulary tables, built on first use
        # One generation at a time: callers may share a client between threads.
        self._lock = threading.Lock()

    @classmethod
    def from_spec(cls, spec: str | os.PathLike[str], **kwargs: Any) -> HFChatClient:
        """Load ``spec`` (``zoo:NAME``, ``real:NAME``, a model folder or a ``.gguf`` file) with
        :func:`lmforge.models.load.load`.

        The client's ``name`` is the spec as given unless ``name=`` is passed; ``dtype`` goes to the
        loader (``"auto"``: :func:`lmforge.common.runtime.resolve_dtype`, bfloat16 only on a CPU with
        native bf16 matmuls); other keyword arguments go to the constructor.
        """
        from lmforge.common.runtime import resolve_dtype
        from lmforge.models.load import load

        dtype = kwargs.pop("dtype", "float32")
        model, tokenizer = load(spec, dtype=resolve_dtype(dtype))
        kwargs.setdefault("name", os.fspath(spec))
        return cls(model, tokenizer, **kwargs)

    def __repr__(self) -> str:
        return f"HFChatClient(name={self.name!r}, max_tokens={self.max_tokens}, temperature={self.temperature})"

    @property
    def has_chat_template(self) -> bool:
        return bool(getattr(self.tokenizer, "chat_template", None))

    def context_limit(self) -> int | None:
        """The model's positions (None when its config does not say)."""
        from lmforge.common.generation import max_positions

        return max_positions(self.model)

    def count_tokens(self, text: str) -> int:
        """Tokens of ``text`` under this model's tokenizer (no special tokens)."""
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def render(self, messages: list[dict[str, str]]) -> str:
        """The prompt text for ``messages``."""
        messages = _check_messages(messages)
        if self.has_chat_template:
            return self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return render_plain(messages)

    def json_constraint(self) -> Callable[[list[int]], Sequence[int]]:
        """A fresh ``allowed_tokens`` function for :func:`~lmforge.common.generation.generate` that
        decodes under ``json_schema`` as ``json_mode`` calls do (with ``json_parser_options``)."""
        from lmforge.common.generation import enforcer_tokenizer_data, json_schema_constraint

        if self._enforcer_data is None:
            self._enforcer_data = enforcer_tokenizer_data(self.tokenizer)
        if not self.json_parser_options:
            return json_schema_constraint(self.tokenizer, self.json_schema, self._enforcer_data)
        import dataclasses

        from lmformatenforcer import CharacterLevelParserConfig, JsonSchemaParser, TokenEnforcer

        fields = {f.name for f in dataclasses.fields(CharacterLevelParserConfig)} - {"alphabet"}
        unknown = sorted(set(self.json_parser_options) - fields)  # type: ignore[arg-type]
        if unknown:
            raise UserError(f"unknown json_parser_options {', '.join(unknown)}; use {', '.join(sorted(fields))}")
        parser = JsonSchemaParser(self.json_schema)
        enforcer = TokenEnforcer(self._enforcer_data, parser)
        # NOTE: TokenEnforcer replaces the parser's config with one holding the tokenizer's alphabet
        # (lm-format-enforcer 0.11), so the options are applied after it, on that config.
        parser.config = dataclasses.replace(parser.config, **self.json_parser_options)  # type: ignore[arg-type]
        return lambda seq: enforcer.get_allowed_tokens(seq).allowed_tokens

    def chat(
        self, messages: list[dict[str, str]], *, json_mode: bool = False, max_tokens: int | None = None
    ) -> ChatResponse:
        return self.chat_batch([messages], json_mode=json_mode, max_tokens=max_tokens)[0]

    def chat_batch(
        self,
        conversations: list[list[dict[str, str]]],
        *,
        json_mode: bool = False,
        max_tokens: int | None = None,
    ) -> list[ChatResponse]:
        from lmforge.common.generation import generate

        _check_max_tokens(max_tokens)
        prompts = [self.render(c) for c in conversations]
        if not prompts:
            return []
        sampling = self.temperature > 0
        with self._lock:
            allowed = None
            if json_mode and self.constrain_json:
                allowed = self.json_constraint()
            outputs = generate(
                self.model,
                self.tokenizer,
                prompts,
                max_new_tokens=self.max_tokens if max_tokens is None else max_tokens,
                do_sample=sampling,
                temperature=self.temperature if sampling else 1.0,
                stop=None if self.has_chat_template else _PLAIN_STOPS,
                batch_size=self.batch_size,
                seed=self.seed,
                allowed_tokens=allowed,
            )
        return [
            ChatResponse(
                text=out.text,
                usage=Usage(out.prompt_tokens, out.completion_tokens),
                done_reason="length" if out.finished_by == "length" else "stop",
            )
            for out in outputs
        ]


# ------------------------------------------------------------------------------ OpenAI-compatible


class _Secret:
    """Holds the API key; its repr and str never show it."""

    __slots__ = ("value",)

    def __init__(self, value: str | None) -> None:
        self.value = value

    def __repr__(self) -> str:
        return "<hidden>" if self.value else "<none>"

    __str__ = __repr__


# Give up on a Retry-After longer than this and wait this long instead.
_MAX_DELAY = 60.0


class OpenAIChatClient:
    """Any OpenAI-compatible ``POST {base_url}/chat/completions`` endpoint.

    Remote APIs (OpenAI, Together, OpenRouter...) and local servers (vLLM, llama.cpp's server,
    ollama's ``/v1``) speak the same protocol. The key is read once, at construction, from the
    environment variable ``api_key_env`` and sent as a bearer token; it is kept out of ``repr``, log
    lines and error messages (a server that echoes it back gets it replaced by ``***``).

    Requests that fail with HTTP 429 or 5xx, time out or lose the connection are retried up to
    ``max_retries`` times, waiting ``backoff * 2**i`` seconds before retry ``i`` (or the server's
    ``Retry-After``, if longer, up to 60 s). Every failure that remains is a one-line
    :class:`UserError`: a refused connection, a timeout, a rejected request (4xx, with the server's
    message), a response that is not chat-completion JSON.

    Args:
        base_url: the API root, e.g. ``https://api.openai.com/v1`` or ``http://127.0.0.1:8000/v1``.
        model: the model name sent to the server (and recorded in ledgers unless ``name`` is given).
        api_key_env: the environment variable holding the key.
        timeout: seconds to wait for a connection and for the response.
        max_retries: retries after the first attempt.
        backoff: seconds before the first retry (doubled for each next one).
        max_tokens: the default limit on generated tokens; None leaves it to the server.
        temperature: sampling temperature sent with every request.
        name: the name recorded in ledgers; ``model`` when None.
        require_key: when False a missing key is allowed (local servers accept any) and no
            ``Authorization`` header is sent.
        workers: threads ``chat_batch`` uses.
        sleep: the function that waits between retries (injectable for tests).
    """

    def __init__(
        self,
        base_url: str,
        model: str,
        *,
        api_key_env: str = "OPENAI_API_KEY",
        timeout: float = 60,
        max_retries: int = 3,
        backoff: float = 1.0,
        max_tokens: int | None = None,
        temperature: float = 0.0,
        name: str | None = None,
        require_key: bool = True,
        workers: int = 8,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        import httpx

        base = str(base_url).strip().rstrip("/")
        if not re.match(r"^https?://[^/\s]+", base):
            raise UserError(f"base URL must start with http:// or https://, got '{base_url}'")
        if not model or not str(model).strip():
            raise UserError("the remote model name is empty")
        if not timeout > 0:
            raise UserError(f"timeout must be > 0 seconds, got {timeout}")
        if isinstance(max_retries, bool) or not isinstance(max_retries, int) or max_retries < 0:
            raise UserError(f"max_retries must be an integer >= 0, got {max_retries!r}")
        if not backoff >= 0:
            raise UserError(f"backoff must be >= 0 seconds, got {backoff}")
        if workers < 1:
            raise UserError(f"workers must be >= 1, got {workers}")
        _check_max_tokens(max_tokens)
        key = os.environ.get(api_key_env, "").strip() or None
        if key is None and require_key:
            raise UserError(
                f"no API key: set the environment variable {api_key_env} (for a local server that needs "
                "none, use require_key=False)"
            )
        self.base_url = base
        self.url = f"{base}/chat/completions"
        self.model = str(model)
        self.name = name if name is not None else self.model
        self.api_key_env = api_key_env
        self.timeout = float(timeout)
        self.max_retries = max_retries
        self.backoff = float(backoff)
        self.max_tokens = max_tokens
        self.temperature = float(temperature)
        self.workers = workers
        self._sleep = sleep
        self._key = _Secret(key)
        self._http = httpx.Client(timeout=httpx.Timeout(self.timeout))

    def __repr__(self) -> str:
        return (
            f"OpenAIChatClient(base_url={self.base_url!r}, model={self.model!r}, "
            f"api_key_env={self.api_key_env!r}, key_set={self._key.value is not None})"
        )

    def close(self) -> None:
        """Close the HTTP connection pool."""
        self._http.close()

    def __enter__(self) -> OpenAIChatClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------------------------- helpers

    def _scrub(self, text: str) -> str:
        """``text`` with the key (should a server echo it) replaced by ``***``, on one line."""
        key = self._key.value
        if key:
            text = text.replace(key, "***")
        return _one_line(text)

    def _payload(self, messages: Messages, json_mode: bool, max_tokens: int | None) -> dict[str, Any]:
        payload: dict[str, Any] = {"model": self.model, "messages": messages, "temperature": self.temperature}
        limit = self.max_tokens if max_tokens is None else max_tokens
        if limit is not None:
            # NOTE: "max_tokens", not OpenAI's newer "max_completion_tokens": every OpenAI-compatible
            # server (vLLM, llama.cpp, ollama) and GPT-4o accept it.
            payload["max_tokens"] = limit
        if json_mode:
            payload["response_format"] = {"type": "json_object"}
        return payload

    def _server_message(self, response: Any) -> str:
        """The error message in a response body (OpenAI's ``{"error": {"message": ...}}`` and the
        common variants), else the body's text."""
        try:
            body = response.json()
        except ValueError:
            body = None
        message: Any = None
        if isinstance(body, dict):
            err = body.get("error")
            if isinstance(err, dict):
                message = err.get("message")
            elif isinstance(err, str):
                message = err
            message = message or body.get("message") or body.get("detail")
        if not message:
            message = response.text or response.reason_phrase or "no message"
        return self._scrub(str(message))

    def _delay(self, attempt: int, response: Any = None) -> float:
        delay = self.backoff * (2**attempt)
        if response is not None:
            try:
                delay = max(delay, float(response.headers.get("retry-after", "")))
            except ValueError:
                pass
        return min(delay, _MAX_DELAY)

    def _post(self, payload: dict[str, Any]) -> dict[str, Any]:
        """POST with retries; the decoded JSON body of a 2xx response."""
        import httpx

        headers = {"Content-Type": "application/json"}
        if self._key.value:
            headers["Authorization"] = f"Bearer {self._key.value}"
        attempts = self.max_retries + 1
        for attempt in range(attempts):
            last = attempt == attempts - 1
            try:
                response = self._http.post(self.url, json=payload, headers=headers)
            except httpx.TimeoutException:
                if last:
                    raise UserError(
                        f"no answer from {self.url} within {self.timeout:g} s after {attempts} attempt(s)"
                    ) from None
                problem, delay = "timed out", self._delay(attempt)
            except (httpx.NetworkError, httpx.RemoteProtocolError) as exc:
                reason = str(exc)
                if last:
                    if "refused" in reason.lower():
                        reason = "connection refused"
                    raise UserError(
                        f"cannot reach {self.base_url} ({self._scrub(reason) or type(exc).__name__}) "
                        f"after {attempts} attempt(s)"
                    ) from None
                problem, delay = f"connection error ({self._scrub(reason)[:80]})", self._delay(attempt)
            else:
                status = response.status_code
                if 200 <= status < 300:
                    try:
                        body = response.json()
                    except ValueError:
                        body = None
                    if not isinstance(body, dict):
                        raise UserError(f"{self.url} answered HTTP {status} with a body that is not JSON")
                    return body
                retryable = status == 429 or status >= 500
                if not retryable:
                    hint = f" (check {self.api_key_env})" if status in (401, 403) else ""
                    raise UserError(
                        f"{self.url} rejected the request (HTTP {status}){hint}: {self._server_message(response)}"
                    )
                if last:
                    what = "is rate-limiting requests" if status == 429 else "failed"
                    raise UserError(
                        f"{self.url} {what} (HTTP {status}) after {attempts} attempt(s): "
                        f"{self._server_message(response)}"
                    )
                problem, delay = f"HTTP {status}", self._delay(attempt, response)
            logger.warning(
                "%s: %s; retrying in %.1f s (attempt %d of %d)", self.url, problem, delay, attempt + 1, attempts
            )
            self._sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    def _parse(self, body: dict[str, Any], messages: Messages) -> ChatResponse:
        try:
            choice = body["choices"][0]
            text = choice["message"].get("content") or ""
            finish = choice.get("finish_reason")
        except (KeyError, IndexError, TypeError, AttributeError):
            raise UserError(
                f"{self.url} answered without choices[0].message; is it an OpenAI-compatible chat endpoint?"
            ) from None
        raw = body.get("usage")
        if isinstance(raw, dict) and isinstance(raw.get("prompt_tokens"), int):
            usage = Usage(int(raw["prompt_tokens"]), int(raw.get("completion_tokens") or 0))
        else:
            # NOTE: a server that reports no usage gets an estimate, so that the ledger never shows
            # a silent 0 for tokens that were spent.
            logger.warning("%s reported no token usage; estimating it with count_tokens", self.url)
            usage = Usage(sum(count_tokens(m["content"]) for m in messages), count_tokens(text))
        return ChatResponse(text=str(text), usage=usage, done_reason="length" if finish == "length" else "stop")

    # ------------------------------------------------------------------------------------- the API

    def chat(
        self, messages: list[dict[str, str]], *, json_mode: bool = False, max_tokens: int | None = None
    ) -> ChatResponse:
        messages = _check_messages(messages)
        _check_max_tokens(max_tokens)
        body = self._post(self._payload(messages, json_mode, max_tokens))
        return self._parse(body, messages)

    def chat_batch(
        self,
        conversations: list[list[dict[str, str]]],
        *,
        json_mode: bool = False,
        max_tokens: int | None = None,
    ) -> list[ChatResponse]:
        """One request per conversation on a thread pool; replies come back in input order."""
        if not conversations:
            return []
        if len(conversations) == 1:
            return [self.chat(conversations[0], json_mode=json_mode, max_tokens=max_tokens)]
        with ThreadPoolExecutor(max_workers=min(self.workers, len(conversations))) as pool:
            return list(pool.map(lambda c: self.chat(c, json_mode=json_mode, max_tokens=max_tokens), conversations))


# ------------------------------------------------------------------------------------ reply cache


class ReplyCache:
    """A greedy local client that answers a conversation it has answered before from memory.

    MINIONS sends the same job again when a round ends without the figures: the remote's code for
    the next round asks the missing figures of the same chunks with the same task and advice. Under
    greedy decoding the local model's reply to an identical prompt is the same (up to the batch's
    padding, which changes bf16 rounding at most), so recomputing it only costs time. The cached
    :class:`ChatResponse` is returned as it was, with its usage (a fresh copy each time): a ledger
    still counts the tokens as spent, as the protocol would spend them. ``hits`` / ``misses`` count
    calls.

    A reply is reused only for the same call: the same messages (system prompt included), ``json_mode``
    and ``max_tokens``, and the same generation settings of the wrapped client at the time of the call
    (its default ``max_tokens``, ``temperature``, ``json_schema``, ``json_parser_options``,
    ``constrain_json``).

    Every other attribute (``context_limit``, ``count_tokens``, ``max_tokens``, ``render``, ``model``)
    is the wrapped client's.

    Raises:
        UserError: the client samples (``temperature > 0``), when wrapped or at any later call: its
            replies are not a function of the prompt.
    """

    # The wrapped client's settings that change a reply (read at every call).
    SETTINGS = ("max_tokens", "temperature", "json_schema", "json_parser_options", "constrain_json")

    def __init__(self, client: ChatClient) -> None:
        self.client = client
        self._check_greedy()
        self.name = client.name
        self._cache: dict[str, ChatResponse] = {}
        self.hits = 0
        self.misses = 0
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Any:
        # Only reached for attributes the cache itself lacks; a half-built instance (copy, pickle) has
        # no client yet and so no forwarded attributes.
        try:
            client = self.__dict__["client"]
        except KeyError:
            raise AttributeError(name) from None
        return getattr(client, name)

    def __repr__(self) -> str:
        return f"ReplyCache({self.client!r}, hits={self.hits}, misses={self.misses})"

    def _check_greedy(self) -> None:
        if float(getattr(self.client, "temperature", 0.0) or 0.0) > 0:
            raise UserError("a reply cache needs greedy decoding (temperature 0)")

    def _key(self, messages: Messages, json_mode: bool, max_tokens: int | None) -> str:
        import json

        settings = {k: getattr(self.client, k, None) for k in self.SETTINGS}
        return json.dumps([messages, bool(json_mode), max_tokens, settings], sort_keys=True, default=repr)

    def chat(
        self, messages: list[dict[str, str]], *, json_mode: bool = False, max_tokens: int | None = None
    ) -> ChatResponse:
        return self.chat_batch([messages], json_mode=json_mode, max_tokens=max_tokens)[0]

    def chat_batch(
        self,
        conversations: list[list[dict[str, str]]],
        *,
        json_mode: bool = False,
        max_tokens: int | None = None,
    ) -> list[ChatResponse]:
        self._check_greedy()
        keys = [self._key(_check_messages(c), json_mode, max_tokens) for c in conversations]
        with self._lock:
            todo: dict[str, list[dict[str, str]]] = {}
            for k, c in zip(keys, conversations):
                if k not in self._cache and k not in todo:
                    todo[k] = c
            if todo:
                fresh = self.client.chat_batch(list(todo.values()), json_mode=json_mode, max_tokens=max_tokens)
                self._cache.update(zip(todo, fresh))
            self.misses += len(todo)
            self.hits += len(keys) - len(todo)
            out = [self._cache[k] for k in keys]
        return [ChatResponse(r.text, Usage(r.usage.prompt_tokens, r.usage.completion_tokens), r.done_reason)
                for r in out]


# ----------------------------------------------------------------------------------------- scripted


Responder = Callable[[Messages], "str | ChatResponse"]


class ScriptedClient:
    """Canned replies for tests, with honest token accounting.

    Args:
        responder: a callable ``(messages) -> str`` (it may also return a full :class:`ChatResponse`,
            used as is), or a list of strings given out in order, one per call.
        name: the name recorded in ledgers.
        done_reasons: the ``done_reason`` of each call in order (a list), or a callable
            ``(messages) -> str``; calls past the end of the list, and all calls when None, get
            ``"length"`` if the reply was cut at ``max_tokens`` and ``"stop"`` otherwise.

    Every call's messages are recorded, copied, in ``calls`` (``chat_batch`` records one per
    conversation, in order) and its ``json_mode`` / ``max_tokens`` in ``options``. Usage is
    :func:`count_tokens` of the messages' contents (prompt) and of the reply (completion). A reply
    longer than ``max_tokens`` such tokens is cut after the last one that fits, as a real model's
    would be.
    """

    def __init__(
        self,
        responder: Responder | Sequence[str],
        *,
        name: str = "scripted",
        done_reasons: Sequence[str] | Callable[[Messages], str] | None = None,
    ) -> None:
        if isinstance(responder, str):
            raise TypeError("responder must be a callable or a list of strings, not one string")
        if not callable(responder):
            replies = list(responder)
            for r in replies:
                if not isinstance(r, str):
                    raise TypeError(f"scripted replies must be strings, got {type(r).__name__}")
            self._replies: list[str] | None = replies
            self._responder: Responder | None = None
        else:
            self._replies = None
            self._responder = responder
        self.name = name
        self.done_reasons = done_reasons
        self.calls: list[Messages] = []
        self.options: list[dict[str, Any]] = []
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"ScriptedClient(name={self.name!r}, calls={len(self.calls)})"

    def chat(
        self, messages: list[dict[str, str]], *, json_mode: bool = False, max_tokens: int | None = None
    ) -> ChatResponse:
        messages = _check_messages(messages)
        _check_max_tokens(max_tokens)
        with self._lock:
            index = len(self.calls)
            self.calls.append(copy.deepcopy(messages))
            self.options.append({"json_mode": json_mode, "max_tokens": max_tokens})
            if self._replies is not None:
                if index >= len(self._replies):
                    raise RuntimeError(
                        f"ScriptedClient '{self.name}' has {len(self._replies)} scripted replies but got call {index + 1}"
                    )
                reply: str | ChatResponse = self._replies[index]
        if self._responder is not None:
            reply = self._responder(copy.deepcopy(messages))
        if isinstance(reply, ChatResponse):
            return reply
        if not isinstance(reply, str):
            raise TypeError(f"the responder must return a str or ChatResponse, got {type(reply).__name__}")
        text, truncated = reply, False
        if max_tokens is not None:
            matches = list(_TOKEN.finditer(reply))
            if len(matches) > max_tokens:
                text = reply[: matches[max_tokens - 1].end()] if max_tokens > 0 else ""
                truncated = True
        reason = "length" if truncated else "stop"
        if callable(self.done_reasons):
            reason = self.done_reasons(copy.deepcopy(messages))
        elif self.done_reasons is not None and index < len(self.done_reasons):
            reason = self.done_reasons[index]
        usage = Usage(sum(count_tokens(m["content"]) for m in messages), count_tokens(text))
        return ChatResponse(text=text, usage=usage, done_reason=reason)

    def chat_batch(
        self,
        conversations: list[list[dict[str, str]]],
        *,
        json_mode: bool = False,
        max_tokens: int | None = None,
    ) -> list[ChatResponse]:
        return [self.chat(c, json_mode=json_mode, max_tokens=max_tokens) for c in conversations]


# ----------------------------------------------------------------------------- structured output

class StructuredOutputError(UserError):
    """A model's replies never gave a valid JSON object within the retry bound (one-line message).

    Attributes:
        attempts: the number of attempts made.
        last_reply: the last reply's text.
    """

    def __init__(self, message: str, *, attempts: int = 0, last_reply: str = "") -> None:
        super().__init__(message)
        self.attempts = attempts
        self.last_reply = last_reply


def chat_json(
    client: ChatClient,
    messages: list[dict[str, str]],
    validate: Callable[[dict[str, Any]], T],
    *,
    retries: int = 5,
    ledger: CostLedger | None = None,
    side: str = "remote",
) -> T:
    """Ask ``client`` for a JSON object until ``validate`` accepts one.

    Each attempt is a ``chat(..., json_mode=True)`` call; the object is :func:`extract_json` of the
    reply. When there is none, or ``validate`` raises ValueError, the reply and a short correction
    naming the problem are appended to the conversation (a copy: ``messages`` is not changed) and
    the model is asked again.

    Args:
        client: the model to ask.
        messages: the conversation so far, ending with the request for JSON (it must mention JSON:
            OpenAI rejects ``json_object`` mode otherwise).
        validate: turns the object into the caller's value; raises ValueError when it is invalid.
        retries: the number of attempts before giving up.
        ledger: records every attempt's usage on ``side`` (the failed ones too). Leave it None when
            ``client`` is a :class:`~lmforge.methods.minions.ledger.LedgeredClient` on the same
            ledger (such a client is recognised and not counted twice).
        side: ``"local"`` or ``"remote"``.

    Returns:
        ``validate``'s value for the first valid object.

    Raises:
        StructuredOutputError: ``retries`` attempts all failed (one line; the ledger keeps them all).
    """
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 1:
        raise UserError(f"retries must be an integer >= 1, got {retries!r}")
    conversation = _check_messages(messages)
    # A LedgeredClient on this ledger records its own calls.
    record = ledger is not None and getattr(client, "ledger", None) is not ledger
    problem, reply = "", ""
    for _ in range(retries):
        response = client.chat(conversation, json_mode=True)
        if record:
            ledger.record(side, client.name, response.usage)  # type: ignore[union-attr]
        reply = response.text
        obj = extract_json(reply)
        if obj is None:
            problem = "no JSON object found in the reply"
            if response.done_reason == "length":
                problem += " (it was cut off at the token limit; keep it shorter)"
        else:
            try:
                return validate(obj)
            except ValueError as exc:
                problem = _one_line(str(exc), 200) or "the JSON object is not valid"
        conversation = [
            *conversation,
            {"role": "assistant", "content": reply},
            {
                "role": "user",
                "content": f"That reply could not be used: {problem}. "
                "Answer again with one JSON object only, in a ```json block.",
            },
        ]
    raise StructuredOutputError(
        f"{client.name} gave no valid JSON after {retries} attempt(s); last problem: {problem}",
        attempts=retries,
        last_reply=reply,
    )
