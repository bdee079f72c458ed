"""``lmforge train``: causal-LM training of a local model with pluggable optimizers and parametrizations.

One small loop, shared by the CLI and the efficient-training methods. The optimizer and the
parametrization are plug-ins looked up by name, so this engine knows no method (the layering rule,
``tests/test_layering.py``):

* ``--optimizer NAME`` picks an :class:`OptimizerFactory`: ``adamw`` (torch's AdamW) is built in; a
  method registers more with :func:`register_optimizer` (the linear gradient transformations
  register ``galore``, ``sketch``, ``orthogonal`` and ``kron``, whose state lives in a rank-r space
  and which therefore need ``--rank``);
* ``--parametrization NAME`` picks a :class:`Parametrization`: ``sp`` (the model as it is) is built
  in; a method registers more with :func:`register_parametrization` (µnit Scaling registers
  ``mus``: it re-initialises the model, brings its own optimizer, saves its own folder format and
  offers an FP8 mode, ``--fp8``, with underflow and overflow counters).

A folder a parametrization saved is recognised by the ``model_type`` in its ``config.json`` (one
transformers does not know) and handed back to that parametrization to load. A name, or such a model
type, that is not registered yet makes the trainer import every method package once
(:func:`lmforge.registry.load_all`), so each registers its plug-ins; a name still unknown then is a
one-line :class:`~lmforge.common.errors.UserError`. Plain ``adamw``/``sp`` runs on a standard model
import no method.

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
        optimizer: the name of a registered :class:`OptimizerFactory` (``adamw`` built in).
        rank, refresh, scale: the projected optimizers' rank, projector refresh interval in steps,
            and GaLore's update scale α.
        parametrization: the name of a registered :class:`Parametrization`: ``sp`` (built in) keeps
            the model as it is; ``mus`` (µnit Scaling's) re-initialises it under µS.
        tau: µS's residual mixing τ (None: the method's default for the depth).
        fp8: the parametrization's FP8 mode (µS: simulated, or on CUDA real, FP8 hidden linears
            with static casts).
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
        opt = get_optimizer(self.optimizer)
        par = get_parametrization(self.parametrization)
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
        if opt.projected:
            if self.rank is None:
                raise UserError(f"--optimizer {self.optimizer} needs --rank (the projected dimension)")
            if self.rank < 1:
                raise UserError(f"--rank must be a positive integer, got {self.rank}")
            if self.refresh <= 0:
                raise UserError(f"the refresh interval must be a positive number of steps, got {self.refresh}")
        if self.fp8 and par.fp8 is None:
            # The model-level check (the parametrization's enable) says the same for a loaded model;
            # failing here saves loading it.
            raise UserError(_fp8_refusal())
        if par.optimizer is not None and self.optimizer != "adamw":
            raise UserError(f"--parametrization {par.name} trains with its own optimizer ({par.optimizer_note}); "
                            "leave --optimizer at adamw")

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


# ------------------------------------------------------------------------------------------ plug-ins


@dataclass(frozen=True)
class OptimizerFactory:
    """An optimizer ``lmforge train --optimizer NAME`` can build.

    Attributes:
        name: the ``--optimizer`` value.
        build: ``build(job, model)`` -> the optimizer over ``model``'s trainable parameters, at the
            peak learning rate ``job.lr`` (the loop scales every group's lr by the schedule).
        projected: its state lives in a rank-r space: the job needs ``--rank`` (>= 1) and a positive
            ``--refresh``.
    """

    name: str
    build: Callable[[TrainJob, torch.nn.Module], torch.optim.Optimizer]
    projected: bool = False


@dataclass(frozen=True)
class FP8Mode:
    """A parametrization's FP8 training mode (``--fp8``).

    Attributes:
        enable: ``enable(model)`` switches it on and returns the cast counters: an object with
            ``to_json()`` (``{layer: {kind: [under, over, total]}}``, saved in checkpoints) and
            ``add(layer, kind, under, over, total)`` (restores a checkpoint's counts).
        is_on: ``is_on(model)``: whether a loaded model already trains in FP8.
        summary: ``summary(counters)`` -> ``train.json``'s ``fp8`` record.
        why: why ``--fp8`` needs this parametrization (the refusal's reason).
    """

    enable: Callable[[torch.nn.Module], Any]
    is_on: Callable[[torch.nn.Module], bool]
    summary: Callable[[Any], dict[str, Any]]
    why: str = ""


@dataclass(frozen=True)
class Parametrization:
    """A parametrization ``lmforge train --parametrization NAME`` can train under.

    Every hook left at None means "as a standard Hugging Face model" (the built-in ``sp``).

    Attributes:
        name: the ``--parametrization`` value.
        label: how errors name its models (e.g. ``"µS"``).
        model_type: the ``model_type`` in the ``config.json`` of the folders it saves; the trainer
            hands such a folder to ``load``. It must be a type transformers does not know.
        load: ``load(folder, job)`` -> the model saved in ``folder`` (the trainer loads the
            tokenizer beside it).
        reinit: ``reinit(model, folder, job)`` -> the model to train, from the standard model
            loaded from ``folder`` (``job.model``); the trainer seeds torch with ``job.seed`` first
            and keeps the tokenizer.
        optimizer: ``optimizer(job, model)``: its own optimizer; ``--optimizer`` must then stay
            ``adamw``.
        optimizer_note: what that optimizer is, for the error that says so.
        save: ``save(model, folder)`` writes the model (else ``model.save_pretrained``).
        fp8: its FP8 mode, if it has one.
    """

    name: str
    label: str = ""
    model_type: str | None = None
    load: Callable[[Path, TrainJob], torch.nn.Module] | None = None
    reinit: Callable[[torch.nn.Module, Path, TrainJob], torch.nn.Module] | None = None
    optimizer: Callable[[TrainJob, torch.nn.Module], torch.optim.Optimizer] | None = None
    optimizer_note: str = ""
    save: Callable[[torch.nn.Module, Path], Any] | None = None
    fp8: FP8Mode | None = None


OPTIMIZER_FACTORIES: dict[str, OptimizerFactory] = {}
PARAMETRIZATION_FACTORIES: dict[str, Parametrization] = {}
_plugins_loaded = False


def register_optimizer(factory: OptimizerFactory) -> OptimizerFactory:
    """Make ``factory`` available as ``--optimizer factory.name``; a second, different registration
    of the same name is a bug."""
    if OPTIMIZER_FACTORIES.get(factory.name, factory) != factory:
        raise ValueError(f"optimizer {factory.name!r} registered twice")
    OPTIMIZER_FACTORIES[factory.name] = factory
    return factory


def register_parametrization(par: Parametrization) -> Parametrization:
    """Make ``par`` available as ``--parametrization par.name``; a second, different registration of
    the same name, or a ``model_type`` transformers knows (its folders could not be told apart from
    standard ones), is a bug."""
    if PARAMETRIZATION_FACTORIES.get(par.name, par) != par:
        raise ValueError(f"parametrization {par.name!r} registered twice")
    if par.model_type is not None and _hf_knows(par.model_type):
        raise ValueError(f"parametrization {par.name!r}: model_type {par.model_type!r} is a transformers type")
    PARAMETRIZATION_FACTORIES[par.name] = par
    return par


def _load_plugins() -> None:
    """Import every method package once, so that each registers its optimizers and parametrizations."""
    global _plugins_loaded
    if not _plugins_loaded:
        from lmforge.registry import load_all

        load_all()
        _plugins_loaded = True


def _names(names: list[str], last: str) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + f" {last} " + names[-1]


def get_optimizer(name: str) -> OptimizerFactory:
    """The registered optimizer ``name`` (methods are imported on the first unknown name).

    Raises:
        UserError: no method registers ``name``.
    """
    if name not in OPTIMIZER_FACTORIES:
        _load_plugins()
    if name not in OPTIMIZER_FACTORIES:
        raise UserError(f"unknown optimizer '{name}'; choose one of {', '.join(OPTIMIZER_FACTORIES)}")
    return OPTIMIZER_FACTORIES[name]


def get_parametrization(name: str) -> Parametrization:
    """The registered parametrization ``name`` (methods are imported on the first unknown name).

    Raises:
        UserError: no method registers ``name``.
    """
    if name not in PARAMETRIZATION_FACTORIES:
        _load_plugins()
    if name not in PARAMETRIZATION_FACTORIES:
        raise UserError(f"unknown parametrization '{name}'; choose {_names(list(PARAMETRIZATION_FACTORIES), 'or')}")
    return PARAMETRIZATION_FACTORIES[name]


def _fp8_refusal() -> str:
    """The error for ``--fp8`` under a parametrization without an FP8 mode: which ones have one, and why."""
    _load_plugins()
    able = [p for p in PARAMETRIZATION_FACTORIES.values() if p.fp8 is not None]
    if not able:
        return "--fp8 needs a parametrization with an FP8 mode, and none is registered"
    why = "; ".join(p.fp8.why for p in able if p.fp8.why)  # type: ignore[union-attr]
    return f"--fp8 needs --parametrization {_names([p.name for p in able], 'or')}" + (f": {why}" if why else "")


def _hf_knows(model_type: str) -> bool:
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING_NAMES

    return model_type in CONFIG_MAPPING_NAMES


def _owner(folder: Path) -> Parametrization | None:
    """The registered parametrization whose saved folders look like ``folder`` (by the ``model_type``
    of its config.json), or None for a standard model. Methods are imported only for a model type
    transformers does not know."""
    try:
        model_type = json.loads((folder / "config.json").read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        return None
    if not isinstance(model_type, str) or _hf_knows(model_type):
        return None

    def find() -> Parametrization | None:
        return next((p for p in PARAMETRIZATION_FACTORIES.values() if p.model_type == model_type), None)

    if find() is None:
        _load_plugins()
    return find()


def _adamw(job: TrainJob, model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.AdamW(model.parameters(), lr=job.lr, weight_decay=job.weight_decay)


register_optimizer(OptimizerFactory(name="adamw", build=_adamw))
register_parametrization(Parametrization(name="sp", label="standard"))


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


def _plugin_tokenizer(folder: Path) -> Any:
    """The tokenizer in a folder a parametrization saved: the fast tokenizer directly, since
    AutoTokenizer would read config.json, whose model type transformers does not know."""
    from transformers import PreTrainedTokenizerFast

    try:
        return PreTrainedTokenizerFast.from_pretrained(str(folder), local_files_only=True)
    except Exception as exc:  # noqa: BLE001 - any loader failure is the user's folder
        raise UserError(f"could not load the tokenizer in '{folder}': {str(exc).splitlines()[0][:200]}") from None


def _load_model(job: TrainJob) -> tuple[torch.nn.Module, Any, Parametrization | None]:
    """(model, tokenizer, the parametrization that owns the model, or None for a standard model)."""
    from lmforge.models.load import resolve_spec

    par = get_parametrization(job.parametrization)
    folder = resolve_spec(job.model)
    owner = _owner(folder)
    if owner is not None:
        if owner.name != job.parametrization:
            raise UserError(f"{folder} is a {owner.label or owner.name} model; train it with "
                            f"--parametrization {owner.name}")
        assert owner.load is not None, f"parametrization {owner.name!r} saves folders it cannot load"
        model = owner.load(folder, job)
        return model, _plugin_tokenizer(folder), owner
    from lmforge.models import load

    model, tok = load(job.model, allow_pickle=job.allow_pickle, trust_remote_code=job.trust_remote_code)
    if par.reinit is not None:
        torch.manual_seed(job.seed)
        return par.reinit(model, folder, job), tok, par
    return model, tok, None


def _build_optimizer(job: TrainJob, model: torch.nn.Module, par: Parametrization | None) -> torch.optim.Optimizer:
    if par is not None and par.optimizer is not None:
        return par.optimizer(job, model)
    return get_optimizer(job.optimizer).build(job, model)


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
    model, tok, par = _load_model(job)
    counters = None
    fp8 = None if par is None else par.fp8
    if fp8 is not None and fp8.is_on(model) and not job.fp8:
        raise UserError(f"{job.model} was saved with FP8 hidden linears; pass --fp8 to go on training it in FP8")
    if job.fp8:
        assert fp8 is not None  # TrainJob refuses --fp8 under a parametrization without an FP8 mode
        counters = fp8.enable(model)
    opt = _build_optimizer(job, model, par)
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
        result.fp8 = fp8.summary(counters)  # type: ignore[union-attr]

    with atomic_dir(out, overwrite=job.overwrite) as tmp_out:
        if par is not None and par.save is not None:
            par.save(model, tmp_out)
        else:
            model.save_pretrained(tmp_out)
        tok.save_pretrained(tmp_out)
        atomic_write_json(tmp_out / "train.json", dataclasses.asdict(result))
    shutil.rmtree(ckdir, ignore_errors=True)
    return result
