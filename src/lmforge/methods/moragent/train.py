"""MoRAgent training: completion-only loss per role, and the equal-parameter LoRA baseline.

Han et al., "MoRAgent" (ICML 2025), §3.3: the loss is the cross-entropy on each role's own tokens
plus Eq. 8's auxiliary routing terms (:func:`lmforge.methods.moragent.adapter.mor_aux_loss`).

* :func:`encode_examples` turns trajectories into ``input_ids``, per-token ``role_ids``
  (:func:`~lmforge.methods.moragent.data.encode_trajectory`) and ``labels``: a token is a target only
  where it belongs to a role segment (reasoner, executor, summarizer, and the closing EOS); user and
  observation tokens are context (-100). Padding and label masking use TRL's own collator
  (``trl.trainer.sft_trainer.DataCollatorForLanguageModeling``, right padding, -100 labels).
* :func:`add_adapter` puts either MoR (:func:`~lmforge.methods.moragent.adapter.apply_mor`) or a
  plain PEFT ``LoraConfig`` adapter on the same decoder layers and projections; :func:`lora_rank_for`
  picks the LoRA rank whose trainable-parameter count is nearest MoR's (routers and gates included).
* :func:`train_adapter` runs AdamW with linear warm-up and cosine decay over shuffled examples. The
  MoR arm adds ``mor_aux_loss``; the LoRA arm has no such term.

**Frozen-prefix cache** (an exact speed-up, on by default): when every adapted layer is at or above
decoder layer ``L0``, the layers below are frozen and see no adapter, so their output (the input of
layer ``L0``) is the same at every step. It is computed once per example and training runs only
layers ``L0..`` from it (``inputs_embeds`` into the same model with its layer list cut). The first
batch checks the cut model's loss against the full model's (:class:`PrefixMismatch` if they differ
beyond float rounding). The logits are taken only at target positions, which is what the loss reads.

Checked: TRL's ``SFTTrainer`` has completion-only and assistant-only masks, but no per-token side
input for the adapter (the role ids) and no extra loss term without subclassing its ``compute_loss``;
its collator is what is reused. peft builds the LoRA baseline.
"""

from __future__ import annotations

import json
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from lmforge.common.errors import UserError
from lmforge.methods.moragent.adapter import LLAMA_TARGETS, apply_mor, count_trainable, mor_aux_loss, mor_layers, set_roles
from lmforge.methods.moragent.data import Trajectory, encode_trajectory
from lmforge.methods.moragent.layer import MoRConfig

__all__ = ["TRAIN_LOG", "Example", "PrefixMismatch", "TrainSettings", "add_adapter", "encode_examples",
           "load_adapter", "lora_rank_for", "mor_trainable_count", "save_adapter", "train_adapter"]

Kind = Literal["mor", "lora"]


@dataclass(frozen=True)
class Example:
    input_ids: list[int]
    role_ids: list[int]
    labels: list[int]


class PrefixMismatch(RuntimeError):
    """The cut model (cached prefix) does not compute the full model's loss: this architecture's
    layers cannot be run from ``inputs_embeds`` with a shortened layer list."""


def encode_examples(tokenizer: Any, trajectories: Sequence[Trajectory], max_len: int = 1024) -> tuple[list[Example], int]:
    """Examples for training and the number dropped for being longer than ``max_len`` tokens."""
    out, too_long = [], 0
    for t in trajectories:
        ids, roles = encode_trajectory(tokenizer, t)
        if len(ids) > max_len:
            too_long += 1
            continue
        out.append(Example(ids, roles, [i if r >= 0 else -100 for i, r in zip(ids, roles)]))
    return out, too_long


def _decoder_layers(model: nn.Module) -> nn.ModuleList:
    inner = getattr(model, "model", None)
    layers = getattr(inner, "layers", None)
    if not isinstance(layers, nn.ModuleList):
        raise UserError(f"{type(model).__name__} has no model.layers list (a Llama-style decoder is needed)")
    return layers


def _linear_dims(model: nn.Module, layers: Sequence[int], targets: Sequence[str]) -> list[tuple[int, int]]:
    dims = []
    for i in layers:
        for name, m in _decoder_layers(model)[i].named_modules():
            if name.rsplit(".", 1)[-1] in targets and isinstance(m, nn.Linear):
                dims.append((m.in_features, m.out_features))
    if not dims:
        raise UserError(f"no {', '.join(targets)} linears in decoder layers {list(layers)}")
    return dims


