"""Decode speed at a given context length, with some layers converted to DSLA.

Decode cost depends on shapes, not values, so :func:`decode_ms_per_token` does not prefill a real
context: it fills a transformers ``DynamicCache`` with random keys/values of ``context`` tokens for the
softmax-attention layers and random GLA states for the DSLA layers (``DSLACacheLayer``), then times
greedy single-token steps through the whole model. Both arms (full attention with its KV cache, and
any mix of converted layers) are timed the same way, in the same process.
"""

from __future__ import annotations

import statistics
import time

import torch
from torch import nn
from transformers import DynamicCache

from lmforge.methods.dsla.convert import attention_modules
from lmforge.methods.dsla.layer import DualStateLinearAttention, dsla_cache_layer


def filled_cache(model: nn.Module, context: int, seed: int = 0) -> DynamicCache:
    """A cache holding ``context`` tokens: random K/V per attention layer, random states per DSLA layer."""
    cfg = model.config
    gen = torch.Generator().manual_seed(seed)
    dtype = next(model.parameters()).dtype
    head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
    n_kv = cfg.num_key_value_heads
    cache = DynamicCache(config=cfg)
    for i, attn in enumerate(attention_modules(model)):
        if isinstance(attn, DualStateLinearAttention):
            shape = (1, attn.n_states, cfg.num_attention_heads, head_dim, head_dim)
            dsla_cache_layer(cache, i).advance(0.01 * torch.randn(shape, generator=gen).to(dtype), context)
        else:
            k = torch.randn(1, n_kv, context, head_dim, generator=gen).to(dtype)
            v = torch.randn(1, n_kv, context, head_dim, generator=gen).to(dtype)
            cache.update(k, v, i)
    return cache


@torch.no_grad()
def decode_ms_per_token(model: nn.Module, context: int, n_tokens: int = 16, warmup: int = 2, seed: int = 0) -> float:
    """Median milliseconds of one greedy decode step after ``context`` cached tokens."""
    model.eval()
    cache = filled_cache(model, context, seed)
    ids = torch.tensor([[int(model.config.bos_token_id or 1)]])
    times = []
    for step in range(warmup + n_tokens):
        pos = context + step
        t0 = time.perf_counter()
        out = model(input_ids=ids, past_key_values=cache, use_cache=True,
                    cache_position=torch.tensor([pos]), position_ids=torch.tensor([[pos]]))
        ids = out.logits[:, -1:].argmax(-1)
        dt = time.perf_counter() - t0
        if step >= warmup:
            times.append(dt)
    return 1e3 * statistics.median(times)
