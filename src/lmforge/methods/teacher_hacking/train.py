"""Distillation runs of the teacher-hacking setup and their proxy / golden curves.

Tiapkin et al., "On Teacher Hacking in Language Model Distillation" (ICML 2025, arXiv 2502.02671),
Section 4: a student is distilled from the teacher with a token-level divergence (forward KL by
default) on responses from one of three sources,

* ``offline``: a fixed set of teacher generations, ``gens_per_prompt`` per training prompt, reused
  over many epochs;
* ``online_teacher``: fresh teacher generations for the batch's prompts at every step;
* ``online_student``: fresh student generations (on-policy) at every step, scored by the teacher,

and two sequence-level distances are tracked on held-out prompts:

* proxy = KL(teacher‖student) = E_{y~teacher}[log teacher(y|x) - log student(y|x)];
* golden = KL(oracle‖student) = E_{y~oracle}[log oracle(y|x) - log student(y|x)] with the oracle's
  exact log-probs.

Both are Monte-Carlo estimates over a fixed set of samples drawn once before training (common random
numbers, so that the curves are smooth in the training step). TRL's ``GKDTrainer`` covers the same
three sources (``lmbda=0`` on a fixed set, ``seq_kd=True``, ``lmbda=1``); it is not used because its
trainer needs a tokenizer, text datasets and HF generation, which would hide the oracle's token ids.
The token-level losses come from :mod:`lmforge.methods.distillm2.losses`.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from transformers import LlamaForCausalLM

from lmforge.methods.distillm2.losses import forward_kl, generalized_jsd, reverse_kl
from lmforge.methods.teacher_hacking.config import LOSSES, REGIMES
from lmforge.methods.teacher_hacking.models import response_logits, sample, sample_many, sequence_log_prob
from lmforge.methods.teacher_hacking.oracle import MarkovOracle, SequenceBatch

@dataclass
class EvalSet:
    """Held-out prompts with fixed oracle and teacher samples and their exact / teacher log-probs."""

    oracle_samples: SequenceBatch
    oracle_logp: torch.Tensor
    teacher_samples: SequenceBatch
    teacher_logp: torch.Tensor

    def golden(self, student: LlamaForCausalLM) -> float:
        """Monte-Carlo KL(oracle‖student), nats per sequence."""
        return float((self.oracle_logp - sequence_log_prob(student, self.oracle_samples)).mean())

    def proxy(self, student: LlamaForCausalLM) -> float:
        """Monte-Carlo KL(teacher‖student), nats per sequence."""
        return float((self.teacher_logp - sequence_log_prob(student, self.teacher_samples)).mean())


def make_eval_set(oracle: MarkovOracle, teacher: LlamaForCausalLM, n_prompts: int, samples_per_prompt: int,
                  generator: torch.Generator) -> EvalSet:
    """Fresh held-out prompts (drawn from the prompt distribution, not the training pool) and their samples."""
    prompts = oracle.sample_prompts(n_prompts, generator).repeat_interleave(samples_per_prompt, dim=0)
    ora = oracle.sample(prompts.shape[0], generator, prompts)
    tea = sample_many(teacher, prompts, oracle.max_response_len, generator)
    return EvalSet(ora, oracle.log_prob(ora), tea, sequence_log_prob(teacher, tea))


def token_loss(name: str, student_logits: torch.Tensor, teacher_logits: torch.Tensor, mask: torch.Tensor,
               beta: float = 0.5) -> torch.Tensor:
    """The token-level distillation divergence ``name`` (p = teacher, q = student), mean over masked tokens."""
    if name == "forward_kl":
        return forward_kl(student_logits, teacher_logits, mask=mask)
    if name == "reverse_kl":
        return reverse_kl(student_logits, teacher_logits, mask=mask)
    if name == "jsd":
        return generalized_jsd(student_logits, teacher_logits, beta=beta, mask=mask)
    raise ValueError(f"unknown loss {name!r}; use one of {LOSSES}")


def loss_mask(batch: SequenceBatch) -> torch.Tensor:
    """Response slots that carry a loss: up to and including EOS, except the slot after the cap (forced EOS)."""
    mask = batch.mask.clone()
    mask[:, -1] = False
    return mask


def eval_steps(steps: int, n_points: int, n_linear: int = 0) -> list[int]:
    """Step 0, ``n_points`` roughly log-spaced steps up to ``steps`` (for the log-log fit) and, when
    ``n_linear > 0``, ``n_linear`` evenly spaced ones (resolution late in training, where a turn happens)."""
    grid = np.round(np.geomspace(1, steps, n_points)).astype(int)
    if n_linear:
        grid = np.concatenate([grid, np.round(np.linspace(0, steps, n_linear + 1)[1:]).astype(int)])
    return [0, *[int(s) for s in np.unique(grid) if s > 0]]


@dataclass
class Curve:
    """Proxy and golden metrics of one distillation run over training steps."""

    regime: str
    steps: list[int] = field(default_factory=list)
    proxy: list[float] = field(default_factory=list)
    golden: list[float] = field(default_factory=list)
    train_loss: list[float] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict of the curve."""
        return {"regime": self.regime, "steps": self.steps, "proxy": self.proxy, "golden": self.golden,
                "train_loss": self.train_loss, "info": self.info}


