"""The issue's layer check: on a real layer of agent-small with its own calibration inputs, the
relative output error orders GANQ < GPTQ < RTN at 3 and 4 bits, and SparseGPT <= Wanda <= magnitude
at 50% sparsity (unstructured and 2:4)."""

from __future__ import annotations

import pytest
import torch

from lmforge.common.quant import quantize_rtn, relative_output_error
from lmforge.methods.ganq.config import GANQConfig
from lmforge.methods.ganq.core import ganq_quantize
from lmforge.methods.gptq.config import GPTQConfig
from lmforge.methods.gptq.core import gptq_quantize
from lmforge.methods.magnitude.config import MagnitudeConfig
from lmforge.methods.magnitude.core import magnitude_prune
from lmforge.methods.sparsegpt.config import SparseGPTConfig
from lmforge.methods.sparsegpt.core import sparsegpt_prune
from lmforge.methods.wanda.config import WandaConfig
from lmforge.methods.wanda.core import wanda_prune


@pytest.mark.parametrize("bits", [3, 4])
def test_quantizers_order_ganq_gptq_rtn(real_layer, bits):
    W, H = real_layer
    # Per-channel, as in the GANQ paper's main table (no groups).
    e_rtn = relative_output_error(W, quantize_rtn(W, bits, 0, sym=False).dequantize(), H)
    e_gptq = relative_output_error(W, gptq_quantize(W, H, GPTQConfig(bits=bits, group_size=0, sym=False)).dequantize(), H)
    e_ganq = relative_output_error(W, ganq_quantize(W, H, GANQConfig(bits=bits)).dequantize(), H)
    assert e_ganq < e_gptq < e_rtn, (e_ganq, e_gptq, e_rtn)


@pytest.mark.parametrize("pattern", [None, "2:4"])
def test_pruners_order_sparsegpt_wanda_magnitude(real_layer, pattern):
    W, H = real_layer
    norms = torch.diagonal(H).sqrt()
    w_sgpt, m_sgpt = sparsegpt_prune(W, H, SparseGPTConfig(sparsity=0.5, pattern=pattern))
    w_wanda, m_wanda = wanda_prune(W, norms, WandaConfig(sparsity=0.5, pattern=pattern))
    w_mag, m_mag = magnitude_prune(W, MagnitudeConfig(sparsity=0.5, pattern=pattern))
    for mask in (m_sgpt, m_wanda, m_mag):
        assert abs(mask.float().mean().item() - 0.5) < 1e-3
    e = [relative_output_error(W, w.double(), H) for w in (w_sgpt, w_wanda, w_mag)]
    assert e[0] <= e[1] <= e[2], e
