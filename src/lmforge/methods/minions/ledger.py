"""Cost ledger for local-remote collaboration: tokens per side and dollars by a price table.

Minions (Narayan et al., ICML 2025, arXiv 2502.15964) reports cost as remote dollars: prompt tokens
times the input price plus completion tokens times the output price, per million tokens, with
GPT-4o at $2.50 / $10.00 (the official code's table; the price of gpt-4o-2024-08-06, which the
``gpt-4o`` alias pointed to during the paper's experiments). Local tokens are counted but free. :class:`CostLedger`
keeps, per side (``"local"`` / ``"remote"``) and per model, the number of calls and the prompt and
completion tokens; :class:`LedgeredClient` wraps any :class:`~lmforge.methods.minions.clients.ChatClient`
so that every call it makes is recorded.

Prices:

* remote models are looked up in the price table (:data:`PRICES` unless another is given): the exact
  name, then the name without a provider prefix (``openai/gpt-4o``), then a dated snapshot of a
  listed model (``gpt-4o-2024-08-06``, ``claude-3-5-sonnet-20241022``). A remote model with no price
  costs the ``default_price`` when one is given, else $0, and is listed in :attr:`CostLedger.unpriced`
  (and in ``to_dict()`` and ``render()``) so that a $0 never passes silently;
* local models cost ``local_price`` when one is given, else $0 (their tokens are always counted).

Each (side, model) resolves its price once, at its first call, and keeps it, so ``to_dict`` /
``from_dict`` round-trip exactly. :meth:`CostLedger.from_file` reads a price table from YAML/JSON.
"""

from __future__ import annotations

import json
import logging
import math
import re
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmforge.common.errors import UserError
from lmforge.common.io import read_user_text
from lmforge.methods.minions.clients import ChatResponse, Usage

if TYPE_CHECKING:
    from lmforge.methods.minions.clients import ChatClient

__all__ = ["PRICES", "SIDES", "CostLedger", "LedgeredClient", "Price"]

logger = logging.getLogger(__name__)

SIDES = ("local", "remote")


@dataclass(frozen=True)
class Price:
    """A model's price in dollars per million tokens.

    Attributes:
        input: dollars per million prompt tokens.
        output: dollars per million completion tokens.
    """

    input: float
    output: float

    def __post_init__(self) -> None:
        for field_name in ("input", "output"):
            value = getattr(self, field_name)
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ValueError(f"price {field_name} must be a number, got {value!r}")
            if not math.isfinite(value) or value < 0:
                raise ValueError(f"price {field_name} must be a finite number >= 0, got {value!r}")

    def cost(self, usage: Usage) -> float:
        """Dollars for ``usage``: prompt/1e6 * input + completion/1e6 * output."""
        return (usage.prompt_tokens * self.input + usage.completion_tokens * self.output) / 1e6

    def to_dict(self) -> dict[str, float]:
        return {"input": self.input, "output": self.output}


# List prices in US dollars per million tokens (standard tier, no batch or cache discounts), as
# published on the providers' pricing pages (openai.com/api/pricing, anthropic.com/pricing); the
# Minions code prices GPT-4o at $2.50 / $10.00, the gpt-4o-2024-08-06 price (the first snapshot,
# gpt-4o-2024-05-13, launched at $5 / $15 and is listed on its own). Prices change: pass
# `prices=` / `default_price=` to CostLedger, or a YAML/JSON price file to CostLedger.from_file,
# to use others.
PRICES: dict[str, Price] = {
    "gpt-4o": Price(2.50, 10.00),
    "gpt-4o-2024-05-13": Price(5.00, 15.00),
    "gpt-4o-mini": Price(0.15, 0.60),
    "gpt-4.1": Price(2.00, 8.00),
    "gpt-4.1-mini": Price(0.40, 1.60),
    "gpt-4.1-nano": Price(0.10, 0.40),
    "o3-mini": Price(1.10, 4.40),
    "gpt-4-turbo": Price(10.00, 30.00),
    "claude-3-5-sonnet": Price(3.00, 15.00),
    "claude-3-5-haiku": Price(0.80, 4.00),
}

