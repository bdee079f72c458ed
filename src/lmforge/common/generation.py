"""Batched autoregressive generation with a hand-written decode loop.

:func:`generate` does not call ``model.generate``: it runs the prefill and the one-token decode steps
itself so that every method and evaluation in lmforge shares one well-understood loop.
Checked: transformers' ``model.generate`` batches too, but per-row stop strings, per-row token counts
and a loop that later methods (Minions, UDora) can step through are not its interface; the tests
check this loop against ``model.generate`` token for token.

* Prompts are encoded once with the tokenizer's own special tokens (``add_special_tokens=True``: a
  Llama tokenizer adds its BOS, a GPT-2 tokenizer adds nothing; not when the prompt text already
  starts with the BOS token, as a rendered chat template does: :func:`encode_prompt`), sorted by length (longest first) and
  cut into batches of ``batch_size`` so that rows in a batch need little padding. Outputs come back in
  the input order.
* Batches are **left-padded** with an explicit ``attention_mask``; ``position_ids`` are computed from
  the mask (``cumsum - 1``, clamped at 0) so a padded row sees exactly the positions it would see
  unpadded. The padding is done here on the encoded ids, so the tokenizer's ``padding_side`` is never
  touched.
* The key/value cache is a transformers-5 :class:`~transformers.DynamicCache` built from the model
  config (so sliding-window layers get sliding cache layers), passed as ``past_key_values`` with
  ``use_cache=True``. The prefill asks only for the last position's logits (``logits_to_keep=1``).
* Each row stops on an EOS token (the tokenizer's ``eos_token_id`` together with the model's
  ``generation_config.eos_token_id``, which may be a list) or when any of ``stop`` appears in the
  decoded tail of its completion. Finished rows are dropped from the batch (the cache is narrowed
  with ``batch_select_indices``) and the loop ends when every row is done.
* Greedy decoding is the argmax; sampling applies temperature, then top-k, then top-p (the order
  Hugging Face uses) and draws with a ``torch.Generator`` seeded from ``seed``. A seeded run is
  reproducible for the same prompts and ``batch_size``; the draws depend on the batch composition.
"""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch import nn

from lmforge.common.errors import UserError
from lmforge.common.batching import inference, run_in_batches

FinishReason = Literal["stop", "eos", "length"]

logger = logging.getLogger(__name__)


@dataclass
class GenerationOutput:
    """One completion.

    Attributes:
        text: the completion only (no prompt), special tokens removed, cut before the first stop string.
        prompt_tokens: number of prompt tokens, special tokens the tokenizer added included.
        completion_tokens: number of tokens generated for this row, the final EOS token included when
            ``finished_by == "eos"`` and the tokens that completed a stop string included when
            ``finished_by == "stop"``.
        finished_by: ``"stop"`` (a stop string), ``"eos"`` (an EOS token) or ``"length"``
            (``max_new_tokens`` reached).
        token_ids: the generated token ids (``completion_tokens`` of them).
    """

    text: str
    prompt_tokens: int
    completion_tokens: int
    finished_by: FinishReason
    token_ids: list[int] = field(default_factory=list, repr=False)


def model_device(model: nn.Module) -> torch.device:
    """The device of the model's first parameter (CPU for a model without parameters)."""
    for p in model.parameters():
        return p.device
    return torch.device("cpu")


def encode_prompt(tokenizer: Any, text: str) -> list[int]:
    """Token ids of a prompt with the tokenizer's special tokens, unless the text already starts with
    the BOS token's text (a rendered chat template does), which would otherwise be doubled; lm-eval
    makes the same check."""
    bos = getattr(tokenizer, "bos_token", None)
    add = not (isinstance(bos, str) and bos and text.startswith(bos))
    return list(tokenizer(text, add_special_tokens=add)["input_ids"])


