"""Calibration capture for layer-wise compression methods (GPTQ, SparseGPT, Wanda and the like).

The pieces, in the order a method uses them:

* :func:`get_decoder_layers` finds the decoder blocks: ``model.model.layers`` for Llama, Qwen2 and
  Mistral, ``model.transformer.h`` for GPT-2 (a bare base model's ``.layers`` / ``.h`` work too).
* :func:`capture_layer_inputs` runs only the embedding part of the model on the calibration batches
  and records what enters decoder layer 0: the hidden states and every other argument of the layer
  call (the attention mask the model built, the rotary ``position_embeddings``, ``position_ids``...).
  A forward pre-hook registered with ``with_kwargs=True`` records them and raises a private exception,
  so no decoder layer and no LM head ever runs.
* :func:`iterate_layers` is the sequential driver: it yields ``(index, layer, inputs)`` for each layer
  in turn and, once the caller has finished with a layer (and possibly changed its weights), runs the
  layer on the stored inputs to produce the next layer's inputs, replacing them batch by batch. Only
  one layer's activations are held at a time, and every layer sees the outputs of the already
  compressed layers before it, which is what GPTQ and SparseGPT prescribe.
* :class:`HessianAccumulator` keeps the streaming ``H = 2/N * sum_i x_i x_i^T`` of a linear layer's
  inputs, and :func:`accumulate_linear_stats` fills one per linear module of a decoder layer by
  forward hooks. GPT-2's ``Conv1D`` modules are linear layers with a transposed weight and are
  treated as such.

Checked: llm-compressor runs the same sequential pipeline inside its modifiers, with no public API
to reuse it for other methods; this module is that pipeline as plain functions (and lmforge checks
its GPTQ/SparseGPT against llm-compressor's results, not its internals).

Capture and replay run under ``torch.no_grad()`` rather than ``torch.inference_mode()`` so that the
stored activations can later be inputs to autograd (block-wise reconstruction methods need that).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from lmforge.common.errors import UserError
from lmforge.common.generation import model_device
from lmforge.common.progress import track

__all__ = [
    "HessianAccumulator",
    "calibration_dtype",
    "add_gram",
    "LayerInputs",
    "accumulate_linear_stats",
    "capture_layer_inputs",
    "get_decoder_layers",
    "is_conv1d",
    "iterate_layers",
    "linear_modules",
]


_CALIB_DTYPE: ContextVar[torch.dtype | None] = ContextVar("lmforge_calibration_dtype", default=None)


def _device_type(t: torch.Tensor) -> str:
    return t.device.type if t.device.type in ("cpu", "cuda", "xpu") else "cpu"


@contextmanager
def calibration_dtype(dtype: torch.dtype | None) -> Iterator[None]:
    """Run the calibration forwards of decoder layers (:meth:`LayerInputs.run`: the statistics
    collection and the replay that feeds the next layer) under autocast to ``dtype`` (bfloat16 or
    float16), as GPU GPTQ runs on half-precision activations. Statistics (Hessians) are still
    accumulated in their own dtype (float32/float64), and the method's own math is outside autocast.
    None (the default) runs the forwards in the model's dtype."""
    if dtype not in (None, torch.bfloat16, torch.float16):
        raise UserError(f"calibration dtype must be bfloat16 or float16 (or None), got {dtype}")
    token = _CALIB_DTYPE.set(dtype)
    try:
        yield
    finally:
        _CALIB_DTYPE.reset(token)


class _StopForward(Exception):
    """Raised by the capture hook to end the model's forward once the layer inputs are recorded."""


# --------------------------------------------------------------------------------------------------
# Architecture lookup


def get_decoder_layers(model: nn.Module) -> nn.ModuleList:
    """The decoder blocks of ``model``.

    Llama, Qwen2 and Mistral (and families laid out like them) keep them in ``model.model.layers``,
    GPT-2 in ``model.transformer.h``; the base models (``LlamaModel``, ``GPT2Model``) have them at
    ``.layers`` / ``.h``.

    Raises:
        UserError: for a model with none of these layouts.
    """
    for path in ("model.layers", "transformer.h", "layers", "h"):
        obj: Any = model
        for part in path.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                break
        if isinstance(obj, nn.ModuleList) and len(obj) > 0:
            return obj
    name = type(model).__name__
    raise UserError(
        f"unsupported architecture {name}: calibration supports Llama, Qwen2, Mistral "
        "(model.model.layers) and GPT-2 (model.transformer.h)"
    )


