"""Tests for lmforge.models.quantized: packed checkpoints, pruned checkpoints, compressed-tensors export."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors import safe_open

from lmforge.common.calibration import get_decoder_layers, linear_modules
from lmforge.common.errors import UserError
from lmforge.common.qlinear import CodebookQuantLinear, UniformQuantLinear, swap_linear
from lmforge.common.quant import CodebookQuantized, UniformQuantized, quantize_rtn
from lmforge.models import load
from lmforge.models.quantized import (
    export_compressed_tensors,
    load_compressed,
    quantized_modules,
    save_compressed,
    save_pruned,
)

from .conftest import make_tokenizer

VOCAB = 32
IDS = torch.tensor([[1, 5, 9, 13, 17, 21, 25, 4], [1, 6, 7, 8, 3, 3, 3, 3]])


def tiny(family: str, seed: int = 0, tie: bool = False):
    """A random model with hidden size 128 (two 4-bit groups of 64 a row) and 2 layers."""
    from transformers import AutoModelForCausalLM, GPT2Config, LlamaConfig

    common = dict(vocab_size=VOCAB, bos_token_id=1, eos_token_id=2)
    if family == "gpt2":
        cfg = GPT2Config(n_embd=128, n_layer=2, n_head=4, n_positions=64, **common)
    else:
        cfg = LlamaConfig(
            hidden_size=128,
            intermediate_size=256,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
            max_position_embeddings=64,
            tie_word_embeddings=tie,
            **common,
        )
    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(cfg).eval()


def decoder_linears(model) -> dict[str, torch.nn.Module]:
    prefix = "transformer.h" if hasattr(model, "transformer") else "model.layers"
    return {
        f"{prefix}.{i}.{name}": m
        for i, layer in enumerate(get_decoder_layers(model))
        for name, m in linear_modules(layer).items()
    }


def dense_weight(module) -> torch.Tensor:
    """(out, in) weight of nn.Linear or GPT-2 Conv1D."""
    w = module.weight.detach()
    return w if isinstance(module, torch.nn.Linear) else w.t()


def quantize_all(model, *, bits=4, group_size=64, sym=False, codebook_at=None, overrides=None):
    """RTN every decoder linear in place; ``codebook_at`` gets a random GANQ-style codebook instead,
    ``overrides`` maps names to (bits, group_size, sym, act_order). Returns {name: quantized}."""
    qs = {}
    g = torch.Generator().manual_seed(0)
    for idx, (name, old) in enumerate(decoder_linears(model).items()):
        w = dense_weight(old)
        bias = None if old.bias is None else old.bias.detach()
        if idx == codebook_at:
            codes = torch.randint(0, 16, w.shape, generator=g, dtype=torch.uint8)
            table = torch.sort(torch.randn(w.shape[0], 16, generator=g) * w.std(), dim=1).values
            rows, cols, vals = torch.tensor([0, 2, 5]), torch.tensor([7, 1, 3]), torch.tensor([0.3, -0.2, 0.1])
            q = CodebookQuantized(codes, table, 4, rows, cols, vals)
            new = CodebookQuantLinear.from_quantized(q, bias)
        else:
            b, gs, s, act = (overrides or {}).get(name, (bits, group_size, sym, False))
            q = quantize_rtn(w, b, gs, s)
            if act:
                perm = torch.randperm(w.shape[1], generator=g)
                q = UniformQuantized(q.codes, q.scales, q.zeros, b, q.group_size, s, g_idx=q.group_index()[perm])
            new = UniformQuantLinear.from_quantized(q, bias)
        swap_linear(model, name, new)
        qs[name] = q
    return qs


def logits(model) -> torch.Tensor:
    mask = (IDS != 3).long()
    with torch.no_grad():
        return model(input_ids=IDS, attention_mask=mask).logits


def stored_bytes(folder: Path, prefixes) -> int:
    """Bytes of the safetensors tensors under the given module names (biases excluded)."""
    total = 0
    with safe_open(str(folder / "model.safetensors"), framework="pt") as fh:
        for key in fh.keys():
            module, _, leaf = key.rpartition(".")
            if module in prefixes and leaf != "bias":
                t = fh.get_tensor(key)
                total += t.numel() * t.element_size()
    return total


# ---------------------------------------------------------------- lmforge format round trip


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_save_load_round_trip(tmp_path, family):
    model = tiny(family, tie=(family == "llama"))
    names = list(decoder_linears(model))
    dense_bytes = {n: dense_weight(m).numel() * 4 for n, m in decoder_linears(model).items()}
    overrides = {names[2]: (3, 32, True, True)}  # a 3-bit act-order layer among 4-bit ones
    qs = quantize_all(model, group_size=64, codebook_at=1, overrides=overrides)
    want = logits(model)
    model.generation_config.max_new_tokens = 7  # saved generation settings must come back
    out = save_compressed(
        model,
        make_tokenizer(),
        tmp_path / "q",
        quant_config={"method": "rtn", "damp": 0.01},
        extra_files={"report.json": {"ok": 1}},
    )

    cfg = json.loads((out / "config.json").read_text())
    qc = cfg["quantization_config"]
    assert qc["quant_method"] == "lmforge" and qc["method"] == "rtn" and qc["damp"] == 0.01
    assert (qc["format"], qc["bits"], qc["group_size"], qc["sym"]) == ("mixed", 4, 64, False)
    assert qc["modules"] == {n: ("codebook" if i == 1 else "uniform") for i, n in enumerate(names)}
    assert qc["module_overrides"] == {names[2]: {"bits": 3, "group_size": 32, "sym": True}}
    assert cfg["model_type"] == family
    assert json.loads((out / "report.json").read_text()) == {"ok": 1}
    with safe_open(str(out / "model.safetensors"), framework="pt") as fh:
        keys = set(fh.keys())
        assert fh.get_tensor(f"{names[0]}.qweight").dtype == torch.int32
    assert {f"{names[1]}.codebook", f"{names[1]}.outlier_vals", f"{names[2]}.g_idx"} <= keys
    assert not any(k.startswith(names[0]) and k.endswith(".weight") for k in keys)

    loaded, tok = load(str(out))
    assert tok.pad_token is not None
    assert loaded.generation_config.max_new_tokens == 7
    assert set(quantized_modules(loaded)) == set(names)
    for i, name in enumerate(names):
        m = loaded.get_submodule(name)
        assert isinstance(m, CodebookQuantLinear if i == 1 else UniformQuantLinear)
        assert m.source_type == ("Conv1D" if family == "gpt2" else "Linear")
        assert torch.equal(m.dequantize_weight(), qs[name].dequantize())
    assert loaded.get_submodule(names[2]).bits == 3 and loaded.get_submodule(names[2]).g_idx is not None
    torch.testing.assert_close(logits(loaded), want, rtol=0, atol=1e-5)
    if family == "llama":  # tied lm_head: not stored, still tied after loading
        assert loaded.lm_head.weight is loaded.model.embed_tokens.weight
    # load_compressed is the same loader, and refuses a dense checkpoint
    again, _ = load_compressed(out)
    torch.testing.assert_close(logits(again), want, rtol=0, atol=1e-5)

    # 4-bit uniform layers take less than a sixth of their dense float32 bytes on disk
    uniform4 = [n for i, n in enumerate(names) if i not in (1, 2)]
    assert stored_bytes(out, set(uniform4)) < sum(dense_bytes[n] for n in uniform4) / 6


def test_all_uniform_format_and_bf16_load(tmp_path):
    model = tiny("llama")
    quantize_all(model, bits=4, group_size=64, sym=True)
    want = logits(model)
    out = save_compressed(model, make_tokenizer(), tmp_path / "q", quant_config={"method": "gptq"})
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert (qc["format"], qc["bits"], qc["group_size"], qc["sym"]) == ("uniform", 4, 64, True)
    assert qc["module_overrides"] == {} and "requested" not in qc
    loaded, _ = load(out, dtype="bfloat16")
    assert loaded.model.embed_tokens.weight.dtype == torch.bfloat16
    q0 = loaded.get_submodule("model.layers.0.self_attn.q_proj")
    assert q0.scales.dtype == torch.float32 and q0.qweight.dtype == torch.int32  # exact grid kept
    torch.testing.assert_close(logits(loaded).float(), want, rtol=0, atol=0.1)


def test_method_settings_that_differ_from_the_layers_are_kept_as_requested(tmp_path):
    model = tiny("llama")
    quantize_all(model, bits=4, group_size=0)  # per-channel layers
    cfg = {"method": "gptq", "bits": 4, "group_size": 1024, "damp": 0.01}  # 1024 > 128 inputs
    out = save_compressed(model, None, tmp_path / "q", quant_config=cfg)
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert (qc["bits"], qc["group_size"], qc["damp"]) == (4, 0, 0.01)
    assert qc["requested"] == {"group_size": 1024}


def test_load_compressed_refuses_dense(tiny_models):
    with pytest.raises(UserError, match="not an lmforge compressed checkpoint"):
        load_compressed(tiny_models["llama"][0])


def test_save_refuses_existing_dir_and_leaves_it(tmp_path):
    model = tiny("llama")
    quantize_all(model)
    out = tmp_path / "q"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    with pytest.raises(UserError, match="already exists"):
        save_compressed(model, make_tokenizer(), out, quant_config={"method": "rtn"})
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]
    assert (out / "keep.txt").read_text() == "mine"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["q"]  # no temp dir left behind
    save_compressed(model, make_tokenizer(), out, quant_config={"method": "rtn"}, overwrite=True)
    assert not (out / "keep.txt").exists() and (out / "model.safetensors").is_file()


def test_save_compressed_argument_errors(tmp_path):
    model = tiny("llama")
    with pytest.raises(UserError, match="no quantized layers"):
        save_compressed(model, None, tmp_path / "a", quant_config={"method": "rtn"})
    quantize_all(model)
    with pytest.raises(ValueError, match="'method'"):
        save_compressed(model, None, tmp_path / "a", quant_config={})
    with pytest.raises(ValueError, match="quant_method"):
        save_compressed(model, None, tmp_path / "a", quant_config={"method": "rtn", "quant_method": "gptq"})
    with pytest.raises(ValueError, match="plain file name"):
        save_compressed(model, None, tmp_path / "a", quant_config={"method": "rtn"}, extra_files={"../x.json": {}})
    assert not (tmp_path / "a").exists()


def _rewrite_config(folder: Path, edit) -> None:
    cfg = json.loads((folder / "config.json").read_text())
    edit(cfg["quantization_config"])
    (folder / "config.json").write_text(json.dumps(cfg))


def test_load_rejects_inconsistent_checkpoints(tmp_path):
    model = tiny("llama")
    quantize_all(model)
    out = save_compressed(model, make_tokenizer(), tmp_path / "q", quant_config={"method": "rtn"})
    name = "model.layers.0.self_attn.q_proj"

    def message(**kwargs) -> str:
        with pytest.raises(UserError) as info:
            load(out, **kwargs)
        assert "\n" not in str(info.value)
        return str(info.value)

    def drop(qc):
        del qc["modules"][name]

    def eight_bit(qc):
        qc["modules"][name] = "uniform"
        qc["bits"] = 8

    def unknown_module(qc):
        qc["bits"] = 4
        qc["modules"]["model.nope"] = "uniform"

    def unknown_kind(qc):
        del qc["modules"]["model.nope"]
        qc["modules"][name] = "ternary"

    _rewrite_config(out, drop)  # packed tensors with no place
    assert "unexpected tensors" in message() and name in message()
    _rewrite_config(out, eight_bit)
    assert "has shape" in message()  # 8-bit layers would need more words
    _rewrite_config(out, unknown_module)
    assert "model.nope" in message()
    _rewrite_config(out, unknown_kind)
    assert "unknown module kind 'ternary'" in message()
    (out / "model.safetensors").write_bytes(b"garbage")
    _rewrite_config(out, lambda qc: qc["modules"].update({name: "uniform"}))
    assert "corrupt" in message()


# ---------------------------------------------------------------- pruned models


def prune_24(model) -> dict[str, float]:
    """Magnitude 2:4 pruning of every decoder linear, in place; returns per-layer sparsity."""
    per_layer = {}
    with torch.no_grad():
        for name, m in decoder_linears(model).items():
            w = dense_weight(m)
            groups = w.reshape(w.shape[0], -1, 4)
            keep = groups.abs().topk(2, dim=-1).indices
            mask = torch.zeros_like(groups, dtype=torch.bool).scatter_(-1, keep, True)
            pruned = (groups * mask).reshape(w.shape)
            m.weight.copy_(pruned if isinstance(m, torch.nn.Linear) else pruned.t())
            per_layer[name] = float((pruned == 0).float().mean())
    return per_layer


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_save_pruned_dense_with_record(tmp_path, family):
    model = tiny(family)
    record = {"method": "magnitude", "sparsity": 0.5, "pattern": "2:4", "per_layer": prune_24(model)}
    out = save_pruned(model, make_tokenizer(), tmp_path / "p", sparsity_config=record)
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["sparsity"] == record and "quantization_config" not in cfg
    loaded, _ = load(out)
    torch.testing.assert_close(logits(loaded), logits(model), rtol=0, atol=0)


def test_save_pruned_checks_pattern_and_refuses_quantized(tmp_path):
    model = tiny("llama")
    names = list(decoder_linears(model))
    record = {"method": "magnitude", "sparsity": 0.5, "pattern": "2:4", "per_layer": {names[0]: 0.5}}
    with pytest.raises(UserError, match=f"'{names[0]}' is not 2:4 sparse"):
        save_pruned(model, None, tmp_path / "p", sparsity_config=record)
    with pytest.raises(ValueError, match="pattern"):
        save_pruned(model, None, tmp_path / "p", sparsity_config={"method": "wanda", "sparsity": 0.5})
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        save_pruned(model, None, tmp_path / "p", sparsity_config={**record, "sparsity": 1.5})
    # pattern None means unstructured (nothing to check)
    out = save_pruned(model, None, tmp_path / "u", sparsity_config={**record, "pattern": None})
    assert json.loads((out / "config.json").read_text())["sparsity"]["pattern"] == "unstructured"
    quantize_all(model)
    with pytest.raises(UserError, match="save_compressed"):
        save_pruned(model, None, tmp_path / "p", sparsity_config={**record, "per_layer": {}})
    assert not (tmp_path / "p").exists()


# ---------------------------------------------------------------- compressed-tensors export


def ct_decompress(folder: Path) -> dict[str, torch.Tensor]:
    """Dequantized weights of every compressed module, by compressed-tensors' own decompressor."""
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from transformers import CompressedTensorsConfig

    qc = json.loads((folder / "config.json").read_text())["quantization_config"]
    compressor = ModelCompressor.from_compression_config(CompressedTensorsConfig.from_dict(qc))
    groups = list(compressor.quantization_config.config_groups.values())
    weights = {}
    with safe_open(str(folder / "model.safetensors"), framework="pt") as fh:
        modules = {k.rpartition(".")[0] for k in fh.keys() if k.endswith(".weight_packed")}
        for name in modules:
            scheme = next(s for s in groups if s.targets == ["Linear"] or name in s.targets)
            local = {k[len(name) + 1 :]: fh.get_tensor(k) for k in fh.keys() if k.rpartition(".")[0] == name}
            weights[name] = PackedQuantizationCompressor.decompress(local, scheme)["weight"]
    return weights


