"""A tiny SFT model for the synthetic max-digit preference task (``lmforge.data.preferences``).

A Llama trained from scratch, in seconds, on the task's SFT data (prompts answered by a random
prompt digit), so that it knows the answer format and the candidate set but not the rule: its
preference between the correct digit and another prompt digit is at chance, and DPO has a rule to
teach. Recipe from ``shared/papers/zoo-learnability.md``: fp32, digits as single tokens (the zoo
tokenizer), loss on the answer only, AdamW with warm-up and cosine decay.
"""

from __future__ import annotations

import random
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from lmforge.data.preferences import RULES, max_digit_sft, max_digit_texts
from lmforge.methods.selective_dpo.core import lr_factor
from lmforge.models.tokenizer import train_tokenizer
from lmforge.models.zoo import collate, encode_pair


def toy_tokenizer() -> Any:
    """The zoo's digit-splitting BPE trained on the task's vocabulary (a few dozen tokens)."""
    return train_tokenizer(max_digit_texts(), 300)


def build_sft_model(seed: int = 0, hidden: int = 64, layers: int = 2, steps: int = 300, batch: int = 64,
                    lr: float = 3e-3, n_digits: int = 5,
                    rules: tuple[str, ...] = RULES, p_correct: float = 0.0) -> tuple[LlamaForCausalLM, Any]:
    """Train the toy SFT model from scratch.

    Returns:
        ``(model, tokenizer)``, model in eval mode.
    """
    tok = toy_tokenizer()
    config = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=4,
                         max_position_embeddings=64, tie_word_embeddings=True, bos_token_id=tok.bos_token_id,
                         eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    data = max_digit_sft(steps * batch, seed, n_digits=n_digits, rules=rules, p_correct=p_correct)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: max(0.1, lr_factor(s, steps, steps // 10)))
    model.train()
    for step in range(steps):
        rows = data[step * batch:(step + 1) * batch]
        b = collate([encode_pair(tok, p, a) for p, a in rows], tok.pad_token_id)
        loss = model(**b).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
    model.eval()
    return model, tok


def answer_accuracy(model: torch.nn.Module, tok: Any, records: list[dict[str, Any]]) -> float:
    """Share of prompts whose greedy first answer token is the correct answer's (the task's
    generation metric, beside the preference accuracy)."""
    prompts = [tok(r["prompt"]).input_ids for r in records]
    targets = [tok(r["answer"], add_special_tokens=False).input_ids[0] for r in records]
    width = max(len(p) for p in prompts)
    # Left-pad so the next-token logits of every row sit at the last position.
    ids = torch.full((len(prompts), width), tok.pad_token_id)
    mask = torch.zeros_like(ids)
    for i, p in enumerate(prompts):
        ids[i, width - len(p):] = torch.tensor(p)
        mask[i, width - len(p):] = 1
    pos = (mask.cumsum(-1) - 1).clamp(min=0)
    with torch.no_grad():
        logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits[:, -1]
    return float((logits.argmax(-1) == torch.tensor(targets)).float().mean())


def shuffled(records: list[dict[str, Any]], seed: int) -> list[dict[str, Any]]:
    """A seeded shuffle (the baseline's random sampler order)."""
    out = list(records)
    random.Random(seed).shuffle(out)
    return out
