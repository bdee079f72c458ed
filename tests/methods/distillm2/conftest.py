"""Tiny teacher/student Llamas sharing a BPE tokenizer trained here (a fraction of a second)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch

SYMBOLS = "abcdefgh"


def make_tokenizer(extra: str = ""):
    from lmforge.models.tokenizer import train_tokenizer

    rng = random.Random(0)
    texts = [" ".join(rng.choice(SYMBOLS + extra) for _ in range(12)) for _ in range(100)]
    return train_tokenizer(texts, 300)


def make_llama(tok, hidden: int, layers: int, seed: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                      tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg).eval()


def prompts(n: int, seed: int = 1) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(SYMBOLS) for _ in range(rng.randint(2, 5))) for _ in range(n)]


@pytest.fixture(scope="session")
def tiny():
    """(teacher, student, tokenizer): 2x32 and 1x16 Llamas at random init, one tokenizer."""
    torch.set_num_threads(1)
    tok = make_tokenizer()
    return make_llama(tok, 32, 2, 0), make_llama(tok, 16, 1, 1), tok


@pytest.fixture(scope="session")
def tiny_dirs(tmp_path_factory: pytest.TempPathFactory, tiny) -> dict[str, Path]:
    """HF folders: teacher, student, a student with a different tokenizer, a student larger than the teacher."""
    teacher, student, tok = tiny
    root = tmp_path_factory.mktemp("distillm2-models")
    out = {}
    for name, model, t in (("teacher", teacher, tok), ("student", student, tok),
                           ("big", make_llama(tok, 64, 2, 3), tok)):
        model.save_pretrained(root / name)
        t.save_pretrained(root / name)
        out[name] = root / name
    other = make_tokenizer("xyz")
    odd = make_llama(other, 16, 1, 2)
    odd.save_pretrained(root / "other-tok")
    other.save_pretrained(root / "other-tok")
    out["other-tok"] = root / "other-tok"
    return out