@pytest.mark.parametrize(
    ("bits", "group_size", "sym"),
    [(4, 32, True), (4, 32, False), (8, 0, False), (4, 0, True)],
    ids=["w4g32sym", "w4g32asym", "w8ch-asym", "w4ch-sym"],
)
def test_export_compressed_tensors_decompresses_exactly(tmp_path, bits, group_size, sym):
    from transformers import AutoModelForCausalLM

    model = tiny("llama")
    qs = quantize_all(model, bits=bits, group_size=group_size, sym=sym)
    want = logits(model)
    out = export_compressed_tensors(model, make_tokenizer(), tmp_path / "ct")
    qc = json.loads((out / "config.json").read_text())["quantization_config"]
    assert qc["quant_method"] == "compressed-tensors" and qc["format"] == "pack-quantized"
    assert qc["quantization_status"] == "compressed" and qc["sparsity_config"] == {}
    assert qc["ignore"] == ["lm_head"]
    (scheme,) = qc["config_groups"].values()
    assert scheme["targets"] == ["Linear"] and scheme["format"] == "pack-quantized"
    w = scheme["weights"]
    assert (w["num_bits"], w["symmetric"], w["type"]) == (bits, sym, "int")
    assert (w["strategy"], w["group_size"]) == (("group", group_size) if group_size else ("channel", None))
    with safe_open(str(out / "model.safetensors"), framework="pt") as fh:
        keys = set(fh.keys())
    name = "model.layers.0.mlp.down_proj"
    assert f"{name}.weight_packed" in keys and f"{name}.weight" not in keys
    assert (f"{name}.weight_zero_point" in keys) == (not sym)

    # compressed-tensors' own decompressor gives back exactly lmforge's dequantized weights
    decompressed = ct_decompress(out)
    assert set(decompressed) == set(qs)
    for n, q in qs.items():
        assert torch.equal(decompressed[n], q.dequantize()), n
    # and transformers loads the checkpoint through its compressed-tensors quantizer on CPU
    ct_model = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    torch.testing.assert_close(logits(ct_model), want, rtol=0, atol=1e-5)
    for n, q in qs.items():
        assert torch.equal(ct_model.get_submodule(n).weight.detach(), q.dequantize()), n


