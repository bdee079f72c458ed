"""MoR as a PEFT-style adapter: wrap a model's linears in place, route roles, save/load beside the base.

Han et al., "MoRAgent: Parameter Efficient Agent Tuning with Mixture-of-Roles" (ICML 2025); the layer
is :class:`lmforge.methods.moragent.layer.MoRLinear` (see that module for the math and the official
code it follows).

* :func:`apply_mor` replaces the target ``nn.Linear`` modules of a model (default: the seven Llama
  projections ``q/k/v/o/gate/up/down_proj`` of every decoder layer; ``layers=`` picks decoder layers,
  e.g. the top ones) by :class:`MoRLinear` and freezes every other parameter.
* :func:`set_roles` / :func:`roles` give the per-token role ids (0 reasoner, 1 executor,
  2 summarizer, -1 none) to every MoR layer; a transformers model calls its linears as ``linear(x)``,
  so the roles travel beside the forward call, not through it.
* :func:`disable` / :func:`enable` / :func:`disabled` switch the adapter off (each layer then returns
  its base linear's output, bit-identical to the unwrapped model) and on; :func:`remove_mor` puts the
  original linears back.
* :func:`mor_state_dict`, :func:`save_mor` (``mor_adapter.safetensors`` + ``mor_config.json``, the
  adapter only, meant to sit beside the untouched base checkpoint) and :func:`load_mor`.
* :func:`mor_aux_loss` (``alpha1 * L1 + alpha2 * L2`` of Eq. 8 over the layers' last forward),
  :func:`count_trainable`, and the closed form :func:`mor_param_count`.

Why not peft (0.21 was checked): ``LoraConfig`` describes one low-rank update per adapter,
``B A x * lora_alpha / r``; it has no expert groups, no learned router with top-k renormalisation,
no sigmoid-gated shared expert and no per-token role input, and peft chooses adapters per request
or per sample (``set_adapter``, mixed-batch ``adapter_names``), never per token. peft's nearest
tuner, X-LoRA, mixes whole LoRA adapters with a classifier run in a second forward pass; it has no
role mask or per-group top-k either. ``LoraConfig._register_custom_module`` (experimental) would let a
custom class replace ``nn.Linear``, but the class must follow peft's LoRA-layer protocol
(``update_layer(adapter_name, r, lora_alpha, ...)``, ``lora_A``/``lora_B`` dicts keyed by adapter
name, merge/unmerge), which MoR cannot honour (its routing depends on the input, so it can never be
merged into ``W0``), and it still would not carry the role ids to the layers. So the adapter is
written here, with peft's shape: in-place injection, a frozen base, adapter-only weights in
safetensors with a JSON config, and an off switch.
"""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from lmforge.common.errors import UserError
from lmforge.common.io import atomic_dir
from lmforge.methods.moragent.layer import NO_ROLE, MoRConfig, MoRLinear, mor_aux_losses

__all__ = [
    "ADAPTER_FILE",
    "CONFIG_FILE",
    "LLAMA_TARGETS",
    "apply_mor",
    "count_trainable",
    "disable",
    "disabled",
    "enable",
    "load_mor",
    "mor_aux_loss",
    "mor_layers",
    "mor_param_count",
    "mor_state_dict",
    "remove_mor",
    "roles",
    "save_mor",
    "set_roles",
]

ADAPTER_FILE = "mor_adapter.safetensors"
CONFIG_FILE = "mor_config.json"
FORMAT = "lmforge-mor"
FORMAT_VERSION = 1

# NOTE: the official config falls back to peft's default Llama targets (q_proj, v_proj) when none
# are given, and the official training script is not released. The paper's "+0.16B" on
# Llama-3.2-1B is reproduced only with all seven projections of all 16 layers at rank 16
# (162.4M trainable parameters with the routers and gates; q_proj+v_proj alone would give 24.8M),
# so all seven are the default here.
LLAMA_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")

_LAYER_INDEX = re.compile(r"(?:^|\.)(?:layers|h|blocks|layer)\.(\d+)(?:\.|$)")


def mor_layers(model: nn.Module) -> dict[str, MoRLinear]:
    """The model's MoR layers by module name, in module order."""
    return {name: m for name, m in model.named_modules() if isinstance(m, MoRLinear)}


def _require_mor(model: nn.Module) -> dict[str, MoRLinear]:
    layers = mor_layers(model)
    if not layers:
        raise UserError("the model has no MoR layers; call apply_mor(model, ...) first")
    return layers


