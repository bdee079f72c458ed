"""Tests for lmforge.models.load: faithful loading of local causal LMs and one-line errors."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from lmforge.common.errors import UserError
from lmforge.models import load, resolve_spec

from .conftest import FAMILIES, save_tiny


def _error(spec, **kwargs) -> str:
    """Load ``spec`` expecting a UserError; return its (one-line) message."""
    with pytest.raises(UserError) as info:
        load(spec, **kwargs)
    msg = str(info.value)
    assert msg and "\n" not in msg, f"message is not one line: {msg!r}"
    return msg


# ---------------------------------------------------------------- faithful loading


@pytest.mark.parametrize("family", FAMILIES)
def test_load_matches_original_logits(tiny_models, family):
    folder, original = tiny_models[family]
    model, tok = load(str(folder))
    assert not model.training
    assert next(model.parameters()).dtype == torch.float32
    assert next(model.parameters()).device.type == "cpu"
    ids = tok(["hello world", "abc"], return_tensors="pt", padding=True)
    with torch.no_grad():
        got = model(**ids).logits
        want = original(**ids).logits
    torch.testing.assert_close(got, want, rtol=0, atol=0)
    assert model.config.model_type == family


def test_pad_token_defaults_to_eos(tiny_models):
    model, tok = load(tiny_models["llama"][0])  # a Path works too
    assert tok.pad_token == tok.eos_token == "</s>"
    assert tok.pad_token_id == 2
    assert model.generation_config.pad_token_id == 2


def test_dtype_and_attn_implementation(tiny_models):
    model, _ = load(tiny_models["qwen2"][0], dtype="bfloat16", attn_implementation="eager")
    assert next(model.parameters()).dtype == torch.bfloat16
    assert model.config._attn_implementation == "eager"
    model, _ = load(tiny_models["qwen2"][0], dtype=torch.float16)
    assert next(model.parameters()).dtype == torch.float16


def test_bad_dtype_and_device(tiny_models):
    assert "unknown dtype 'float7'" in _error(tiny_models["llama"][0], dtype="float7")
    assert "unknown device" in _error(tiny_models["llama"][0], device="toaster")


def test_resolve_spec_local(tiny_models):
    folder = tiny_models["gpt2"][0]
    assert resolve_spec(str(folder)) == folder


# ---------------------------------------------------------------- spec / folder errors


def test_missing_folder(tmp_path):
    missing = tmp_path / "nope"
    assert _error(str(missing)) == f"model folder '{missing}' does not exist"


def test_hub_id_is_not_downloaded():
    msg = _error("meta-llama/Llama-3-8B")
    assert "'meta-llama/Llama-3-8B'" in msg
    assert "only local folders or zoo:NAME" in msg
    assert "never downloads" in msg


def test_file_instead_of_folder(tmp_path):
    f = tmp_path / "model.safetensors"
    f.write_bytes(b"x")
    assert "is a file, not a model folder" in _error(f)


def test_empty_zoo_name():
    assert "empty zoo model name" in _error("zoo:")


def test_no_config(tmp_path):
    assert _error(tmp_path) == f"'{tmp_path}' has no config.json; is it a Hugging Face model folder?"


def test_unparsable_config(model_copy):
    folder = model_copy("llama")
    (folder / "config.json").write_text("{not json", encoding="utf-8")
    msg = _error(folder)
    assert msg.startswith(f"config.json in '{folder}' is not valid JSON")


def test_encoder_only_refused(tmp_path):
    from transformers import BertConfig

    BertConfig(vocab_size=32, hidden_size=16, num_hidden_layers=1, num_attention_heads=2, intermediate_size=32).save_pretrained(
        tmp_path
    )
    assert _error(tmp_path) == f"'{tmp_path}' holds a bert model, not a decoder-only causal LM"


def test_encoder_decoder_refused(tmp_path):
    from transformers import T5Config

    T5Config(vocab_size=32, d_model=16, d_ff=32, num_layers=1, num_heads=2, d_kv=8).save_pretrained(tmp_path)
    assert _error(tmp_path) == f"'{tmp_path}' holds a t5 model, not a decoder-only causal LM"


# ---------------------------------------------------------------- weights


def test_no_weights(model_copy):
    folder = model_copy("llama")
    (folder / "model.safetensors").unlink()
    assert "has no model weights" in _error(folder)


def test_truncated_safetensors(model_copy):
    folder = model_copy("llama")
    weights = folder / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])
    msg = _error(folder)
    assert msg.startswith(f"weights file '{weights}' is corrupt: ")
    assert len(msg) > len(f"weights file '{weights}' is corrupt: ")


def test_garbage_safetensors(model_copy):
    folder = model_copy("gpt2")
    weights = folder / "model.safetensors"
    weights.write_bytes(b"\x00" * 3)
    assert _error(folder).startswith(f"weights file '{weights}' is corrupt: ")


def test_weights_not_matching_config(model_copy):
    from safetensors.torch import load_file, save_file

    folder = model_copy("llama")
    sd = load_file(folder / "model.safetensors")
    sd.pop("model.norm.weight")
    save_file(sd, folder / "model.safetensors", metadata={"format": "pt"})
    msg = _error(folder)
    assert "do not match its config" in msg and "model.norm.weight" in msg


def test_pickle_refused_then_allowed(tmp_path):
    folder = tmp_path / "pickled"
    folder.mkdir()
    original = save_tiny(folder, "llama", safe_serialization=False)
    assert not list(folder.glob("*.safetensors"))
    assert _error(folder) == f"refusing to load pickle weights from '{folder}' (pass --allow-pickle to trust them)"
    model, tok = load(folder, allow_pickle=True)
    ids = tok("abc", return_tensors="pt")
    with torch.no_grad():
        torch.testing.assert_close(model(**ids).logits, original(**ids).logits, rtol=0, atol=0)


def test_other_pickle_names_refused(model_copy):
    folder = model_copy("llama")
    (folder / "model.safetensors").unlink()
    (folder / "weights.pt").write_bytes(b"not really")
    assert "refusing to load pickle weights" in _error(folder)
    assert "not under the name transformers loads" in _error(folder, allow_pickle=True)


def test_safetensors_preferred_over_pickle(model_copy, tiny_models):
    folder = model_copy("llama")
    (folder / "pytorch_model.bin").write_bytes(b"a pickle that must never be opened")
    model, tok = load(folder)  # no allow_pickle needed: safetensors exist
    ids = tok("abc", return_tensors="pt")
    with torch.no_grad():
        torch.testing.assert_close(model(**ids).logits, tiny_models["llama"][1](**ids).logits, rtol=0, atol=0)


# ---------------------------------------------------------------- tokenizer


def test_missing_tokenizer(model_copy):
    folder = model_copy("mistral")
    (folder / "tokenizer.json").unlink()
    (folder / "tokenizer_config.json").unlink()
    msg = _error(folder)
    assert msg.startswith(f"'{folder}' has no tokenizer")


def test_broken_tokenizer(model_copy):
    folder = model_copy("mistral")
    (folder / "tokenizer.json").write_text("{broken", encoding="utf-8")
    assert _error(folder).startswith(f"could not load the tokenizer in '{folder}'")


# ---------------------------------------------------------------- remote code


def _add_remote_code(folder: Path, marker: Path, model_type: str | None = None) -> None:
    """Point config.json's auto_map at a custom module that writes ``marker`` when imported."""
    code = textwrap.dedent(
        f"""
        from pathlib import Path
        Path({str(marker)!r}).write_text("imported")
        from transformers import LlamaConfig, LlamaForCausalLM

        class EvilConfig(LlamaConfig):
            model_type = {(model_type or "llama")!r}

        class EvilForCausalLM(LlamaForCausalLM):
            config_class = EvilConfig
        """
    )
    (folder / "evil.py").write_text(code, encoding="utf-8")
    cfg = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    cfg["auto_map"] = {"AutoConfig": "evil.EvilConfig", "AutoModelForCausalLM": "evil.EvilForCausalLM"}
    if model_type is not None:
        cfg["model_type"] = model_type
    (folder / "config.json").write_text(json.dumps(cfg), encoding="utf-8")


