"""The llm-compressor oracle on agent-small: grids, sparsity patterns, lm_head, a plain model back.

Besides checking the adapter, these tests pin the llm-compressor behaviour lmforge's own GPTQ,
SparseGPT and Wanda are matched against (so an llm-compressor upgrade that changes it fails here):

* GPTQ's grid is fixed before the sweep: per row-group min-max of the *original* weights, symmetric
  ``scale = max|w| / 7.5`` with codes in ``[-8, 7]`` (4 bits), asymmetric
  ``scale = (max - min) / 7``, ``zero = round(clamp(-4 - min / scale, -4, 3))`` (3 bits), where the
  range ``[min, max]`` is first widened to contain 0.
* SparseGPT's unstructured mask is chosen per 128-column block over all rows
  (``int(0.5 * numel) + 1`` zeros a block), so rows end up with different sparsities.
* Wanda's unstructured mask is per output row: exactly ``int(0.5 * in_features)`` zeros each.

Each test runs llm-compressor once on a fresh agent-small (16 x 128 calibration tokens): about 1 s
for GPTQ, SparseGPT and Wanda, 4 s for AWQ, plus about 5 s to import llm-compressor once.
"""

from __future__ import annotations

import math
import random

import pytest
import torch
from torch import nn

N_CALIB, SEQ = 16, 128


@pytest.fixture(scope="module")
def llmc():
    from lmforge.oracle import llmcompressor as oracle

    oracle.available()  # imports llmcompressor without letting it reconfigure loguru
    pytest.importorskip("llmcompressor")
    return oracle


def _token_rows(tok, seed: int, n: int, length: int) -> list[torch.Tensor]:
    from lmforge.data.text import paragraph

    rng = random.Random(seed)
    rows: list[torch.Tensor] = []
    while len(rows) < n:
        ids = tok(paragraph(rng, 40), add_special_tokens=False)["input_ids"]
        if len(ids) >= length:
            rows.append(torch.tensor([ids[:length]], dtype=torch.long))
    return rows


@pytest.fixture(scope="module")
def data():
    """Calibration ids (seed 0) and held-out texts (seed 1, 8 x 128 tokens)."""
    from lmforge.models.load import load

    _, tok = load("zoo:agent-small")
    calib = _token_rows(tok, 0, N_CALIB, SEQ)
    held = [tok.decode(r[0]) for r in _token_rows(tok, 1, 8, SEQ)]
    return calib, held


@pytest.fixture
def agent():
    from lmforge.models.load import load

    return load("zoo:agent-small")


def _ppl(model, tok, texts) -> float:
    from lmforge.common.scoring import perplexity

    return perplexity(model, tok, texts, max_length=SEQ, stride=SEQ).ppl


def _linears(model: nn.Module) -> dict[str, nn.Linear]:
    return {n: m for n, m in model.named_modules() if isinstance(m, nn.Linear) and not n.endswith("lm_head")}