def _layer_kinds(model: nn.Module, n_layers: int) -> list[str]:
    """The attention kind of each layer (``config.layer_types``, e.g. full vs sliding attention) or one
    kind for all. Layers of different kinds receive different attention masks from the model."""
    cfg = getattr(model, "config", None)
    kinds = getattr(cfg, "layer_types", None) if cfg is not None else None
    if isinstance(kinds, (list, tuple)) and len(kinds) >= n_layers:
        return [str(k) for k in kinds[:n_layers]]
    return ["default"] * n_layers


def is_conv1d(module: nn.Module) -> bool:
    """Whether ``module`` is GPT-2's ``Conv1D`` (a linear layer with an ``(in, out)`` weight)."""
    try:
        from transformers.pytorch_utils import Conv1D
    except ImportError:  # pragma: no cover - transformers is a dependency
        return False
    return isinstance(module, Conv1D)


def linear_modules(module: nn.Module) -> dict[str, nn.Module]:
    """``{name: module}`` of every ``nn.Linear`` and GPT-2 ``Conv1D`` in ``module`` (relative names)."""
    return {
        name: sub
        for name, sub in module.named_modules()
        if name and (isinstance(sub, nn.Linear) or is_conv1d(sub))
    }


def in_features(module: nn.Module) -> int:
    """Input dimension of a linear module: ``in_features`` for ``nn.Linear``, ``weight.shape[0]`` for
    GPT-2's ``Conv1D`` (whose weight is stored as ``(in, out)``)."""
    if isinstance(module, nn.Linear):
        return module.in_features
    if is_conv1d(module):
        return int(module.weight.shape[0])
    raise TypeError(f"{type(module).__name__} is not a linear module")


# --------------------------------------------------------------------------------------------------
# Layer inputs


@dataclass
class LayerInputs:
    """What one decoder layer receives, per calibration batch.

    Attributes:
        hidden_states: the hidden states entering the layer, one ``(batch, seq, hidden)`` tensor per
            calibration batch.
        args: the other positional arguments of the layer call (GPT-2 passes the cache and the
            attention mask positionally), per batch.
        kwargs: the keyword arguments of the layer call (``attention_mask``, ``position_embeddings``,
            ``position_ids``...), per batch; ``past_key_values`` is None and ``use_cache`` False.
        padding_masks: the ``(batch, seq)`` attention mask of each calibration batch (1 = real token),
            or None where the batch had no mask.
    """

    hidden_states: list[torch.Tensor]
    args: list[tuple[Any, ...]]
    kwargs: list[dict[str, Any]]
    padding_masks: list[torch.Tensor | None] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.hidden_states)

    def n_tokens(self) -> int:
        """Number of real (unpadded) token positions over all batches."""
        total = 0
        for h, m in zip(self.hidden_states, self.padding_masks):
            total += int(m.sum().item()) if m is not None else h.shape[0] * h.shape[1]
        return total

    def run(self, layer: nn.Module, index: int) -> torch.Tensor:
        """Run ``layer`` on batch ``index`` and return its output hidden states (under the
        :func:`calibration_dtype` autocast when one is active)."""
        dtype = _CALIB_DTYPE.get()
        with torch.autocast(_device_type(self.hidden_states[index]), dtype=dtype or torch.bfloat16,
                            enabled=dtype is not None):
            out = layer(self.hidden_states[index], *self.args[index], **self.kwargs[index])
        return out[0] if isinstance(out, (tuple, list)) else out

    def forward_all(self, layer: nn.Module) -> list[torch.Tensor]:
        """Outputs of ``layer`` on every batch (a new list; the stored inputs are unchanged)."""
        with torch.no_grad():
            return [self.run(layer, i) for i in range(len(self))]


