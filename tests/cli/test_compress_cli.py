"""``lmforge compress``: bad input is one line and exit status 2 with nothing written; a real run
writes a loadable model and a compression.json with the documented fields."""

from __future__ import annotations

import json

import pytest

from tests.cli.helpers import call




@pytest.fixture(scope="module")
def layerless_model(tmp_path_factory, zoo_tokenizer):
    """A causal LM with no decoder layers (nothing to compress), saved as a local HF folder."""
    from transformers import LlamaConfig, LlamaForCausalLM

    path = tmp_path_factory.mktemp("layerless")
    cfg = LlamaConfig(vocab_size=len(zoo_tokenizer), hidden_size=16, intermediate_size=32, num_hidden_layers=0,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64)
    LlamaForCausalLM(cfg).save_pretrained(path)
    zoo_tokenizer.save_pretrained(path)
    return path


@pytest.mark.parametrize(
    "args,needle",
    [
        (["gptq", "--bits", "9"], "bits"),
        (["gptq", "--bits", "1"], "bits"),
        (["wanda", "--sparsity", "1.0"], "sparsity"),
        (["sparsegpt", "--sparsity", "-0.5"], "sparsity"),
        (["sparsegpt", "--pattern", "4:4"], "N:M"),
        (["wanda", "--pattern", "3:2"], "N:M"),
        (["gptq", "--calib-samples", "0"], "calibration set is empty"),
        (["wanda", "--bits", "4"], "takes no --bits"),
        (["nosuch"], "unknown compression method"),
    ],
)
def test_bad_input_is_one_line_exit_2_nothing_written(monkeypatch, capsys, tmp_path, nano_dir, args, needle):
    out = tmp_path / "out"
    code, stdout, stderr = call(monkeypatch, capsys, "compress", *args, "--model", str(nano_dir), "--out", str(out))
    assert code == 2
    lines = [ln for ln in stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and needle in lines[0], stderr
    assert not out.exists()


def test_model_without_linear_layers(monkeypatch, capsys, tmp_path, layerless_model):
    out = tmp_path / "out"
    code, _, stderr = call(monkeypatch, capsys, "compress", "rtn", "--model", str(layerless_model), "--out", str(out))
    assert code == 2 and "no linear layers to compress" in stderr
    assert len(stderr.strip().splitlines()) == 1
    assert not out.exists()


def test_existing_out_needs_overwrite(monkeypatch, capsys, tmp_path, nano_dir):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("user data")
    code, _, stderr = call(monkeypatch, capsys, "compress", "rtn", "--model", str(nano_dir), "--out", str(out))
    assert code == 2 and "--overwrite" in stderr
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]


@pytest.mark.parametrize("method,flags", [("gptq", ["--bits", "4", "--group-size", "32"]), ("wanda", ["--pattern", "2:4"])])
def test_compress_writes_model_and_record(monkeypatch, capsys, tmp_path, nano_dir, method, flags):
    out = tmp_path / method
    code, stdout, stderr = call(monkeypatch, capsys, "compress", method, "--model", str(nano_dir), "--out", str(out),
                                "--calib-samples", "4", "--seq-len", "64", *flags, "--json")
    assert code == 0, stderr
    record = json.loads(stdout)
    assert record == json.loads((out / "compression.json").read_text())
    assert {"layers", "seconds", "bytes", "ppl_before", "ppl_after"} <= set(record)
    assert record["layers"] and all(set(layer) >= {"name", "rel_error"} for layer in record["layers"])
    assert all(0 <= layer["rel_error"] < 1 for layer in record["layers"])
    config = json.loads((out / "config.json").read_text())
    if method == "gptq":
        assert config["quantization_config"]["quant_method"] == "lmforge"
        # 4-bit codes + scales take well under a quarter of the fp32 bytes.
        assert record["bytes"] < record["bytes_dense_fp32"] / 4
    else:
        assert config["sparsity"]["pattern"] == "2:4"
        from lmforge.common.sparsity import NMPattern, is_nm
        from lmforge.models.load import load

        model, _ = load(str(out))
        for layer in model.model.layers:
            assert is_nm(layer.mlp.down_proj.weight.detach(), NMPattern(2, 4))