def test_remote_code_not_run_for_known_model_type(model_copy, tmp_path):
    folder = model_copy("llama")
    marker = tmp_path / "MARKER"
    _add_remote_code(folder, marker)
    try:
        model, _ = load(folder)
    except UserError as exc:
        assert "\n" not in str(exc)
    else:
        assert type(model).__name__ == "LlamaForCausalLM"
    assert not marker.exists()


def test_remote_code_not_run_for_custom_model_type(model_copy, tmp_path):
    folder = model_copy("llama")
    marker = tmp_path / "MARKER"
    _add_remote_code(folder, marker, model_type="evil_lm")
    msg = _error(folder)
    assert "needs custom model code" in msg and "--trust-remote-code" in msg
    assert not marker.exists()


def test_remote_code_runs_only_when_trusted(model_copy, tmp_path):
    """Positive control for the two tests above: with trust_remote_code the module *is* imported.

    Runs in a subprocess with a private HF_HOME so that the dynamic-module cache stays in tmp_path.
    """
    folder = model_copy("llama")
    marker = tmp_path / "MARKER"
    _add_remote_code(folder, marker, model_type="evil_lm")
    script = (
        "import sys\n"
        "from lmforge.models import load\n"
        "from lmforge.common.errors import UserError\n"
        "try:\n"
        "    load(sys.argv[1], trust_remote_code=True)\n"
        "except UserError as e:\n"
        "    print('UserError:', e)\n"
    )
    env = dict(os.environ, HF_HOME=str(tmp_path / "hf_home"), HF_MODULES_CACHE=str(tmp_path / "hf_modules"))
    proc = subprocess.run([sys.executable, "-c", script, str(folder)], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert marker.exists()