def test_export_compressed_tensors_mixed_schemes(tmp_path):
    model = tiny("llama")
    names = list(decoder_linears(model))
    assert names[3].endswith("o_proj")  # not fused by vLLM, so it may have its own scheme
    qs = quantize_all(model, bits=4, group_size=32, sym=True, overrides={names[3]: (8, 0, False, False)})
    out = export_compressed_tensors(model, None, tmp_path / "ct")
    groups = json.loads((out / "config.json").read_text())["quantization_config"]["config_groups"]
    assert sorted(len(g["targets"]) for g in groups.values()) == [1, len(names) - 1]
    decompressed = ct_decompress(out)
    for n, q in qs.items():
        assert torch.equal(decompressed[n], q.dequantize()), n


def test_export_compressed_tensors_refusals(tmp_path):
    def refused(model) -> str:
        with pytest.raises(UserError) as info:
            export_compressed_tensors(model, None, tmp_path / "ct")
        assert not (tmp_path / "ct").exists()
        return str(info.value)

    model = tiny("llama")
    quantize_all(model, bits=3, group_size=32)
    assert "3-bit" in refused(model)
    model = tiny("llama")
    quantize_all(model, codebook_at=0)
    assert "codebook" in refused(model)
    model = tiny("llama")
    names = list(decoder_linears(model))
    quantize_all(model, bits=4, group_size=32, overrides={names[3]: (4, 32, False, True)})
    assert "act-order" in refused(model)
    model = tiny("llama")
    names = list(decoder_linears(model))
    quantize_all(model, bits=4, group_size=32, sym=True, overrides={names[0]: (8, 0, False, False)})
    assert "fused" in refused(model)  # q_proj 8-bit beside 4-bit k/v: vLLM cannot fuse them
    model = tiny("gpt2")
    quantize_all(model)
    assert "Conv1D" in refused(model)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_export_compressed_tensors_2of4_dense(tmp_path, family):
    from transformers import AutoModelForCausalLM

    model = tiny(family)
    record = {"method": "sparsegpt", "sparsity": 0.5, "pattern": "2:4", "per_layer": prune_24(model)}
    model.config.sparsity = record  # as a pruned model carries it; the export picks it up
    out = export_compressed_tensors(model, make_tokenizer(), tmp_path / "ct")
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["sparsity"] == record and "quantization_config" not in cfg
    reloaded = AutoModelForCausalLM.from_pretrained(str(out)).eval()
    for name, m in decoder_linears(model).items():
        w = dense_weight(reloaded.get_submodule(name))
        assert torch.equal(w, dense_weight(m)), name
        assert int((w.reshape(w.shape[0], -1, 4) != 0).sum(-1).max()) <= 2
    torch.testing.assert_close(logits(reloaded), logits(model), rtol=0, atol=0)
    # a claimed 2:4 pattern that the weights do not have is refused
    dense = tiny(family, seed=1)
    with pytest.raises(UserError, match="not 2:4 sparse"):
        export_compressed_tensors(dense, None, tmp_path / "ct2", sparsity_config=record)
    # without a record the dense model is still written (as the plain checkpoint it is)
    out = export_compressed_tensors(dense, None, tmp_path / "ct3")
    assert "sparsity" not in json.loads((out / "config.json").read_text())


