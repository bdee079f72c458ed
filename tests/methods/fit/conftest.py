"""A tokenizer fitted on the spurious-keyword suite and a tiny Llama, shared by the FIT tests."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from lmforge.data import spurious as sp
from lmforge.methods.fit.data import FieldSpec, build_fit_data

TASK = "Is the sentiment positive or negative?"
SPEC = FieldSpec(label="label", spurious_label="keyword_label", core_name=sp.CORE_NAME, spurious_name=None,
                 spurious_name_field="family", spurious_name_format="the {}")


@pytest.fixture(scope="session")
def fit_tok():
    from lmforge.models.tokenizer import train_tokenizer

    recs = sp.make_split("tok", 150, 0.5, tuple(sp.FAMILIES))
    return train_tokenizer([e["prompt"] + e["completion"] for e in build_fit_data(recs, TASK, SPEC, mode="all")], 600)


def tiny_model(tok, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    return LlamaForCausalLM(LlamaConfig(
        vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=2,
        num_key_value_heads=2, max_position_embeddings=128, tie_word_embeddings=True, bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id))


@pytest.fixture(scope="session")
def tiny_dir(fit_tok, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A saved tiny model folder (for the CLI)."""
    d = tmp_path_factory.mktemp("fit-tiny") / "model"
    m = tiny_model(fit_tok)
    m.save_pretrained(d)
    fit_tok.save_pretrained(d)
    return d
