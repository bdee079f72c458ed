"""The compression engine: walk the decoder layers in order and compress their linear layers.

One engine serves every layer-wise method (RTN, GPTQ, GANQ, magnitude, Wanda, SparseGPT; AWQ walks
the same layers with its own per-layer search). For each decoder layer, in order:

1. the layer's inputs are those produced by layers ``0..l-1`` *already compressed* (the sequential
   pipeline of the GPTQ and SparseGPT papers; :func:`lmforge.common.calibration.iterate_layers`);
2. one forward pass over the calibration batches accumulates ``H = 2/N X^T X`` of every linear
   module's input (float64 by default, which is where the Cholesky factorizations need it);
3. the method's function maps ``(name, W, H)`` to a :class:`LinearResult`; the module's weight is
   replaced by the result's dense weight, so the next layers see the compressed layer;
4. the relative output error ``||W X - W' X|| / ||W X||`` on this layer's calibration inputs is
   recorded from ``H`` (no activations kept).

Modules that share one input (q/k/v, gate/up) are hooked once and share one Hessian; a method may
take them in one call (``group_fn``: GPTQ sweeps their stacked rows once).

Checked: llm-compressor runs this pipeline inside its modifiers with no public per-tensor hook; this
module is the same pipeline written against lmforge's calibration capture.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn

from lmforge.common.calibration import (
    accumulate_linear_stats,
    is_conv1d,
    get_decoder_layers,
    iterate_layers,
    linear_modules,
)
from lmforge.common.errors import UserError
from lmforge.common.quant import CodebookQuantized, UniformQuantized, relative_output_error

__all__ = [
    "CompressionResult",
    "LayerRecord",
    "LinearResult",
    "check_compressible",
    "compress_linears",
    "get_weight",
    "layers_prefix",
    "set_weight",
]

Quantized = UniformQuantized | CodebookQuantized


@dataclass
class LinearResult:
    """What a method returns for one linear module.

    Attributes:
        weight: the dense ``(out, in)`` weight the compressed module computes with.
        quantized: the packed form for quantizers (None for pruning).
        mask: the pruning mask, True where pruned (None for quantizers).
    """

    weight: torch.Tensor
    quantized: Quantized | None = None
    mask: torch.Tensor | None = None


@dataclass
class LayerRecord:
    """One compressed linear module in the report."""

    name: str
    rel_error: float | None
    shape: tuple[int, int]
    sparsity: float


@dataclass
class CompressionResult:
    """A compression run: per-module records and the packed weights of quantizers.

    Attributes:
        method: method name.
        config: the method's config as a dict.
        layers: one record per compressed linear, in model order.
        seconds: wall time of the walk.
        quantized: ``{full module name: packed weight}`` for quantizers.
        n_calib_tokens: calibration tokens seen by layer 0.
        skipped: linear modules left uncompressed because no calibration token reached them (an
            expert no token was routed to): compressing them blind would zero or distort them.
        extra: method-specific facts for the report (e.g. AWQ's scaled groups).
    """

    method: str
    config: dict[str, Any]
    layers: list[LayerRecord] = field(default_factory=list)
    seconds: float = 0.0
    quantized: dict[str, Quantized] = field(default_factory=dict)
    n_calib_tokens: int = 0
    skipped: list[str] = field(default_factory=list)
    extra: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return {
            "method": self.method,
            "config": self.config,
            "seconds": self.seconds,
            "n_calib_tokens": self.n_calib_tokens,
            "layers": [asdict(r) | {"shape": list(r.shape)} for r in self.layers],
            "skipped": self.skipped,
            **self.extra,
        }


def get_weight(module: nn.Module) -> torch.Tensor:
    """A float32 copy of the ``(out, in)`` weight of a linear module (GPT-2 ``Conv1D`` stores it
    transposed)."""
    w = module.weight.detach()
    return (w.t() if is_conv1d(module) else w).float().clone()


@torch.no_grad()
def set_weight(module: nn.Module, w: torch.Tensor) -> None:
    """Write an ``(out, in)`` weight into a linear module in its own layout and dtype."""
    target = module.weight
    target.copy_((w.t() if is_conv1d(module) else w).to(dtype=target.dtype, device=target.device))


def check_compressible(model: nn.Module, skip: Iterable[str] = ()) -> dict[str, list[str]]:
    """``{layer prefix: [linear names]}`` of the decoder layers; a UserError if there is nothing to
    compress (no decoder layers, or no linear module inside them)."""
    try:
        layers = get_decoder_layers(model)
    except UserError:
        for path in ("model.layers", "transformer.h", "layers", "h"):
            try:
                found_list = model.get_submodule(path)
            except AttributeError:
                continue
            if isinstance(found_list, nn.ModuleList) and len(found_list) == 0:
                raise UserError("the model has no linear layers to compress (it has no decoder layers)") from None
        raise
    prefix = layers_prefix(model, layers)
    found = {}
    for i, layer in enumerate(layers):
        names = [n for n in linear_modules(layer) if not any(s in f"{prefix}.{i}.{n}" for s in skip)]
        found[f"{prefix}.{i}"] = names
    if not any(found.values()):
        raise UserError("the model has no linear layers to compress in its decoder layers")
    return found


def layers_prefix(model: nn.Module, layers: nn.ModuleList) -> str:
    """The dotted name of the decoder-layer list inside ``model`` (e.g. ``"model.layers"``)."""
    for name, mod in model.named_modules():
        if mod is layers:
            return name
    return "layers"


LinearFn = Callable[[str, torch.Tensor, torch.Tensor], LinearResult]
# ``(full names, weights, H) -> results``, one call for modules that share one Hessian.
GroupFn = Callable[[list[str], list[torch.Tensor], torch.Tensor], list[LinearResult]]


def compress_linears(
    model: nn.Module,
    calib_batches: list[Any],
    fn: LinearFn,
    *,
    method: str,
    config: dict[str, Any],
    hessian_dtype: torch.dtype = torch.float64,
    skip: Iterable[str] = (),
    progress: bool = True,
    layer_errors: bool = True,
    needs: str = "hessian",
    group_fn: GroupFn | None = None,
    true_sequential: bool = False,
) -> CompressionResult:
    """Compress every linear module of every decoder layer with ``fn(full_name, W, H)``.

    Args:
        model: a causal LM with a supported layout (Llama, Qwen2, Mistral, GPT-2...). The LM head and
            embeddings are never touched.
        calib_batches: ``(batch, seq)`` token-id tensors (or mappings with ``input_ids`` and
            ``attention_mask``).
        fn: the method, called once per linear module in model order.
        method, config: recorded in the result.
        hessian_dtype: accumulation dtype of ``H``.
        skip: substrings of full module names to leave alone.
        progress: progress bar over layers.
        layer_errors: record each module's relative output error (needs the full ``X^T X``; off,
            ``rel_error`` is None).
        needs: what ``fn`` reads of ``H``: ``"hessian"`` (all of it) or ``"diag"`` (only its diagonal,
            e.g. Wanda); with ``"diag"`` and ``layer_errors`` off only ``diag(H)`` is accumulated.
        group_fn: optional; called instead of ``fn`` once for the modules of a layer that share one
            Hessian (q/k/v, gate/up), with their names and weights in module order, returning one
            result per module. It must equal ``fn`` applied to each (GPTQ sweeps the stacked rows
            once: every row's sweep is independent given the shared factorization).
        true_sequential: GPTQ's "true sequential" mode: within a layer, the groups of modules that
            share an input (q/k/v, o, gate/up, down for Llama) are compressed in forward order, each
            calibrated on inputs that already pass through the compressed earlier groups (one more
            partial forward of the layer per group). Off, all of a layer's modules are calibrated on
            the layer's uncompressed forward (llm-compressor's choice).

    Raises:
        UserError: for an empty calibration set or a model without linear layers to compress.
    """
    if not calib_batches:
        raise UserError("the calibration set is empty")
    plan = check_compressible(model, skip)
    prefixes = list(plan)
    result = CompressionResult(method=method, config=config)
    start = time.perf_counter()
    # The last layer's outputs feed nothing: run_last=False skips that forward.
    for i, layer, inputs in iterate_layers(model, calib_batches, progress=progress, run_last=False):
        if i == 0:
            result.n_calib_tokens = inputs.n_tokens()
        names = plan[prefixes[i]]
        if not names:
            continue
        diag_only = needs == "diag" and not layer_errors
        hessians = accumulate_linear_stats(
            layer, inputs, names, dtype=hessian_dtype, share_inputs=True, diag_only=diag_only
        )
        modules = linear_modules(layer)
        live = [n for n in names if hessians[n].n_samples > 0]
        weights = {n: get_weight(modules[n]) for n in live}
        results: dict[str, LinearResult] = {}
        hess: dict[str, torch.Tensor] = {}
        # Modules sharing one accumulator (the same object) form one group, in module order.
        groups: dict[int, list[str]] = {}
        for name in live:
            groups.setdefault(id(hessians[name]), []).append(name)
        for si, group in enumerate(groups.values()):
            if true_sequential and si > 0:
                # The earlier groups of this layer are already compressed (set below), so this
                # group's inputs are re-collected through them.
                acc = accumulate_linear_stats(
                    layer, inputs, group, dtype=hessian_dtype, share_inputs=True, diag_only=diag_only
                )
                H = acc[group[0]].hessian
            else:
                H = hessians[group[0]].hessian
            hess.update((n, H) for n in group)
            fulls = [f"{prefixes[i]}.{n}" for n in group]
            if group_fn is not None and len(group) > 1:
                outs = group_fn(fulls, [weights[n] for n in group], H)
                if len(outs) != len(group):
                    raise RuntimeError(f"group_fn returned {len(outs)} results for {len(group)} modules")
                results.update(zip(group, outs))
            else:
                for n, full in zip(group, fulls):
                    results[n] = fn(full, weights[n], H)
            if true_sequential:
                for n in group:
                    set_weight(modules[n], results[n].weight)
        for name in names:
            full = f"{prefixes[i]}.{name}"
            mod = modules[name]
            if name not in results:
                result.skipped.append(full)
                continue
            W = weights[name]
            H = hess[name]
            res = results[name]
            set_weight(mod, res.weight)
            if res.quantized is not None:
                result.quantized[full] = res.quantized
            result.layers.append(
                LayerRecord(
                    name=full,
                    rel_error=relative_output_error(W, res.weight, H) if layer_errors else None,
                    shape=(int(W.shape[0]), int(W.shape[1])),
                    sparsity=float((res.weight == 0).float().mean()),
                )
            )
    result.seconds = time.perf_counter() - start
    return result
