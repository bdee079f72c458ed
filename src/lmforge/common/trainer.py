"""``lmforge train``: causal-LM training of a local model with lmforge's optimizers and parametrizations.

One small loop, shared by the CLI and the efficient-training methods:

* ``--optimizer adamw`` (torch's AdamW), or a linear gradient transformation that keeps its state in
  a small space (:mod:`lmforge.methods.grad_transforms`: ``galore`` SVD projector with a periodic
  refresh, ``sketch`` Gaussian and ``orthogonal`` random sketches, ``kron`` two-sided map);
* ``--parametrization mus`` re-initialises the model under µnit Scaling
  (:mod:`lmforge.methods.unit_scaling`: Res-Post-LayerNorm with a fixed τ, unit-variance weights,
  1/√fan_in multipliers, Lion with the hidden learning rate scaled by √(d_base/d)); ``--fp8`` then
  casts every hidden linear to FP8 statically (E4M3 forward, E5M2 gradients) and counts
  underflows and overflows.

The data is a local text file in the formats :func:`lmforge.data.calibration.read_texts` reads
(``.jsonl`` with a ``text`` field, ``.json``, or plain text), or lmforge's built-in corpus. Texts are
joined with EOS into one token stream and every step draws random windows from it with a seed that
depends only on (seed, step), so a resumed run sees the batches the interrupted one would have.

Checked first: transformers' ``Trainer`` and TRL's ``SFTTrainer`` take any ``torch.optim.Optimizer``
and would run the projected optimizers, but neither resumes an optimizer whose state lives in
another space or a model class transformers does not know (µS), and both pull in their
argument surface for a loop of ~40 lines; the loop here is what the CLI needs and checkpoints the
optimizer's own ``state_dict``.

Outputs: a model folder (written to a temporary folder and renamed; never over an existing one
without ``overwrite``) with ``train.json`` (settings, the loss per step, optimizer-state bytes and
the FP8 counters). Checkpoints go to ``.NAME.ckpt/`` beside it every ``ckpt_every`` steps and a rerun
of the same command resumes from there; they are removed when the model is saved.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from lmforge.common.errors import UserError
from lmforge.common.io import atomic_dir, atomic_write_json, check_output_dir
from lmforge.common.progress import make_progress

OPTIMIZERS = ("adamw", "galore", "sketch", "orthogonal", "kron")
PARAMETRIZATIONS = ("sp", "mus")


@dataclass
class TrainJob:
    """One ``lmforge train`` run.

    Attributes:
        model: a local HF causal-LM folder, ``zoo:NAME``, or a folder saved by a µS run.
        out: where the trained model goes.
        data: a text file (``.jsonl``/``.json``/plain); None trains on lmforge's built-in corpus.
        steps, lr, batch_size, seq_len, warmup, min_lr_ratio: the schedule (linear warm-up, then a
            cosine decay to ``min_lr_ratio * lr``).
        weight_decay: decoupled weight decay.
        clip: gradient-norm clipping (0: off).
        optimizer: one of :data:`OPTIMIZERS`.
        rank, refresh, scale: the projected optimizers' rank, projector refresh interval in steps,
            and GaLore's update scale α.
        parametrization: ``sp`` keeps the model as it is; ``mus`` re-initialises it under µS.
        tau: µS's residual mixing τ (None: the method's default for the depth).
        fp8: µS only: simulated (or, on CUDA, real) FP8 hidden linears with static casts.
        seed: seeds the windows and any random projection.
        ckpt_every: steps between checkpoints (0: none).
        overwrite: replace an existing ``out``.
    """

    model: str
    out: str
    data: str | None = None
    steps: int = 200
    lr: float = 1e-3
    batch_size: int = 8
    seq_len: int = 128
    warmup: int = 20
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    clip: float = 1.0
    optimizer: str = "adamw"
    rank: int | None = None
    refresh: int = 200
    scale: float = 1.0
    parametrization: str = "sp"
    tau: float | None = None
    fp8: bool = False
    seed: int = 0
    ckpt_every: int = 50
    overwrite: bool = False
    progress: bool = True
    allow_pickle: bool = False
    trust_remote_code: bool = False

    def __post_init__(self) -> None:
        if self.optimizer not in OPTIMIZERS:
            raise UserError(f"unknown optimizer '{self.optimizer}'; choose one of {', '.join(OPTIMIZERS)}")
        if self.parametrization not in PARAMETRIZATIONS:
            raise UserError(f"unknown parametrization '{self.parametrization}'; choose sp or mus")
        if self.steps < 1:
            raise UserError(f"--steps must be at least 1, got {self.steps}")
        if not self.lr > 0:
            raise UserError(f"--lr must be positive, got {self.lr}")
        if self.batch_size < 1 or self.seq_len < 2:
            raise UserError("--batch-size must be >= 1 and --seq-len >= 2")
        for flag, value in (("--weight-decay", self.weight_decay), ("--warmup", self.warmup),
                            ("--ckpt-every", self.ckpt_every), ("--clip", self.clip)):
            if value < 0:
                raise UserError(f"{flag} must be >= 0, got {value}")
        if not 0.0 <= self.min_lr_ratio <= 1.0:
            raise UserError(f"--min-lr-ratio must lie in [0, 1], got {self.min_lr_ratio}")
        if self.optimizer != "adamw":
            if self.rank is None:
                raise UserError(f"--optimizer {self.optimizer} needs --rank (the projected dimension)")
            if self.rank < 1:
                raise UserError(f"--rank must be a positive integer, got {self.rank}")
            if self.refresh <= 0:
                raise UserError(f"the refresh interval must be a positive number of steps, got {self.refresh}")
        if self.fp8 and self.parametrization != "mus":
            # The model-level check (enable_fp8) says the same for a loaded model; failing here
            # saves loading it.
            raise UserError("--fp8 needs --parametrization mus: the casts are static (no scale factors), so "
                            "values stay inside FP8's range only when weights, activations and gradients are "
                            "unit-scaled, which µS guarantees and the standard parametrization does not")
        if self.parametrization == "mus" and self.optimizer != "adamw":
            raise UserError("--parametrization mus trains with its own optimizer (Lion, per-layer learning "
                            "rates); leave --optimizer at adamw")

    def key(self) -> str:
        """A digest of everything that decides the trajectory (a checkpoint resumes only its own job)."""
        d = {k: v for k, v in dataclasses.asdict(self).items() if k not in ("overwrite", "progress", "out")}
        if self.data is not None and os.path.isfile(self.data):
            st = os.stat(self.data)  # an edited data file is another run
            d["data_stat"] = [st.st_size, st.st_mtime_ns]
        return hashlib.sha256(json.dumps(d, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class TrainResult:
    """What a run did: the settings, losses per step, optimizer-state bytes, FP8 counters."""

    job: dict[str, Any]
    losses: list[float] = field(default_factory=list)
    state_bytes: int = 0
    adamw_state_bytes: int = 0
    fp8: dict[str, Any] | None = None
    seconds: float = 0.0
    resumed_from: int = 0


def token_stream(tokenizer: Any, texts: list[str]) -> torch.Tensor:
    """The texts tokenized and joined with EOS into one long tensor (the calibration windows' stream)."""
    from lmforge.data.calibration import token_ids

    return torch.tensor(token_ids(tokenizer, texts), dtype=torch.long)


def batch_at(stream: torch.Tensor, step: int, seed: int, batch_size: int, seq_len: int,
             bos: int | None) -> torch.Tensor:
    """Step ``step``'s batch: ``batch_size`` random windows of ``seq_len`` tokens (BOS first), drawn
    with a generator seeded by (seed, step) alone, so resuming reproduces the same batches."""
    if len(stream) < seq_len + 1:
        raise UserError(f"the training text has {len(stream)} tokens, fewer than one window of {seq_len}")
    rng = random.Random(f"lmforge-train-{seed}-{step}")
    rows = []
    for _ in range(batch_size):
        start = rng.randrange(0, len(stream) - seq_len + 1)
        w = stream[start:start + seq_len].clone()
        if bos is not None:
            w[0] = bos
        rows.append(w)
    return torch.stack(rows)


def lr_factor(step: int, steps: int, warmup: int, min_ratio: float) -> float:
    """Linear warm-up over ``warmup`` steps, then cosine to ``min_ratio`` (µS: 10% of peak)."""
    if warmup > 0 and step < warmup:
        return (step + 1) / warmup
    t = (step - warmup) / max(1, steps - warmup)
    return min_ratio + (1 - min_ratio) * 0.5 * (1 + math.cos(math.pi * min(1.0, t)))


def adamw_state_bytes(model: torch.nn.Module) -> int:
    """What AdamW's two moments would take for the trainable parameters (the baseline)."""
    return sum(2 * p.numel() * p.element_size() for p in model.parameters() if p.requires_grad)


def optimizer_state_bytes(opt: torch.optim.Optimizer) -> int:
    """Bytes of every tensor in the optimizer's state."""
    total = 0
    for st in opt.state.values():
        for v in st.values():
            if torch.is_tensor(v) and v.numel() > 1:
                total += v.numel() * v.element_size()
    return total


def _is_mus_folder(folder: Path) -> bool:
    """Whether ``folder`` holds a model saved by a µS run (its config.json names the µS model type)."""
    from lmforge.methods.unit_scaling.model import MODEL_TYPE

    try:
        return json.loads((folder / "config.json").read_text()).get("model_type") == MODEL_TYPE
    except (OSError, ValueError, AttributeError):
        return False


def _mus_config(job: TrainJob) -> Any:
    from lmforge.methods.unit_scaling.config import MuSConfig

    return MuSConfig() if job.tau is None else MuSConfig(tau=job.tau)


def _load_model(job: TrainJob) -> tuple[torch.nn.Module, Any, bool]:
    """(model, tokenizer, is_mus) of ``job.model``."""
    from lmforge.models.load import resolve_spec

    folder = resolve_spec(job.model)
    if _is_mus_folder(folder):
        if job.parametrization != "mus":
            raise UserError(f"{folder} is a µS model; train it with --parametrization mus")
        from transformers import PreTrainedTokenizerFast

        from lmforge.methods.unit_scaling.model import load_mus

        model = load_mus(folder)
        if job.tau is not None and abs(model.mus_config.tau - job.tau) > 1e-12:
            raise UserError(f"{folder} was built with tau={model.mus_config.tau}; tau is fixed at initialisation, "
                            "drop --tau or start from a standard model")
        # The fast tokenizer directly: AutoTokenizer would read config.json, whose model type
        # transformers does not know.
        try:
            tok = PreTrainedTokenizerFast.from_pretrained(str(folder), local_files_only=True)
        except Exception as exc:  # noqa: BLE001 - any loader failure is the user's folder
            raise UserError(f"could not load the tokenizer in '{folder}': {str(exc).splitlines()[0][:200]}") from None
        return model, tok, True
    from lmforge.models import load

    model, tok = load(job.model, allow_pickle=job.allow_pickle, trust_remote_code=job.trust_remote_code)
    if job.parametrization == "mus":
        # NOTE: µS is a parametrization of the weights at initialisation (unit-variance weights with
        # 1/sqrt(fan_in) multipliers), so a checkpoint trained under the standard parametrization
        # cannot be converted; the model's config and tokenizer are kept and the weights drawn anew.
        from lmforge.methods.unit_scaling.apply import build_mus_model

        if getattr(model.config, "model_type", None) != "llama":
            raise UserError(f"--parametrization mus builds Llama-style models; {folder} is a "
                            f"'{getattr(model.config, 'model_type', '?')}' model")
        torch.manual_seed(job.seed)
        model = build_mus_model(model.config, _mus_config(job))
        return model, tok, True
    return model, tok, False


def _build_optimizer(job: TrainJob, model: torch.nn.Module, is_mus: bool) -> torch.optim.Optimizer:
    if is_mus:
        from lmforge.methods.unit_scaling.apply import build_mus_optimizer

        return build_mus_optimizer(model, model.mus_config, lr=job.lr, weight_decay=job.weight_decay)
    if job.optimizer == "adamw":
        return torch.optim.AdamW(model.parameters(), lr=job.lr, weight_decay=job.weight_decay)
    from lmforge.methods.grad_transforms.apply import build_optimizer
    from lmforge.methods.grad_transforms.config import GradTransformConfig

    cfg = GradTransformConfig(kind=job.optimizer, rank=int(job.rank or 0), refresh=job.refresh, scale=job.scale,
                              seed=job.seed)
    return build_optimizer(model, cfg, lr=job.lr, weight_decay=job.weight_decay)


def run_training(job: TrainJob, texts: list[str] | None = None,
                 log: Callable[[str], None] | None = None) -> TrainResult:
    """Train ``job.model`` as ``job`` says and save it to ``job.out``; returns what happened.

    Args:
        job: the run.
        texts: training documents (overrides ``job.data``; the tests and reproductions pass them).
        log: where to say that a run resumed.
    """
    out = check_output_dir(job.out, job.overwrite)
    if texts is None:
        if job.data is not None:
            from lmforge.data.calibration import read_texts

            texts = read_texts(job.data)
        else:
            from lmforge.data.calibration import builtin_texts

            texts = builtin_texts(job.seed, n=2000)
    model, tok, is_mus = _load_model(job)
    counters = None
    fp8_on = is_mus and any(getattr(lin, "fp8", False) for lin in model.hidden_linears().values())
    if fp8_on and not job.fp8:
        raise UserError(f"{job.model} was saved with FP8 hidden linears; pass --fp8 to go on training it in FP8")
    if job.fp8:
        from lmforge.methods.unit_scaling.apply import enable_fp8

        counters = enable_fp8(model)
    opt = _build_optimizer(job, model, is_mus)
    # The peak learning rates, taken before a checkpoint's (already decayed) group lrs are loaded.
    base_lrs = [g["lr"] for g in opt.param_groups]
    positions = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    if positions is not None and job.seq_len > positions:
        raise UserError(f"--seq-len {job.seq_len} exceeds the model's {positions} positions")
    stream = token_stream(tok, texts)
    bos = tok.bos_token_id

    ckdir = out.parent / f".{out.name}.ckpt"
    ckpt = ckdir / "ckpt.pt"
    result = TrainResult(job=dataclasses.asdict(job))
    start = 0
    if ckpt.is_file():
        saved = torch.load(ckpt, map_location="cpu", weights_only=False)
        if saved.get("key") == job.key():
            model.load_state_dict(saved["model"])
            opt.load_state_dict(saved["opt"])
            start = int(saved["step"])
            result.losses = list(saved["losses"])
            result.resumed_from = start
            if counters is not None and saved.get("fp8"):
                for layer, rec in saved["fp8"].items():  # the counts of the steps before the resume
                    for kind, (under, over, total) in rec.items():
                        counters.add(layer, kind, under, over, total)
            if log is not None:
                log(f"resuming from step {start} ({ckpt})")
        elif log is not None:
            log(f"ignoring a checkpoint of another run in {ckdir}")

    model.train()
    t0 = time.perf_counter()
    with make_progress() as prog:
        bar = prog.add_task("train", total=job.steps, completed=start, info="")
        if not job.progress:
            prog.update(bar, visible=False)
        for step in range(start, job.steps):
            f = lr_factor(step, job.steps, job.warmup, job.min_lr_ratio)
            for g, lr0 in zip(opt.param_groups, base_lrs):
                g["lr"] = lr0 * f
            ids = batch_at(stream, step, job.seed, job.batch_size, job.seq_len, bos)
            loss = model(input_ids=ids, labels=ids).loss
            if not torch.isfinite(loss):
                raise UserError(f"the loss became {float(loss)} at step {step}; lower --lr")
            loss.backward()
            if job.clip > 0:
                torch.nn.utils.clip_grad_norm_(model.parameters(), job.clip)
            opt.step()
            opt.zero_grad(set_to_none=True)
            result.losses.append(float(loss.detach()))
            prog.update(bar, advance=1, info=f"loss {result.losses[-1]:.3f}")
            done = step + 1
            if job.ckpt_every and done % job.ckpt_every == 0 and done < job.steps:
                ckdir.mkdir(parents=True, exist_ok=True)
                tmp = ckdir / "ckpt.pt.tmp"
                torch.save({"key": job.key(), "step": done, "model": model.state_dict(),
                            "opt": opt.state_dict(), "losses": result.losses,
                            "fp8": None if counters is None else counters.to_json()}, tmp)
                os.replace(tmp, ckpt)
    model.eval()
    result.seconds = time.perf_counter() - t0
    result.state_bytes = optimizer_state_bytes(opt)
    result.adamw_state_bytes = adamw_state_bytes(model)
    if counters is not None:
        from lmforge.methods.unit_scaling.fp8 import KINDS

        result.fp8 = {"underflow_rate": counters.rates()["underflow"], "overflow_rate": counters.rates()["overflow"],
                      **{f"{k}_underflow_rate": counters.rates(k)["underflow"] for k in KINDS},
                      "per_layer": counters.to_json()}

    with atomic_dir(out, overwrite=job.overwrite) as tmp_out:
        if is_mus:
            from lmforge.methods.unit_scaling.model import save_mus

            save_mus(model, tmp_out)
        else:
            model.save_pretrained(tmp_out)
        tok.save_pretrained(tmp_out)
        atomic_write_json(tmp_out / "train.json", dataclasses.asdict(result))
    shutil.rmtree(ckdir, ignore_errors=True)
    return result
