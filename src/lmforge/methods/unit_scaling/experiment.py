"""Tiny char-LM experiments for µnit Scaling: a seeded corpus, model builders and a training loop.

Used by ``lmforge reproduce unit-scaling`` and the tests. The corpus is the grammar English of
:mod:`lmforge.data.text` (the zoo's language-modelling data), tokenized by characters, so a 4-layer
model of width 64-256 learns it within a few hundred steps on one CPU thread.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

import torch
from torch import nn
from transformers import LlamaConfig

from lmforge.data.text import paragraph
from lmforge.methods.unit_scaling.config import MuSConfig
from lmforge.methods.unit_scaling.fp8 import FP8Counters
from lmforge.methods.unit_scaling.model import build_mus, build_sp, simulate_fp8_casts
from lmforge.methods.unit_scaling.optim import Lion, cosine_schedule, mus_param_groups


@dataclass
class CharCorpus:
    """Train and held-out id streams of a char-tokenized grammar corpus."""

    vocab: list[str]
    train: torch.Tensor
    heldout: torch.Tensor

    @property
    def vocab_size(self) -> int:
        return len(self.vocab)


def char_corpus(seed: int = 0, n_paragraphs: int = 1500) -> CharCorpus:
    """A seeded corpus: ``n_paragraphs`` grammar paragraphs for training, a tenth as many held out."""
    rng = random.Random(seed)
    train_text = "\n".join(paragraph(rng, rng.randint(3, 8)) for _ in range(n_paragraphs))
    held_text = "\n".join(paragraph(rng, rng.randint(3, 8)) for _ in range(max(n_paragraphs // 10, 20)))
    vocab = sorted(set(train_text) | set(held_text))
    idx = {c: i for i, c in enumerate(vocab)}
    enc = lambda s: torch.tensor([idx[c] for c in s], dtype=torch.long)  # noqa: E731
    return CharCorpus(vocab, enc(train_text), enc(held_text))


def batches(stream: torch.Tensor, batch: int, seq: int, n: int, seed: int) -> list[torch.Tensor]:
    """``n`` seeded batches of random windows ``(batch, seq)``."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        starts = torch.randint(0, len(stream) - seq, (batch,), generator=g)
        out.append(torch.stack([stream[s:s + seq] for s in starts.tolist()]))
    return out


def llama_config(width: int, vocab: int, layers: int = 4, seq: int = 64) -> LlamaConfig:
    """The tiny Llama shape: head dim 16, FFN 4x width."""
    return LlamaConfig(hidden_size=width, num_hidden_layers=layers, num_attention_heads=max(width // 16, 1),
                       num_key_value_heads=max(width // 16, 1), intermediate_size=4 * width, vocab_size=vocab,
                       max_position_embeddings=max(seq, 128), tie_word_embeddings=False)


@dataclass
class RunResult:
    """One training run: per-step training losses, the held-out loss, and FP8 counters if any."""

    losses: list[float]
    heldout: float
    counters: dict[str, dict[str, float]] = field(default_factory=dict)


@torch.no_grad()
def heldout_loss(model: nn.Module, eval_batches: list[torch.Tensor]) -> float:
    """Mean loss over ``eval_batches``."""
    model.eval()
    tot = sum(float(model(input_ids=b, labels=b).loss) for b in eval_batches)
    model.train()
    return tot / len(eval_batches)


def train_run(kind: str, width: int, corpus: CharCorpus, lr: float, steps: int, *, fp8: bool = False,
              tau: float = 0.4, weight_decay: float = 0.0, batch: int = 8, seq: int = 64, seed: int = 0,
              count: bool = False, eval_batches: int = 8, d_base: int = 64, grad_scale: bool = False) -> RunResult:
    """Train a 4-layer ``kind`` ("mus" or "sp") model with Lion + cosine-to-10% and return its losses.

    For ``"mus"``, ``lr`` is η (hidden layers get η·sqrt(d_base/d)); for ``"sp"`` it is the single LR
    of every parameter (SP has no width rule). The SP model is µS's in every part but the
    parametrization (:class:`~lmforge.methods.unit_scaling.model.SPForCausalLM`). ``fp8`` runs the
    hidden linears through the static casts (``grad_scale``: with the static gradient scale,
    ``MuSConfig.fp8_grad_scale``); ``count`` records their underflow/overflow rates (slower).
    """
    cfg = llama_config(width, corpus.vocab_size, seq=seq)
    if kind == "mus":
        mus = MuSConfig(tau=tau, d_base=d_base, lr=lr, weight_decay=weight_decay, fp8_grad_scale=grad_scale)
        model: nn.Module = build_mus(cfg, mus, seed=seed)
        counters = None
        if fp8:
            from lmforge.methods.unit_scaling.apply import enable_fp8

            counters = enable_fp8(model)
            counters.enabled = count
        opt = Lion(mus_param_groups(model, mus, lr, weight_decay), lr=lr, betas=mus.betas,
                   weight_decay=weight_decay)
    elif kind == "sp":
        model = build_sp(cfg, seed=seed, mus=MuSConfig(fp8_grad_scale=grad_scale))
        counters = simulate_fp8_casts(model, FP8Counters(enabled=count)) if fp8 else None
        opt = Lion(model.parameters(), lr=lr, weight_decay=weight_decay)
    else:
        raise ValueError(f"unknown model kind {kind!r}")
    sched = cosine_schedule(opt, steps, 0.1)
    train = batches(corpus.train, batch, seq, steps, seed + 1)
    held = batches(corpus.heldout, batch, seq, eval_batches, 12345)
    losses: list[float] = []
    for b in train:
        loss = model(input_ids=b, labels=b).loss
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        losses.append(float(loss.detach()))
        if not torch.isfinite(loss):
            break
    if counters is not None:
        counters.enabled = False
    h = heldout_loss(model, held) if all(map(_finite, losses)) else float("nan")
    rates = {}
    if counters is not None and count:
        rates = {k: counters.rates(k) for k in ("activation", "weight", "gradient")}
    return RunResult(losses, h, rates)


def _finite(x: float) -> bool:
    return x == x and abs(x) != float("inf")
