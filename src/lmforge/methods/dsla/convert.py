"""Wiring DSLA layers into a Hugging Face Llama-style causal LM: convert, restore, save and resume.

The official ``src/layer.py`` of https://github.com/utnslab/DSLA-Serve converts a layer by building
a ``DualStateLinearAttention`` and loading the teacher's q/k/v/o from a checkpoint, and converts
back by rebuilding a ``LlamaAttention`` from the checkpoint. Here the original attention *object*
is kept (not re-loaded), so :func:`restore_layers` gives back a model whose logits are bit-identical
to the untouched model's; :func:`dsla_state_dict`/:func:`load_dsla_state` carry only the DSLA
parameters (per-stage resumable safetensors files).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable

import torch
from torch import nn

from lmforge.common.errors import UserError
from lmforge.methods.dsla.layer import DSLAConfig, DualStateLinearAttention

__all__ = [
    "attention_modules",
    "convert_layers",
    "converted",
    "dsla_state_dict",
    "load_dsla_state",
    "restore_layers",
]

# The original attention modules of converted layers, {layer index: module}: a plain dict attribute
# (not registered as submodules), so they are not in the model's state_dict or parameters().
_ORIGINALS = "_dsla_originals"
_KEY = re.compile(r"^model\.layers\.(\d+)\.self_attn\.(.+)$")


def _attention_class_name(model: nn.Module) -> str:
    """The class name of the model's attention modules, for error messages (best effort)."""
    for module in model.modules():
        if type(module).__name__.endswith(("Attention", "Attn")):
            return type(module).__name__
    return f"<no attention module found in {type(model).__name__}>"


def attention_modules(model: nn.Module) -> list[nn.Module]:
    """The attention modules ``model.model.layers[i].self_attn``, after checking they are Llama-style.

    Args:
        model: a causal LM such as ``LlamaForCausalLM`` (SmolLM2 is one).

    Returns:
        One module per decoder layer (DSLA modules for converted layers).

    Raises:
        UserError: the model has no ``model.layers``, its config lacks ``num_attention_heads`` /
            ``num_key_value_heads``, or an attention lacks ``q_proj``/``k_proj``/``v_proj``/``o_proj``
            linears or ``head_dim``; the one-line message names the attention class.
    """
    layers = getattr(getattr(model, "model", None), "layers", None)
    config = getattr(model, "config", None)
    if layers is None or not isinstance(layers, (nn.ModuleList, list, tuple)):
        raise UserError(f"DSLA converts Llama-style attention only; {_attention_class_name(model)} in "
                        f"{type(model).__name__} is not (the model has no model.layers)")
    for attr in ("hidden_size", "num_attention_heads", "num_key_value_heads"):
        if getattr(config, attr, None) is None:
            raise UserError(f"DSLA converts Llama-style attention only; {_attention_class_name(model)} in "
                            f"{type(model).__name__} is not (its config has no {attr})")
    mods = []
    for i, layer in enumerate(layers):
        attn = getattr(layer, "self_attn", None)
        name = type(attn).__name__ if attn is not None else f"<missing self_attn in {type(layer).__name__}>"
        missing = [p for p in ("q_proj", "k_proj", "v_proj", "o_proj")
                   if not isinstance(getattr(attn, p, None), nn.Linear)]
        if attn is None or missing or not isinstance(getattr(attn, "head_dim", None), int):
            what = f"no {'/'.join(missing)} linear" if missing else "no integer head_dim"
            raise UserError(f"DSLA converts Llama-style attention only; {name} (layer {i}) is not ({what})")
        mods.append(attn)
    return mods


def converted(model: nn.Module) -> list[int]:
    """Indices of the layers whose attention is currently DSLA, ascending.

    Raises:
        UserError: not a Llama-style model (see :func:`attention_modules`).
    """
    return [i for i, attn in enumerate(attention_modules(model)) if isinstance(attn, DualStateLinearAttention)]


def _indices(model: nn.Module, layers: Iterable[int]) -> list[int]:
    n = len(model.model.layers)
    idx = [int(i) for i in layers]
    if len(set(idx)) != len(idx):
        raise ValueError(f"duplicate layer indices in {idx}")
    bad = [i for i in idx if not 0 <= i < n]
    if bad:
        raise ValueError(f"layer indices {bad} out of range for a {n}-layer model")
    return idx