def mor_trainable_count(dims: Sequence[tuple[int, int]], config: MoRConfig) -> int:
    """MoR's trainable parameters on linears of these (in, out) sizes: experts' A and B, the routers
    and the shared gates (the count :func:`~lmforge.methods.moragent.adapter.count_trainable` gives)."""
    per = [config.n_experts * config.rank * (i + o) + i * (sum(config.routed) + len(config.routed)) for i, o in dims]
    return sum(per)


def lora_rank_for(dims: Sequence[tuple[int, int]], target: int) -> int:
    """The LoRA rank whose count ``rank * sum(in + out)`` is nearest ``target`` (at least 1)."""
    return max(1, round(target / sum(i + o for i, o in dims)))


def add_adapter(model: nn.Module, kind: Kind, layers: Sequence[int], *, config: MoRConfig | None = None,
                targets: Sequence[str] = LLAMA_TARGETS, lora_rank: int | None = None,
                lora_alpha: float | None = None, seed: int = 0) -> tuple[nn.Module, dict[str, Any]]:
    """Put a MoR or an equal-size LoRA adapter on ``layers`` (decoder indices, negatives from the top).

    Returns ``(model, info)`` with ``info`` the trainable count and, for LoRA, its rank (matched to
    MoR's count unless ``lora_rank`` is given) and alpha (``= rank``: scaling 1, as MoR's experts
    have; ``# NOTE`` in the code).
    """
    n = len(_decoder_layers(model))
    idx = sorted({i + n if i < 0 else i for i in layers})
    if not idx or idx[0] < 0 or idx[-1] >= n:
        raise UserError(f"adapter layers {list(layers)} are out of range for a model with {n} decoder layers")
    cfg = config or MoRConfig()
    dims = _linear_dims(model, idx, targets)
    torch.manual_seed(seed)
    if kind == "mor":
        apply_mor(model, targets, layers=idx, config=cfg)
        info = {"kind": "mor", "layers": idx, "rank": cfg.rank, "trainable": count_trainable(model)}
    elif kind == "lora":
        from peft import LoraConfig, get_peft_model

        rank = lora_rank or lora_rank_for(dims, mor_trainable_count(dims, cfg))
        # NOTE: alpha = rank (scaling 1), matching the official MoR layer, which adds x A B unscaled.
        alpha = lora_alpha if lora_alpha is not None else float(rank)
        model = get_peft_model(model, LoraConfig(r=rank, lora_alpha=alpha, lora_dropout=0.0,
                                                 target_modules=list(targets), layers_to_transform=idx,
                                                 bias="none"))
        info = {"kind": "lora", "layers": idx, "rank": rank, "alpha": alpha,
                "trainable": sum(p.numel() for p in model.parameters() if p.requires_grad)}
    else:
        raise UserError(f"adapter kind must be 'mor' or 'lora', got {kind!r}")
    info["mor_equivalent"] = mor_trainable_count(dims, cfg)
    return model, info


@dataclass
class TrainSettings:
    """The schedule: AdamW (no weight decay), linear warm-up over ``warmup`` steps, cosine to 0.

    ``bf16``: autocast matmuls to bfloat16 (adapter weights and optimizer state stay float32).
    ``prefix_cache``: the exact frozen-prefix cache of the module docstring.
    """

    steps: int = 100
    lr: float = 2e-4
    batch_size: int = 8
    warmup: int = 10
    seed: int = 0
    clip: float = 1.0
    bf16: bool = True
    prefix_cache: bool = True
    aux: bool = True
    log: Callable[[int, float], None] | None = field(default=None, repr=False)

    def check(self) -> None:
        if self.steps < 1 or self.batch_size < 1 or self.lr <= 0 or self.warmup < 0:
            raise UserError("training needs steps >= 1, batch_size >= 1, lr > 0 and warmup >= 0")


def _collate(tokenizer: Any, batch: Sequence[Example]) -> dict[str, torch.Tensor]:
    from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
    out = DataCollatorForLanguageModeling(pad_token_id=int(pad))(
        [{"input_ids": e.input_ids, "labels": e.labels} for e in batch])
    width = out["input_ids"].shape[1]
    out["role_ids"] = torch.tensor([e.role_ids + [-1] * (width - len(e.role_ids)) for e in batch])
    return out