def _layer_index(name: str) -> int | None:
    m = _LAYER_INDEX.search(name)
    return None if m is None else int(m.group(1))


def _resolve_layers(model: nn.Module, layers: int | Sequence[int] | None) -> set[int] | None:
    if layers is None:
        return None
    wanted = [layers] if isinstance(layers, int) else list(layers)
    indices = {i for name, _ in model.named_modules() if (i := _layer_index(name)) is not None}
    if not indices:
        raise UserError("cannot pick MoR layers: the model has no numbered decoder layers (…layers.N…)")
    n = max(indices) + 1
    out: set[int] = set()
    for i in wanted:
        j = int(i) + n if int(i) < 0 else int(i)
        if not 0 <= j < n:
            raise UserError(f"MoR layer index {i} is out of range for a model with {n} layers")
        out.add(j)
    return out


def _target_names(model: nn.Module, target_modules: Sequence[str], layers: set[int] | None) -> list[str]:
    names: list[str] = []
    for name, module in model.named_modules():
        if not name or name.rsplit(".", 1)[-1] not in target_modules:
            continue
        if layers is not None and _layer_index(name) not in layers:
            continue
        if isinstance(module, MoRLinear):
            raise UserError(f"'{name}' already has a MoR adapter; remove_mor(model) first")
        if not isinstance(module, nn.Linear):
            raise UserError(f"MoR target '{name}' is a {type(module).__name__}, not an nn.Linear")
        names.append(name)
    return names


def _wrap(model: nn.Module, names: Sequence[str], config: MoRConfig) -> None:
    for p in model.parameters():
        p.requires_grad_(False)
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, MoRLinear(getattr(parent, child), config))


def apply_mor(model: nn.Module, target_modules: Sequence[str] = LLAMA_TARGETS,
              layers: int | Sequence[int] | None = None, rank: int | None = None, alpha: float | None = None,
              config: MoRConfig | None = None, **config_fields: Any) -> nn.Module:
    """Wrap the target linears of ``model`` in :class:`MoRLinear`, in place; freeze everything else.

    Args:
        model: e.g. a transformers ``LlamaForCausalLM``.
        target_modules: module-name suffixes (the last dotted component) to wrap.
        layers: decoder-layer indices to wrap (negative counts from the top: ``range(-4, 0)`` is the
            top four); None wraps every layer.
        rank: expert rank (overrides ``config.rank``).
        alpha: LoRA scale numerator (overrides ``config.alpha``; None keeps the official factor 1).
        config: a :class:`MoRConfig`; further ``config_fields`` override its fields.

    Returns:
        ``model`` (modified in place), with ``model.mor_config`` holding the configuration used.
    """
    if mor_layers(model):
        raise UserError("the model already has MoR layers; remove_mor(model) first")
    fields = (config or MoRConfig()).to_dict()
    if rank is not None:
        fields["rank"] = rank
    if alpha is not None:
        fields["alpha"] = alpha
    fields.update(config_fields)
    cfg = MoRConfig.from_dict(fields)
    targets = [target_modules] if isinstance(target_modules, str) else list(target_modules)
    wanted = _resolve_layers(model, layers)
    names = _target_names(model, targets, wanted)
    if not names:
        where = "" if wanted is None else f" in layers {sorted(wanted)}"
        raise UserError(f"no nn.Linear named {targets}{where} in the model")
    _wrap(model, names, cfg)
    model.mor_config = cfg
    model.mor_targets = {"target_modules": targets, "layers": None if wanted is None else sorted(wanted)}
    return model


def remove_mor(model: nn.Module) -> nn.Module:
    """Put the original linears back and drop the adapter (the base stays frozen, as apply_mor left it)."""
    for name, layer in _require_mor(model).items():
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, layer.base)
    for attr in ("mor_config", "mor_targets"):
        if hasattr(model, attr):
            delattr(model, attr)
    return model


# --------------------------------------------------------------------------------------------
# Roles and the off switch.


def _check_role_ids(role_ids: torch.Tensor | int | None, n_groups: int) -> None:
    if role_ids is None:
        return
    ids = torch.as_tensor(role_ids)
    if ids.dtype.is_floating_point or ids.dtype == torch.bool or ids.is_complex():
        raise UserError(f"role ids must be integers (0 reasoner, 1 executor, 2 summarizer, -1 none), got {ids.dtype}")
    if ids.numel() and (int(ids.min()) < NO_ROLE or int(ids.max()) >= n_groups):
        raise UserError(f"role ids must be in -1..{n_groups - 1}, got values from {int(ids.min())} to {int(ids.max())}")


