"""Rewriters Re(y, w) that set a response's attribute to w, and attribute classifiers W(y).

RATE (Reber et al., ICML 2025, arXiv 2410.11348) rewrites each response with an LLM (gpt-4o at
T = 0.7 in the paper) using one prompt for the rewrite and for the rewrite of the rewrite:
``"{completion}\\n\\n[Adjust this review so it's {w_string}, but change *nothing* else."``.

One interface, ``rewrite(texts, targets) -> texts`` (targets are the w to set, 0 or 1), with:

* :class:`ProgrammaticRewriter`: a Python function ``(text, w) -> text`` (tests; rule-based
  attributes; :data:`BUILTIN` has crude length and sentiment rules for the CLI);
* :class:`ChatRewriter`: the paper's prompt through any chat client — a local Hugging Face model
  (:class:`~lmforge.methods.minions.clients.HFChatClient`, lmforge's batched generation engine) or
  an OpenAI-compatible API (:class:`~lmforge.methods.minions.clients.OpenAIChatClient`; the key is
  read from an environment variable and never appears in a repr, a log line or an error).

:func:`make_rewriter` builds one from a CLI spec: ``programmatic``, ``hf:PATH`` or ``openai:MODEL``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from lmforge.common.errors import UserError
from lmforge.methods.rate.config import RateConfig


@runtime_checkable
class Rewriter(Protocol):
    """Anything that rewrites texts so that their attribute takes the target values."""

    name: str

    def rewrite(self, texts: Sequence[str], targets: Sequence[int]) -> list[str]: ...


class ProgrammaticRewriter:
    """A rule ``fn(text, w) -> text`` applied to each text."""

    def __init__(self, fn: Callable[[str, int], str], name: str = "programmatic") -> None:
        self.fn = fn
        self.name = name

    def __repr__(self) -> str:
        return f"ProgrammaticRewriter(name={self.name!r})"

    def rewrite(self, texts: Sequence[str], targets: Sequence[int]) -> list[str]:
        return [self.fn(t, int(w)) for t, w in zip(texts, targets, strict=True)]


@dataclass
class ChatRewriter:
    """The paper's rewrite prompt sent through a chat client.

    Attributes:
        client: a ``ChatClient`` (``chat_batch(conversations, max_tokens=...)``).
        cfg: the prompt template and the strings that name w = 1 and w = 0.
        truncated: how many replies were cut at ``max_tokens`` (reported, kept).
    """

    client: Any
    cfg: RateConfig
    truncated: int = field(default=0)

    @property
    def name(self) -> str:
        return f"chat:{getattr(self.client, 'name', type(self.client).__name__)}"

    def __repr__(self) -> str:
        return f"ChatRewriter(client={self.client!r})"

    def prompt(self, text: str, w: int) -> str:
        target = self.cfg.w1_string if w == 1 else self.cfg.w0_string
        return self.cfg.rewrite_prompt.format(original_completion=text, w_counterfactual_string=target)

    def rewrite(self, texts: Sequence[str], targets: Sequence[int]) -> list[str]:
        convs = [[{"role": "user", "content": self.prompt(t, int(w))}] for t, w in zip(texts, targets, strict=True)]
        replies = self.client.chat_batch(convs, max_tokens=self.cfg.max_tokens)
        self.truncated += sum(r.done_reason == "length" for r in replies)
        return [r.text.strip() for r in replies]


# ----------------------------------------------------------------------- built-in rule attributes

_POS_NEG = {"good": "bad", "great": "terrible", "love": "hate", "loved": "hated", "best": "worst",
            "excellent": "awful", "wonderful": "horrible", "enjoyed": "disliked", "happy": "sad",
            "beautiful": "ugly", "brilliant": "dull", "fun": "boring"}
_NEG_POS = {v: k for k, v in _POS_NEG.items()}
_WORD = re.compile(r"[A-Za-z]+")


def sentiment_w(text: str) -> int:
    """1 if the text has more positive than negative lexicon words, else 0."""
    words = [m.group(0).lower() for m in _WORD.finditer(text)]
    return int(sum(w in _POS_NEG for w in words) > sum(w in _NEG_POS for w in words))


def _swap(text: str, table: dict[str, str]) -> str:
    def sub(m: re.Match[str]) -> str:
        word = m.group(0)
        rep = table.get(word.lower())
        if rep is None:
            return word
        return rep.capitalize() if word[0].isupper() else rep

    return _WORD.sub(sub, text)


def sentiment_rewrite(text: str, w: int) -> str:
    """Swap lexicon words to the target polarity; add a short verdict if that is not enough."""
    out = _swap(text, _NEG_POS if w == 1 else _POS_NEG)
    if sentiment_w(out) != w:
        out = out.rstrip() + (" Overall it was good." if w == 1 else " Overall it was bad.")
    return out


@dataclass
class LengthRule:
    """Length as the attribute: W = 1 when the text has at least ``threshold`` words; the rewrite
    to long repeats the text's content behind "In other words,", to short keeps its first
    ``threshold // 2`` words (crude, for demos: an LLM rewriter is the real thing)."""

    threshold: int

    def w(self, text: str) -> int:
        return int(len(text.split()) >= self.threshold)

    def rewrite(self, text: str, w: int) -> str:
        words = text.split()
        if w == 1:
            while len(words) < self.threshold:
                words = words + ["In", "other", "words,"] + (words or ["nothing."])
            return " ".join(words)
        return " ".join(words[: max(1, min(len(words), self.threshold) // 2)])


BUILTIN = ("length", "sentiment")


def builtin_attribute(name: str, texts: Sequence[str]) -> tuple[Callable[[str], int], ProgrammaticRewriter, RateConfig]:
    """(classifier, programmatic rewriter, prompt strings) of a built-in attribute; ``length`` takes
    its threshold from the median word count of ``texts``."""
    if name == "sentiment":
        return sentiment_w, ProgrammaticRewriter(sentiment_rewrite, "programmatic:sentiment"), RateConfig(
            attribute="sentiment", w1_string="positive sentiment", w0_string="negative sentiment")
    if name == "length":
        counts = sorted(len(t.split()) for t in texts) or [1]
        rule = LengthRule(max(2, counts[len(counts) // 2]))
        return rule.w, ProgrammaticRewriter(rule.rewrite, "programmatic:length"), RateConfig(
            attribute="length", w1_string="longer", w0_string="shorter")
    raise UserError(f"no built-in attribute '{name}'; built-in: {', '.join(BUILTIN)} (or give w per record)")


def make_rewriter(spec: str, cfg: RateConfig, *, programmatic: ProgrammaticRewriter | None = None,
                  base_url: str = "https://api.openai.com/v1", api_key_env: str = "OPENAI_API_KEY",
                  seed: int = 0) -> Rewriter:
    """A rewriter from a spec: ``programmatic`` (needs ``programmatic``), ``hf:PATH`` (a local model
    folder or ``zoo:NAME``) or ``openai:MODEL`` (an OpenAI-compatible endpoint at ``base_url``)."""
    from lmforge.methods.minions.clients import HFChatClient, OpenAIChatClient

    if spec == "programmatic":
        if programmatic is None:
            raise UserError("the programmatic rewriter needs a built-in attribute (length, sentiment)")
        return programmatic
    kind, _, target = spec.partition(":")
    if not target.strip():
        raise UserError(f"rewriter '{spec}' names no model; use programmatic, hf:PATH or openai:MODEL")
    if kind == "hf":
        client = HFChatClient.from_spec(target, temperature=cfg.temperature, max_tokens=cfg.max_tokens or 256, seed=seed)
        return ChatRewriter(client, cfg)
    if kind == "openai":
        client = OpenAIChatClient(base_url, target, api_key_env=api_key_env, temperature=cfg.temperature,
                                  max_tokens=cfg.max_tokens)
        return ChatRewriter(client, cfg)
    raise UserError(f"unknown rewriter '{spec}'; use programmatic, hf:PATH or openai:MODEL")