def offline_dataset(teacher: LlamaForCausalLM, prompts: torch.Tensor, gens_per_prompt: int, max_response_len: int,
                    generator: torch.Generator) -> tuple[SequenceBatch, torch.Tensor]:
    """The fixed offline set: ``gens_per_prompt`` teacher generations per prompt, with the teacher's logits cached."""
    data = sample_many(teacher, prompts.repeat_interleave(gens_per_prompt, dim=0), max_response_len, generator)
    with torch.no_grad():
        logits = torch.cat([response_logits(teacher, data.index(slice(i, i + 512)))
                            for i in range(0, len(data), 512)])
    return data, logits


def distill(student: LlamaForCausalLM, teacher: LlamaForCausalLM, oracle: MarkovOracle, regime: str,
            train_prompts: torch.Tensor, steps: int, batch_size: int, lr: float, eval_set: EvalSet,
            generator: torch.Generator, gens_per_prompt: int = 1, loss: str = "forward_kl",
            n_eval_points: int = 30, n_linear_points: int = 0, online_chunk: int = 16) -> Curve:
    """Distil ``teacher`` into ``student`` (in place) for ``steps`` steps from one data source.

    Args:
        student: the student (trained in place).
        teacher: the frozen teacher.
        oracle: the oracle (only for the response-length cap; the student never sees oracle data here).
        regime: one of :data:`REGIMES`.
        train_prompts: the training prompt pool ``[n, prompt_len]``; the offline set has
            ``gens_per_prompt`` teacher generations for each, the online sources draw batches from it.
        steps: optimiser steps (Adam, constant LR).
        batch_size: sequences per step.
        lr: learning rate.
        eval_set: held-out prompts and samples for the proxy and golden metrics.
        generator: torch RNG for data order and sampling.
        gens_per_prompt: generations per prompt in the offline set.
        loss: token-level divergence, one of :data:`LOSSES`.
        n_eval_points: number of log-spaced evaluation steps besides step 0.
        n_linear_points: number of evenly spaced evaluation steps added to them.
        online_chunk: online-teacher generations are drawn for this many steps at once (faster; each
            generation is still used exactly once, so the data are the same as drawing per step).

    Returns:
        The :class:`Curve` with proxy and golden at the evaluation steps.
    """
    if regime not in REGIMES:
        raise ValueError(f"unknown regime {regime!r}; use one of {REGIMES}")
    teacher.eval()
    for p in teacher.parameters():
        p.requires_grad_(False)
    opt = torch.optim.Adam(student.parameters(), lr=lr)
    curve = Curve(regime=regime, info={"gens_per_prompt": gens_per_prompt, "n_prompts": int(train_prompts.shape[0]),
                                       "loss": loss, "steps": steps, "batch_size": batch_size, "lr": lr})
    evals = set(eval_steps(steps, n_eval_points, n_linear_points))
    n_pool = train_prompts.shape[0]
    if regime == "offline":
        data, data_logits = offline_dataset(teacher, train_prompts, gens_per_prompt, oracle.max_response_len,
                                            generator)
        order, pos = torch.randperm(len(data), generator=generator), 0
        curve.info["dataset_size"] = len(data)
    pending: list[tuple[SequenceBatch, torch.Tensor]] = []

    for step in range(steps + 1):
        if step in evals:
            curve.steps.append(step)
            curve.proxy.append(eval_set.proxy(student))
            curve.golden.append(eval_set.golden(student))
        if step == steps:
            break
        if regime == "offline":
            if pos + batch_size > len(data):  # a new epoch: reshuffle the fixed set
                order, pos = torch.randperm(len(data), generator=generator), 0
            idx = order[pos:pos + batch_size]
            pos += batch_size
            batch, t_logits = data.index(idx), data_logits[idx]
        elif regime == "online_teacher":
            if not pending:
                prompts = train_prompts[torch.randint(0, n_pool, (online_chunk * batch_size,), generator=generator)]
                fresh = sample(teacher, prompts, oracle.max_response_len, generator)
                with torch.no_grad():
                    logits = response_logits(teacher, fresh)
                pending = [(fresh.index(slice(i, i + batch_size)), logits[i:i + batch_size])
                           for i in range(0, len(fresh), batch_size)]
            batch, t_logits = pending.pop(0)
        else:  # online_student: on-policy samples from the current student, scored by the teacher
            prompts = train_prompts[torch.randint(0, n_pool, (batch_size,), generator=generator)]
            batch = sample(student, prompts, oracle.max_response_len, generator)
            with torch.no_grad():
                t_logits = response_logits(teacher, batch)
        student.train()
        s_logits = response_logits(student, batch)
        value = token_loss(loss, s_logits, t_logits, loss_mask(batch))
        opt.zero_grad(set_to_none=True)
        value.backward()
        opt.step()
        curve.train_loss.append(float(value.detach()))
    student.eval()
    return curve


def clone(model: LlamaForCausalLM) -> LlamaForCausalLM:
    """A deep copy (students of different regimes start from the same initialisation)."""
    return copy.deepcopy(model)