def set_roles(model: nn.Module, role_ids: torch.Tensor | int | None) -> None:
    """Set the token roles of every MoR layer for the following forward calls.

    ``role_ids``: ``[B, T]`` for the tokens being fed (with a KV cache, the new tokens only), ``[B]``
    or an int for one role per sequence / for all, ``-1`` for tokens without a role (base output
    only), or None to clear.
    """
    # NOTE: how the official training tags prompt and context tokens (system prompt, tool list,
    # observations) is not released; both "no role" (-1, base only) and "the role of the span being
    # generated" can be expressed here, and the choice is left to the caller.
    layers = _require_mor(model)
    _check_role_ids(role_ids, next(iter(layers.values())).config.n_groups)
    for layer in layers.values():
        layer.set_roles(role_ids)


@contextlib.contextmanager
def roles(model: nn.Module, role_ids: torch.Tensor | int | None) -> Iterator[nn.Module]:
    """``with roles(model, role_ids): model(...)`` sets the roles and restores the previous ones after."""
    layers = _require_mor(model)
    previous = {name: layer._role_ids for name, layer in layers.items()}
    set_roles(model, role_ids)
    try:
        yield model
    finally:
        for name, layer in layers.items():
            layer.set_roles(previous[name])


def disable(model: nn.Module) -> None:
    """Switch every MoR layer off: the model computes exactly its base outputs."""
    for layer in _require_mor(model).values():
        layer.disabled = True


def enable(model: nn.Module) -> None:
    """Switch every MoR layer back on."""
    for layer in _require_mor(model).values():
        layer.disabled = False


@contextlib.contextmanager
def disabled(model: nn.Module) -> Iterator[nn.Module]:
    """``with disabled(model): ...`` runs the base model and restores each layer's previous state after."""
    layers = _require_mor(model)
    previous = {name: layer.disabled for name, layer in layers.items()}
    disable(model)
    try:
        yield model
    finally:
        for name, layer in layers.items():
            layer.disabled = previous[name]


# --------------------------------------------------------------------------------------------
# Losses and counts.


def mor_aux_loss(model: nn.Module) -> torch.Tensor:
    """``alpha1 * L1 + alpha2 * L2`` (Eq. 8) from the routing of the last training-mode forward.

    Each MoR layer keeps its routed weights and token roles when it runs in training mode; the
    per-layer terms (:func:`lmforge.methods.moragent.layer.mor_aux_losses`) are averaged over layers.
    """
    layers = _require_mor(model)
    l1: list[torch.Tensor] = []
    l2: list[torch.Tensor] = []
    cfg = next(iter(layers.values())).config
    for layer in layers.values():
        if layer.last_routing is None:
            continue
        routed, role_ids = layer.last_routing
        a, b = mor_aux_losses(routed, role_ids, layer.config.top_k)
        l1.append(a)
        l2.append(b)
    if not l1:
        raise UserError("no MoR routing recorded; run a forward pass in training mode (model.train()) first")
    # NOTE: averaging the per-layer terms over layers is a choice made here (Eq. 8's exact
    # aggregation could not be confirmed); HF's Mixtral balance loss pools all layers instead.
    return cfg.alpha1 * torch.stack(l1).mean() + cfg.alpha2 * torch.stack(l2).mean()


def count_trainable(model: nn.Module) -> int:
    """Number of trainable parameters (``requires_grad``) in ``model``."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def mor_param_count(linear_shapes: Sequence[tuple[int, int]], rank: int = 16,
                    routed: Sequence[int] = (4, 4, 3)) -> int:
    """Closed form of the MoR trainable parameters over the wrapped linears.

    Each linear ``(d_in, d_out)`` gets ``E = sum(routed) + groups`` experts of ``r * (d_in + d_out)``
    parameters, one bias-free router row per routed expert and one shared gate per group
    (``E * d_in``):  ``sum over linears of  E * (r * (d_in + d_out) + d_in)``.
    """
    E = sum(routed) + len(routed)
    return sum(E * (rank * (d_in + d_out) + d_in) for d_in, d_out in linear_shapes)


# --------------------------------------------------------------------------------------------
# Save / load.


def mor_state_dict(model: nn.Module) -> dict[str, torch.Tensor]:
    """The adapter's tensors only, keyed ``<module name>.<mor parameter>`` (base weights excluded)."""
    state: dict[str, torch.Tensor] = {}
    for name, layer in _require_mor(model).items():
        for key, value in layer.state_dict().items():
            if not key.startswith("base."):
                state[f"{name}.{key}"] = value
    return state


