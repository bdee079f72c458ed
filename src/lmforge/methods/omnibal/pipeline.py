"""The distributed runtime for the OmniBal reproduction: a VLM-shaped model on dp × pp processes.

OmniBal (ICML 2025) balances the data, the model partition and the memory of VLM training on 3D
parallelism. This module is the runtime those choices are timed and checked on: a LLaVA/InternVL-
shaped model (a ViT over image tiles, an MLP projector, a causal LLM over image + text tokens)
trained with pipeline parallelism composed with data parallelism, on gloo (CPU) or NCCL.

The pipeline schedule is **not** hand-written: each pipeline replica runs
``torch.distributed.pipelining``'s :class:`~torch.distributed.pipelining.PipelineStage` and
:class:`~torch.distributed.pipelining.Schedule1F1B` (the kept library) over its micro-batches; after
the schedule step the gradients are averaged over the data-parallel group (one flat all-reduce per
stage) and an optimizer steps. Weights are random (seeded), data are random (seeded per step,
replica and micro-batch): the runtime is for timing and for exactness checks against
:func:`reference_grads`, a single-process replay of the same steps.

* :class:`VLMConfig`, :func:`build_layers`: the model as a FLAT list of layers, each mapping one
  tensor ``h`` ``[1, ·, d]`` (a packed micro-batch, batch 1) to one tensor:
  ``[Embed] + ViT blocks + [Projector] + LLM blocks + [Head]``. NOTE: the length of ``h`` changes
  once, at the projector (see :class:`Layout`): one length for both halves would pad the LLM to
  ``max n_tiles·P + max T`` rather than ``max L`` (35% more LLM positions on L ≈ 600 batches).
  A micro-batch holds ``n_tiles`` image tiles of ``P`` tokens each and ``T`` text tokens; in the
  LLM sequence the image tokens come first, then the text (as LLaVA/InternVL put them),
  ``L = n_tiles·P + T``.
* :class:`StepPlan`: one optimizer step's micro-batches per data-parallel replica, as
  ``(n_tiles, T)`` pairs. Pipelining needs one activation shape per schedule step, so a replica's
  micro-batches are padded to that replica's maxima in that step, separately for the two
  models, as a padded VLM batch is: the ViT runs on ``max n_tiles`` tiles (padding tiles are
  computed, then dropped by the projector) and the LLM on ``max L`` positions (padding last, so
  causal attention keeps it away from the real tokens). Padding is real compute and changes no
  real token's value (checked). Shapes may change from step to step (see the NOTE below).
* :class:`Layout`: where tokens sit in ``h``, shared by the layers of one process. Before the
  projector ``h`` is ``[1, max n_tiles·P + max T, d]`` (the ViT tile slots, then the text slots);
  from the projector on it is the LLM sequence ``[1, max L, d]``. The step-level sizes are set by
  the runtime before each step (every rank derives them from the same plan). The projector also
  needs each micro-batch's own ``(n_tiles, T)``, to put its image tokens right before its text:
  those come in a second, integer tensor, ``counts`` ``[n_micro, 2]``, passed as a keyword
  argument of ``Schedule1F1B.step`` on every stage; the schedule splits it per micro-batch and
  :class:`StageModule` copies the row into the layout before running its layers (no extra
  communication: every stage builds it from the plan).
* :func:`stage_module`: one stage's slice of the layers, with activation recomputation
  (``torch.utils.checkpoint``, non-reentrant) on the chosen layers; a recomputed layer sees the
  layout of its own micro-batch again (1F1B runs it after later micro-batches' forwards).
* :func:`train_steps`: one rank's training loop (stage = ``rank % pp``, replica = ``rank // pp``);
  :func:`launch` spawns the processes (file:// rendezvous) and returns what each rank returned;
  on ranks that torchrun starts (more ranks, more nodes), :mod:`lmforge.methods.omnibal.torchrun`
  runs the same :func:`train_steps` after an ``env://`` rendezvous.

NOTE (loss scaling): ``Schedule1F1B`` sums the gradients of the per-micro-batch losses and, with
``scale_grads=True`` (its default, kept here), divides the stage's gradients by ``n_microbatches``
at the end of the step. So the loss function is the plain per-micro-batch loss (mean token
cross-entropy over that micro-batch's real text tokens) and a replica's gradient is that of the
MEAN of its micro-batch losses; the data-parallel all-reduce then averages over replicas.
:func:`reference_grads` backpropagates ``loss / (n_micro · dp)`` per micro-batch, the same
quantity.

NOTE (shapes change between steps): a ``PipelineStage`` allocates its receive buffers (activations
forward, gradients backward) once, at the schedule's first step, from the first shape it sees;
``Schedule1F1B`` never re-initialises the stage afterwards, so a later step with a different
shape would receive into buffers of the old size (torch 2.13 does not support reuse across
shapes: gloo aborts the process on the size mismatch, checked). :func:`train_steps` therefore
keeps one (stage, schedule) pair per distinct ``(max n_tiles, max T, max L, n_micro)`` and builds
a new pair, in *static* metadata mode (example meta tensors for the stage's input and output, so
no metadata-inference forward/backward runs), the first time a shape occurs. The build takes
about 0.2 ms; the first step at a new shape also runs the library's warm-up vote between
neighbouring stages and allocates new buffers: measured on two gloo processes, a step at a new
shape costs 1-3 ms more than a cached one (tiny model). Both show in the results per step
(``build_seconds``, ``new_shape``). The cache is not bounded (each entry holds ``n_micro``
activation and gradient receive buffers).
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import timedelta
from typing import Any

import numpy as np
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from lmforge.common.errors import UserError

IGNORE_INDEX = -100


# --------------------------------------------------------------------------------------------
# The model
# --------------------------------------------------------------------------------------------


@dataclass
class VLMConfig:
    """Sizes of the VLM-shaped model (defaults: 27 layers, 2.8 M parameters, 11.3 MB in float32).

    The ViT's MLP is 16× wider than the LLM's (``vit_mlp_ratio`` 32 vs ``llm_mlp_ratio`` 2) so
    that a ViT layer costs more than an LLM layer although it sees only the image tokens.
    Measured (one CPU thread, forward + backward, float32, a micro-batch of L ≈ 600): an LLM layer
    ≈ 5 ms (about 3.5 ms of it SDPA attention over 600 positions); a ViT layer ≈ 6-9 ms at 4
    tiles, 8-12 ms at 5-6 tiles, 17 ms at 8 tiles, i.e. 1.2-2.4× an LLM layer on typical
    micro-batches and 3× at 8 tiles (timings on a shared 2-core machine vary by ±30%). Raise
    ``vit_mlp_ratio`` for a heavier ViT (48: about 2.1-2.7× at 5-6 tiles, 15.6 MB).

    Attributes:
        vit_layers: ViT transformer blocks.
        llm_layers: LLM transformer blocks.
        d_model: hidden size, shared by the ViT and the LLM (the projector maps d → d).
        n_heads: attention heads (ViT and LLM).
        vit_mlp_ratio: ViT MLP width / d_model.
        llm_mlp_ratio: LLM MLP width / d_model.
        patch_tokens: ``P``, tokens per image tile.
        in_dim: input feature size (random features stand in for pixels and token ids).
        vocab: output vocabulary of the head.
        dtype: parameter and activation dtype.
    """

    vit_layers: int = 8
    llm_layers: int = 16
    d_model: int = 64
    n_heads: int = 2
    vit_mlp_ratio: int = 32
    llm_mlp_ratio: int = 2
    patch_tokens: int = 64
    in_dim: int = 32
    vocab: int = 512
    dtype: torch.dtype = torch.float32

    @property
    def n_layers(self) -> int:
        """Length of the flat layer list: embed + ViT + projector + LLM + head."""
        return self.vit_layers + self.llm_layers + 3

    def seq_len(self, n_tiles: int, text: int) -> int:
        """``L = n_tiles·P + T``."""
        return n_tiles * self.patch_tokens + text


@dataclass
class Layout:
    """Where the image and text tokens sit in ``h``; shared by the layers of one process.

    Step level (the runtime sets it before each step with :meth:`set_step`; every micro-batch of a
    replica's step is padded to it): :attr:`tiles` (ViT batch, max ``n_tiles``), :attr:`text`
    (text slots before the projector, max ``T``), :attr:`seq` (LLM length, max ``L``). Micro-batch
    level (:meth:`set_micro`, set by the stage module from its ``counts`` argument before each
    forward): the micro-batch's own ``n_tiles`` and ``T``, which the projector needs to put the
    micro-batch's image tokens right before its text.

    Before the projector ``h`` is ``[1, tiles·patch + text, d]`` (all ViT tile slots, then the text
    slots); from the projector on it is the LLM sequence ``[1, seq, d]``: the micro-batch's
    ``n_tiles·patch`` image tokens, its ``T`` text tokens, then zero padding.
    """

    patch: int
    tiles: int = 0
    text: int = 0
    seq: int = 0
    micro_tiles: int = 0
    micro_text: int = 0

    @property
    def image_slots(self) -> int:
        """ViT token slots before the projector: ``tiles · patch``."""
        return self.tiles * self.patch

    @property
    def pre_len(self) -> int:
        """Length of ``h`` before the projector."""
        return self.tiles * self.patch + self.text

    def set_step(self, tiles: int, text: int, seq: int) -> None:
        self.tiles, self.text, self.seq = tiles, text, seq

    def set_micro(self, tiles: int, text: int) -> None:
        if tiles > self.tiles or text > self.text or tiles * self.patch + text > self.seq:
            raise UserError(f"micro-batch ({tiles} tiles, {text} text) exceeds the step layout "
                            f"({self.tiles} tiles, {self.text} text, L={self.seq})")
        self.micro_tiles, self.micro_text = tiles, text

    def snapshot(self) -> tuple[int, ...]:
        return self.tiles, self.text, self.seq, self.micro_tiles, self.micro_text

    def restore(self, snap: tuple[int, ...]) -> None:
        self.tiles, self.text, self.seq, self.micro_tiles, self.micro_text = snap


def _attention(x: torch.Tensor, qkv: nn.Linear, proj: nn.Linear, n_heads: int, causal: bool) -> torch.Tensor:
    """Multi-head self-attention of ``x`` ``[B, S, d]`` (SDPA)."""
    b, s, d = x.shape
    q, k, v = qkv(x).view(b, s, 3, n_heads, d // n_heads).permute(2, 0, 3, 1, 4)
    out = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return proj(out.transpose(1, 2).reshape(b, s, d))


class _Block(nn.Module):
    """Pre-norm transformer block (LayerNorm, attention, LayerNorm, GELU MLP)."""

    def __init__(self, d: int, n_heads: int, mlp_ratio: int, causal: bool) -> None:
        super().__init__()
        if d % n_heads:
            raise UserError(f"d_model {d} is not a multiple of n_heads {n_heads}")
        self.n_heads, self.causal = n_heads, causal
        self.norm1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.norm2 = nn.LayerNorm(d)
        self.fc1 = nn.Linear(d, mlp_ratio * d)
        self.fc2 = nn.Linear(mlp_ratio * d, d)

    def block(self, x: torch.Tensor) -> torch.Tensor:
        x = x + _attention(self.norm1(x), self.qkv, self.proj, self.n_heads, self.causal)
        return x + self.fc2(F.gelu(self.fc1(self.norm2(x))))


class Embed(nn.Module):
    """Input features ``[1, tiles·P + text, in_dim]`` → hidden states ``[1, tiles·P + text, d]``."""

    def __init__(self, in_dim: int, d: int) -> None:
        super().__init__()
        self.linear = nn.Linear(in_dim, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x)


class ViTBlock(_Block):
    """A ViT block on the step's ViT slots only, as ``[tiles, P, d]`` with bidirectional attention
    within a tile (padding tiles are computed, and cannot affect real ones); the text slots pass
    through unchanged."""

    def __init__(self, d: int, n_heads: int, mlp_ratio: int, layout: Layout) -> None:
        super().__init__(d, n_heads, mlp_ratio, causal=False)
        self.layout = layout

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        n, p, k = self.layout.tiles, self.layout.patch, self.layout.image_slots
        if n == 0:
            return h.clone()
        img = self.block(h[:, :k].reshape(n, p, h.shape[-1]))
        return torch.cat([img.reshape(1, k, h.shape[-1]), h[:, k:]], dim=1)


class Projector(nn.Module):
    """The vision-language projector: a two-layer GELU MLP over this micro-batch's real tiles, then
    the LLM sequence ``[1, seq, d]``: its image tokens, its text tokens, zero padding (the ViT's
    padding tiles end here)."""

    def __init__(self, d: int, layout: Layout) -> None:
        super().__init__()
        self.layout = layout
        self.fc1 = nn.Linear(d, 2 * d)
        self.fc2 = nn.Linear(2 * d, d)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        lay = self.layout
        k, n, t = lay.image_slots, lay.micro_tiles * lay.patch, lay.micro_text
        img = self.fc2(F.gelu(self.fc1(h[:, :n])))  # the real tiles only: padding tiles are dropped here
        pad = h.new_zeros(1, lay.seq - n - t, h.shape[-1])
        return torch.cat([img, h[:, k: k + t], pad], dim=1)


class LLMBlock(_Block):
    """A causal LLM block over the whole LLM sequence (image tokens, text, padding last)."""

    def __init__(self, d: int, n_heads: int, mlp_ratio: int) -> None:
        super().__init__(d, n_heads, mlp_ratio, causal=True)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.block(h)


class Head(nn.Module):
    """Final norm and the linear map to vocabulary logits ``[1, seq, vocab]``."""

    def __init__(self, d: int, vocab: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(d)
        self.linear = nn.Linear(d, vocab)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return self.linear(self.norm(h))


def build_layers(cfg: VLMConfig, seed: int, layout: Layout | None = None) -> list[nn.Module]:
    """The model as a flat layer list, with weights drawn from ``seed`` (the global RNG is left
    untouched), so every rank and the single-process reference build the same model.

    Args:
        cfg: model sizes and dtype.
        seed: weight seed.
        layout: the shared :class:`Layout` (a new one when None; :func:`layout_of` finds it).

    Returns:
        ``[Embed] + vit_layers × ViTBlock + [Projector] + llm_layers × LLMBlock + [Head]``; the
        projector is at index ``cfg.vit_layers + 1``.
    """
    layout = layout if layout is not None else Layout(patch=cfg.patch_tokens)
    if layout.patch != cfg.patch_tokens:
        raise UserError(f"layout.patch {layout.patch} != cfg.patch_tokens {cfg.patch_tokens}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        layers: list[nn.Module] = [Embed(cfg.in_dim, cfg.d_model)]
        layers += [ViTBlock(cfg.d_model, cfg.n_heads, cfg.vit_mlp_ratio, layout) for _ in range(cfg.vit_layers)]
        layers.append(Projector(cfg.d_model, layout))
        layers += [LLMBlock(cfg.d_model, cfg.n_heads, cfg.llm_mlp_ratio) for _ in range(cfg.llm_layers)]
        layers.append(Head(cfg.d_model, cfg.vocab))
    return [layer.to(cfg.dtype) for layer in layers]


def layout_of(layers: Sequence[nn.Module]) -> Layout:
    """The :class:`Layout` the layers share (the one :func:`build_layers` attached)."""
    for layer in layers:
        inner = layer.layer if isinstance(layer, _Checkpointed) else layer
        if isinstance(getattr(inner, "layout", None), Layout):
            return inner.layout
    raise UserError("no layer carries a Layout (build the layers with build_layers)")


class _Checkpointed(nn.Module):
    """Recompute the wrapped layer's activations in backward (non-reentrant checkpoint).

    The layout current at forward time is handed to the checkpointed function, so the recompute
    (which 1F1B runs after later micro-batches' forwards have changed the layout) sees it again.
    """

    def __init__(self, layer: nn.Module, layout: Layout | None = None) -> None:
        super().__init__()
        self.layer = layer
        self._layout = layout if layout is not None else getattr(layer, "layout", None)

    def _run(self, h: torch.Tensor, snap: tuple[int, ...] | None) -> torch.Tensor:
        if snap is None or self._layout is None:
            return self.layer(h)
        before = self._layout.snapshot()
        self._layout.restore(snap)
        try:
            return self.layer(h)
        finally:
            self._layout.restore(before)

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        snap = self._layout.snapshot() if self._layout is not None else None
        return checkpoint(self._run, h, snap, use_reentrant=False)


class StageModule(nn.Sequential):
    """One stage's layers; ``forward(h, counts)`` first sets the layout's micro-batch counts.

    ``counts`` is this micro-batch's ``[[n_tiles, T]]`` (int64, ``[1, 2]``): the schedule splits
    the step's ``[n_micro, 2]`` keyword tensor along dim 0 and hands each stage its row, so every
    stage knows the micro-batch it is running without any extra communication.
    """

    def __init__(self, layers: Sequence[nn.Module], layout: Layout | None) -> None:
        super().__init__(*layers)
        self._layout = layout

    def forward(self, h: torch.Tensor, counts: torch.Tensor | None = None) -> torch.Tensor:
        if counts is not None and self._layout is not None:
            n, t = (int(v) for v in counts.reshape(-1).tolist())
            self._layout.set_micro(n, t)
        for layer in self:
            h = layer(h)
        return h


def stage_cuts(boundaries: Sequence[int], n_layers: int) -> list[int]:
    """Normalise a partition to its ``pp + 1`` cut points ``[0, c_1, …, n_layers]``.

    Args:
        boundaries: either the full cut list (starting at 0, ending at ``n_layers``) or the
            ``pp − 1`` interior cuts (stage ``s`` holds layers ``[cuts[s], cuts[s+1])``).
        n_layers: length of the flat layer list.

    Raises:
        UserError: a stage would be empty or a cut is out of range.
    """
    cuts = [int(b) for b in boundaries]
    if not (cuts and cuts[0] == 0 and cuts[-1] == n_layers):
        cuts = [0, *cuts, n_layers]
    if any(b <= a for a, b in zip(cuts, cuts[1:])) or cuts[0] != 0 or cuts[-1] != n_layers:
        raise UserError(f"bad pipeline boundaries {list(boundaries)} for {n_layers} layers "
                        "(cuts must increase strictly from 0 to the layer count)")
    return cuts


def stage_module(layers: Sequence[nn.Module], boundaries: Sequence[int], stage: int,
                 recompute: set[int] | frozenset[int] = frozenset()) -> StageModule:
    """One stage's slice of the flat layer list (the layers themselves, not copies), as a
    :class:`StageModule` (an ``nn.Sequential``); layers whose GLOBAL index is in ``recompute`` are
    wrapped in a non-reentrant checkpoint.

    Args:
        layers: the flat layer list (:func:`build_layers`).
        boundaries: cut points (see :func:`stage_cuts`).
        stage: stage index.
        recompute: global layer indices to recompute in backward.
    """
    cuts = stage_cuts(boundaries, len(layers))
    if not 0 <= stage < len(cuts) - 1:
        raise UserError(f"stage {stage} out of range for {len(cuts) - 1} stages")
    try:
        layout: Layout | None = layout_of(layers)
    except UserError:
        layout = None
    return StageModule([_Checkpointed(layers[i], layout) if i in recompute else layers[i]
                        for i in range(cuts[stage], cuts[stage + 1])], layout)


# --------------------------------------------------------------------------------------------
# Step plans and data
# --------------------------------------------------------------------------------------------


@dataclass
class StepPlan:
    """One optimizer step: each data-parallel replica's micro-batches as ``(n_tiles, T)`` pairs.

    ``micro[r]`` is replica ``r``'s list (its length is that replica's ``n_microbatches``; it must be
    at least ``pp`` for 1F1B). ``T`` counts text tokens only; the micro-batch's LLM length is
    ``L = n_tiles·P + T``. A replica's micro-batches are padded to :meth:`shape`.
    """

    micro: list[list[tuple[int, int]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.micro = [[(int(n), int(t)) for n, t in rep] for rep in self.micro]
        for rep in self.micro:
            if not rep:
                raise UserError("every replica needs at least one micro-batch")
            for n, t in rep:
                if n < 0 or t < 1:
                    raise UserError(f"micro-batch (n_tiles={n}, T={t}): need n_tiles ≥ 0 and T ≥ 1 "
                                    "(the loss is over text tokens)")

    @property
    def dp(self) -> int:
        return len(self.micro)

    def shape(self, replica: int, patch_tokens: int) -> tuple[int, int, int]:
        """Replica ``replica``'s padded ``(tiles, text, L)``: the maxima over its micro-batches of
        ``n_tiles`` (the ViT batch), ``T`` (text slots before the projector) and ``L`` (the LLM)."""
        rep = self.micro[replica]
        return (max(n for n, _ in rep), max(t for _, t in rep), max(n * patch_tokens + t for n, t in rep))

    def counts(self, replica: int) -> torch.Tensor:
        """Replica ``replica``'s ``[n_micro, 2]`` int64 ``(n_tiles, T)`` rows."""
        return torch.tensor(self.micro[replica], dtype=torch.long).reshape(-1, 2)


def _data_seed(seed: int, step: int, replica: int, micro: int) -> int:
    return int(np.random.SeedSequence([seed, step, replica, micro]).generate_state(1, dtype=np.uint64)[0] >> 1)


def micro_batch(cfg: VLMConfig, plan: StepPlan, seed: int, step: int, replica: int, micro: int,
                dtype: torch.dtype | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The random padded inputs ``[1, tiles·P + text, in_dim]`` and targets ``[1, L]`` of one
    micro-batch, padded to the replica's step shape.

    The real tiles and text tokens are drawn from ``(seed, step, replica, micro)`` alone (they do
    not depend on the padding); padding slots hold zero features. Targets are random token ids on
    the LLM sequence's text positions and ``IGNORE_INDEX`` on image and padding positions.
    """
    dtype = dtype or cfg.dtype
    n, t = plan.micro[replica][micro]
    tiles, text, seq = plan.shape(replica, cfg.patch_tokens)
    p = cfg.patch_tokens
    g = torch.Generator().manual_seed(_data_seed(seed, step, replica, micro))
    x = torch.zeros(1, tiles * p + text, cfg.in_dim, dtype=dtype)
    x[0, : n * p] = torch.randn(n * p, cfg.in_dim, generator=g, dtype=dtype)
    x[0, tiles * p: tiles * p + t] = torch.randn(t, cfg.in_dim, generator=g, dtype=dtype)
    y = torch.full((1, seq), IGNORE_INDEX, dtype=torch.long)
    y[0, n * p: n * p + t] = torch.randint(0, cfg.vocab, (t,), generator=g)
    return x, y


def loss_fn(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """Mean token cross-entropy of one micro-batch over its real text tokens."""
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), target.reshape(-1), ignore_index=IGNORE_INDEX)


# --------------------------------------------------------------------------------------------
# The distributed runtime
# --------------------------------------------------------------------------------------------


def _layer_grads(layers: Sequence[nn.Module], indices: range) -> dict[int, dict[str, torch.Tensor]]:
    return {i: {n: p.grad.detach().clone() for n, p in layers[i].named_parameters() if p.grad is not None}
            for i in indices}


def _make_optimizer(params: list[nn.Parameter], optimizer: str, lr: float) -> torch.optim.Optimizer:
    if optimizer == "sgd":
        return torch.optim.SGD(params, lr=lr)
    if optimizer == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.0)
    raise UserError(f"unknown optimizer {optimizer!r} (sgd or adamw)")


def _all_reduce_mean_grads(params: list[nn.Parameter], group: dist.ProcessGroup, size: int) -> None:
    """Average the gradients over ``group`` with one flat all-reduce."""
    grads = [p.grad if p.grad is not None else torch.zeros_like(p) for p in params]
    flat = torch.cat([g.reshape(-1) for g in grads])
    dist.all_reduce(flat, op=dist.ReduceOp.SUM, group=group)
    flat.div_(size)
    offset = 0
    for p in params:
        k = p.numel()
        p.grad = flat[offset: offset + k].view_as(p).clone()
        offset += k


def train_steps(rank: int, world: int, pp: int, dp: int, cfg: VLMConfig, boundaries: Sequence[int],
                recompute: set[int] | frozenset[int], plans: Sequence[StepPlan], seed: int, lr: float = 1e-3,
                dtype: torch.dtype | None = None, *, optimizer: str = "sgd", return_grads: bool = False,
                device: str = "cpu") -> dict[str, Any]:
    """One rank's training loop: 1F1B pipelining over this replica's micro-batches, then the
    data-parallel gradient mean and an optimizer step, for each plan. Call inside an initialised
    default process group (see :func:`launch`).

    The process grid is ``dp × pp``: rank ``r`` is stage ``r % pp`` of replica ``r // pp``. Every
    rank builds the whole model from ``seed`` and keeps its stage's slice.

    Args:
        rank: global rank.
        world: world size (``pp · dp``).
        pp: pipeline stages per replica.
        dp: data-parallel replicas.
        cfg: model config.
        boundaries: partition of the flat layer list (see :func:`stage_cuts`).
        recompute: global layer indices recomputed in backward.
        plans: one :class:`StepPlan` per step (each with ``dp`` replicas).
        seed: weight and data seed.
        lr: learning rate.
        dtype: parameter/activation dtype (``cfg.dtype`` when None).
        optimizer: ``"sgd"`` or ``"adamw"`` (no weight decay).
        return_grads: also return the first step's averaged gradients of this stage's layers.
        device: ``"cpu"``; ``"cuda"`` (this rank's device ``cuda:{rank % device_count}``, right when
            every node runs one rank per device); or ``"cuda:N"`` (under torchrun: ``cuda:LOCAL_RANK``).

    Returns:
        ``rank``, ``stage``, ``replica``; per step: ``step_seconds`` (the max over all ranks of
        each rank's barrier-to-barrier time), ``local_seconds`` (this rank's), ``build_seconds``
        (stage + schedule construction, 0 when cached), ``new_shape`` (a shape first seen),
        ``shapes`` (the replica's padded ``(tiles, text, L)``, see :meth:`StepPlan.shape`);
        ``losses`` (on a last-stage rank: the replica's mean micro-batch loss per step; empty
        elsewhere) and ``micro_losses``; with ``return_grads``, ``grads``: ``{global layer index:
        {parameter name: gradient}}``.
    """
    # Imported here: the pipelining package pulls in torch.export (about 1 s per process).
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B

    if pp * dp != world:
        raise UserError(f"pp·dp = {pp}·{dp} != world size {world}")
    if any(plan.dp != dp for plan in plans):
        raise UserError("every StepPlan needs one micro-batch list per data-parallel replica")
    dtype = dtype or cfg.dtype
    stage, replica = rank % pp, rank // pp
    dev = torch.device(device)
    if dev.type == "cuda":
        if dev.index is None:
            dev = torch.device("cuda", rank % torch.cuda.device_count())
        torch.cuda.set_device(dev)

    # Every rank creates every group, in the same order (new_group is collective).
    pp_groups = [dist.new_group([r * pp + s for s in range(pp)]) for r in range(dp)]
    dp_groups = [dist.new_group([r * pp + s for r in range(dp)]) for s in range(pp)]
    pp_group, dp_group = pp_groups[replica], dp_groups[stage]

    cfg_d = replace(cfg, dtype=dtype)
    layers = build_layers(cfg_d, seed)
    layout = layout_of(layers)
    cuts = stage_cuts(boundaries, len(layers))
    if len(cuts) - 1 != pp:
        raise UserError(f"boundaries give {len(cuts) - 1} stages, pp is {pp}")
    module = stage_module(layers, cuts, stage, recompute).to(dev)
    params = [p for p in module.parameters()]
    opt = _make_optimizer(params, optimizer, lr)
    first, last = stage == 0, stage == pp - 1
    proj_idx = cfg.vit_layers + 1

    def width_len(after_layer: int, shape: tuple[int, int, int]) -> tuple[int, int]:
        """(width, length) of the hidden state after layer ``after_layer`` (-1: the input)."""
        tiles, text, seq = shape
        if after_layer < 0:
            return cfg.in_dim, tiles * cfg.patch_tokens + text
        if after_layer == len(layers) - 1:
            return cfg.vocab, seq
        return cfg.d_model, (seq if after_layer >= proj_idx else tiles * cfg.patch_tokens + text)

    cache: dict[tuple[int, ...], Any] = {}

    def schedule_for(shape: tuple[int, int, int], n_micro: int) -> tuple[Any, float, bool]:
        key = (*shape, n_micro)
        if key in cache:
            return cache[key], 0.0, False
        t0 = time.perf_counter()

        def meta(after_layer: int) -> torch.Tensor:
            width, length = width_len(after_layer, shape)
            return torch.empty(1, length, width, dtype=dtype, device="meta").requires_grad_(after_layer >= 0)

        # Static metadata (example meta tensors): no metadata-inference forward/backward runs.
        pipe_stage = PipelineStage(module, stage, pp, dev, input_args=meta(cuts[stage] - 1),
                                   output_args=meta(cuts[stage + 1] - 1), group=pp_group)
        sched = Schedule1F1B(pipe_stage, n_micro, loss_fn=loss_fn, scale_grads=True)
        cache[key] = sched
        return sched, time.perf_counter() - t0, True

    out: dict[str, Any] = {"rank": rank, "stage": stage, "replica": replica, "step_seconds": [],
                           "local_seconds": [], "build_seconds": [], "new_shape": [], "shapes": [],
                           "losses": [], "micro_losses": []}
    for step, plan in enumerate(plans):
        shape = plan.shape(replica, cfg.patch_tokens)
        n_micro = len(plan.micro[replica])
        if n_micro < pp:
            raise UserError(f"step {step}: replica {replica} has {n_micro} micro-batches, 1F1B needs ≥ pp = {pp}")
        counts = plan.counts(replica)  # stays on the CPU: read as Python ints by StageModule
        xs = ys = None
        if first or last:
            pairs = [micro_batch(cfg_d, plan, seed, step, replica, m, dtype) for m in range(n_micro)]
            xs = torch.cat([x for x, _ in pairs]).to(dev) if first else None
            ys = torch.cat([y for _, y in pairs]).to(dev) if last else None
        opt.zero_grad(set_to_none=True)

        dist.barrier()
        t0 = time.perf_counter()
        layout.set_step(*shape)
        sched, build_s, new = schedule_for(shape, n_micro)
        losses: list[torch.Tensor] = []
        args = (xs,) if first else ()
        sched.step(*args, target=ys if last else None, losses=losses if last else None, return_outputs=False,
                   counts=counts)
        if dp > 1:
            _all_reduce_mean_grads(params, dp_group, dp)
        if return_grads and step == 0:
            out["grads"] = _layer_grads(layers, range(cuts[stage], cuts[stage + 1]))
        opt.step()
        if dev.type == "cuda":
            torch.cuda.synchronize(dev)
        dist.barrier()
        elapsed = time.perf_counter() - t0

        out["local_seconds"].append(elapsed)
        out["build_seconds"].append(build_s)
        out["new_shape"].append(new)
        out["shapes"].append(shape)
        if last:
            vals = [float(v.detach()) for v in losses]
            out["micro_losses"].append(vals)
            out["losses"].append(sum(vals) / len(vals))

    times = torch.tensor(out["local_seconds"], dtype=torch.float64, device=dev if dev.type == "cuda" else "cpu")
    dist.all_reduce(times, op=dist.ReduceOp.MAX)
    out["step_seconds"] = times.cpu().tolist()
    if return_grads:
        out["grads"] = {i: {n: g.cpu() for n, g in gs.items()} for i, gs in out["grads"].items()}
    dist.barrier()
    for g in pp_groups + dp_groups:
        dist.destroy_process_group(g)
    return out


def reference_grads(cfg: VLMConfig, plans: Sequence[StepPlan], seed: int, *, lr: float = 1e-3,
                    dtype: torch.dtype | None = None, optimizer: str = "sgd") -> dict[str, Any]:
    """Single-process replay of :func:`train_steps`: the whole model, the same micro-batches, the
    same padding and the same optimizer.

    Each step backpropagates ``loss / (n_micro_r · dp)`` for every micro-batch of every replica
    ``r`` (the mean over replicas of each replica's mean micro-batch loss), then steps.

    Returns:
        ``grads``: the first step's gradients, ``{global layer index: {parameter name: tensor}}``;
        ``losses``: per step, each replica's mean micro-batch loss.
    """
    dtype = dtype or cfg.dtype
    cfg_d = replace(cfg, dtype=dtype)
    layers = build_layers(cfg_d, seed)
    layout = layout_of(layers)
    model = nn.Sequential(*layers)
    opt = _make_optimizer(list(model.parameters()), optimizer, lr)
    result: dict[str, Any] = {"losses": []}
    for step, plan in enumerate(plans):
        opt.zero_grad(set_to_none=True)
        per_replica = []
        for r in range(plan.dp):
            layout.set_step(*plan.shape(r, cfg.patch_tokens))
            n_micro = len(plan.micro[r])
            total = 0.0
            for m in range(n_micro):
                layout.set_micro(*plan.micro[r][m])
                x, y = micro_batch(cfg_d, plan, seed, step, r, m, dtype)
                loss = loss_fn(model(x), y)
                (loss / (n_micro * plan.dp)).backward()
                total += float(loss.detach())
            per_replica.append(total / n_micro)
        result["losses"].append(per_replica)
        if step == 0:
            result["grads"] = _layer_grads(layers, range(len(layers)))
        opt.step()
    return result


def _spawned(rank: int, world: int, init: str, out_dir: str, backend: str, threads: int, timeout_s: float,
             fn: Callable[..., Any], args: tuple, kwargs: dict) -> None:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    torch.set_num_threads(threads)
    if backend == "nccl":
        torch.cuda.set_device(rank % torch.cuda.device_count())
    dist.init_process_group(backend, init_method=init, rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))
    try:
        result = fn(rank, world, *args, **kwargs)
        torch.save(result, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def launch(world: int, fn: Callable[..., Any], *args: Any, threads: int = 1, backend: str = "gloo",
           timeout_s: float = 600.0, **kwargs: Any) -> list[Any]:
    """Run ``fn(rank, world, *args, **kwargs)`` on ``world`` spawned processes and return each
    rank's return value (saved with ``torch.save`` in a temporary directory and read back).

    Each process sets ``OMP_WAIT_POLICY=PASSIVE`` (inherited from here; spinning OpenMP threads
    starve the other processes on few cores) and ``torch.set_num_threads(threads)``, then joins a
    process group (``backend``, file:// rendezvous in the temporary directory). ``fn`` must be
    picklable (a module-level function).

    Raises:
        TimeoutError: the processes did not finish within ``timeout_s`` (they are terminated).
    """
    prev = os.environ.get("OMP_WAIT_POLICY")
    os.environ["OMP_WAIT_POLICY"] = "PASSIVE"
    try:
        with tempfile.TemporaryDirectory(prefix="omnibal-pp-") as tmp:
            init = f"file://{os.path.join(tmp, 'rendezvous')}"
            ctx = mp.start_processes(_spawned, args=(world, init, tmp, backend, threads, timeout_s, fn, args, kwargs),
                                     nprocs=world, join=False, start_method="spawn")
            deadline = time.monotonic() + timeout_s + 60.0
            while not ctx.join(timeout=1.0):
                if time.monotonic() > deadline:
                    for p in ctx.processes:
                        if p.is_alive():
                            p.terminate()
                    raise TimeoutError(f"distributed run of {getattr(fn, '__name__', fn)} exceeded {timeout_s:.0f} s")
            return [torch.load(os.path.join(tmp, f"rank{r}.pt"), weights_only=False) for r in range(world)]
    finally:
        if prev is None:
            os.environ.pop("OMP_WAIT_POLICY", None)
        else:
            os.environ["OMP_WAIT_POLICY"] = prev


def model_bytes(cfg: VLMConfig) -> int:
    """Parameter bytes of the whole model at ``cfg.dtype``."""
    layers = build_layers(cfg, 0)
    return sum(p.numel() * p.element_size() for layer in layers for p in layer.parameters())


__all__ = [
    "IGNORE_INDEX", "Embed", "Head", "LLMBlock", "Layout", "Projector", "StageModule", "StepPlan", "VLMConfig",
    "ViTBlock",
    "build_layers", "launch", "layout_of", "loss_fn", "micro_batch", "model_bytes", "reference_grads",
    "stage_cuts", "stage_module", "train_steps",
]

