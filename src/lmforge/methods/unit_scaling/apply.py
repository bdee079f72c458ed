"""The µnit Scaling contract the CLI calls: build a µS model and optimizer, switch FP8 on, check µS-ness.

Narayan et al., "µnit Scaling: Simple and Scalable FP8 LLM Training" (ICML 2025).

The ``train_*`` and ``fp8_*`` hooks at the end are what this package's ``__init__`` registers with
the trainer as ``lmforge train --parametrization mus`` (:class:`lmforge.common.trainer.Parametrization`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import nn
from transformers import LlamaConfig

from lmforge.common.errors import UserError
from lmforge.methods.unit_scaling.config import MuSConfig
from lmforge.methods.unit_scaling.fp8 import KINDS, FP8Counters
from lmforge.methods.unit_scaling.model import MuSForCausalLM, build_mus, load_mus
from lmforge.methods.unit_scaling.optim import Lion, mus_param_groups


def is_mus(model: nn.Module) -> bool:
    """Whether ``model`` is µS-parametrized (built by :func:`build_mus_model` or ``load_mus``)."""
    return isinstance(model, MuSForCausalLM) and bool(getattr(model, "is_mus", False))


def build_mus_model(llama_config: LlamaConfig, cfg: MuSConfig) -> torch.nn.Module:
    """A freshly initialised µS causal LM shaped by ``llama_config``; FP8 on when ``cfg.fp8``.

    Args:
        llama_config: width, depth, heads, FFN width, vocabulary and RoPE settings.
        cfg: µS hyperparameters.

    Returns:
        A :class:`~lmforge.methods.unit_scaling.model.MuSForCausalLM` (HF-style outputs).
    """
    model = build_mus(llama_config, cfg)
    if cfg.fp8:
        enable_fp8(model)
    return model


def build_mus_optimizer(model: nn.Module, cfg: MuSConfig, lr: float, weight_decay: float) -> torch.optim.Optimizer:
    """Lion over µS's parameter groups (hidden LR ``lr·sqrt(d_base/d)``), fully decoupled λ.

    Args:
        model: a µS model.
        cfg: its µS config (``d_base``, ``betas``).
        lr: peak η.
        weight_decay: λ.

    Returns:
        The optimizer; pair it with ``optim.cosine_schedule`` for the paper's cosine-to-10%.
    """
    if not is_mus(model):
        raise UserError("build_mus_optimizer needs a µS model: its LR rule assumes N(0,1) weights with "
                        "1/sqrt(fan_in) multipliers (build it with build_mus_model)")
    return Lion(mus_param_groups(model, cfg, lr, weight_decay), lr=lr, betas=cfg.betas,
                weight_decay=weight_decay, independent_wd=True)


def enable_fp8(model: nn.Module) -> FP8Counters:
    """Run every hidden linear of a µS model in FP8 (E4M3 forward, E5M2 backward, static casts).

    Args:
        model: a µS model.

    Returns:
        The counters the casts record underflows/overflows into (also ``model.fp8_counters``).
    """
    if not is_mus(model):
        raise UserError(
            "FP8 with static casts needs a µS model: without scale factors, values stay inside FP8's range "
            "only when weights, activations and gradients are unit-scaled, which µS guarantees and the "
            "standard parametrization does not (build the model with build_mus_model)")
    counters = model.fp8_counters if model.fp8_counters is not None else FP8Counters()
    for lin in model.hidden_linears().values():
        lin.fp8 = True
        lin.counters = counters
    model.fp8_counters = counters
    return counters


# ------------------------------------------------------------------ the trainer's parametrization

# Why --fp8 needs µS (the trainer's refusal under another parametrization).
FP8_WHY = ("the casts are static (no scale factors), so values stay inside FP8's range only when weights, "
           "activations and gradients are unit-scaled, which µS guarantees and the standard parametrization does not")


def _job_config(job: Any) -> MuSConfig:
    return MuSConfig() if job.tau is None else MuSConfig(tau=job.tau)


def train_load(folder: Path, job: Any) -> nn.Module:
    """A µS folder (``save_mus``) to train on; ``job.tau``, when given, must be the one it was built with."""
    model = load_mus(folder)
    if job.tau is not None and abs(model.mus_config.tau - job.tau) > 1e-12:
        raise UserError(f"{folder} was built with tau={model.mus_config.tau}; tau is fixed at initialisation, "
                        "drop --tau or start from a standard model")
    return model


def train_reinit(model: nn.Module, folder: Path, job: Any) -> nn.Module:
    """A fresh µS model shaped like the standard Llama ``model`` loaded from ``folder``.

    NOTE: µS is a parametrization of the weights at initialisation (unit-variance weights with
    1/sqrt(fan_in) multipliers), so a checkpoint trained under the standard parametrization cannot
    be converted: its config is kept (and, by the trainer, its tokenizer) and the weights are drawn anew.
    """
    if getattr(model.config, "model_type", None) != "llama":
        raise UserError(f"--parametrization mus builds Llama-style models; {folder} is a "
                        f"'{getattr(model.config, 'model_type', '?')}' model")
    return build_mus_model(model.config, _job_config(job))


def train_optimizer(job: Any, model: nn.Module) -> torch.optim.Optimizer:
    """Lion over µS's learning-rate groups, at the job's peak lr and weight decay."""
    return build_mus_optimizer(model, model.mus_config, lr=job.lr, weight_decay=job.weight_decay)


def fp8_is_on(model: nn.Module) -> bool:
    """Whether any hidden linear of a µS model already runs in FP8 (a folder saved with ``--fp8``)."""
    return any(getattr(lin, "fp8", False) for lin in model.hidden_linears().values())


def fp8_summary(counters: FP8Counters) -> dict[str, Any]:
    """``train.json``'s ``fp8`` record: overall and per-kind rates and the per-layer counts."""
    return {"underflow_rate": counters.rates()["underflow"], "overflow_rate": counters.rates()["overflow"],
            **{f"{k}_underflow_rate": counters.rates(k)["underflow"] for k in KINDS},
            "per_layer": counters.to_json()}
