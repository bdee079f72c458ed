"""Log-likelihood scoring of continuations and sliding-window perplexity.

:func:`score_continuations` is the engine behind multiple-choice and log-likelihood evaluations: for
each ``(context, continuation)`` pair it returns the log-probability of every continuation token given
everything before it, plus whether greedy decoding would have produced the continuation.

:func:`perplexity` is the standard Hugging Face sliding-window perplexity: windows of ``max_length``
tokens start every ``stride`` tokens and each window scores only the tokens that no previous window
scored (the others are labelled -100), so with ``stride < max_length`` every token but the first is
scored exactly once, each with at least ``max_length - stride`` tokens of context (except near the
start).

Both compute ``log_softmax`` in float32 whatever the model's dtype.

Checked: lm-eval's ``HFLM.loglikelihood`` does the same computation, but only through its harness
request objects; this is the computation on plain string pairs, tested against a naive loop.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.common.errors import UserError
from lmforge.common.batching import inference, run_in_batches
from lmforge.common.generation import accepts_logits_to_keep, encode_prompt, max_positions, model_device
from lmforge.common.progress import make_progress


@dataclass
class ContinuationScore:
    """Scores of one continuation given its context.

    Attributes:
        token_logprobs: log p(token | everything before it), one per continuation token.
        sum: sum of ``token_logprobs`` (the log-likelihood of the continuation).
        mean: ``sum / n_tokens``.
        n_tokens: number of continuation tokens.
        greedy_match: True when the argmax at every continuation position is the continuation token.
    """

    token_logprobs: list[float]
    sum: float
    mean: float
    n_tokens: int
    greedy_match: bool


@dataclass
class PerplexityResult:
    """``ppl = exp(nll_sum / n_tokens)``; ``nll_sum`` in nats."""

    nll_sum: float
    n_tokens: int
    ppl: float


def _context_prefix(tokenizer: Any) -> list[int]:
    """Token to stand in for an empty context: BOS, else EOS (as lm-eval does)."""
    for attr in ("bos_token_id", "eos_token_id"):
        tid = getattr(tokenizer, attr, None)
        if tid is not None:
            return [int(tid)]
    raise UserError("an empty context needs a BOS or EOS token and the tokenizer has neither")


def encode_pair(tokenizer: Any, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """Context ids (with the tokenizer's special tokens) and continuation ids (without)."""
    ctx = encode_prompt(tokenizer, context)
    cont = tokenizer(continuation, add_special_tokens=False)["input_ids"]
    if not ctx:
        ctx = _context_prefix(tokenizer)
    return list(ctx), list(cont)


def score_continuations(
    model: nn.Module,
    tokenizer: Any,
    pairs: Sequence[tuple[str, str]],
    *,
    batch_size: int = 16,
    progress: bool = False,
) -> list[ContinuationScore]:
    """Log-probabilities of each continuation given its context.

    The input of a pair is ``context_ids + continuation_ids``: the context is encoded with the
    tokenizer's special tokens (a BOS for Llama-style tokenizers), the continuation without, and the
    two id lists are concatenated (not the strings), so a continuation such as ``" Paris"`` keeps its
    own tokenization. An empty context stands as the BOS (else EOS) token. When the pair is longer
    than the model's positions the context is cut from the left. Pairs are sorted by length and
    right-padded into batches; results come back in input order.

    Args:
        model: a causal LM.
        tokenizer: its tokenizer.
        pairs: ``(context, continuation)`` pairs; a continuation must encode to at least one token.
        batch_size: pairs per forward pass.
        progress: show a progress bar over batches.
    """
    if batch_size < 1:
        raise UserError(f"batch_size must be >= 1, got {batch_size}")
    pairs = list(pairs)
    if not pairs:
        return []
    limit = max_positions(model)
    encoded: list[tuple[list[int], list[int]]] = []
    for i, (context, continuation) in enumerate(pairs):
        ctx, cont = encode_pair(tokenizer, context, continuation)
        if not cont:
            raise UserError(f"pair {i}: the continuation {continuation!r} encodes to no tokens")
        if limit is not None and len(ctx) + len(cont) > limit:
            if len(cont) >= limit:
                raise UserError(
                    f"pair {i}: the continuation alone has {len(cont)} tokens, over the model's {limit}"
                )
            ctx = ctx[len(ctx) + len(cont) - limit :]
        encoded.append((ctx, cont))

    device = model_device(model)
    pad_id = getattr(tokenizer, "pad_token_id", None)
    if pad_id is None:
        pad_id = getattr(tokenizer, "eos_token_id", None) or 0
    keep_logits = accepts_logits_to_keep(model)

    def run(batch: list[int]) -> list[ContinuationScore]:
        return _score_batch(model, [encoded[i] for i in batch], device, int(pad_id), keep_logits)

    with inference(model):
        return run_in_batches([len(c) + len(x) for c, x in encoded], batch_size, run,
                              progress=progress, description="score")


def _score_batch(
    model: nn.Module,
    rows: list[tuple[list[int], list[int]]],
    device: torch.device,
    pad_id: int,
    keep_logits: bool,
) -> list[ContinuationScore]:
    n = len(rows)
    full = [ctx + cont for ctx, cont in rows]
    width = max(len(x) for x in full)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((n, width), dtype=torch.long)
    for i, ids in enumerate(full):
        input_ids[i, : len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention_mask[i, : len(ids)] = 1
    input_ids = input_ids.to(device)
    attention_mask = attention_mask.to(device)

    # The logits that predict continuation tokens sit at positions [len(ctx) - 1, len(full) - 1).
    # Only that span (over the whole batch) goes through the LM head.
    first = min(len(ctx) for ctx, _ in rows) - 1
    last = width - 1  # exclusive
    kwargs: dict[str, Any] = {}
    offset = 0
    if keep_logits:
        kwargs["logits_to_keep"] = torch.arange(first, last, device=device)
        offset = first
    logits = model(input_ids=input_ids, attention_mask=attention_mask, use_cache=False, **kwargs).logits

    out: list[ContinuationScore] = []
    for i, (ctx, cont) in enumerate(rows):
        start = len(ctx) - 1 - offset
        row_logits = logits[i, start : start + len(cont)].float()
        logprobs = F.log_softmax(row_logits, dim=-1)
        target = torch.tensor(cont, dtype=torch.long, device=logprobs.device)
        token_lp = logprobs.gather(1, target[:, None]).squeeze(1)
        greedy = bool((row_logits.argmax(dim=-1) == target).all().item())
        lp = token_lp.tolist()
        total = float(sum(lp))
        out.append(
            ContinuationScore(
                token_logprobs=lp, sum=total, mean=total / len(lp), n_tokens=len(lp), greedy_match=greedy
            )
        )
    return out


def join_texts(tokenizer: Any, texts: Sequence[str] | str) -> list[int]:
    """Token ids of ``texts`` as one stream: the first text with the tokenizer's special tokens (its
    BOS, if it adds one), every later text without, and the EOS token between consecutive texts."""
    if isinstance(texts, str):
        texts = [texts]
    texts = list(texts)
    if not texts:
        raise UserError("perplexity needs at least one text")
    eos = getattr(tokenizer, "eos_token_id", None)
    if len(texts) > 1 and eos is None:
        raise UserError("joining several texts needs an EOS token and the tokenizer has none")
    ids: list[int] = list(tokenizer(texts[0], add_special_tokens=True)["input_ids"])
    for text in texts[1:]:
        ids.append(int(eos))
        ids.extend(tokenizer(text, add_special_tokens=False)["input_ids"])
    return ids


def sliding_windows(n_ids: int, max_length: int, stride: int) -> list[tuple[int, int, int]]:
    """The windows of the Hugging Face sliding-window method as ``(begin, end, n_new)``.

    The window covers ids ``[begin, end)``; its last ``n_new`` ids are the ones no earlier window
    covered, and are the only ones whose prediction is scored (the first id of the whole stream has
    no prediction, so the first window scores ``n_new - 1`` tokens).
    """
    windows = []
    prev_end = 0
    for begin in range(0, n_ids, stride):
        end = min(begin + max_length, n_ids)
        windows.append((begin, end, end - prev_end))
        prev_end = end
        if end == n_ids:
            break
    return windows


def perplexity(
    model: nn.Module,
    tokenizer: Any,
    texts: list[str] | str,
    *,
    max_length: int | None = None,
    stride: int | None = None,
    progress: bool = False,
) -> PerplexityResult:
    """Perplexity of ``texts`` with the Hugging Face sliding-window method.

    The texts are joined into one token stream with the tokenizer's EOS token between consecutive
    texts (see :func:`join_texts`); the EOS tokens are scored like any other token. Windows of
    ``max_length`` tokens (default ``config.max_position_embeddings``) start every ``stride`` tokens
    (default ``max_length // 2``); in each window the targets already scored by an earlier window are
    set to -100, so each token is scored at most once. With ``stride < max_length`` every token after
    the first is scored exactly once (``n_tokens == len(ids) - 1``); with ``stride == max_length`` the
    windows are disjoint and the first token of each window is context only.

    Args:
        model: a causal LM.
        tokenizer: its tokenizer.
        texts: one text or a list of texts.
        max_length: window length in tokens.
        stride: distance between window starts, ``1 <= stride <= max_length``.
        progress: show a progress bar over windows.
    """
    if max_length is None:
        max_length = max_positions(model)
        if max_length is None:
            raise UserError("the model config has no max_position_embeddings; pass max_length")
    if max_length < 2:
        raise UserError(f"max_length must be >= 2, got {max_length}")
    limit = max_positions(model)
    if limit is not None and max_length > limit:
        raise UserError(f"max_length={max_length} exceeds the model's {limit} positions")
    if stride is None:
        stride = max(1, max_length // 2)
    if not (1 <= stride <= max_length):
        raise UserError(f"stride must be between 1 and max_length={max_length}, got {stride}")

    ids = join_texts(tokenizer, texts)
    if len(ids) < 2:
        raise UserError("perplexity needs at least two tokens of text")
    device = model_device(model)
    stream = torch.tensor(ids, dtype=torch.long, device=device)[None, :]
    windows = sliding_windows(len(ids), max_length, stride)

    nll_sum = 0.0
    n_tokens = 0
    prog = make_progress() if progress else None
    task = prog.add_task("perplexity", total=len(windows), info="") if prog is not None else None
    with inference(model), prog if prog is not None else contextlib.nullcontext():
        for begin, end, n_new in windows:
            window = stream[:, begin:end]
            labels = window.clone()
            labels[:, : window.shape[1] - n_new] = -100
            logits = model(input_ids=window, use_cache=False).logits
            # Position t predicts token t+1.
            shift_logits = logits[0, :-1].float()
            shift_labels = labels[0, 1:]
            nll = F.cross_entropy(shift_logits, shift_labels, ignore_index=-100, reduction="sum")
            nll_sum += float(nll.item())
            n_tokens += int((shift_labels != -100).sum().item())
            if prog is not None and task is not None:
                prog.advance(task)
    if n_tokens == 0:
        ppl = float("nan")
    else:
        mean = nll_sum / n_tokens
        ppl = math.exp(mean) if mean < 700 else float("inf")
    return PerplexityResult(nll_sum=nll_sum, n_tokens=n_tokens, ppl=ppl)
