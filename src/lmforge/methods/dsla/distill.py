"""Chained distillation of attention layers into DSLA (DSLA-Serve ``distill.py``, ``run_distill.py``).

Layers are converted one stage at a time in the given order (the entropy order, :mod:`.order`).
Stage ``k`` converts layer ``ℓ_k`` with ``ℓ_1 … ℓ_{k−1}`` already converted, then:

1. **local** (the issue's addition, not in the official code): the new layer alone is fitted to the
   teacher's attention output on cached teacher inputs (the post-norm hidden states entering that
   attention), by MSE;
2. **joint**, the official loss ``CE + α·T²·KL(p_T ‖ p_S) + β·mean_ℓ MSE(h_S^ℓ, h_T^ℓ)`` over the
   converted layers, with only the converted layers' attention trained (the official ``--freeze``).
   The official defaults: α = 0.001 (``soft_loss``), β = 0.01 (``align_loss``), T = 1, MSE
   (``loss_func``); the KL is ``F.kl_div(..., reduction="batchmean")``, summed over positions and
   the vocabulary and divided by the batch size, as the official trainer computes it.

NOTE: the official trainer pairs converted layer ``ℓ`` with ``hidden_states[ℓ]``, which in
transformers' tuple is the input of layer ℓ (index 0 is the embeddings), an off-by-one.
``hidden_index="output"`` (the default) uses layer ℓ's output, as the paper describes; ``"official"``
keeps the official index.

Checked: TRL's ``GKDTrainer`` and transformers' ``Trainer`` do not freeze per layer with a hidden-state
term; the official trainer is a modified HF ``Trainer``. The loop is written here (a few lines),
with the checkpoint per stage that ``lmforge train dsla`` resumes from.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from lmforge.methods.dsla.convert import attention_modules, convert_layers, converted, dsla_state_dict, load_dsla_state
from lmforge.methods.dsla.layer import DSLAConfig, DualStateLinearAttention, energy_rescale_


@dataclass
class DistillConfig:
    """Chained distillation settings (official defaults where the official code has them).

    Attributes:
        local_steps: MSE steps fitting the new layer to the teacher attention (0: skip).
        joint_steps: steps of the official loss per stage.
        lr: AdamW learning rate of the DSLA parameters.
        alpha: KL weight (official ``soft_loss`` default 0.001).
        beta: hidden-state MSE weight (official ``align_loss`` default 0.01).
        temperature: KL temperature (official 1).
        hidden_index: ``output`` (layer ℓ's output) or ``official`` (transformers' ``hidden_states[ℓ]``).
        energy_init: fold ‖teacher‖/‖DSLA‖ into ``o_proj`` before training (a NOTE deviation).
        batch_size: windows per step.
        seed: seed of the window order and of the DSLA initialisation.
    """

    local_steps: int = 60
    joint_steps: int = 30
    lr: float = 1e-3
    alpha: float = 0.001
    beta: float = 0.01
    temperature: float = 1.0
    hidden_index: str = "output"
    energy_init: bool = False
    batch_size: int = 4
    seed: int = 0


@dataclass
class StageLog:
    """What one stage did."""

    layer: int
    local_mse: list[float] = field(default_factory=list)
    joint_loss: list[float] = field(default_factory=list)
    energy_factor: float | None = None


class ZeroAttention(nn.Module):
    """The ablation baseline: an attention layer that outputs zeros (the residual passes through)."""

    def forward(self, hidden_states: torch.Tensor, *args: Any, **kwargs: Any) -> tuple[torch.Tensor, None]:
        return torch.zeros_like(hidden_states), None


def zero_layers(model: nn.Module, layers: Sequence[int]) -> dict[int, nn.Module]:
    """Replace those layers' attention by :class:`ZeroAttention`; returns the originals to put back."""
    mods = attention_modules(model)
    originals = {}
    for i in layers:
        originals[i] = mods[i]
        model.model.layers[i].self_attn = ZeroAttention()
    return originals


def put_back(model: nn.Module, originals: dict[int, nn.Module]) -> None:
    """Undo :func:`zero_layers`."""
    for i, mod in originals.items():
        model.model.layers[i].self_attn = mod