# Suffixes of a dated or floating snapshot of a listed model: gpt-4o-2024-08-06, gpt-4-0613,
# claude-3-5-sonnet-20241022, claude-3-5-haiku-latest. Only these, so that an unlisted variant
# (gpt-4o-audio) is never silently priced as its base model.
_SNAPSHOT = re.compile(r"(\d{4}(-\d{2}-\d{2})?|\d{8}|latest)")


def lookup_price(prices: Mapping[str, Price], model: str) -> Price | None:
    """The price of ``model`` in ``prices``: the exact name, else without a provider prefix
    (``openai/gpt-4o``), else the longest listed name of which it is a dated snapshot; None if none."""
    candidates = [model]
    if "/" in model:
        candidates.append(model.rsplit("/", 1)[1])
    for name in candidates:
        if name in prices:
            return prices[name]
    for name in candidates:
        best = None
        for key in prices:
            if name.startswith(key + "-") and _SNAPSHOT.fullmatch(name[len(key) + 1 :]):
                if best is None or len(key) > len(best):
                    best = key
        if best is not None:
            return prices[best]
    return None


@dataclass
class _Entry:
    """Calls and tokens of one (side, model), with the price resolved at its first call."""

    calls: int
    usage: Usage
    price: Price | None

    @property
    def dollars(self) -> float:
        return self.price.cost(self.usage) if self.price is not None else 0.0


def _check_side(side: str) -> None:
    if side not in SIDES:
        raise ValueError(f"side must be 'local' or 'remote', got {side!r}")