def eos_token_ids(model: nn.Module, tokenizer: Any) -> list[int]:
    """EOS ids: the tokenizer's plus the model's ``generation_config.eos_token_id`` (int or list)."""
    ids: list[int] = []
    candidates: list[Any] = [getattr(tokenizer, "eos_token_id", None)]
    gen_cfg = getattr(model, "generation_config", None)
    if gen_cfg is not None:
        candidates.append(getattr(gen_cfg, "eos_token_id", None))
    for cand in candidates:
        if cand is None:
            continue
        for i in cand if isinstance(cand, (list, tuple)) else [cand]:
            if i is not None and int(i) not in ids:
                ids.append(int(i))
    return ids


def pad_token_id(tokenizer: Any, eos_ids: Sequence[int]) -> int:
    """The tokenizer's pad id, else the first EOS id; a UserError if neither exists."""
    pad = getattr(tokenizer, "pad_token_id", None)
    if pad is not None:
        return int(pad)
    if eos_ids:
        return int(eos_ids[0])
    raise UserError("the tokenizer has neither a pad token nor an EOS token; set tokenizer.pad_token")


def accepts_logits_to_keep(model: nn.Module) -> bool:
    """Whether ``model.forward`` takes ``logits_to_keep`` (every transformers-5 causal LM does; a
    wrapper with a ``get_base_model()``, such as a peft model, passes it on to the model it wraps)."""
    inner = model.get_base_model() if callable(getattr(model, "get_base_model", None)) else model
    try:
        return "logits_to_keep" in inspect.signature(inner.forward).parameters
    except (TypeError, ValueError):
        return False


def has_learned_positions(model: nn.Module) -> bool:
    """Whether the model adds a learned absolute position table (GPT-2's ``wpe``, OPT's
    ``embed_positions``), which cannot go past ``max_position_embeddings``."""
    return any(
        isinstance(mod, nn.Embedding) and name.rsplit(".", 1)[-1] in ("wpe", "embed_positions")
        for name, mod in model.named_modules()
    )


def max_positions(model: nn.Module) -> int | None:
    """``config.max_position_embeddings`` (GPT-2's ``n_positions``) or None when the config has none."""
    cfg = getattr(model, "config", None)
    value = getattr(cfg, "max_position_embeddings", None) if cfg is not None else None
    return int(value) if value else None


def check_sampling_args(
    max_new_tokens: int, do_sample: bool, temperature: float, top_p: float, top_k: int, batch_size: int
) -> None:
    if max_new_tokens < 0:
        raise UserError(f"max_new_tokens must be >= 0, got {max_new_tokens}")
    if batch_size < 1:
        raise UserError(f"batch_size must be >= 1, got {batch_size}")
    if do_sample:
        if not (temperature > 0 and math.isfinite(temperature)):
            raise UserError(f"temperature must be a positive number when sampling, got {temperature}")
        if not (0.0 < top_p <= 1.0):
            raise UserError(f"top_p must be in (0, 1], got {top_p}")
        if top_k < 0:
            raise UserError(f"top_k must be >= 0 (0 disables it), got {top_k}")


def _constrain(logits: torch.Tensor, sequences: list[list[int]],
               allowed_tokens: Callable[[list[int]], Sequence[int]]) -> torch.Tensor:
    """``logits`` with every token outside ``allowed_tokens(sequence)`` set to -inf, row by row."""
    mask = torch.full_like(logits, float("-inf"))
    for j, seq in enumerate(sequences):
        ok = list(allowed_tokens(seq))
        if not ok:
            raise RuntimeError("the decoding constraint allows no token")
        mask[j, torch.tensor(ok, dtype=torch.long, device=logits.device)] = 0.0
    return logits + mask


