"""InjecAgent-style cases (:mod:`lmforge.data.injecagent`) as UDora attack cases, and the paper's
pre-filter run on a real agent: the data module knows no model and no method, so the two pieces that
need them live here."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from lmforge.data.injecagent import DEFAULT_INIT, AttackCase, FilterResult, filter_untriggered
from lmforge.methods.udora.attack import Case, greedy_trace


def to_case(case: AttackCase, raw: bool = True) -> Case:
    """``Case.injecagent(prompt, target)``. ``raw`` keeps the ReAct text verbatim (no chat template),
    which is what the zoo agent was trained on; ``raw=False`` wraps it as one user message for a chat
    model, as the official does."""
    out = Case.injecagent(case.prompt, case.target, name=case.name)
    return dataclasses.replace(out, raw=raw) if raw else out


def filter_cases(model: Any, tokenizer: Any, cases: Sequence[AttackCase], max_new_tokens: int = 48, *,
                 chat: bool = False, init: str = DEFAULT_INIT) -> FilterResult:
    """:func:`lmforge.data.injecagent.filter_untriggered` with the attack loop's own greedy decode as
    the agent (the prompt in the tokenizer's chat template when ``chat``)."""
    from lmforge.common.generation import encode_prompt

    def trace(text: str) -> str:
        if chat:
            text = tokenizer.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                 add_generation_prompt=True)
        was = model.training
        model.eval()
        try:
            return greedy_trace(model, tokenizer, encode_prompt(tokenizer, text), max_new_tokens).text
        finally:
            model.train(was)

    return filter_untriggered(cases, trace, init=init)