class CostLedger:
    """Tokens per side and per model, and dollars by a price table.

    Thread-safe: clients that run calls in a thread pool may record concurrently.

    Args:
        prices: the price table for remote models (dollars per million tokens); :data:`PRICES` when
            None.
        default_price: the price of a remote model missing from the table; when None such a model
            costs $0 and is listed in :attr:`unpriced`.
        local_price: the price of every local model; when None local calls cost $0.
    """

    def __init__(
        self,
        prices: dict[str, Price] | None = None,
        *,
        default_price: Price | None = None,
        local_price: Price | None = None,
    ) -> None:
        self.prices: dict[str, Price] = dict(PRICES if prices is None else prices)
        self.default_price = default_price
        self.local_price = local_price
        self._entries: dict[tuple[str, str], _Entry] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return (
            f"CostLedger(calls local={self.calls('local')} remote={self.calls('remote')}, "
            f"dollars={self.dollars():.6f})"
        )

    # ------------------------------------------------------------------------------------- recording

    def price_for(self, side: str, model: str) -> Price | None:
        """The price a new (side, model) entry gets; None means $0 (and, for remote, unpriced)."""
        _check_side(side)
        if side == "local":
            return self.local_price
        price = lookup_price(self.prices, model)
        return price if price is not None else self.default_price

    def record(self, side: str, model: str, usage: Usage) -> None:
        """Add one call's ``usage`` for ``model`` on ``side`` (``"local"`` or ``"remote"``)."""
        _check_side(side)
        if not isinstance(usage, Usage):
            raise TypeError(f"usage must be a Usage, got {type(usage).__name__}")
        with self._lock:
            entry = self._entries.get((side, model))
            if entry is None:
                price = self.price_for(side, model)
                if price is None and side == "remote":
                    logger.warning("no price for remote model '%s'; its calls are counted as $0", model)
                entry = self._entries[(side, model)] = _Entry(0, Usage(), price)
            entry.calls += 1
            entry.usage = entry.usage + usage

    # ------------------------------------------------------------------------------------- queries

    def usage(self, side: str) -> Usage:
        """Total tokens of ``side``."""
        _check_side(side)
        with self._lock:
            return sum((e.usage for (s, _), e in self._entries.items() if s == side), Usage())

    def calls(self, side: str) -> int:
        """Number of calls recorded on ``side``."""
        _check_side(side)
        with self._lock:
            return sum(e.calls for (s, _), e in self._entries.items() if s == side)

    def dollars(self, side: str | None = None) -> float:
        """Dollars of ``side``, or of both sides when None."""
        if side is not None:
            _check_side(side)
        with self._lock:
            return sum(e.dollars for (s, _), e in self._entries.items() if side is None or s == side)

    @property
    def unpriced(self) -> list[str]:
        """Remote models that had no price (counted as $0), sorted."""
        with self._lock:
            return sorted(m for (s, m), e in self._entries.items() if s == "remote" and e.price is None)

    @property
    def models(self) -> list[tuple[str, str]]:
        """The (side, model) pairs recorded so far, in first-call order."""
        with self._lock:
            return list(self._entries)

    # ------------------------------------------------------------------------------- serialisation

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able summary: per side, per model (with the price used), and the total."""
        with self._lock:
            entries = list(self._entries.items())
        sides: dict[str, dict[str, Any]] = {}
        for side in SIDES:
            mine = [e for (s, _), e in entries if s == side]
            usage = sum((e.usage for e in mine), Usage())
            sides[side] = {
                "calls": sum(e.calls for e in mine),
                **usage.to_dict(),
                "dollars": sum(e.dollars for e in mine),
            }
        return {
            "sides": sides,
            "total_dollars": sum(e.dollars for _, e in entries),
            "models": [
                {
                    "side": side,
                    "model": model,
                    "calls": e.calls,
                    "prompt_tokens": e.usage.prompt_tokens,
                    "completion_tokens": e.usage.completion_tokens,
                    "price": e.price.to_dict() if e.price is not None else None,
                    "dollars": e.dollars,
                }
                for (side, model), e in entries
            ],
            "unpriced": sorted(m for (s, m), e in entries if s == "remote" and e.price is None),
            "default_price": self.default_price.to_dict() if self.default_price is not None else None,
            "local_price": self.local_price.to_dict() if self.local_price is not None else None,
        }

    @classmethod
    def from_dict(cls, data: Mapping[str, Any], prices: dict[str, Price] | None = None) -> CostLedger:
        """Rebuild a ledger from :meth:`to_dict` (each model keeps the price it was recorded with).

        Args:
            data: a dict written by :meth:`to_dict`.
            prices: the price table for models recorded later (:data:`PRICES` when None).

        Raises:
            UserError: ``data`` is not a ledger dict.
        """
        try:
            ledger = cls(
                prices,
                default_price=_price_or_none(data.get("default_price")),
                local_price=_price_or_none(data.get("local_price")),
            )
            for row in data["models"]:
                side, model = str(row["side"]), str(row["model"])
                _check_side(side)
                usage = Usage(int(row["prompt_tokens"]), int(row["completion_tokens"]))
                ledger._entries[(side, model)] = _Entry(int(row["calls"]), usage, _price_or_none(row["price"]))
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise UserError(f"not a cost-ledger dict ({type(exc).__name__}: {exc})") from None
        return ledger

    @classmethod
    def from_file(cls, path: str | Path) -> CostLedger:
        """An empty ledger whose prices come from a YAML or JSON price file.

        The file is either a mapping of model names to prices::

            gpt-4o: {input: 2.50, output: 10.00}     # dollars per million tokens

        or a mapping with the keys ``prices`` (that mapping), and optionally ``default`` (the price of
        remote models not listed), ``local`` (the price of local models) and ``merge`` (true, the
        default: the listed prices override :data:`PRICES`; false: only the listed prices are known).
        A flat mapping is merged over :data:`PRICES` too.

        Raises:
            UserError: the file is missing, unreadable, not YAML/JSON, or a price is malformed (one line).
        """
        path = Path(path)
        raw = read_user_text(path, "price")
        where = f"price file '{path}'"
        if path.suffix.lower() == ".json":
            try:
                data = json.loads(raw)
            except json.JSONDecodeError as exc:
                raise UserError(f"{where} is not valid JSON (line {exc.lineno}: {exc.msg})") from None
        else:
            import yaml

            try:
                data = yaml.safe_load(raw)
            except yaml.YAMLError as exc:
                mark = getattr(exc, "problem_mark", None)
                at = f" (line {mark.line + 1})" if mark is not None else ""
                raise UserError(f"{where} is not valid YAML{at}") from None
        if not isinstance(data, dict) or not data:
            raise UserError(f"{where} must be a mapping of model names to {{input, output}} prices")
        default = local = None
        merge = True
        if "prices" in data:
            unknown = sorted(str(k) for k in data if k not in ("prices", "default", "local", "merge"))
            if unknown:
                raise UserError(f"{where}: unknown key '{unknown[0]}' (expected prices, default, local, merge)")
            table = data["prices"] if data["prices"] is not None else {}
            if not isinstance(table, dict):
                raise UserError(f"{where}: 'prices' must be a mapping of model names to {{input, output}}")
            if data.get("default") is not None:
                default = _parse_price(where, "default", data["default"])
            if data.get("local") is not None:
                local = _parse_price(where, "local", data["local"])
            merge = data.get("merge", True)
            if not isinstance(merge, bool):
                raise UserError(f"{where}: 'merge' must be true or false, got {merge!r}")
        else:
            table = data
        parsed = {str(model): _parse_price(where, f"'{model}'", value) for model, value in table.items()}
        prices = {**PRICES, **parsed} if merge else parsed
        return cls(prices, default_price=default, local_price=local)

    # ------------------------------------------------------------------------------------- display

    def render(self) -> str:
        """A small aligned table: one row per side and the total (calls, tokens, dollars)."""
        header = ("side", "calls", "prompt tok", "completion tok", "$")
        rows: list[tuple[str, ...]] = []
        total_calls, total = 0, Usage()
        for side in SIDES:
            usage, calls = self.usage(side), self.calls(side)
            total_calls, total = total_calls + calls, total + usage
            rows.append((side, f"{calls:,}", f"{usage.prompt_tokens:,}", f"{usage.completion_tokens:,}",
                         f"{self.dollars(side):.6f}"))
        rows.append(("total", f"{total_calls:,}", f"{total.prompt_tokens:,}", f"{total.completion_tokens:,}",
                     f"{self.dollars():.6f}"))
        widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]

        def line(cells: Sequence[str]) -> str:
            first = cells[0].ljust(widths[0])
            rest = [c.rjust(w) for c, w in zip(cells[1:], widths[1:])]
            return "  ".join([first, *rest]).rstrip()

        out = [line(header), *(line(r) for r in rows)]
        unpriced = self.unpriced
        if unpriced:
            out.append(f"note: no price for {', '.join(unpriced)} (counted as $0)")
        return "\n".join(out)


def _price_or_none(value: Any) -> Price | None:
    if value is None:
        return None
    return Price(float(value["input"]), float(value["output"]))


def _parse_price(where: str, what: str, value: Any) -> Price:
    """A :class:`Price` from a file's ``{input: x, output: y}``; a one-line UserError otherwise."""
    expected = f"{where}: price for {what} must be a mapping with numbers 'input' and 'output' (dollars per million tokens)"
    if not isinstance(value, dict) or set(value) != {"input", "output"}:
        raise UserError(expected)
    for v in value.values():
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise UserError(expected)
    try:
        return Price(float(value["input"]), float(value["output"]))
    except ValueError as exc:
        raise UserError(f"{where}: price for {what}: {exc}") from None


