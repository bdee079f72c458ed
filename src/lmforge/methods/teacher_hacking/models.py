"""Teacher and student LMs of the teacher-hacking setup: tiny Llamas over the oracle's token ids.

Tiapkin et al. (arXiv 2502.02671) distil T5-large into T5-base/small; here both are
``transformers.LlamaForCausalLM`` (the zoo's architecture, built from a ``LlamaConfig``) with the
oracle's vocabulary, so that sequence log-probs of teacher, student and oracle are of the same
token sequences. Sampling and scoring follow the oracle's conventions (:mod:`.oracle`): a response is
at most ``max_response_len`` symbols and EOS is forced after the cap, so every model defines a proper
distribution over the same finite set of responses as the oracle.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from lmforge.methods.teacher_hacking.oracle import EOS, SequenceBatch, response_mask


@dataclass(frozen=True)
class TinyShape:
    """Llama hyper-parameters of a tiny teacher or student."""

    hidden: int
    layers: int
    heads: int
    intermediate: int

    def __post_init__(self) -> None:
        if min(self.hidden, self.layers, self.heads, self.intermediate) < 1 or self.hidden % self.heads:
            raise ValueError("shape sizes must be >= 1 and hidden a multiple of heads")


def build_lm(shape: TinyShape, vocab_size: int, max_len: int, seed: int) -> LlamaForCausalLM:
    """A freshly initialised tiny Llama (zoo conventions: tied embeddings, init range 0.02)."""
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=shape.hidden, intermediate_size=shape.intermediate,
        num_hidden_layers=shape.layers, num_attention_heads=shape.heads, num_key_value_heads=shape.heads,
        max_position_embeddings=max_len, tie_word_embeddings=True, bos_token_id=EOS, eos_token_id=EOS,
        pad_token_id=EOS, initializer_range=0.02,
    )
    torch.manual_seed(seed)
    return LlamaForCausalLM(config)


def response_logits(model: LlamaForCausalLM, batch: SequenceBatch) -> torch.Tensor:
    """``[n, max_response_len + 1, vocab]`` logits predicting each response slot.

    The sequence fed is prompt + response without its last slot (the slot after the cap is forced EOS,
    so nothing predicts past it); the logits at prompt position ``P-1+t`` predict response slot ``t``.
    """
    p = batch.prompts.shape[1]
    ids = torch.cat([batch.prompts, batch.responses[:, :-1]], dim=1)
    return model(input_ids=ids).logits[:, p - 1:, :]


def token_log_probs_from_logits(logits: torch.Tensor, batch: SequenceBatch) -> torch.Tensor:
    """Per-slot log-probs of the batch's response tokens; 0 on padding and on the forced final EOS."""
    lp = torch.log_softmax(logits.float(), dim=-1).gather(-1, batch.responses[..., None]).squeeze(-1)
    lp = lp.clone()
    lp[:, -1] = 0.0  # slot max_response_len is EOS with probability 1 (the cap)
    return torch.where(batch.mask, lp, torch.zeros_like(lp))


@torch.no_grad()
def sequence_log_prob(model: LlamaForCausalLM, batch: SequenceBatch, chunk: int = 512) -> torch.Tensor:
    """``log q(response | prompt)`` per row, in chunks (float64)."""
    model.eval()
    out = []
    for i in range(0, len(batch), chunk):
        part = batch.index(slice(i, i + chunk))
        out.append(token_log_probs_from_logits(response_logits(model, part), part).sum(-1).double())
    return torch.cat(out)


@torch.no_grad()
def sample(model: LlamaForCausalLM, prompts: torch.Tensor, max_response_len: int, generator: torch.Generator,
           temperature: float = 1.0) -> SequenceBatch:
    """Ancestral samples (temperature 1 by default, as in the paper) with a KV cache; EOS forced after the cap."""
    model.eval()
    n = prompts.shape[0]
    out = torch.full((n, max_response_len + 1), EOS, dtype=torch.long)
    done = torch.zeros(n, dtype=torch.bool)
    step_ids, past = prompts, None
    for t in range(max_response_len):
        res = model(input_ids=step_ids, past_key_values=past, use_cache=True)
        past = res.past_key_values
        probs = torch.softmax(res.logits[:, -1, :].float() / temperature, dim=-1)
        tok = torch.multinomial(probs, 1, generator=generator).squeeze(-1)
        tok = torch.where(done, torch.full_like(tok, EOS), tok)
        out[:, t] = tok
        done |= tok == EOS
        if bool(done.all()):
            break
        step_ids = tok[:, None]
    return SequenceBatch(prompts, out, response_mask(out))


@torch.no_grad()
def sample_many(model: LlamaForCausalLM, prompts: torch.Tensor, max_response_len: int, generator: torch.Generator,
                chunk: int = 512) -> SequenceBatch:
    """:func:`sample` in chunks of ``chunk`` prompts."""
    return SequenceBatch.cat([sample(model, prompts[i:i + chunk], max_response_len, generator)
                              for i in range(0, prompts.shape[0], chunk)])


def nll_loss(model: LlamaForCausalLM, batch: SequenceBatch) -> torch.Tensor:
    """Mean token negative log-likelihood of the responses (SFT on oracle data)."""
    lp = token_log_probs_from_logits(response_logits(model, batch), batch)
    mask = batch.mask.clone()
    mask[:, -1] = False  # the forced EOS carries no loss
    return -(lp * mask).sum() / mask.sum().clamp_min(1)


def train_mle(model: LlamaForCausalLM, data: SequenceBatch, steps: int, batch_size: int, lr: float,
              generator: torch.Generator) -> list[float]:
    """Maximum-likelihood training (AdamW, constant LR) on a fixed set of oracle sequences, reshuffled per epoch."""
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    losses: list[float] = []
    order = torch.randperm(len(data), generator=generator)
    pos = 0
    model.train()
    for _ in range(steps):
        if pos + batch_size > len(data):
            order, pos = torch.randperm(len(data), generator=generator), 0
        idx = order[pos:pos + batch_size]
        pos += batch_size
        loss = nll_loss(model, data.index(idx))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    model.eval()
    return losses