@pytest.mark.parametrize("method", ["gptq", "awq", "ganq", "rtn"])
def test_round_trip_logits_equal_in_memory_model(tmp_path, nano, method):
    """Save, load, and the logits equal the in-memory compressed model's (which runs from packed codes)."""
    import copy

    import torch

    from lmforge.compression import get_method, make_config, pack_model
    from lmforge.data.calibration import builtin_texts, token_windows
    from lmforge.models.load import load
    from lmforge.models.quantized import save_compressed

    model, tok = nano
    model = copy.deepcopy(model)
    calib = token_windows(tok, builtin_texts(0, 40), 4, 64, 0)
    flags = {"bits": 3} | ({"iters": 2} if method == "ganq" else {"group_size": 32})
    cfg = make_config(method, flags=flags)
    res = get_method(method).apply(model, calib, cfg, progress=False)
    assert pack_model(model, res) == len(res.layers)
    ids = torch.randint(4, len(tok), (2, 24), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        before = model(input_ids=ids).logits
    save_compressed(model, tok, tmp_path / "q", quant_config={"method": method, **{k: getattr(cfg, k) for k in ("bits",)}})
    loaded, _ = load(str(tmp_path / "q"))
    with torch.no_grad():
        after = loaded(input_ids=ids).logits
    assert torch.allclose(before, after, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize(
    "args,needle",
    [
        (["rtn", "--bits", "3"], "4- and 8-bit"),
        (["ganq", "--bits", "4"], "codebooks"),
        (["gptq", "--bits", "4", "--group-size", "32", "--set", "act_order=true"], "act-order"),
        (["gptq", "--bits", "4", "--group-size", "48"], "not a multiple"),
    ],
)
def test_unexportable_compressed_tensors_is_refused_before_any_work(monkeypatch, capsys, tmp_path, nano_dir, args, needle):
    out, ct = tmp_path / "q", tmp_path / "ct"
    code, _, stderr = call(monkeypatch, capsys, "compress", *args, "--model", str(nano_dir), "--out", str(out),
                           "--export-compressed-tensors", str(ct), "--calib-samples", "2", "--seq-len", "32")
    assert code == 2 and needle in stderr and len(stderr.strip().splitlines()) == 1, stderr
    assert not out.exists() and not ct.exists()


def test_out_and_export_must_differ(monkeypatch, capsys, tmp_path, nano_dir):
    out = tmp_path / "q"
    code, _, stderr = call(monkeypatch, capsys, "compress", "rtn", "--model", str(nano_dir), "--out", str(out),
                           "--export-compressed-tensors", str(out / "ct"))
    assert code == 2 and "separate folders" in stderr
    assert not out.exists()


def test_flags_override_recipe_and_set_overrides_flags(tmp_path):
    from lmforge.common.errors import UserError
    from lmforge.compression import make_config

    recipe = tmp_path / "r.yaml"
    recipe.write_text("bits: 4\ngroup_size: 64\nsym: true\n")
    cfg = make_config("gptq", recipe=recipe, flags={"bits": 3, "group_size": None})
    assert (cfg.bits, cfg.group_size, cfg.sym) == (3, 64, True)
    cfg = make_config("gptq", recipe=recipe, flags={"bits": 3}, overrides=["bits=8"])
    assert cfg.bits == 8
    assert make_config("wanda", overrides=["pattern=2:4"]).pattern == "2:4"  # not YAML's base-60 124
    with pytest.raises(UserError, match="not both"):
        make_config("wanda", flags={"sparsity": 0.5, "pattern": "2:4"})


def test_perplexity_report_dtype_and_cache(monkeypatch, tmp_path, nano_dir):
    """The report runs in --eval-dtype on a cast copy (the compressed float32 weights are never
    rounded), equals heldout_perplexity of that cast by hand, and the original's perplexity is read
    back from the cache on the next job with the same model, text and dtype, but measured again when a
    weight, the window or the dtype differs."""
    import copy

    import torch

    from lmforge import compression
    from lmforge.compression import CompressionJob, heldout_perplexity, make_config, run_compression
    from lmforge.models.load import load

    monkeypatch.setenv("LMFORGE_CACHE", str(tmp_path / "cache"))
    model, tok = load(str(nano_dir))
    evalf = tmp_path / "eval.txt"
    evalf.write_text(" ".join(f"Move block {i} onto block {i + 1}, then call done()." for i in range(60)))
    texts = compression.default_texts(CompressionJob(method="rtn", model=str(nano_dir), out=None, config=None,
                                                     eval_file=str(evalf)))[3]
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ppl16, _ = compression._report_perplexity(model, tok, texts, 64, 0, torch.bfloat16)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert next(model.parameters()).dtype == torch.float32
    want16, _ = heldout_perplexity(copy.deepcopy(model).to(torch.bfloat16), tok, texts, seq_len=64)
    want32, _ = heldout_perplexity(model, tok, texts, seq_len=64)
    assert ppl16 == want16 and ppl16 != want32

    calls = []
    real = compression._report_perplexity
    monkeypatch.setattr(compression, "_report_perplexity", lambda *a: calls.append(a[-1]) or real(*a))

    def job(**kw):
        base = dict(method="rtn", model=str(nano_dir), out=None, config=make_config("rtn", flags={"bits": 4}),
                    calib_samples=2, seq_len=64, progress=False, eval_dtype="float32", eval_file=str(evalf))
        return run_compression(CompressionJob(**{**base, **kw}))

    first = job()
    assert first["ppl_before"] == pytest.approx(want32) and first["ppl_before_cached"] is False
    assert first["ppl_dtype"] == "float32" and len(calls) == 2  # before and after
    second = job(config=make_config("rtn", flags={"bits": 3}))
    assert second["ppl_before_cached"] is True and second["ppl_before"] == first["ppl_before"]
    assert len(calls) == 3  # only the compressed model's
    assert job(eval_dtype="bfloat16")["ppl_before_cached"] is False
    assert job(seq_len=32)["ppl_before_cached"] is False
    key = compression._ppl_key(model, tok, texts, 64, 0, torch.float32)
    bumped = copy.deepcopy(model)
    with torch.no_grad():
        next(bumped.parameters()).view(-1)[0] += 1e-3
    assert compression._ppl_key(bumped, tok, texts, 64, 0, torch.float32) != key
    assert compression._ppl_key(model, tok, None, 64, 0, torch.float32) != compression._ppl_key(
        model, tok, None, 64, 1, torch.float32)  # the built-in records of another seed
    (tmp_path / "cache" / "ppl" / f"{key}.json").write_text("{not json")
    assert job()["ppl_before_cached"] is False  # a broken entry is measured again
    # ppl_after is measured on the dense dequantized weights before packing: the saved packed model
    # gives the same perplexity
    rec = job(method="gptq", config=make_config("gptq", flags={"bits": 3, "group_size": 32}), out=str(tmp_path / "q"))
    packed, _ = load(str(tmp_path / "q"))
    assert heldout_perplexity(packed, tok, texts, seq_len=64)[0] == pytest.approx(rec["ppl_after"], rel=1e-4)