def convert_layers(model: nn.Module, layers: Iterable[int], dsla_cfg: DSLAConfig | None = None) -> nn.Module:
    """Replace the given layers' attention with DSLA layers (in place), keeping the originals.

    Each DSLA layer copies its teacher's q/k/v/o (expanded for GQA), on the teacher's device and in
    its dtype. The original module objects are kept untouched on the model for :func:`restore_layers`
    (in a plain dict attribute, outside ``state_dict()``/``parameters()``; a later ``model.to(...)``
    does not move them).

    Args:
        model: a Llama-style causal LM (checked by :func:`attention_modules`).
        layers: decoder-layer indices to convert.
        dsla_cfg: DSLA hyperparameters (defaults: :class:`~lmforge.methods.dsla.layer.DSLAConfig`).

    Returns:
        ``model`` itself.

    Raises:
        UserError: not a Llama-style model.
        ValueError: an index is out of range, repeated, or already converted.
    """
    mods = attention_modules(model)
    idx = _indices(model, layers)
    already = [i for i in idx if isinstance(mods[i], DualStateLinearAttention)]
    if already:
        raise ValueError(f"layers {already} are already DSLA")
    originals: dict[int, nn.Module] = model.__dict__.setdefault(_ORIGINALS, {})
    for i in idx:
        attn = mods[i]
        dsla = DualStateLinearAttention.from_attention(attn, model.config, dsla_cfg, layer_idx=i)
        dsla.train(attn.training)
        originals[i] = attn
        model.model.layers[i].self_attn = dsla
    return model


def restore_layers(model: nn.Module, layers: Iterable[int]) -> nn.Module:
    """Put back the very original attention objects of the given converted layers (in place).

    Args:
        model: a model converted by :func:`convert_layers`.
        layers: indices to restore.

    Returns:
        ``model`` itself; its logits equal the never-converted model's bit for bit.

    Raises:
        ValueError: an index is out of range, repeated, or not converted.
    """
    attention_modules(model)
    idx = _indices(model, layers)
    originals: dict[int, nn.Module] = model.__dict__.get(_ORIGINALS, {})
    bad = [i for i in idx
           if i not in originals or not isinstance(model.model.layers[i].self_attn, DualStateLinearAttention)]
    if bad:
        raise ValueError(f"layers {bad} are not converted to DSLA")
    for i in idx:
        model.model.layers[i].self_attn = originals.pop(i)
    return model


def dsla_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The parameters of the DSLA layers only, under the model's own key names.

    Returns:
        ``{"model.layers.{i}.self_attn.{name}": tensor}`` (detached contiguous copies, e.g.
        ``model.layers.25.self_attn.gk_proj.weight``), ready for ``safetensors.torch.save_file``.
    """
    out: dict[str, torch.Tensor] = {}
    for i in converted(model):
        for name, t in model.model.layers[i].self_attn.state_dict().items():
            out[f"model.layers.{i}.self_attn.{name}"] = t.detach().clone().contiguous()
    return out


def load_dsla_state(model: nn.Module, state: dict[str, torch.Tensor], dsla_cfg: DSLAConfig | None = None) -> nn.Module:
    """Convert the layers named in ``state`` (those not converted yet) and load their DSLA parameters.

    ``n_states`` is taken from the saved ``alpha`` (so a single-state file loads as single-state);
    the other hyperparameters come from ``dsla_cfg``.

    Args:
        model: a Llama-style causal LM, converted or not.
        state: the output of :func:`dsla_state_dict` (e.g. read back with ``safetensors.torch.load_file``).
        dsla_cfg: DSLA hyperparameters for the layers converted here.

    Returns:
        ``model`` itself.

    Raises:
        ValueError: a key is not ``model.layers.{i}.self_attn.*``, or a layer's keys do not match
            its DSLA module (missing/unexpected/mis-shaped parameters).
    """
    per_layer: dict[int, dict[str, torch.Tensor]] = {}
    for key, t in state.items():
        m = _KEY.match(key)
        if m is None:
            raise ValueError(f"not a DSLA parameter key: {key!r}")
        per_layer.setdefault(int(m.group(1)), {})[m.group(2)] = t
    cfg = dsla_cfg or DSLAConfig()
    done = set(converted(model))
    for i, sub in sorted(per_layer.items()):
        if i not in done:
            alpha = sub.get("alpha")
            layer_cfg = dataclasses.replace(cfg, n_states=int(alpha.numel())) if alpha is not None else cfg
            convert_layers(model, [i], layer_cfg)
        try:
            model.model.layers[i].self_attn.load_state_dict(sub, strict=True)
        except RuntimeError as e:
            raise ValueError(f"DSLA state for layer {i} does not match its module: {e}") from None
    return model