def _inner(model: nn.Module) -> nn.Module:
    """The causal LM under a peft wrapper (or the model itself)."""
    base = getattr(model, "base_model", None)
    return getattr(base, "model", model) if base is not None and hasattr(model, "peft_config") else model


def _first_adapted_layer(model: nn.Module) -> int:
    lm = _inner(model)
    for i, layer in enumerate(_decoder_layers(lm)):
        if any(p.requires_grad for p in layer.parameters()):
            return i
    raise UserError("the model has no trainable decoder layer; add an adapter first")


def _loss(lm: nn.Module, batch: dict[str, torch.Tensor], start: int, hidden: torch.Tensor | None) -> torch.Tensor:
    """Mean CE over target tokens, from layer ``start`` on ``hidden`` (or the whole model)."""
    labels = batch["labels"]
    inner = lm.model
    if hidden is None:
        h = inner(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False).last_hidden_state
    else:
        full = inner.layers
        inner.layers = nn.ModuleList(list(full)[start:])
        try:
            h = inner(inputs_embeds=hidden, attention_mask=batch["attention_mask"], use_cache=False).last_hidden_state
        finally:
            inner.layers = full
    # position t predicts token t+1
    target = labels[:, 1:]
    keep = target != -100
    logits = lm.lm_head(h[:, :-1][keep])
    return nn.functional.cross_entropy(logits.float(), target[keep])


def _prefix_hidden(lm: nn.Module, batch: dict[str, torch.Tensor], start: int) -> torch.Tensor:
    """The input of decoder layer ``start``: the model run with its layer list cut to ``[:start]``,
    read from the last kept layer's output (``hidden_states[-1]`` would be after the final norm)."""
    inner = lm.model
    full = inner.layers
    captured: list[torch.Tensor] = []

    def grab(_module: nn.Module, _args: Any, output: Any) -> None:
        captured.append(output[0] if isinstance(output, tuple) else output)

    inner.layers = nn.ModuleList(list(full)[:start])
    handle = inner.layers[-1].register_forward_hook(grab)
    try:
        with torch.no_grad():
            inner(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=False)
    finally:
        handle.remove()
        inner.layers = full
    return captured[-1].detach()


