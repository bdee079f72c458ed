"""The tiny model zoo: Llama models with a tokenizer trained here, trained here on lmforge's own
synthetic agentic corpus, deterministically.

``zoo:NAME`` resolves through :func:`ensure_built`: a build in the per-user cache (XDG, keyed by a
hash of the spec), else the copy committed with lmforge (the demo model, so ``make demo`` does not
retrain it), else a fresh build with a progress bar. A build checkpoints every few hundred steps
and resumes from the checkpoint after an interruption.

Determinism: the data for step ``t`` comes from ``random.Random(seed, t)`` and every torch random
draw is seeded, so the same spec on the same machine (same torch build and thread count) gives the
same loss curve and the same weights. Schedules are in steps, never in wall time, for that reason.

Recipe, from ``shared/papers/zoo-learnability.md``: fp32 (bf16 autocast learned far worse), digits
as single tokens and needle keys as single tokens, loss on answer tokens only, AdamW with warm-up
and cosine decay, and a needle-length curriculum that advances on training exact match but is
also pushed forward on a step schedule so that it reaches the evaluation length.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import math
import os
import random
import re
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from collections.abc import Callable
from typing import Any

import torch
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

from lmforge.common.errors import UserError
from lmforge.common.io import atomic_dir, atomic_write_json
from lmforge.common.progress import make_progress, save_pretrained_quietly
from lmforge.data import corpus
from lmforge.models.tokenizer import train_tokenizer

# Bump when a generator or the training loop changes what a spec produces: it is part of the hash.
DATA_VERSION = 4
PACKAGED_DIR = Path(__file__).resolve().parent.parent / "zoo_weights"


@dataclass(frozen=True)
class ModelShape:
    """Llama hyper-parameters."""

    hidden: int
    layers: int
    heads: int
    kv_heads: int
    intermediate: int
    max_position: int = 1024
    rope_theta: float = 10000.0

    def __post_init__(self) -> None:
        if min(self.hidden, self.layers, self.heads, self.kv_heads, self.intermediate, self.max_position) < 1:
            raise ValueError("shape sizes must all be at least 1")
        if self.hidden % self.heads or self.heads % self.kv_heads:
            raise ValueError(f"shape.hidden ({self.hidden}) must be a multiple of shape.heads ({self.heads}), "
                             f"and heads a multiple of shape.kv_heads ({self.kv_heads})")


@dataclass(frozen=True)
class TrainSchedule:
    """Optimisation and curriculum, all in steps.

    Attributes:
        steps: optimiser steps.
        tokens_per_step: approximate (unpadded) tokens per batch.
        lr / warmup / min_lr_ratio: AdamW peak LR, linear warm-up steps, cosine floor.
        mixture: task -> sampling weight for a step's batch (one task per batch).
        needle_start / needle_max: curriculum bounds, in haystack sentences (~8 tokens each).
        needle_advance: advance when teacher-forced exact match over the last 8 needle batches
            reaches this; the level also never lags a linear schedule that starts at
            ``needle_floor_start`` and reaches ``needle_max`` at ``needle_floor_end`` of the steps.
        ckpt_every: steps between resumable checkpoints.
        eval_every: steps between teacher-forced probe evaluations (the training curves).
    """

    steps: int
    tokens_per_step: int
    lr: float
    warmup: int
    mixture: tuple[tuple[str, float], ...]
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.01
    needle_start: int = 4
    needle_max: int = 72
    needle_advance: float = 0.85
    needle_floor_start: float = 0.35
    needle_floor_end: float = 0.9
    ckpt_every: int = 250
    eval_every: int = 100

    def __post_init__(self) -> None:
        if self.steps < 1 or self.tokens_per_step < 1:
            raise ValueError("train.steps and train.tokens_per_step must be at least 1")
        if not self.lr > 0:
            raise ValueError("train.lr must be positive")
        known = {"toolcall", "workflow", "needle", "textworld", "text", "docjob", "injecagent"}
        bad = [t for t, _ in self.mixture if t not in known]
        if bad or any(w < 0 for _, w in self.mixture) or sum(w for _, w in self.mixture) <= 0:
            raise ValueError(f"train.mixture needs weights >= 0, not all 0, over {sorted(known)}; got {self.mixture}")
        if self.warmup < 1 or self.ckpt_every < 1 or self.eval_every < 1:
            raise ValueError("train.warmup, train.ckpt_every and train.eval_every must be at least 1")
        if not 1 <= self.needle_start <= self.needle_max:
            raise ValueError("need 1 <= train.needle_start <= train.needle_max")
        if not 0 <= self.needle_floor_start < self.needle_floor_end:
            raise ValueError("need 0 <= train.needle_floor_start < train.needle_floor_end")


@dataclass(frozen=True)
class EvalSizes:
    """Held-out evaluation sizes (greedy decoding)."""

    toolcall: int = 200
    workflow: int = 100
    needle: int = 100
    needle_lengths: tuple[int, ...] = (128, 256, 512, 1024)
    textworld: int = 100


@dataclass(frozen=True)
class ZooSpec:
    """Everything that determines a zoo model.

    ``vocab_size`` is an upper bound: the BPE trainer stops earlier when the corpus offers no more
    merges (agent-small's vocabulary has 1,759 entries).
    """

    name: str
    description: str
    shape: ModelShape
    train: TrainSchedule
    vocab_size: int = 2048
    seed: int = 0
    threads: int = 2
    evals: EvalSizes = field(default_factory=EvalSizes)
    targets: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]*", self.name):
            raise ValueError(f"zoo name {self.name!r} may use letters, digits, '.', '_' and '-' only")
        if self.threads < 1:
            raise ValueError("threads must be at least 1")
        if self.vocab_size < 300:
            raise ValueError("vocab_size (an upper bound on the BPE vocabulary) must be at least 300")
        ev = self.evals
        if min(ev.toolcall, ev.workflow, ev.needle, ev.textworld) < 1:
            raise ValueError("evals sizes must be at least 1")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def digest(self) -> str:
        """Hash of the spec (minus its description) and DATA_VERSION: the cache key."""
        d = self.to_dict()
        d.pop("description")
        blob = json.dumps({"spec": d, "data_version": DATA_VERSION}, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


_MIX = (("toolcall", 0.22), ("workflow", 0.18), ("needle", 0.45), ("textworld", 0.11), ("text", 0.04))

ZOO: dict[str, ZooSpec] = {
    "agent-nano": ZooSpec(
        name="agent-nano",
        description="0.2M-parameter Llama for tests; builds in under a minute; its loss falls but it "
                    "solves none of the tasks.",
        shape=ModelShape(hidden=64, layers=2, heads=4, kv_heads=2, intermediate=192, max_position=1024),
        train=TrainSchedule(steps=150, tokens_per_step=2048, lr=3e-3, warmup=15, mixture=_MIX,
                            needle_max=24, ckpt_every=100, eval_every=50),
        evals=EvalSizes(toolcall=32, workflow=16, needle=16, needle_lengths=(128, 256), textworld=16),
        targets=(),
    ),
    "agent-small": ZooSpec(
        name="agent-small",
        description="Llama for the demo, trained on tool calls, plans, needles and blocksworld "
                    "(`lmforge reproduce zoo` reports what it learned).",
        shape=ModelShape(hidden=192, layers=4, heads=6, kv_heads=3, intermediate=512, max_position=1024),
        train=TrainSchedule(steps=3000, tokens_per_step=4096, lr=2e-3, warmup=100, mixture=_MIX,
                            needle_max=64, ckpt_every=200, eval_every=100),
        targets=(("toolcall_exact_match", 0.95), ("needle_512_exact_match", 0.80),
                 ("workflow_node_f1", 0.70), ("textworld_success", 0.50)),
    ),
    # NOTE: layer pruning needs depth (the zigzag paper prunes 32-layer models); agent-small's four
    # layers leave nothing to remove at 10-20%. agent-deep trades width for twelve layers at about
    # agent-small's cost per step, and half its steps, so that it builds in about half an hour.
    "agent-deep": ZooSpec(
        name="agent-deep",
        description="Twelve-layer Llama for layer pruning (`lmforge reproduce zigzag`), same data as "
                    "agent-small.",
        shape=ModelShape(hidden=128, layers=12, heads=4, kv_heads=2, intermediate=384, max_position=1024),
        train=TrainSchedule(steps=1500, tokens_per_step=4096, lr=2e-3, warmup=75, mixture=_MIX,
                            needle_max=64, ckpt_every=200, eval_every=100),
        targets=(),
    ),
    # NOTE: the MINIONS local worker for `lmforge reproduce minions` (agent-small cannot read
    # documents). Its data is the exact worker prompt on report chunks (lmforge.data.docjobs), with
    # a curriculum in "sentences" of 100 characters: copy-only one-figure chunks first (levels 1-2),
    # then negatives, follow-ups and longer chunks, up to 600 characters by 60% of the steps. One
    # thread, so the build leaves a core free and stays bit-reproducible on a shared machine.
    "reader-small": ZooSpec(
        name="reader-small",
        description="Two-layer Llama that does MINIONS worker jobs on report chunks (`lmforge reproduce "
                    "minions`): finds the asked figure or answers null, as JobOutput JSON.",
        shape=ModelShape(hidden=128, layers=2, heads=4, kv_heads=4, intermediate=512, max_position=1024),
        train=TrainSchedule(steps=1800, tokens_per_step=4096, lr=2e-3, warmup=50, mixture=(("docjob", 1.0),),
                            needle_start=1, needle_max=6, needle_floor_start=0.25, needle_floor_end=0.6,
                            ckpt_every=200, eval_every=100),
        threads=1,
        evals=EvalSizes(toolcall=1, workflow=1, needle=1, needle_lengths=(128,), textworld=1),
        targets=(),
    ),
    # NOTE: the InjecAgent-style ReAct agent for `lmforge reproduce udora` (lmforge.data.injecagent:
    # benign synthetic tools). Trained only on whole episodes (~350 tokens, loss on the agent's two
    # steps). One thread, like reader-small, so it stays bit-reproducible on a shared machine.
    "agent-injec": ZooSpec(
        name="agent-injec",
        description="Three-layer ReAct agent in the InjecAgent format with benign tools: calls the user's "
                    "tool, answers after observations, ignores instructions inside them (`lmforge "
                    "reproduce udora`).",
        shape=ModelShape(hidden=160, layers=3, heads=5, kv_heads=5, intermediate=512, max_position=1024),
        train=TrainSchedule(steps=650, tokens_per_step=4096, lr=2e-3, warmup=40, mixture=(("injecagent", 1.0),),
                            ckpt_every=200, eval_every=100),
        threads=1,
        evals=EvalSizes(toolcall=1, workflow=1, needle=1, needle_lengths=(128,), textworld=1),
        targets=(),
    ),
}


def get_spec(name: str) -> ZooSpec:
    if name not in ZOO:
        raise UserError(f"unknown zoo model '{name}'; known: {', '.join(sorted(ZOO))}")
    return ZOO[name]


def cache_root() -> Path:
    """``$LMFORGE_CACHE`` or ``$XDG_CACHE_HOME/lmforge`` (default ``~/.cache/lmforge``)."""
    if os.environ.get("LMFORGE_CACHE"):
        return Path(os.environ["LMFORGE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "lmforge"


def cache_dir(spec: ZooSpec) -> Path:
    return cache_root() / "zoo" / f"{spec.name}-{spec.digest()}"


def packaged_dir(spec: ZooSpec) -> Path | None:
    """The committed copy of ``spec`` if one ships with lmforge and its hash matches."""
    path = PACKAGED_DIR / spec.name
    meta = path / "zoo.json"
    if meta.is_file():
        try:
            if json.loads(meta.read_text())["digest"] == spec.digest():
                return path
        except (KeyError, json.JSONDecodeError):
            return None
    return None


def ensure_built(name: str) -> Path:
    """Folder of zoo model ``name``: cached, else committed, else built now (progress bar)."""
    spec = get_spec(name)
    out = cache_dir(spec)
    if (out / "zoo.json").is_file():
        return out
    packaged = packaged_dir(spec)
    if packaged is not None:
        return packaged
    build(spec, out)
    return out


# --------------------------------------------------------------------------------------------
# Batching


def _step_rng(seed: int, step: int, stream: str) -> random.Random:
    # A string seed is hashed deterministically by random.Random (sha512), unlike hash().
    return random.Random(f"{seed}:{stream}:{step}")


Encoded = tuple[list[int], list[bool]]


def encode_segments(tok: PreTrainedTokenizerFast, segments: list[tuple[str, bool]], eos_loss: bool = True) -> Encoded:
    """``BOS seg1 seg2 ... EOS`` ids with a per-token loss flag (answer segments and EOS).

    The first segment is tokenized with the tokenizer's BOS exactly as a prompt is at inference,
    so the model is trained on the token boundaries it will see.
    """
    ids: list[int] = [tok.bos_token_id]
    flags: list[bool] = [False]
    for i, (text, is_answer) in enumerate(segments):
        if not text:
            continue
        piece = tok(text, add_special_tokens=False).input_ids
        ids += piece
        flags += [is_answer] * len(piece)
    ids.append(tok.eos_token_id)
    flags.append(eos_loss)
    return ids, flags


def encode_pair(tok: PreTrainedTokenizerFast, prompt: str, answer: str) -> Encoded:
    """``BOS prompt answer EOS``, loss on the answer and EOS (on everything for plain text)."""
    return encode_segments(tok, [(prompt, False), (answer, True)])


def collate(examples: list[Encoded], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-padded input_ids, attention_mask and labels (-100 where there is no loss)."""
    width = max(len(ids) for ids, _ in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    labels = torch.full((len(examples), width), -100, dtype=torch.long)
    mask = torch.zeros((len(examples), width), dtype=torch.long)
    for i, (ids, flags) in enumerate(examples):
        t = torch.tensor(ids)
        input_ids[i, : len(ids)] = t
        mask[i, : len(ids)] = 1
        keep = torch.tensor(flags)
        labels[i, : len(ids)] = torch.where(keep, t, torch.full_like(t, -100))
    return {"input_ids": input_ids, "attention_mask": mask, "labels": labels}


def make_batch(
    tok: PreTrainedTokenizerFast, task: str, rng: random.Random, tokens: int, needle_level: int
) -> dict[str, torch.Tensor]:
    """One single-task batch of about ``tokens`` unpadded tokens (at least 4 sequences)."""
    examples: list[Encoded] = []
    total = 0
    while total < tokens or len(examples) < 4:
        if task == "needle":
            n = rng.randint(max(1, needle_level // 2), needle_level)
            enc = encode_segments(tok, corpus.needle_segments(rng, n))
        elif task == "docjob":  # worker jobs with follow-ups; the curriculum level caps the chunk
            enc = encode_segments(tok, corpus.docjob_segments(rng, needle_level))
        elif task == "injecagent":  # a whole ReAct episode: loss on both of the agent's steps
            enc = encode_segments(tok, corpus.injecagent_segments(rng))
        else:
            enc = encode_pair(tok, *corpus.PAIR_FNS[task](rng))
        examples.append(enc)
        total += len(enc[0])
    return collate(examples, tok.pad_token_id)


def answer_exact_match(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Per row: whether every answer token is the argmax (teacher forcing)."""
    pred = logits[:, :-1].argmax(-1)
    gold = labels[:, 1:]
    ok = (pred == gold) | (gold == -100)
    return ok.all(dim=1)


def lr_at(step: int, sched: TrainSchedule) -> float:
    if step < sched.warmup:
        return sched.lr * (step + 1) / sched.warmup
    frac = (step - sched.warmup) / max(1, sched.steps - sched.warmup)
    return sched.lr * (sched.min_lr_ratio + (1 - sched.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * frac)))


def build_model(spec: ZooSpec, vocab_size: int, tok: PreTrainedTokenizerFast) -> LlamaForCausalLM:
    s = spec.shape
    config = LlamaConfig(
        vocab_size=vocab_size, hidden_size=s.hidden, intermediate_size=s.intermediate,
        num_hidden_layers=s.layers, num_attention_heads=s.heads, num_key_value_heads=s.kv_heads,
        max_position_embeddings=s.max_position, rope_theta=s.rope_theta, tie_word_embeddings=True,
        bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
        initializer_range=0.02,
    )
    torch.manual_seed(spec.seed)
    model = LlamaForCausalLM(config)
    return model


# --------------------------------------------------------------------------------------------
# Training


@dataclass
class TrainState:
    step: int = 0
    needle_level: int = 4
    needle_hist: list[float] = field(default_factory=list)
    losses: list[tuple[int, str, float]] = field(default_factory=list)
    probes: list[dict[str, Any]] = field(default_factory=list)
    levels: list[tuple[int, int]] = field(default_factory=list)
    seconds: float = 0.0


def _probe_sets(tok: PreTrainedTokenizerFast, spec: ZooSpec) -> dict[str, dict[str, torch.Tensor]]:
    """Fixed held-out teacher-forced probe batches (a stream the training data never uses)."""
    out = {}
    for task in ("toolcall", "workflow", "textworld"):
        rng = _step_rng(spec.seed, 0, f"probe-{task}")
        out[task] = collate([encode_pair(tok, *corpus.PAIR_FNS[task](rng)) for _ in range(24)], tok.pad_token_id)
    rng = _step_rng(spec.seed, 0, "probe-needle")
    # One query, no EOS target: after an answer, training continues with the next question.
    out["needle_512"] = collate(
        [encode_segments(tok, corpus.needle_segments(rng, 56)[:2], eos_loss=False) for _ in range(16)],
        tok.pad_token_id)
    if any(t == "docjob" for t, _ in spec.train.mixture):
        from lmforge.data import docjobs  # held-out reports (odd seeds), like the other probes

        rng = _step_rng(spec.seed, 0, "probe-docjob")
        out["docjob"] = collate([encode_pair(tok, *docjobs.pair(rng, heldout=True)) for _ in range(24)],
                                tok.pad_token_id)
    if any(t == "injecagent" for t, _ in spec.train.mixture):
        rng = _step_rng(spec.seed, 0, "probe-injecagent")
        out["injecagent"] = collate([encode_segments(tok, corpus.injecagent_segments(rng)) for _ in range(24)],
                                    tok.pad_token_id)
    return out


@torch.no_grad()
def _probe(model: LlamaForCausalLM, probes: dict[str, dict[str, torch.Tensor]]) -> dict[str, float]:
    model.eval()
    res = {}
    for name, batch in probes.items():
        logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        res[name] = float(answer_exact_match(logits, batch["labels"]).float().mean())
    model.train()
    return res


def train(spec: ZooSpec, workdir: Path, progress: bool = True,
          log: Callable[[str], None] | None = None) -> tuple[LlamaForCausalLM, PreTrainedTokenizerFast, TrainState]:
    """Train ``spec`` with checkpoints in ``workdir``; resumes from ``workdir/ckpt.pt``."""
    prev_threads = torch.get_num_threads()
    torch.set_num_threads(spec.threads)
    try:
        # The mixture picks the tokenizer's sample (agentic mixtures: the same sample as ever).
        tasks = [t for t, _ in spec.train.mixture]
        tok = train_tokenizer(corpus.tokenizer_training_texts(spec.seed, tasks=tasks), spec.vocab_size)
        model = build_model(spec, len(tok), tok)
        sched = spec.train
        decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
        no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
        opt = torch.optim.AdamW(
            [{"params": decay, "weight_decay": sched.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
            lr=sched.lr, betas=(0.9, 0.95), eps=1e-8,
        )
        state = TrainState(needle_level=sched.needle_start)
        ckpt = workdir / "ckpt.pt"
        if ckpt.is_file():
            saved = torch.load(ckpt, map_location="cpu", weights_only=False)
            # A checkpoint left by another spec (an earlier build into the same --out) is not
            # resumed: the build must stay a pure function of its spec.
            if saved.get("digest") == spec.digest():
                model.load_state_dict(saved["model"])
                opt.load_state_dict(saved["opt"])
                state = TrainState(**saved["state"])
                if log is not None:
                    log(f"resuming {spec.name} from step {state.step}")
            elif log is not None:
                log(f"ignoring a checkpoint of another spec in {workdir}")
        probes = _probe_sets(tok, spec)
        names = [t for t, _ in sched.mixture]
        weights = [w for _, w in sched.mixture]
        model.train()
        t0 = time.time() - state.seconds
        with make_progress() as prog:
            bar = prog.add_task(f"zoo build {spec.name}", total=sched.steps, completed=state.step, info="")
            if not progress:
                prog.update(bar, visible=False)
            while state.step < sched.steps:
                step = state.step
                rng = _step_rng(spec.seed, step, "train")
                task = rng.choices(names, weights)[0]
                ramp = (step / sched.steps - sched.needle_floor_start) / (
                    sched.needle_floor_end - sched.needle_floor_start)
                floor = sched.needle_start + (sched.needle_max - sched.needle_start) * min(1.0, max(0.0, ramp))
                state.needle_level = int(min(sched.needle_max, max(state.needle_level, floor)))
                batch = make_batch(tok, task, rng, sched.tokens_per_step, state.needle_level)
                for g in opt.param_groups:
                    g["lr"] = lr_at(step, sched)
                out = model(**batch)
                out.loss.backward()
                torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                opt.step()
                opt.zero_grad(set_to_none=True)
                loss = float(out.loss.detach())
                state.losses.append((step, task, loss))
                if task == "needle":
                    em = float(answer_exact_match(out.logits.detach(), batch["labels"]).float().mean())
                    state.needle_hist = (state.needle_hist + [em])[-8:]
                    if len(state.needle_hist) == 8 and sum(state.needle_hist) / 8 >= sched.needle_advance:
                        state.needle_level = min(sched.needle_max, max(state.needle_level + 1,
                                                                       int(state.needle_level * 1.25)))
                        state.needle_hist = []
                    state.levels.append((step, state.needle_level))
                state.step += 1
                if state.step % sched.eval_every == 0 or state.step == sched.steps:
                    state.probes.append({"step": state.step, **_probe(model, probes)})
                state.seconds = time.time() - t0
                if state.probes and state.probes[-1]["step"] == state.step and log is not None:
                    log(f"step {state.step} s={state.seconds:.0f} needle_level={state.needle_level} "
                        + " ".join(f"{k}={v:.2f}" for k, v in state.probes[-1].items() if k != "step"))
                prog.update(bar, advance=1, info=f"loss {loss:.3f} needle≤{state.needle_level} sent.")
                if state.step % sched.ckpt_every == 0 and state.step < sched.steps:
                    tmp = workdir / "ckpt.pt.tmp"
                    torch.save({"model": model.state_dict(), "opt": opt.state_dict(),
                                "state": dataclasses.asdict(state), "digest": spec.digest()}, tmp)
                    os.replace(tmp, ckpt)
        model.eval()
        return model, tok, state
    finally:
        torch.set_num_threads(prev_threads)


def build(spec: ZooSpec, out: Path, overwrite: bool = False, progress: bool = True,
          evaluate: bool = True, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Train, evaluate and save ``spec`` to ``out`` (atomically); returns the zoo.json metadata."""
    from lmforge.models.learnability import evaluate_zoo_model

    if out.exists() and not overwrite:
        raise UserError(f"output '{out}' already exists; pass --overwrite to replace it")
    workdir = out.parent / f".{out.name}.work"
    workdir.mkdir(parents=True, exist_ok=True)
    model, tok, state = train(spec, workdir, progress=progress, log=log)
    metrics = evaluate_zoo_model(model, tok, spec, progress=progress) if evaluate else {}
    meta = {
        "name": spec.name,
        "digest": spec.digest(),
        "spec": spec.to_dict(),
        "params": sum(p.numel() for p in model.parameters()),
        "train_seconds": round(state.seconds, 1),
        "torch": torch.__version__,
        "threads": spec.threads,
        "metrics": metrics,
        "targets": dict(spec.targets),
    }
    with atomic_dir(out, overwrite=overwrite) as tmp:
        save_pretrained_quietly(model, tmp, safe_serialization=True)
        tok.save_pretrained(tmp)
        atomic_write_json(tmp / "curves.json", {
            "losses": state.losses, "probes": state.probes, "needle_levels": state.levels})
        atomic_write_json(tmp / "zoo.json", meta)
    shutil.rmtree(workdir, ignore_errors=True)
    return meta
