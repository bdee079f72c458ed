"""Calibration and held-out text for compression: the built-in corpus, local files, token windows.

GPTQ, SparseGPT, Wanda and AWQ calibrate on random fixed-length windows of a text corpus (C4 or
WikiText-2 in the papers: 128 windows of 2048 tokens). Here the corpus is either a local file in a
standard format or, by default, lmforge's own synthetic mixture (the zoo's training distribution).
The held-out text uses another seed, so no calibration window is also scored.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import torch

from lmforge.common.errors import UserError
from lmforge.data import corpus

__all__ = ["builtin_eval_pairs", "builtin_texts", "read_texts", "token_ids", "token_windows"]


def builtin_texts(seed: int, n: int = 400) -> list[str]:
    """``n`` documents of the zoo's corpus (tool calls, workflows, block worlds, prose, short needle
    haystacks), each rendered as prompt + answer."""
    rng = random.Random(seed)
    makers = [
        corpus.toolcall_pair,
        corpus.workflow_pair,
        corpus.textworld_pair,
        corpus.text_pair,
        lambda r: corpus.needle_pair(r, n_sentences=r.randint(4, 16)),
    ]
    docs = []
    for i in range(n):
        prompt, answer = makers[i % len(makers)](rng)
        docs.append((prompt + " " + answer).strip())
    rng.shuffle(docs)
    return docs


def builtin_eval_pairs(seed: int, n: int = 200) -> list[tuple[str, str]]:
    """Held-out ``(prompt, answer)`` records of the zoo's mixture (tool calls, workflows, block worlds,
    prose), from another seed range than calibration. The zoo is trained on answers only (prose on
    every token), so the held-out perplexity of a zoo model is measured on the answer tokens."""
    rng = random.Random(10_000 + seed)
    makers = [corpus.toolcall_pair, corpus.workflow_pair, corpus.textworld_pair, corpus.text_pair]
    return [makers[i % len(makers)](rng) for i in range(n)]


def read_texts(path: str | Path) -> list[str]:
    """Documents from a local file: ``.jsonl`` (a ``"text"`` field per line, as C4 and most HF text
    datasets are shipped), ``.json`` (a list of strings or of such records), or plain text (one
    document per blank-line-separated paragraph, as in WikiText's raw files)."""
    p = Path(path)
    if p.is_dir():
        raise UserError(f"{p} is a directory, not a text file")
    if not p.is_file():
        raise UserError(f"text file not found: {p}" if not p.exists() else f"{p} is not a regular file")
    try:
        raw = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise UserError(f"cannot read {p} as UTF-8 text: {exc}") from None
    texts: list[str] = []
    if p.suffix == ".jsonl":
        for i, line in enumerate(raw.splitlines(), 1):
            if not line.strip():
                continue
            try:
                rec = json.loads(line)
            except json.JSONDecodeError:
                raise UserError(f"{p}:{i}: not a JSON line") from None
            text = rec.get("text") if isinstance(rec, dict) else rec
            if not isinstance(text, str):
                raise UserError(f"{p}:{i}: expected a string 'text' field")
            texts.append(text)
    elif p.suffix == ".json":
        try:
            data = json.loads(raw)
        except json.JSONDecodeError as exc:
            raise UserError(f"{p}: not valid JSON ({exc.msg})") from None
        if not isinstance(data, list):
            raise UserError(f"{p}: expected a JSON list of strings or of {{'text': ...}} records")
        for rec in data:
            text = rec.get("text") if isinstance(rec, dict) else rec
            if not isinstance(text, str):
                raise UserError(f"{p}: every entry needs a string text")
            texts.append(text)
    else:
        texts = [t.strip() for t in raw.split("\n\n")]
    texts = [t for t in texts if t.strip()]
    if not texts:
        raise UserError(f"{p} holds no text")
    return texts


def token_ids(tokenizer, texts: list[str]) -> list[int]:
    """The texts tokenized (no special tokens) and joined with EOS into one stream of ids."""
    eos = tokenizer.eos_token_id
    ids: list[int] = []
    for t in texts:
        ids.extend(tokenizer(t, add_special_tokens=False)["input_ids"])
        if eos is not None:
            ids.append(int(eos))
    return ids


def token_windows(tokenizer, texts: list[str], n_samples: int, seq_len: int, seed: int) -> list[torch.Tensor]:
    """``n_samples`` random windows of ``seq_len`` tokens, each a ``(1, seq_len)`` long tensor.

    The texts are tokenized and joined with EOS into one stream (GPTQ samples a random document and a
    random window in it; joining lets documents shorter than ``seq_len`` be used too).

    Raises:
        UserError: for ``n_samples < 1`` (an empty calibration set) or too little text.
    """
    if n_samples < 1:
        raise UserError(f"the calibration set is empty: calib_samples must be >= 1, got {n_samples}")
    if seq_len < 2:
        raise UserError(f"calibration sequences need at least 2 tokens, got seq_len={seq_len}")
    ids = token_ids(tokenizer, texts)
    if len(ids) < seq_len + 1:
        raise UserError(f"the calibration text has {len(ids)} tokens, fewer than one window of {seq_len}")
    stream = torch.tensor(ids, dtype=torch.long)
    rng = random.Random(seed)
    out = []
    for _ in range(n_samples):
        start = rng.randrange(0, len(ids) - seq_len + 1)
        window = stream[start : start + seq_len].clone()
        bos = tokenizer.bos_token_id
        if bos is not None:
            # NOTE: GPTQ's C4 windows start mid-document without BOS; llm-compressor tokenizes each
            # sample with its BOS. We start every window with BOS, as every sequence the model saw in
            # training did, so that the first position's activations are typical.
            window[0] = int(bos)
        out.append(window[None, :])
    return out