def _normalize_batch(batch: Any, device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    if isinstance(batch, Mapping):
        if "input_ids" not in batch:
            raise UserError("a calibration batch given as a mapping needs an 'input_ids' entry")
        ids = batch["input_ids"]
        mask = batch.get("attention_mask")
    else:
        ids, mask = batch, None
    ids = torch.as_tensor(ids)
    if ids.dim() == 1:
        ids = ids[None, :]
    if ids.dim() != 2 or ids.dtype not in (torch.int64, torch.int32):
        raise UserError(
            f"calibration input_ids must be a (batch, seq) integer tensor, got shape {tuple(ids.shape)}"
        )
    ids = ids.to(device=device, dtype=torch.long)
    if mask is not None:
        mask = torch.as_tensor(mask).to(device)
        if mask.dim() == 1:
            mask = mask[None, :]
        if mask.shape != ids.shape:
            raise UserError(
                f"attention_mask shape {tuple(mask.shape)} does not match input_ids {tuple(ids.shape)}"
            )
        mask = mask.to(torch.long)
    return ids, mask


def _strip_cache(value: Any) -> Any:
    try:
        from transformers.cache_utils import Cache
    except ImportError:  # pragma: no cover
        return value
    return None if isinstance(value, Cache) else value


class _TensorPool:
    """Shares equal tensors between batches (the causal mask and rotary tables of equal-length,
    unpadded batches are identical), so that storing per-batch layer kwargs costs little memory."""

    def __init__(self, max_candidates: int = 8) -> None:
        self._pool: dict[tuple[Any, ...], list[torch.Tensor]] = {}
        self._max = max_candidates

    def share(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            key = (tuple(obj.shape), obj.dtype, obj.device)
            candidates = self._pool.setdefault(key, [])
            for cand in candidates:
                if cand is obj or torch.equal(cand, obj):
                    return cand
            if len(candidates) < self._max:
                candidates.append(obj)
            return obj
        if isinstance(obj, tuple):
            return tuple(self.share(o) for o in obj)
        if isinstance(obj, list):
            return [self.share(o) for o in obj]
        if isinstance(obj, dict):
            return {k: self.share(v) for k, v in obj.items()}
        return obj


_Call = tuple[tuple[Any, ...], dict[str, Any]]


def _capture(
    model: nn.Module, batches: Iterable[Any], want: Sequence[int]
) -> tuple[list[torch.Tensor], dict[int, list[_Call]], list[torch.Tensor | None]]:
    """Record the hidden states entering layer 0 and the (args, kwargs) entering each layer in
    ``want``. Layers before the last wanted one that must be passed through are replaced by an
    identity for the duration (their kwargs are all that is needed); the pre-hook of the last wanted
    layer stops the forward."""
    layers = get_decoder_layers(model)
    want = sorted(set(want) | {0})
    last = want[-1]
    device = model_device(model)
    hidden: list[torch.Tensor] = []
    calls: dict[int, list[_Call]] = {i: [] for i in want}
    masks: list[torch.Tensor | None] = []
    pool = _TensorPool()

    def make_hook(index: int):
        def hook(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]):
            if args:
                h, rest = args[0], tuple(_strip_cache(a) for a in args[1:])
            else:
                kwargs = dict(kwargs)
                h, rest = kwargs.pop("hidden_states"), ()
            kw = {k: _strip_cache(v) for k, v in kwargs.items()}
            if "use_cache" in kw:
                kw["use_cache"] = False
            if index == 0:
                hidden.append(h.detach())
            calls[index].append((pool.share(rest), pool.share(kw)))
            if index == last:
                raise _StopForward
            return None

        return hook

    def identity_forward(hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        return hidden_states

    handles = [layers[i].register_forward_pre_hook(make_hook(i), with_kwargs=True) for i in want]
    stubbed = list(range(last))
    # A layer may already carry an instance-level forward (accelerate's hooks wrap it that way);
    # it is put back afterwards.
    saved_forward = {i: vars(layers[i]).get("forward") for i in stubbed}
    was_training = model.training
    model.eval()
    try:
        for i in stubbed:
            layers[i].forward = identity_forward  # type: ignore[method-assign]
        with torch.no_grad():
            for batch in batches:
                ids, mask = _normalize_batch(batch, device)
                masks.append(mask)
                try:
                    model(input_ids=ids, attention_mask=mask, use_cache=False)
                except _StopForward:
                    pass
                else:
                    raise RuntimeError("the model forward ended without reaching the captured decoder layer")
    finally:
        for i in stubbed:
            if saved_forward[i] is not None:
                layers[i].forward = saved_forward[i]  # type: ignore[method-assign]
            elif "forward" in vars(layers[i]):
                del layers[i].forward
        for h in handles:
            h.remove()
        model.train(was_training)
    if not hidden:
        raise UserError("no calibration batches were given")
    return hidden, calls, masks


def capture_layer_inputs(model: nn.Module, input_ids_batches: Iterable[Any]) -> LayerInputs:
    """Run the embedding part of ``model`` on each batch and record the inputs of decoder layer 0.

    Args:
        model: a causal LM (or its base model) with a supported layout, see :func:`get_decoder_layers`.
        input_ids_batches: batches as ``(batch, seq)`` integer tensors, or mappings with ``input_ids``
            and optionally ``attention_mask`` (padded positions are then excluded from the statistics
            of :func:`accumulate_linear_stats`). Tensors are moved to the model's device.

    Returns:
        The :class:`LayerInputs` of layer 0, one entry per batch.
    """
    hidden, calls, masks = _capture(model, input_ids_batches, [0])
    return LayerInputs(
        hidden_states=hidden,
        args=[a for a, _ in calls[0]],
        kwargs=[k for _, k in calls[0]],
        padding_masks=masks,
    )


def iterate_layers(
    model: nn.Module, calib_batches: Iterable[Any], *, progress: bool = False, run_last: bool = True
) -> Iterator[tuple[int, nn.Module, LayerInputs]]:
    """Walk the decoder layers in order, each fed the outputs of the (possibly modified) earlier ones.

    For each layer this yields ``(index, layer, inputs)``. The caller may read ``inputs``, run the layer
    on them (e.g. :func:`accumulate_linear_stats`) and change the layer's weights; when the caller asks
    for the next item, the layer is run on every stored batch and its outputs replace the inputs in
    place, batch by batch, so only one layer's activations (plus one batch) are alive at a time.

    ``inputs.hidden_states`` is the same list object for every layer: after the generator is
    exhausted it holds the last layer's outputs (before the model's final norm), unless ``run_last``
    is False: then the last layer is not run again (a compressor that only reads each layer's inputs
    saves that forward).

    Layers whose attention kind differs (``config.layer_types``, e.g. Qwen2 with sliding-window
    layers) get the attention mask of their own kind, captured once up front.

    Args:
        model: a supported causal LM, see :func:`get_decoder_layers`.
        calib_batches: as for :func:`capture_layer_inputs`.
        progress: show a progress bar over layers.
        run_last: run the last layer on the stored inputs once the caller is done with it.
    """
    layers = get_decoder_layers(model)
    kinds = _layer_kinds(model, len(layers))
    first_of_kind: dict[str, int] = {}
    for i, kind in enumerate(kinds):
        first_of_kind.setdefault(kind, i)
    hidden, calls, masks = _capture(model, calib_batches, sorted(first_of_kind.values()))
    per_kind = {
        kind: ([a for a, _ in calls[i]], [k for _, k in calls[i]]) for kind, i in first_of_kind.items()
    }
    indices: Iterable[int] = range(len(layers))
    if progress:
        indices = track(indices, "layers", total=len(layers))
    for i in indices:
        layer = layers[i]
        args, kwargs = per_kind[kinds[i]]
        inputs = LayerInputs(hidden_states=hidden, args=args, kwargs=kwargs, padding_masks=masks)
        yield i, layer, inputs
        if i == len(layers) - 1 and not run_last:
            break
        with torch.no_grad():
            for b in range(len(hidden)):
                hidden[b] = inputs.run(layer, b)


# --------------------------------------------------------------------------------------------------
# Hessians


# Column-block width of :func:`add_gram`'s triangular product (measured on an AVX2 CPU, 1 thread:
# about 190-wide blocks ran 1.3x (n = 576) to 1.5x (n = 1536) faster than the full product).
_GRAM_BLOCK = 192


def _gram_bounds(n: int) -> list[int]:
    k = max(1, round(n / _GRAM_BLOCK))
    return [(i * n) // k for i in range(k + 1)]


@torch.no_grad()
def add_gram(H: torch.Tensor, rows: torch.Tensor) -> None:
    """``H += rows^T rows`` for a symmetric ``H``, computing only the blocks on and above the diagonal.

    ``rows^T rows`` is symmetric, so the blocks below the diagonal are copies of those above: on CPU
    the columns are cut into blocks of about 190, each block row ``rows[:, a:c]^T rows[:, a:]`` is one
    matrix product and its transpose fills the mirror block (for n = 576 in three blocks: 6 of the 9
    block products). Each entry is the same sum as in the full product ``H.addmm_(rows.t(), rows)``,
    though BLAS may block a sub-product's summation differently, so results agree up to float32
    rounding (not bit for bit); tests/common/test_calibration.py checks it against a float64 product
    and checks that the blocked result is exactly symmetric.

    NOTE: the GPU keeps the full product: cuBLAS may choose another algorithm (split-K) for another
    shape, and a GPU gains little from the saved flops. Checked: torch has no ``syrk``
    (symmetric rank-k update) binding, which is what this computes.
    """
    n = rows.shape[1]
    bounds = _gram_bounds(n) if rows.device.type == "cpu" else [0, n]
    same = H.dtype == rows.dtype
    if len(bounds) == 2:
        if same:
            H.addmm_(rows.t(), rows)
        else:
            H.add_((rows.t() @ rows).to(H.dtype))
        return
    for a, c in zip(bounds[:-1], bounds[1:]):
        if same:
            H[a:c, a:].addmm_(rows[:, a:c].t(), rows[:, a:])
        else:
            H[a:c, a:].add_((rows[:, a:c].t() @ rows[:, a:]).to(H.dtype))
        # H is symmetric before the update and so is the block row just added: mirror it.
        H[c:, a:c] = H[a:c, c:].t()


class HessianAccumulator:
    """Streaming ``H = (2 / N) * sum_i x_i x_i^T`` over the rows ``x_i`` of a linear layer's inputs.

    ``N`` is the number of rows seen so far. Each :meth:`add_batch` flattens all leading dimensions
    (batch, sequence) into rows, drops the rows whose mask is 0 and applies the running-average update
    GPTQ uses: with ``n`` rows so far and ``m`` new rows ``X``,

    ``H <- H * n / (n + m);  X <- sqrt(2 / (n + m)) * X;  H <- H + X^T X``

    By induction ``H = (2 / N) * sum_i x_i x_i^T = (2 / N) X_all^T X_all`` after any number of batches,
    the Hessian of the layer-wise squared error ``||W X^T - W' X^T||^2 / N`` with respect to a weight
    row. ``H`` is kept in ``dtype`` (float32 by default, float64 for extra accuracy). With float64 and float32
    activations, each batch's ``X^T X`` is computed in float32 and added to the float64 sum.
    """

    def __init__(
        self,
        n_features: int,
        *,
        dtype: torch.dtype = torch.float32,
        device: torch.device | str | None = None,
        diag_only: bool = False,
    ) -> None:
        if dtype not in (torch.float32, torch.float64):
            raise UserError(f"HessianAccumulator dtype must be float32 or float64, got {dtype}")
        # diag_only keeps only diag(H) = 2/N ||X_j||^2 (what Wanda needs): O(N n) instead of O(N n^2).
        self.diag_only = diag_only
        self.n_features = int(n_features)
        self.dtype = dtype
        self.device = torch.device(device) if device is not None else None
        self.H: torch.Tensor | None = None
        self.n_samples = 0

    def _ensure(self, device: torch.device) -> torch.Tensor:
        if self.H is None:
            self.device = self.device or device
            shape = (self.n_features,) if self.diag_only else (self.n_features, self.n_features)
            self.H = torch.zeros(shape, dtype=self.dtype, device=self.device)
        return self.H

    @torch.no_grad()
    def add_batch(self, x: torch.Tensor, mask: torch.Tensor | None = None) -> None:
        """Add the rows of ``x`` (shape ``(..., n_features)``).

        ``mask`` (shape ``x.shape[:-1]``) keeps the rows where it is nonzero.
        """
        if x.shape[-1] != self.n_features:
            raise ValueError(f"expected inputs with {self.n_features} features, got {x.shape[-1]}")
        rows = x.detach().reshape(-1, self.n_features)
        if mask is not None:
            if tuple(mask.shape) != tuple(x.shape[:-1]):
                raise ValueError(
                    f"mask shape {tuple(mask.shape)} does not match inputs {tuple(x.shape[:-1])}"
                )
            rows = rows[mask.reshape(-1).to(rows.device) != 0]
        m = rows.shape[0]
        if m == 0:
            return
        H = self._ensure(rows.device)
        n = self.n_samples
        H.mul_(n / (n + m))
        self.n_samples = n + m
        if self.diag_only:
            rows = rows.to(device=H.device, dtype=self.dtype)
            H.add_(rows.pow(2).sum(dim=0), alpha=2.0 / self.n_samples)
        elif self.dtype == torch.float64 and rows.dtype in (torch.float32, torch.bfloat16, torch.float16):
            # The batch's own X^T X is a short sum, computed in float32 (half the time of float64 on
            # CPU); the running sum over many batches, where round-off accumulates, is float64.
            rows = rows.to(device=H.device, dtype=torch.float32) * math.sqrt(2.0 / self.n_samples)
            add_gram(H, rows)
        else:
            rows = rows.to(device=H.device, dtype=self.dtype) * math.sqrt(2.0 / self.n_samples)
            add_gram(H, rows)

    @property
    def hessian(self) -> torch.Tensor:
        """The current ``H`` (zeros before any row was added); with ``diag_only`` the diagonal
        matrix of the accumulated ``diag(H)``."""
        if self.H is None:
            return torch.zeros(self.n_features, self.n_features, dtype=self.dtype, device=self.device)
        return torch.diag(self.H) if self.diag_only else self.H


def accumulate_linear_stats(
    layer_module: nn.Module,
    layer_inputs: LayerInputs,
    names: Sequence[str] | None = None,
    *,
    dtype: torch.dtype = torch.float32,
    share_inputs: bool = False,
    diag_only: bool = False,
) -> dict[str, HessianAccumulator]:
    """Run ``layer_module`` on ``layer_inputs`` and accumulate the input Hessian of its linear modules.

    Forward pre-hooks on each ``nn.Linear`` (and GPT-2 ``Conv1D``) inside the decoder layer feed their
    inputs to a :class:`HessianAccumulator`; padded positions (``layer_inputs.padding_masks``) are
    left out. The layer's outputs are discarded: when the first batch shows that each selected linear
    runs exactly once, the forward of every later batch ends at the input of the last one.

    Args:
        layer_module: one decoder layer.
        layer_inputs: its inputs, as yielded by :func:`iterate_layers`.
        names: linear module names relative to the layer (e.g. ``"self_attn.q_proj"``, ``"mlp.c_fc"``);
            all linear modules when None.
        dtype: accumulation dtype, float32 or float64.
        share_inputs: modules called on the very same input tensor (q/k/v, gate/up) share one
            accumulator (the same object under each name): one ``X^T X`` instead of three.
        diag_only: keep only ``diag(H)`` (see :class:`HessianAccumulator`).

    Returns:
        ``{name: accumulator}`` in module order.
    """
    found = linear_modules(layer_module)
    if names is None:
        selected = found
    else:
        missing = [n for n in names if n not in found]
        if missing:
            raise UserError(f"no linear module named {missing} in the layer; it has {sorted(found)}")
        selected = {n: found[n] for n in found if n in set(names)}
    stats = {
        name: HessianAccumulator(in_features(mod), dtype=dtype, diag_only=diag_only) for name, mod in selected.items()
    }
    current: dict[str, torch.Tensor | None] = {"mask": None}
    # id(input) -> (input, accumulator) within one batch; holding the tensor keeps its id from being
    # reused by a later input of the same batch.
    seen: dict[int, tuple[torch.Tensor, HessianAccumulator]] = {}
    # Calls of each module in the current batch, in order. Only the inputs of the linears matter, so
    # once the first batch has shown that every selected linear runs exactly once per forward, the
    # later batches stop at the last one's input (for Llama, down_proj's own product and the residual
    # add are never computed: a quarter of the layer's linear work).
    called: list[str] = []
    stop_at: dict[str, str | None] = {"name": None}

    def make_hook(name: str):
        def hook(module: nn.Module, args: tuple[Any, ...]) -> None:
            called.append(name)
            x = args[0]
            stop = stop_at["name"] == name and len(called) == len(selected) == len(set(called))
            if share_inputs:
                hit = seen.get(id(x))
                if hit is not None and hit[0] is x:
                    if stats[name] is not hit[1] and stats[name].n_samples == 0:
                        stats[name] = hit[1]
                    if stats[name] is hit[1]:
                        if stop:
                            raise _StopForward
                        return
                seen[id(x)] = (x, stats[name])
            mask = current["mask"]
            if mask is not None and tuple(mask.shape) != tuple(x.shape[:-1]):
                mask = None  # the module saw a reshaped input (not token-aligned); keep every row
            stats[name].add_batch(x, mask)
            if stop:
                raise _StopForward

        return hook

    # accelerate's offloading hooks move weights back after a module's forward: never cut a forward
    # short under them.
    may_stop = not any(hasattr(m, "_hf_hook") for m in layer_module.modules())
    # Pre-hooks: the input is all a Hessian needs (the module's output was never read).
    handles = [mod.register_forward_pre_hook(make_hook(name)) for name, mod in selected.items()]
    try:
        with torch.no_grad():
            for b in range(len(layer_inputs)):
                masks = layer_inputs.padding_masks
                current["mask"] = masks[b] if b < len(masks) else None
                seen.clear()
                called.clear()
                try:
                    layer_inputs.run(layer_module, b)
                except _StopForward:
                    pass
                if b == 0 and may_stop and sorted(called) == sorted(selected):
                    stop_at["name"] = called[-1]
    finally:
        seen.clear()
        for h in handles:
            h.remove()
    return stats
