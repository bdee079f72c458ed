"""The layer profiler on a stack with one deliberately heavy layer.

Light layers are ``Linear(d, d)`` (``2·n·d²`` forward FLOPs); the heavy one is
``Linear(d, 4d) → Linear(4d, d)`` (``16·n·d²``, 8x). Its forward and backward must time at least 2x a
light layer's (a margin timer noise does not cross at these sizes), and the byte counts are closed
forms: every output is ``n·d`` float32; a light layer saves its input (``n·d·4``), the heavy one its
input and the hidden ``[n, 4d]`` (``5·n·d·4``).
"""

from __future__ import annotations

import statistics

import torch
from torch import nn

from lmforge.methods.omnibal.profile import LayerProfile, profile_layers

torch.set_num_threads(1)


def test_heavy_layer_profiles_heavier() -> None:
    n, d = 512, 256
    torch.manual_seed(0)
    heavy = nn.Sequential(nn.Linear(d, 4 * d), nn.Linear(4 * d, d))
    layers = [nn.Linear(d, d), nn.Linear(d, d), heavy, nn.Linear(d, d)]
    prof = profile_layers(layers, torch.randn(n, d), repeats=7, warmup=1)
    assert isinstance(prof, LayerProfile)
    assert len(prof.fwd_s) == len(prof.bwd_s) == len(prof.act_bytes) == len(prof.out_bytes) == 4
    # measured heavy/light (light = median of the three light layers), 20 runs each: >= 7.4 alone with
    # 1 or 2 threads; >= 2.6 with three such runs sharing 2 cores (5 threads)
    light_f = statistics.median(prof.fwd_s[i] for i in (0, 1, 3))
    light_b = statistics.median(prof.bwd_s[i] for i in (0, 1, 3))
    assert prof.fwd_s[2] >= 2 * light_f, prof.fwd_s
    assert prof.bwd_s[2] >= 2 * light_b, prof.bwd_s
    assert all(t > 0 for t in prof.fwd_s + prof.bwd_s)
    assert prof.out_bytes == [n * d * 4] * 4
    assert prof.act_bytes == [n * d * 4, n * d * 4, 5 * n * d * 4, n * d * 4]


def test_profile_feeds_outputs_forward() -> None:
    """Layer i's input is layer i-1's output: a widening stack changes the byte counts downstream."""
    n = 3
    layers = [nn.Linear(4, 8), nn.Tanh(), nn.Linear(8, 2)]
    prof = profile_layers(layers, torch.randn(n, 4), repeats=1, warmup=0)
    assert prof.out_bytes == [n * 8 * 4, n * 8 * 4, n * 2 * 4]
    assert prof.act_bytes == [n * 4 * 4, n * 8 * 4, n * 8 * 4]  # tanh saves its output; Linear its input
