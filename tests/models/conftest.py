"""Fixtures for the model-loading tests: tiny random causal LMs saved to disk with an offline tokenizer."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
import torch

FAMILIES = ("llama", "qwen2", "mistral", "gpt2")

# A character-level vocabulary: 3 specials + a-z + space. No pad token on purpose.
_SPECIALS = ["<unk>", "<s>", "</s>"]
_CHARS = [chr(ord("a") + i) for i in range(26)] + [" "]
VOCAB_SIZE = 32  # >= len(_SPECIALS) + len(_CHARS)


def make_tokenizer():
    """A tiny fast tokenizer built offline with the `tokenizers` library (one token per character)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {tok: i for i, tok in enumerate(_SPECIALS + _CHARS)}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def make_config(family: str):
    """A tiny config of ``family`` (2 layers, hidden size 32)."""
    from transformers import GPT2Config, LlamaConfig, MistralConfig, Qwen2Config

    common = dict(vocab_size=VOCAB_SIZE, bos_token_id=1, eos_token_id=2)
    if family == "gpt2":
        return GPT2Config(n_embd=32, n_layer=2, n_head=4, n_positions=64, **common)
    decoder = dict(
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        **common,
    )
    cls = {"llama": LlamaConfig, "qwen2": Qwen2Config, "mistral": MistralConfig}[family]
    return cls(**decoder)


def save_tiny(folder: Path, family: str, seed: int = 0, *, safe_serialization: bool = True):
    """Save a tiny random model of ``family`` and the tokenizer into ``folder``; return the model."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(make_config(family)).eval()
    if safe_serialization:
        model.save_pretrained(folder)
    else:
        # transformers 5 always writes safetensors; write the pickle format by hand.
        model.config.save_pretrained(folder)
        torch.save(model.state_dict(), folder / "pytorch_model.bin")
    make_tokenizer().save_pretrained(folder)
    return model


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory) -> dict[str, tuple[Path, torch.nn.Module]]:
    """One saved tiny model per family: ``{family: (folder, original model)}``. Do not modify the folders."""
    root = tmp_path_factory.mktemp("tiny_models")
    out = {}
    for i, family in enumerate(FAMILIES):
        folder = root / family
        folder.mkdir()
        out[family] = (folder, save_tiny(folder, family, seed=i))
    return out


@pytest.fixture
def model_copy(tiny_models, tmp_path) -> Callable[[str], Path]:
    """Copy a saved tiny model into ``tmp_path`` so that a test may break it."""

    def copy(family: str = "llama") -> Path:
        dst = tmp_path / f"{family}-copy"
        shutil.copytree(tiny_models[family][0], dst)
        return dst

    return copy