class LedgeredClient:
    """A :class:`~lmforge.methods.minions.clients.ChatClient` that records every call's usage.

    Calls that raise are not recorded (no usage came back). The model name recorded, and the one
    used for pricing, is the wrapped client's ``name``.

    Args:
        client: the client to wrap.
        ledger: where to record.
        side: ``"local"`` or ``"remote"``.
    """

    def __init__(self, client: ChatClient, ledger: CostLedger, side: str) -> None:
        _check_side(side)
        self.client = client
        self.ledger = ledger
        self.side = side
        self.name = client.name

    def __repr__(self) -> str:
        return f"LedgeredClient({self.client!r}, side={self.side!r})"

    def chat(
        self, messages: list[dict[str, str]], *, json_mode: bool = False, max_tokens: int | None = None
    ) -> ChatResponse:
        response = self.client.chat(messages, json_mode=json_mode, max_tokens=max_tokens)
        self.ledger.record(self.side, self.name, response.usage)
        return response

    def chat_batch(
        self,
        conversations: list[list[dict[str, str]]],
        *,
        json_mode: bool = False,
        max_tokens: int | None = None,
    ) -> list[ChatResponse]:
        responses = self.client.chat_batch(conversations, json_mode=json_mode, max_tokens=max_tokens)
        for response in responses:
            self.ledger.record(self.side, self.name, response.usage)
        return responses