def _attn_io(teacher: nn.Module, layer: int, windows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The teacher's attention input (post-norm hidden) and output at ``layer`` on ``windows``."""
    got: dict[str, torch.Tensor] = {}

    def hook(_mod, args, kwargs, out):
        got["x"] = (kwargs.get("hidden_states") if "hidden_states" in kwargs else args[0]).detach()
        got["y"] = out[0].detach()

    h = teacher.model.layers[layer].self_attn.register_forward_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            teacher(windows)
    finally:
        h.remove()
    return got["x"], got["y"]


def official_loss(student_out: Any, teacher_out: Any, labels: torch.Tensor, layers: Sequence[int],
                  cfg: DistillConfig) -> tuple[torch.Tensor, dict[str, float]]:
    """``CE + α·T²·KL_batchmean(p_T ‖ p_S) + β·mean MSE`` (see the module docstring)."""
    logits = student_out.logits
    ce = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), labels[:, 1:].flatten())
    t = cfg.temperature
    kl = F.kl_div(F.log_softmax(logits.float() / t, dim=-1), F.softmax(teacher_out.logits.float() / t, dim=-1),
                  reduction="batchmean") * t * t
    off = 1 if cfg.hidden_index == "output" else 0
    mse = torch.stack([F.mse_loss(student_out.hidden_states[i + off].float(), teacher_out.hidden_states[i + off].float())
                       for i in layers]).mean()
    loss = ce + cfg.alpha * kl + cfg.beta * mse
    return loss, {"ce": float(ce.detach()), "kl": float(kl.detach()), "mse": float(mse.detach())}


def _dsla_params(model: nn.Module, layers: Sequence[int]) -> list[nn.Parameter]:
    mods = attention_modules(model)
    return [p for i in layers for p in mods[i].parameters()]


def distill_stage(student: nn.Module, teacher: nn.Module, layer: int, windows: torch.Tensor, cfg: DistillConfig,
                  dsla_cfg: DSLAConfig, progress: Callable[[str], None] | None = None) -> StageLog:
    """Convert ``layer`` of ``student`` and train it (local MSE, then the official joint loss).

    Args:
        student: the model being converted (already holding the earlier stages' DSLA layers).
        teacher: the unconverted model (frozen).
        layer: the layer this stage converts.
        windows: ``[N, T]`` token windows (the training data; batches are drawn in a seeded order).
        cfg: distillation settings.
        dsla_cfg: the DSLA layer settings.
        progress: called with a short status line now and then.
    """
    if cfg.hidden_index not in ("output", "official"):
        raise ValueError(f"hidden_index must be output or official, not {cfg.hidden_index!r}")
    log = StageLog(layer)
    convert_layers(student, [layer], dsla_cfg)
    dsla = attention_modules(student)[layer]
    assert isinstance(dsla, DualStateLinearAttention)
    gen = torch.Generator().manual_seed(cfg.seed * 1000 + layer)
    n = windows.shape[0]

    def batch() -> torch.Tensor:
        return windows[torch.randperm(n, generator=gen)[: cfg.batch_size]]

    teacher.eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    for p in student.parameters():
        p.requires_grad_(False)

    if cfg.energy_init or cfg.local_steps:
        x_all, y_all = _attn_io(teacher, layer, windows[: max(cfg.batch_size * 4, 1)])
    if cfg.energy_init:
        log.energy_factor = float(energy_rescale_(dsla, x_all, y_all))
    if cfg.local_steps:
        params = list(dsla.parameters())
        for p in params:
            p.requires_grad_(True)
        opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
        m = x_all.shape[0]
        for step in range(cfg.local_steps):
            idx = torch.randperm(m, generator=gen)[: cfg.batch_size]
            out, _ = dsla(hidden_states=x_all[idx])
            loss = F.mse_loss(out.float(), y_all[idx].float())
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            log.local_mse.append(float(loss.detach()))
            if progress and (step + 1) % 20 == 0:
                progress(f"layer {layer}: local step {step + 1}/{cfg.local_steps}, MSE {float(loss):.4g}")
    if cfg.joint_steps:
        layers = converted(student)
        params = _dsla_params(student, layers)
        for p in params:
            p.requires_grad_(True)
        opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=0.0)
        student.train()
        for step in range(cfg.joint_steps):
            ids = batch()
            with torch.no_grad():
                t_out = teacher(ids, output_hidden_states=True)
            s_out = student(ids, output_hidden_states=True)
            loss, parts = official_loss(s_out, t_out, ids, layers, cfg)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            log.joint_loss.append(float(loss.detach()))
            if progress and (step + 1) % 10 == 0:
                progress(f"layer {layer}: joint step {step + 1}/{cfg.joint_steps}, loss {float(loss):.4f} "
                         f"(kl {parts['kl']:.3f}, mse {parts['mse']:.4g})")
        student.eval()
    for p in student.parameters():
        p.requires_grad_(False)
    return log