def enforcer_tokenizer_data(tokenizer: Any) -> Any:
    """lm-format-enforcer's vocabulary tables for ``tokenizer`` (its ``TokenEnforcerTokenizerData``).

    NOTE: written here because lm-format-enforcer 0.11's transformers integration imports
    ``transformers.tokenization_utils``, which transformers 5 no longer has. Each regular token's
    text is what it adds when decoded after an anchor token (so a word-initial token keeps its
    leading space), and it starts a word when that text is longer than its text decoded alone.
    """
    from lmformatenforcer import TokenEnforcerTokenizerData

    special = set(getattr(tokenizer, "all_special_ids", []) or [])
    anchor = tokenizer.encode("0", add_special_tokens=False)[-1]
    anchor_text = tokenizer.decode([anchor])
    ids = [i for i in range(len(tokenizer)) if i not in special]
    with_anchor = tokenizer.batch_decode([[anchor, i] for i in ids])
    alone = tokenizer.batch_decode([[i] for i in ids])
    regular = []
    for i, both, one in zip(ids, with_anchor, alone):
        if "\ufffd" in one or (any(ord(ch) < 32 for ch in one) and one.strip(" \t\n\r")):
            # NOTE: a token that is part of a multi-byte character decodes to U+FFFD alone; the
            # enforcer reads text, so such tokens would pass unchecked and let later characters
            # (control characters inside a string) through. They are left out: the constrained reply
            # then spells every character with whole-character tokens. Tokens mixing control
            # characters with text are left out too (JSON strings cannot hold raw control
            # characters); tokens of whitespace alone stay, for the space between JSON tokens.
            continue
        text = both[len(anchor_text):]
        regular.append((i, text, len(text) > len(one)))

    def decode(tokens: list[int]) -> str:
        return tokenizer.decode(tokens).rstrip("\ufffd")  # a cut multi-byte character is not text yet

    eos = tokenizer.eos_token_id
    return TokenEnforcerTokenizerData(regular, decode, eos, False, len(tokenizer))


def json_schema_constraint(tokenizer: Any, schema: dict[str, Any] | None = None,
                           tokenizer_data: Any = None) -> Callable[[list[int]], Sequence[int]]:
    """An ``allowed_tokens`` function for :func:`generate` that keeps each completion a JSON value
    valid under ``schema`` (None: any JSON object), ending at EOS once it is complete.

    Uses lm-format-enforcer's ``JsonSchemaParser`` and ``TokenEnforcer`` (checked first: transformers
    has no JSON-schema decoding of its own; xgrammar needs triton on Linux). One constraint serves a
    whole batch: its states are keyed by the token sequence, and the first call of a row (its prompt)
    starts that row's parse. ``tokenizer_data`` (:func:`enforcer_tokenizer_data`) can be passed to
    skip rebuilding the vocabulary tables (a few seconds for a 49k vocabulary).
    """
    from lmformatenforcer import JsonSchemaParser, TokenEnforcer

    data = tokenizer_data if tokenizer_data is not None else enforcer_tokenizer_data(tokenizer)
    enforcer = TokenEnforcer(data, JsonSchemaParser(schema))

    def allowed(seq: list[int]) -> Sequence[int]:
        return enforcer.get_allowed_tokens(seq).allowed_tokens

    return allowed


def _select_next(
    logits: torch.Tensor,
    do_sample: bool,
    temperature: float,
    top_k: int,
    top_p: float,
    generator: torch.Generator | None,
) -> torch.Tensor:
    """Next token ids, shape ``(batch,)``, from last-position logits ``(batch, vocab)``."""
    if not do_sample:
        return logits.argmax(dim=-1)
    scores = logits.float()
    if temperature != 1.0:
        scores = scores / temperature
    if top_k > 0 and top_k < scores.shape[-1]:
        kth = torch.topk(scores, top_k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if top_p < 1.0:
        sorted_scores, sorted_idx = torch.sort(scores, dim=-1, descending=False)
        cum = sorted_scores.softmax(dim=-1).cumsum(dim=-1)
        remove_sorted = cum <= (1.0 - top_p)
        remove_sorted[:, -1] = False  # always keep the most likely token
        remove = remove_sorted.scatter(1, sorted_idx, remove_sorted)
        scores = scores.masked_fill(remove, float("-inf"))
    probs = scores.softmax(dim=-1)
    return torch.multinomial(probs, num_samples=1, generator=generator).squeeze(1)


def _first_stop(text: str, stop: Sequence[str]) -> int:
    """Index of the earliest occurrence of any stop string in ``text``, or -1."""
    best = -1
    for s in stop:
        i = text.find(s)
        if i != -1 and (best == -1 or i < best):
            best = i
    return best


def chat_prompts(tokenizer: Any, conversations: Sequence[Sequence[dict[str, str]]], system: str | None = None) -> list[str]:
    """Render chat conversations with the tokenizer's chat template, ready for the assistant's turn.

    Args:
        tokenizer: a tokenizer with a ``chat_template``.
        conversations: one list of ``{"role", "content"}`` messages per prompt.
        system: a system message put first in every conversation that has none.

    Raises:
        UserError: the tokenizer has no chat template, or a message is not a role/content dict.
    """
    if not getattr(tokenizer, "chat_template", None):
        raise UserError("this tokenizer has no chat template; send plain prompts (drop --chat/--system/messages=)")
    out = []
    for i, conv in enumerate(conversations):
        msgs = [dict(m) for m in conv]
        if any(not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str) for m in msgs):
            raise UserError(f"conversation {i}: every message needs a string 'role' and 'content'")
        if system is not None and not (msgs and msgs[0]["role"] == "system"):
            msgs.insert(0, {"role": "system", "content": system})
        out.append(tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False))
    return out