def train_adapter(model: nn.Module, tokenizer: Any, examples: Sequence[Example], settings: TrainSettings,
                  progress: Any = None) -> dict[str, Any]:
    """Train the model's adapter (MoR or peft LoRA) on ``examples``; returns the log.

    Batches are drawn from a seeded shuffle of the examples, epoch after epoch. The log holds the loss
    per step, the wall time and whether the prefix cache ran.
    """
    settings.check()
    if not examples:
        raise UserError("no training examples")
    params = [p for p in model.parameters() if p.requires_grad]
    if not params:
        raise UserError("the model has no trainable parameters; add an adapter first")
    has_mor = bool(mor_layers(model))
    lm = _inner(model)
    start = _first_adapted_layer(model) if settings.prefix_cache else 0
    opt = torch.optim.AdamW(params, lr=settings.lr, weight_decay=0.0)

    def factor(step: int) -> float:
        if step < settings.warmup:
            return (step + 1) / (settings.warmup + 1)
        span = max(1, settings.steps - settings.warmup)
        return 0.5 * (1 + math.cos(math.pi * (step - settings.warmup) / span))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, factor)
    rng = random.Random(f"moragent-train:{settings.seed}")
    order: list[int] = []
    cache: dict[int, torch.Tensor] = {}
    losses: list[float] = []
    t0 = time.perf_counter()
    model.train()
    device = params[0].device
    autocast = torch.autocast(device.type, dtype=torch.bfloat16, enabled=settings.bf16)
    checked = False
    try:
        for step in range(settings.steps):
            if len(order) < settings.batch_size:
                perm = list(range(len(examples)))
                rng.shuffle(perm)
                order += perm
            idx, order = order[: settings.batch_size], order[settings.batch_size:]
            batch = {k: v.to(device) for k, v in _collate(tokenizer, [examples[i] for i in idx]).items()}
            if has_mor:
                set_roles(model, batch["role_ids"])
            with autocast:
                hidden = None
                if start > 0:
                    # one prefix per example (right padding: its rows are independent of the batch)
                    missing = [i for i in idx if i not in cache]
                    if missing:
                        sub = {k: v.to(device) for k, v in _collate(tokenizer, [examples[i] for i in missing]).items()}
                        h = _prefix_hidden(lm, sub, start)
                        for j, i in enumerate(missing):
                            cache[i] = h[j, : len(examples[i].input_ids)].clone()
                    width = batch["input_ids"].shape[1]
                    hidden = torch.stack([nn.functional.pad(cache[i], (0, 0, 0, width - cache[i].shape[0]))
                                          for i in idx])
                ref = None
                if start > 0 and not checked:
                    # before the step's own forward: a MoR layer keeps the routing of its last call
                    # for the auxiliary loss, which must be the step's, with its graph
                    with torch.no_grad():
                        ref = _loss(lm, batch, 0, None)
                loss = _loss(lm, batch, start, hidden)
                if ref is not None:
                    if not torch.allclose(loss.detach().float(), ref.float(), rtol=2e-2, atol=2e-2):
                        raise PrefixMismatch(f"prefix-cached loss {float(loss):.5f} != full model's {float(ref):.5f}")
                    checked = True
                total = loss + (mor_aux_loss(model) if has_mor and settings.aux else 0.0)
            opt.zero_grad(set_to_none=True)
            total.backward()
            if settings.clip > 0:
                torch.nn.utils.clip_grad_norm_(params, settings.clip)
            opt.step()
            sched.step()
            losses.append(float(loss.detach()))
            if settings.log is not None:
                settings.log(step, losses[-1])
            if progress is not None:
                progress(step)
    finally:
        if has_mor:
            set_roles(model, None)
            for layer in mor_layers(model).values():
                layer.last_routing = None  # the last step's graph: frees it (and lets the model be copied)
        model.eval()
    return {"losses": losses, "seconds": time.perf_counter() - t0, "prefix_layer": start,
            "examples": len(examples), "steps": settings.steps}


TRAIN_LOG = "mor_train.json"


def save_adapter(model: nn.Module, folder: str | Path, log: dict[str, Any], *, overwrite: bool = False) -> Path:
    """Save the trained adapter only (never the base weights), atomically, with the training log.

    MoR: :func:`~lmforge.methods.moragent.adapter.save_mor` (``mor_adapter.safetensors``,
    ``mor_config.json``); LoRA: peft's ``save_pretrained`` (``adapter_model.safetensors``,
    ``adapter_config.json``, loadable by ``PeftModel.from_pretrained``). Both add ``mor_train.json``.
    """
    from lmforge.common.io import atomic_dir
    from lmforge.methods.moragent.adapter import save_mor

    folder = Path(folder)
    with atomic_dir(folder, overwrite=overwrite) as tmp:
        if mor_layers(model):
            save_mor(model, tmp / "adapter", overwrite=False)
            for f in (tmp / "adapter").iterdir():
                f.rename(tmp / f.name)
            (tmp / "adapter").rmdir()
        elif hasattr(model, "peft_config"):
            model.save_pretrained(str(tmp), safe_serialization=True)
        else:
            raise UserError("the model has no MoR or LoRA adapter to save")
        (tmp / TRAIN_LOG).write_text(json.dumps(log, indent=2) + "\n", encoding="utf-8")
    return folder


def load_adapter(base_model: nn.Module, folder: str | Path) -> nn.Module:
    """Load an adapter folder written by :func:`save_adapter` onto ``base_model``: MoR when it holds
    ``mor_config.json``, else a peft LoRA (``adapter_config.json``); anything else is a UserError."""
    from lmforge.methods.moragent.adapter import CONFIG_FILE, load_mor

    p = Path(folder)
    if (p / CONFIG_FILE).is_file():
        return load_mor(base_model, p)
    if (p / "adapter_config.json").is_file():
        from peft import PeftModel

        if not (p / "adapter_model.safetensors").is_file():
            raise UserError(f"{p}: a LoRA adapter folder needs adapter_model.safetensors (pickle weights are not loaded)")
        return PeftModel.from_pretrained(base_model, str(p), is_trainable=False).eval()
    raise UserError(f"{p} is not an adapter folder (no {CONFIG_FILE} for MoR, no adapter_config.json for LoRA)")