def save_mor(model: nn.Module, folder: str | Path, overwrite: bool = False) -> Path:
    """Write ``mor_adapter.safetensors`` and ``mor_config.json`` into ``folder`` (atomically).

    The base model is not written: the folder is meant to sit beside the base checkpoint, whose
    name or path is recorded in the JSON (``base_model_name_or_path``) when the model has one.
    """
    from safetensors.torch import save_file

    layers = _require_mor(model)
    cfg: MoRConfig = next(iter(layers.values())).config
    base_config = getattr(model, "config", None)
    meta = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "base_model_name_or_path": getattr(base_config, "_name_or_path", None) or None,
        "config": cfg.to_dict(),
        "targets": getattr(model, "mor_targets", None),
        "modules": list(layers),
    }
    state = {k: v.detach().contiguous().cpu() for k, v in mor_state_dict(model).items()}
    with atomic_dir(folder, overwrite=overwrite) as tmp:
        save_file(state, str(tmp / ADAPTER_FILE), metadata={"format": FORMAT})
        (tmp / CONFIG_FILE).write_text(json.dumps(meta, indent=2) + "\n", encoding="utf-8")
    return Path(folder)


def load_mor(base_model: nn.Module, folder: str | Path) -> nn.Module:
    """Wrap ``base_model`` exactly as the saved adapter was and load its weights (in place).

    Args:
        base_model: the base model the adapter was trained on (without MoR layers).
        folder: a folder written by :func:`save_mor`.

    Returns:
        ``base_model`` with the adapter, in the mode it was in.
    """
    from safetensors.torch import load_file

    p = Path(folder)
    cfg_path, weights_path = p / CONFIG_FILE, p / ADAPTER_FILE
    if not cfg_path.is_file() or not weights_path.is_file():
        raise UserError(f"{p} is not a MoR adapter folder (needs {CONFIG_FILE} and {ADAPTER_FILE})")
    try:
        meta = json.loads(cfg_path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise UserError(f"{cfg_path}: not valid JSON ({exc.msg} at line {exc.lineno})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise UserError(f"{cfg_path} is not a MoR adapter config (format {FORMAT!r})")
    if meta.get("format_version") != FORMAT_VERSION:
        raise UserError(f"{cfg_path} has MoR format version {meta.get('format_version')}, this lmforge reads "
                        f"{FORMAT_VERSION}")
    if mor_layers(base_model):
        raise UserError("the base model already has MoR layers; load the adapter into a plain base model")
    cfg = MoRConfig.from_dict(meta["config"])
    names = list(meta["modules"])
    modules = dict(base_model.named_modules())
    missing = [n for n in names if n not in modules]
    if missing:
        raise UserError(f"the base model has no module '{missing[0]}' that the MoR adapter in {p} wraps")
    wrong = [n for n in names if not isinstance(modules[n], nn.Linear)]
    if wrong:
        raise UserError(f"MoR adapter module '{wrong[0]}' is a {type(modules[wrong[0]]).__name__} in the base "
                        "model, not an nn.Linear")
    _wrap(base_model, names, cfg)
    base_model.mor_config = cfg
    base_model.mor_targets = meta.get("targets")
    state = load_file(str(weights_path))
    layers = mor_layers(base_model)
    expected = mor_state_dict(base_model)
    if set(state) != set(expected):
        extra = sorted(set(state) - set(expected))
        lost = sorted(set(expected) - set(state))
        raise UserError(f"MoR adapter in {p} does not match the model: "
                        + (f"unexpected tensor '{extra[0]}'" if extra else f"missing tensor '{lost[0]}'"))
    for key, value in state.items():
        if tuple(value.shape) != tuple(expected[key].shape):
            raise UserError(f"MoR adapter tensor '{key}' has shape {tuple(value.shape)}, the model needs "
                            f"{tuple(expected[key].shape)} (a different base model?)")
    for name, layer in layers.items():
        prefix = f"{name}."
        own = {k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)}
        layer.load_state_dict(own, strict=False)
    return base_model