def chain_distill(student: nn.Module, teacher: nn.Module, order: Sequence[int], windows: torch.Tensor,
                  cfg: DistillConfig, dsla_cfg: DSLAConfig, ckpt_dir: str | Path | None = None,
                  progress: Callable[[str], None] | None = None) -> list[StageLog]:
    """Run the stages in ``order``; with ``ckpt_dir``, save after each stage and resume from there.

    The checkpoint is ``dsla.safetensors`` (the DSLA parameters of every converted layer) and
    ``stages.json`` (the stage logs and settings), both written atomically; a rerun with the same
    ``order`` and settings loads them and continues with the next layer. Different settings are
    refused rather than mixed.
    """
    from lmforge.common.errors import UserError
    from lmforge.common.io import atomic_write_json

    logs: list[StageLog] = []
    ckpt = Path(ckpt_dir) if ckpt_dir is not None else None
    settings = {"order": list(order), "distill": asdict(cfg), "dsla": asdict(dsla_cfg)}
    if ckpt is not None and (ckpt / "stages.json").is_file():
        saved = json.loads((ckpt / "stages.json").read_text())
        if saved["settings"] != settings:
            raise UserError(f"{ckpt} holds a run with other settings; pass --overwrite to start again")
        logs = [StageLog(**s) for s in saved["stages"]]
        from safetensors.torch import load_file

        load_dsla_state(student, load_file(str(ckpt / "dsla.safetensors")), dsla_cfg)
        if progress:
            progress(f"resumed after {len(logs)} stage(s): layers {[s.layer for s in logs]}")
    for layer in list(order)[len(logs):]:
        logs.append(distill_stage(student, teacher, layer, windows, cfg, dsla_cfg, progress))
        if ckpt is not None:
            from safetensors.torch import save_file

            ckpt.mkdir(parents=True, exist_ok=True)
            tmp = ckpt / "dsla.safetensors.tmp"
            save_file({k: v.detach().contiguous() for k, v in dsla_state_dict(student).items()}, str(tmp))
            tmp.replace(ckpt / "dsla.safetensors")
            atomic_write_json(ckpt / "stages.json", {"settings": settings, "stages": [asdict(s) for s in logs]})
    return logs


@torch.no_grad()
def evaluate(student: nn.Module, teacher: nn.Module, windows: torch.Tensor, batch_size: int = 4) -> dict[str, float]:
    """Mean per-token NLL of the student and KL(teacher ‖ student) on ``windows`` (next-token)."""
    nll = kl = 0.0
    count = 0
    for i in range(0, windows.shape[0], batch_size):
        ids = windows[i:i + batch_size]
        s = student(ids).logits[:, :-1].float()
        t = teacher(ids).logits[:, :-1].float()
        ls, lt = F.log_softmax(s, -1), F.log_softmax(t, -1)
        nll += float(F.nll_loss(ls.flatten(0, 1), ids[:, 1:].flatten(), reduction="sum"))
        kl += float((lt.exp() * (lt - ls)).sum())
        count += ids[:, 1:].numel()
    return {"nll": nll / count, "kl": kl / count}
