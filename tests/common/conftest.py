"""Fixtures for the engine tests: tiny random causal LMs and a small byte-level BPE tokenizer."""

from __future__ import annotations

import os

import pytest
import torch

os.environ.setdefault("LMFORGE_NO_PROGRESS", "1")

FAMILIES = ("llama", "qwen2", "mistral", "gpt2")

CORPUS = [
    "the quick brown fox jumps over the lazy dog.",
    "a model predicts the next token from the tokens before it.",
    "we measure perplexity on held out text and report the mean.",
    "quantization maps weights to a small grid of values.",
    "pruning removes weights whose magnitude times activation is small.",
    "calibration data flows through each layer one at a time.",
    "the cat sat on the mat, and the dog sat on the log!",
    "numbers like 12, 345 and 6789 appear in text too?",
]


def make_tokenizer(*, with_pad: bool = True, vocab_size: int = 320):
    """A byte-level BPE trained on ``CORPUS``; BOS is added to every encoding (like Llama's tokenizer).

    The alphabet is restricted to the characters of the corpus, so every token decodes to printable
    ASCII (no partial UTF-8 bytes), which keeps stop-string tests exact.
    """
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>"] + (["<pad>"] if with_pad else [])
    backend = Tokenizer(models.BPE(unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=[], show_progress=False
    )
    backend.train_from_iterator(CORPUS, trainer=trainer)
    bos = backend.token_to_id("<s>")
    backend.post_processor = processors.TemplateProcessing(
        single="<s> $A", pair="<s> $A <s> $B", special_tokens=[("<s>", bos)]
    )
    kwargs = dict(unk_token="<unk>", bos_token="<s>", eos_token="</s>")
    if with_pad:
        kwargs["pad_token"] = "<pad>"
    return PreTrainedTokenizerFast(tokenizer_object=backend, **kwargs)


def make_model(
    family: str, tokenizer, *, seed: int = 0, layers: int = 2, attn: str = "eager", init: float = 0.2
):
    """A tiny random float32 model of ``family`` whose special ids match ``tokenizer``.

    ``init`` is a larger initializer range than the default 0.02, so that logits are spread out and
    greedy argmax is not decided by float rounding.
    """
    from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig, MistralConfig, Qwen2Config

    specials = dict(
        vocab_size=len(tokenizer),
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    if family == "gpt2":
        cfg = GPT2Config(
            n_embd=64, n_layer=layers, n_head=4, n_positions=256, initializer_range=init, **specials
        )
    else:
        cls = {"llama": LlamaConfig, "qwen2": Qwen2Config, "mistral": MistralConfig}[family]
        cfg = cls(
            hidden_size=64,
            intermediate_size=128,
            num_hidden_layers=layers,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=256,
            initializer_range=init,
            **specials,
        )
    cfg._attn_implementation = attn
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(cfg, attn_implementation=attn, dtype=torch.float32)
    return model.eval()


@pytest.fixture(scope="session")
def tokenizer():
    return make_tokenizer()


@pytest.fixture(scope="session")
def models(tokenizer):
    """``{family: model}``, built once per session; tests must not modify them."""
    return {fam: make_model(fam, tokenizer, seed=i) for i, fam in enumerate(FAMILIES)}