def _snapshot(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _max_distinct_per_group(w: torch.Tensor, group: int) -> int:
    g = w.reshape(w.shape[0], -1, group).sort(dim=-1).values
    return int((1 + (g.diff(dim=-1) != 0).sum(-1)).max())


def _assert_plain(model: nn.Module, params_before: dict[str, nn.Parameter]) -> None:
    """No quantization state, wrappers, hooks or offloading left; same parameter objects; still tied."""
    for name, m in model.named_modules():
        assert not hasattr(m, "quantization_scheme"), name
        assert not hasattr(m, "weight_scale"), name
        assert "forward" not in m.__dict__, name
        assert not (m._forward_hooks or m._forward_pre_hooks), name
        assert type(m._parameters) is dict, name
    assert dict(model.named_parameters(remove_duplicate=False)).keys() == params_before.keys()
    for name, p in model.named_parameters(remove_duplicate=False):
        assert p is params_before[name], name
    assert model.lm_head.weight is model.model.embed_tokens.weight


def _assert_lm_head_kept(model: nn.Module, before: dict[str, torch.Tensor]) -> None:
    assert torch.equal(model.lm_head.weight, before["lm_head.weight"])
    assert torch.equal(model.model.embed_tokens.weight, before["model.embed_tokens.weight"])


def test_rejects_bad_arguments(llmc, agent, data):
    model, tok = agent
    calib, _ = data
    with pytest.raises(ValueError, match="method"):
        llmc.run_llmcompressor(model, tok, "rtn", calib)
    with pytest.raises(ValueError, match="pattern"):
        llmc.run_llmcompressor(model, tok, "wanda", calib, pattern="2-4")
    with pytest.raises(ValueError, match="token ids"):
        llmc.run_llmcompressor(model, tok, "gptq", [torch.zeros(1, 8)])
    with pytest.raises(ValueError, match="group_size=128"):  # 128 does not divide hidden size 192
        llmc.run_llmcompressor(model, tok, "gptq", calib, group_size=128)


def test_gptq_w4_g32(llmc, agent, data):
    model, tok = agent
    calib, held = data
    before = _snapshot(model)
    params = dict(model.named_parameters(remove_duplicate=False))
    ppl0 = _ppl(model, tok, held)

    out = llmc.run_llmcompressor(model, tok, "gptq", calib, bits=4, group_size=32)

    assert out is model
    _assert_plain(model, params)
    _assert_lm_head_kept(model, before)
    for name, lin in _linears(model).items():
        w, w0 = lin.weight.detach(), before[f"{name}.weight"]
        assert not torch.equal(w, w0), name
        assert _max_distinct_per_group(w, 32) <= 16, name
        # the grid: symmetric min-max of the original weights, scale = max|w0| / 7.5, codes in [-8, 7]
        scale = w0.reshape(w0.shape[0], -1, 32).abs().amax(-1, keepdim=True) / 7.5
        codes = w.reshape(scale.shape[0], -1, 32) / scale
        assert (codes - codes.round()).abs().max() < 1e-3, name
        assert codes.round().min() >= -8 and codes.round().max() <= 7, name
    # other parameters (norms) untouched
    quantized = {f"{n}.weight" for n in _linears(model)}
    for key, value in model.state_dict().items():
        if key not in quantized:
            assert torch.equal(value, before[key]), key
    ppl1 = _ppl(model, tok, held)
    # W4 g32 is almost lossless on agent-small (measured 6.565 -> 6.557): finite, changed, close
    assert math.isfinite(ppl1) and ppl1 != ppl0
    assert abs(ppl1 / ppl0 - 1) < 0.05


def test_gptq_w3_asym_per_channel_actorder(llmc, agent, data):
    model, tok = agent
    calib, held = data
    before = _snapshot(model)

    llmc.run_llmcompressor(model, tok, "gptq", calib, bits=3, group_size=-1, sym=False, actorder=True)

    _assert_lm_head_kept(model, before)
    for name, lin in _linears(model).items():
        w, w0 = lin.weight.detach(), before[f"{name}.weight"]
        # asymmetric min-max grid of each original row (range widened to contain 0), codes in [-4, 3]
        lo = w0.amin(1, keepdim=True).clamp(max=0)
        hi = w0.amax(1, keepdim=True).clamp(min=0)
        scale = (hi - lo) / 7
        zero = torch.clamp(-4 - lo / scale, -4, 3).round()
        codes = w / scale + zero
        assert (codes - codes.round()).abs().max() < 1e-3, name
        assert codes.round().min() >= -4 and codes.round().max() <= 3, name
        assert int((1 + (w.sort(1).values.diff(dim=1) != 0).sum(1)).max()) <= 8, name
    assert math.isfinite(_ppl(model, tok, held))


def test_sparsegpt_unstructured(llmc, agent, data):
    model, tok = agent
    calib, held = data
    before = _snapshot(model)
    params = dict(model.named_parameters(remove_duplicate=False))

    llmc.run_llmcompressor(model, tok, "sparsegpt", calib, sparsity=0.5)

    _assert_plain(model, params)
    _assert_lm_head_kept(model, before)
    for name, lin in _linears(model).items():
        zero = lin.weight.detach() == 0
        frac = zero.float().mean().item()
        assert 0.5 <= frac < 0.5 + 2e-3, (name, frac)
        # the mask is chosen per 128-column block across all rows: int(numel / 2) + 1 zeros a block
        for i in range(0, zero.shape[1], 128):
            block = zero[:, i : i + 128]
            expected = int(block.numel() * 0.5) + 1
            assert expected <= block.sum().item() <= expected + 2, (name, i)
        assert not torch.equal(lin.weight.detach(), before[f"{name}.weight"])
    assert math.isfinite(_ppl(model, tok, held))


def test_wanda_unstructured(llmc, agent, data, tmp_path, monkeypatch):
    model, tok = agent
    calib, held = data
    before = _snapshot(model)
    params = dict(model.named_parameters(remove_duplicate=False))
    monkeypatch.chdir(tmp_path)

    llmc.run_llmcompressor(model, tok, "wanda", calib, sparsity=0.5)

    assert list(tmp_path.iterdir()) == []  # nothing written to the working directory
    _assert_plain(model, params)
    _assert_lm_head_kept(model, before)
    for name, lin in _linears(model).items():
        w, w0 = lin.weight.detach(), before[f"{name}.weight"]
        per_row = (w == 0).sum(1)
        # the mask is per output row: exactly int(0.5 * in_features) zeros in every row
        assert torch.all(per_row == int(0.5 * w.shape[1])), name
        # Wanda only masks, it does not update the kept weights
        kept = w != 0
        assert torch.equal(w[kept], w0[kept]), name
    assert math.isfinite(_ppl(model, tok, held))


@pytest.mark.parametrize("method", ["sparsegpt", "wanda"])
def test_two_four(llmc, agent, data, method):
    model, tok = agent
    calib, held = data
    before = _snapshot(model)

    llmc.run_llmcompressor(model, tok, method, calib, pattern="2:4")

    _assert_lm_head_kept(model, before)
    for name, lin in _linears(model).items():
        w = lin.weight.detach()
        zeros_per_4 = (w.reshape(w.shape[0], -1, 4) == 0).sum(-1)
        assert torch.all(zeros_per_4 >= 2), name
        assert (w == 0).float().mean().item() == pytest.approx(0.5, abs=1e-3), name
    assert math.isfinite(_ppl(model, tok, held))


def test_awq_w4_g32(llmc, agent, data):
    model, tok = agent
    calib, held = data
    before = _snapshot(model)
    params = dict(model.named_parameters(remove_duplicate=False))

    llmc.run_llmcompressor(model, tok, "awq", calib, bits=4, group_size=32)

    _assert_plain(model, params)
    _assert_lm_head_kept(model, before)
    for name, lin in _linears(model).items():
        assert _max_distinct_per_group(lin.weight.detach(), 32) <= 16, name
        assert not torch.equal(lin.weight.detach(), before[f"{name}.weight"]), name
    # the smoothing scales land in the RMSNorms (q/k/v and gate/up mappings)
    for i, layer in enumerate(model.model.layers):
        for norm in ("input_layernorm", "post_attention_layernorm"):
            key = f"model.layers.{i}.{norm}.weight"
            assert not torch.equal(getattr(layer, norm).weight, before[key]), key
    assert math.isfinite(_ppl(model, tok, held))