def generate(
    model: nn.Module,
    tokenizer: Any,
    prompts: list[str] | None = None,
    *,
    messages: Sequence[Sequence[dict[str, str]]] | None = None,
    system: str | None = None,
    max_new_tokens: int = 64,
    do_sample: bool = False,
    temperature: float = 1.0,
    top_p: float = 1.0,
    top_k: int = 0,
    stop: list[str] | None = None,
    batch_size: int = 16,
    seed: int | None = None,
    progress: bool = False,
    allowed_tokens: Callable[[list[int]], Sequence[int]] | None = None,
    prompt_ids: Sequence[Sequence[int]] | None = None,
    position_hook: Callable[[list[int], torch.Tensor], None] | None = None,
) -> list[GenerationOutput]:
    """Generate a completion for each prompt with a batched, KV-cached decode loop.

    Args:
        model: a causal LM (``LlamaForCausalLM``, ``Qwen2ForCausalLM``, ``GPT2LMHeadModel``...).
        tokenizer: its tokenizer; a missing pad token falls back to EOS.
        prompts: the prompts (raw text); the result has the same length and order.
        messages: instead of ``prompts``, one chat conversation per prompt (lists of
            ``{"role", "content"}``), rendered with the tokenizer's chat template
            (:func:`chat_prompts`); instruct models expect this.
        system: with ``messages``, a system message for conversations that have none.
        max_new_tokens: at most this many tokens per completion.
        do_sample: sample instead of greedy argmax.
        temperature, top_p, top_k: sampling controls (ignored when greedy); ``top_k=0`` and
            ``top_p=1`` disable their filter.
        stop: stop strings; a row ends as soon as one appears in its completion and the text is cut
            before it. Empty strings are ignored.
        batch_size: rows per forward pass.
        seed: seeds the sampling generator; None uses torch's global RNG.
        progress: show a progress bar over batches.
        allowed_tokens: constrained decoding: called with a row's token ids so far (its prompt's
            ids, then what it generated) before every step, it returns the token ids the next one
            may be; the others get probability 0 (e.g. :func:`json_schema_constraint`).
        prompt_ids: instead of ``prompts`` / ``messages``, the prompts as token ids, used as given
            (no special tokens added): for a caller that lays out its own tokens.
        position_hook: called before every forward pass with ``(rows, positions)``: ``rows`` the
            indices (into the prompt list) of the batch's rows in order, ``positions`` a ``(len(rows),
            T)`` long tensor of the positions the pass feeds (a token's index in its row's prompt +
            completion; -1 for left padding). An adapter that conditions on per-token side inputs
            (e.g. a role per token) sets them here; the engine knows nothing of what it sets.

    Returns:
        One :class:`GenerationOutput` per prompt, in input order.

    A prompt plus ``max_new_tokens`` longer than ``config.max_position_embeddings`` is a
    :class:`UserError` for models with learned absolute positions (GPT-2) and a logged warning for
    rotary models.
    """
    check_sampling_args(max_new_tokens, do_sample, temperature, top_p, top_k, batch_size)
    if sum(x is not None for x in (prompts, messages, prompt_ids)) != 1:
        raise UserError("generate() takes either prompts or messages or prompt_ids: exactly one of them")
    if prompt_ids is not None:
        if system is not None:
            raise UserError("system= needs messages=; token-id prompts have no chat turns")
        encoded_given = [[int(t) for t in ids] for ids in prompt_ids]
        prompts = [""] * len(encoded_given)
    if messages is not None:
        prompts = chat_prompts(tokenizer, messages, system=system)
    elif system is not None:
        raise UserError("system= needs messages=; a raw prompt has no chat turns")
    if isinstance(prompts, str):
        raise UserError("generate() takes a list of prompts, not a single string")
    prompts = list(prompts)
    if not prompts:
        return []
    stops = [s for s in (stop or []) if s]

    device = model_device(model)
    eos_ids = eos_token_ids(model, tokenizer)
    pad_id = pad_token_id(tokenizer, eos_ids)

    encoded = encoded_given if prompt_ids is not None else [encode_prompt(tokenizer, p) for p in prompts]
    for i, ids in enumerate(encoded):
        if not ids:
            raise UserError(
                f"prompt {i} encodes to no tokens and the tokenizer adds no BOS token; "
                "give a non-empty prompt"
            )
    limit = max_positions(model)
    if limit is not None:
        longest = max(len(ids) for ids in encoded)
        if longest + max_new_tokens > limit:
            msg = (
                f"a prompt of {longest} tokens plus max_new_tokens={max_new_tokens} exceeds the model's "
                f"{limit} positions"
            )
            if has_learned_positions(model):
                # A learned position table (GPT-2's wpe) has no row past the limit: fail clearly.
                raise UserError(msg + "; shorten the prompt or lower max_new_tokens")
            # Once per model: a protocol that sends many long prompts (MINION's worker) would
            # otherwise repeat the same line for every call.
            if not getattr(model, "_lmforge_warned_positions", False):
                logger.warning("%s; rotary positions beyond the trained range may degrade the output "
                               "(said once per model)", msg)
                try:
                    model._lmforge_warned_positions = True
                except AttributeError:
                    pass

    generator: torch.Generator | None = None
    if do_sample and seed is not None:
        generator = torch.Generator(device=device)
        generator.manual_seed(int(seed))

    def run(batch: list[int]) -> list[GenerationOutput]:
        return _generate_batch(
            model,
            tokenizer,
            [encoded[i] for i in batch],
            device=device,
            pad_id=pad_id,
            eos_ids=eos_ids,
            stops=stops,
            max_new_tokens=max_new_tokens,
            do_sample=do_sample,
            temperature=temperature,
            top_k=top_k,
            top_p=top_p,
            generator=generator,
            allowed_tokens=allowed_tokens,
            row_ids=batch,
            position_hook=position_hook,
        )

    with inference(model):
        return run_in_batches([len(ids) for ids in encoded], batch_size, run, progress=progress,
                              description="generate")