def test_save_pruned_then_export_keeps_the_record(tmp_path):
    model = tiny("llama")
    record = {"method": "wanda", "sparsity": 0.5, "pattern": "2:4", "per_layer": prune_24(model)}
    save_pruned(model, None, tmp_path / "p", sparsity_config=record)
    assert model.config.sparsity == record
    out = export_compressed_tensors(model, None, tmp_path / "ct")
    assert json.loads((out / "config.json").read_text())["sparsity"] == record


def test_pruned_nm_check_uses_n_pruned_of_m(tmp_path, zoo_tokenizer):
    """1:4 (one pruned in every four) saves; a 3:4 claim on the same weights is refused."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from lmforge.common.errors import UserError
    from lmforge.common.sparsity import NMPattern, nm_mask
    from lmforge.models.quantized import save_pruned

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(zoo_tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
    model = LlamaForCausalLM(cfg)
    names = []
    with torch.no_grad():
        for name, mod in model.model.layers[0].named_modules():
            if isinstance(mod, torch.nn.Linear):
                mod.weight.masked_fill_(nm_mask(mod.weight.abs(), NMPattern(1, 4)), 0.0)
                names.append(f"model.layers.0.{name}")
    per_layer = {n: 0.25 for n in names}
    save_pruned(model, zoo_tokenizer, tmp_path / "ok", sparsity_config={"method": "magnitude", "sparsity": 0.25,
                                                                         "pattern": "1:4", "per_layer": per_layer})
    with pytest.raises(UserError, match="not 3:4 sparse"):
        save_pruned(model, zoo_tokenizer, tmp_path / "bad", sparsity_config={"method": "magnitude", "sparsity": 0.75,
                                                                              "pattern": "3:4", "per_layer": per_layer})
    assert not (tmp_path / "bad").exists()
    with pytest.raises(ValueError, match="plain file name"):
        save_pruned(model, zoo_tokenizer, tmp_path / "x", sparsity_config={"method": "m", "sparsity": 0.25,
                    "pattern": "1:4", "per_layer": per_layer}, extra_files={"config.json": {}})


def test_duplicate_outliers_are_refused():
    from lmforge.common.qlinear import CodebookQuantLinear
    from lmforge.common.quant import CodebookQuantized

    q = CodebookQuantized(codes=torch.zeros(2, 4, dtype=torch.uint8), codebook=torch.zeros(2, 4), bits=2,
                          outlier_rows=torch.tensor([0, 0]), outlier_cols=torch.tensor([1, 1]),
                          outlier_vals=torch.tensor([1.0, 2.0]))
    with pytest.raises(ValueError, match="duplicate"):
        CodebookQuantLinear.from_quantized(q)
