"""lmforge's cache saves print no transformers progress bar (a stray bar breaks one-line errors)."""

from transformers import LlamaConfig, LlamaForCausalLM
from transformers.utils import logging as hf_logging

from lmforge.common.progress import save_pretrained_quietly


def _tiny() -> LlamaForCausalLM:
    cfg = LlamaConfig(vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=16)
    return LlamaForCausalLM(cfg)


def test_plain_save_prints_the_bar_and_the_quiet_one_does_not(tmp_path, capfd):
    hf_logging.enable_progress_bar()
    model = _tiny()
    model.save_pretrained(tmp_path / "plain")
    assert "Writing model shards" in capfd.readouterr().err  # the behaviour the helper exists for
    save_pretrained_quietly(model, tmp_path / "quiet")
    assert "Writing model shards" not in capfd.readouterr().err
    assert (tmp_path / "quiet" / "model.safetensors").exists()
    assert hf_logging.is_progress_bar_enabled()  # restored afterwards


def test_quiet_save_keeps_a_disabled_bar_disabled(tmp_path):
    hf_logging.disable_progress_bar()
    try:
        save_pretrained_quietly(_tiny(), tmp_path / "m")
        assert not hf_logging.is_progress_bar_enabled()
    finally:
        hf_logging.enable_progress_bar()