def _generate_batch(
    model: nn.Module,
    tokenizer: Any,
    rows: list[list[int]],
    *,
    device: torch.device,
    pad_id: int,
    eos_ids: list[int],
    stops: list[str],
    max_new_tokens: int,
    do_sample: bool,
    temperature: float,
    top_k: int,
    top_p: float,
    generator: torch.Generator | None,
    allowed_tokens: Callable[[list[int]], Sequence[int]] | None = None,
    row_ids: list[int] | None = None,
    position_hook: Callable[[list[int], torch.Tensor], None] | None = None,
) -> list[GenerationOutput]:
    from transformers import DynamicCache

    n = len(rows)
    lengths = [len(r) for r in rows]
    width = max(lengths)
    input_ids = torch.full((n, width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((n, width), dtype=torch.long)
    for i, ids in enumerate(rows):
        input_ids[i, width - len(ids) :] = torch.tensor(ids, dtype=torch.long)
        attention_mask[i, width - len(ids) :] = 1
    input_ids = input_ids.to(device)
    attention_mask = attention_mask.to(device)
    position_ids = (attention_mask.cumsum(dim=-1) - 1).clamp(min=0)

    generated = torch.full((n, max(max_new_tokens, 1)), pad_id, dtype=torch.long, device=device)
    n_generated = [0] * n
    finished: list[FinishReason] = ["length"] * n

    if max_new_tokens > 0:
        cache = DynamicCache(config=model.config)
        extra = {"logits_to_keep": 1} if accepts_logits_to_keep(model) else {}
        ids_of = row_ids if row_ids is not None else list(range(n))
        if position_hook is not None:
            position_hook(list(ids_of), position_ids.masked_fill(attention_mask == 0, -1))
        out = model(
            input_ids=input_ids,
            attention_mask=attention_mask,
            position_ids=position_ids,
            past_key_values=cache,
            use_cache=True,
            **extra,
        )
        logits = out.logits[:, -1, :]
        next_pos = position_ids[:, -1] + 1
        eos_t = torch.tensor(eos_ids, dtype=torch.long, device=device) if eos_ids else None
        active = list(range(n))  # batch row -> index into `rows`
        active_t = torch.arange(n, device=device)
        # Only the tail of each completion is decoded for the stop check. A stop string of L
        # characters spans at most L tokens when each token decodes to at least one character;
        # 4L + 8 also covers byte-fallback tokens (up to 4 per character) and empty decodes.
        tail = 4 * max((len(s) for s in stops), default=0) + 8

        for step in range(max_new_tokens):
            if allowed_tokens is not None:
                logits = _constrain(logits, [rows[r] + generated[r, :step].tolist() for r in active], allowed_tokens)
            tok = _select_next(logits, do_sample, temperature, top_k, top_p, generator)
            generated[active_t, step] = tok
            done_rows: list[int] = []  # positions in `active`
            if eos_t is not None:
                is_eos = torch.isin(tok, eos_t).tolist()
                for j, hit in enumerate(is_eos):
                    if hit:
                        finished[active[j]] = "eos"
                        done_rows.append(j)
            for r in active:
                n_generated[r] = step + 1
            if stops:
                check = [j for j in range(len(active)) if finished[active[j]] != "eos"]
                if check:
                    lo = max(0, step + 1 - tail)
                    tails = generated[active_t[check], lo : step + 1].tolist()
                    texts = tokenizer.batch_decode(tails, skip_special_tokens=True)
                    for j, text in zip(check, texts):
                        if any(s in text for s in stops):
                            finished[active[j]] = "stop"
                            done_rows.append(j)
            if step == max_new_tokens - 1:
                break
            if done_rows:
                done = set(done_rows)
                keep = [j for j in range(len(active)) if j not in done]
                if not keep:
                    break
                keep_t = torch.tensor(keep, dtype=torch.long, device=device)
                cache.batch_select_indices(keep_t)
                attention_mask = attention_mask[keep_t]
                next_pos = next_pos[keep_t]
                tok = tok[keep_t]
                active = [active[j] for j in keep]
                active_t = active_t[keep_t]
            ones = attention_mask.new_ones((attention_mask.shape[0], 1))
            attention_mask = torch.cat([attention_mask, ones], dim=1)
            if position_hook is not None:
                position_hook([ids_of[r] for r in active], next_pos[:, None])
            out = model(
                input_ids=tok[:, None],
                attention_mask=attention_mask,
                position_ids=next_pos[:, None],
                past_key_values=cache,
                use_cache=True,
            )
            logits = out.logits[:, -1, :]
            next_pos = next_pos + 1
        del cache

    token_lists = generated.tolist()
    outputs: list[GenerationOutput] = []
    for i in range(n):
        ids = token_lists[i][: n_generated[i]]
        text_ids = ids[:-1] if finished[i] == "eos" else ids
        text = tokenizer.decode(text_ids, skip_special_tokens=True)
        reason = finished[i]
        if stops:
            cut = _first_stop(text, stops)
            if cut != -1:
                text = text[:cut]
                reason = "stop"
        outputs.append(
            GenerationOutput(
                text=text,
                prompt_tokens=lengths[i],
                completion_tokens=len(ids),
                finished_by=reason,
                token_ids=ids,
            )
        )
    return outputs
