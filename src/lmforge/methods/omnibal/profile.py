"""Per-layer profile of a layer stack: forward and backward time, saved activations, output size.

OmniBal (Yao et al., ICML 2025, arXiv 2407.20761), method section, Balanced Model Partitioning, step 1:
profile the forward and backward time of every ViT and LLM layer; the partition search
(:mod:`lmforge.methods.omnibal.bmp`) ranks and simulates candidates from these numbers, and the
memory-balance part's adaptive recompute (:mod:`lmforge.methods.omnibal.recompute`) uses the
activation sizes.

No kept library does this: ``torch.profiler`` records kernels and ops, not per-layer forward and
backward times of a stack fed layer to layer, and ``torch.distributed.pipelining`` (checked in
torch 2.13) has no profiling for partitioning.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from lmforge.methods.omnibal.recompute import saved_activation_bytes


@dataclass
class LayerProfile:
    """Profile of a layer stack, one entry per layer.

    Attributes:
        fwd_s: median forward time (seconds).
        bwd_s: median backward time (seconds): gradients w.r.t. the layer's input and parameters.
        act_bytes: bytes saved for backward by one forward (:func:`saved_activation_bytes`).
        out_bytes: bytes of the layer's output (what crosses a stage boundary after this layer).
    """

    fwd_s: list[float]
    bwd_s: list[float]
    act_bytes: list[int]
    out_bytes: list[int]


def _sync(t: torch.Tensor) -> None:
    if t.device.type == "cuda":
        torch.cuda.synchronize(t.device)


def _timed(fn: Callable[[], object], ref: torch.Tensor) -> tuple[float, object]:
    _sync(ref)
    t0 = time.perf_counter()
    out = fn()
    _sync(ref)
    return time.perf_counter() - t0, out


def profile_layers(layers: Sequence[nn.Module], example_input: torch.Tensor, repeats: int = 3,
                   warmup: int = 1) -> LayerProfile:
    """Profile each layer on the activations of the layers before it.

    Layer i runs on layer i-1's (detached) output. Per repeat, one forward is timed, then one
    backward: ``torch.autograd.grad`` of the output (with a fixed random ``grad_output``) w.r.t. the
    input (if floating point) and the parameters that require grad. The median over ``repeats`` is
    kept; ``warmup`` untimed forward+backward runs come first. CUDA work is synchronised around each
    timed region.

    Args:
        layers: modules in pipeline order, each taking one tensor and returning one tensor.
        example_input: the first layer's input (one micro-batch).
        repeats: timed runs per layer (>= 1).
        warmup: untimed runs per layer before them.

    Returns:
        A :class:`LayerProfile`.
    """
    if repeats < 1 or warmup < 0:
        raise ValueError(f"need repeats >= 1 and warmup >= 0, got {repeats}, {warmup}")
    prof = LayerProfile([], [], [], [])
    x = example_input.detach()
    gen = torch.Generator(device=x.device).manual_seed(0)
    for i, layer in enumerate(layers):
        inp = x.detach().requires_grad_(x.is_floating_point())
        params = [p for p in layer.parameters() if p.requires_grad]
        wrt = ([inp] if inp.requires_grad else []) + params
        fwd_t, bwd_t = [], []
        out: torch.Tensor | None = None
        grad_out: torch.Tensor | None = None
        for r in range(warmup + repeats):
            with torch.enable_grad():
                tf, out = _timed(lambda: layer(inp), inp)
            if not isinstance(out, torch.Tensor):
                raise TypeError(f"layer {i} returned {type(out).__name__}, expected one tensor")
            if grad_out is None:
                grad_out = torch.randn(out.shape, generator=gen, device=out.device, dtype=out.dtype)
            if out.requires_grad and wrt:
                tb, _ = _timed(lambda: torch.autograd.grad(out, wrt, grad_out, allow_unused=True), inp)
            else:
                tb = 0.0
            if r >= warmup:
                fwd_t.append(tf)
                bwd_t.append(tb)
        assert out is not None
        prof.fwd_s.append(statistics.median(fwd_t))
        prof.bwd_s.append(statistics.median(bwd_t))
        prof.act_bytes.append(saved_activation_bytes(layer, inp))
        prof.out_bytes.append(out.numel() * out.element_size())
        x = out.detach()
    return prof
