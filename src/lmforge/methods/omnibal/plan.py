"""OmniBal wiring: lengths → micro-batch plans, profile → BMP, memory → recompute plan, timed runs.

The math lives in :mod:`.isf`, :mod:`.metrics`, :mod:`.bmp`, :mod:`.simulate` and :mod:`.recompute`;
the runtime in :mod:`.pipeline`. This module joins them the way OmniBal's three steps follow one
another (data balance, then model partition, then memory):

* :func:`scale_samples` maps InternVL sample lengths onto the miniature model: a tile is
  ``P`` tokens instead of InternVL's 256, and text shrinks by the same factor ``256 / P``.
* :func:`packed_micro` (ISF groups, one packed sequence each) and :func:`padded_micro` (the
  baseline: ``micro_bs`` samples padded to the longest, ``micro_bs · max L`` LLM positions) give
  ``(n_tiles, T)`` micro-batches; :func:`step_plans` cuts them into steps.
* :func:`layer_memory` measures each layer's parameter bytes, saved-activation bytes and ΔM (what
  recompute saves) on one micro-batch; :func:`stage_memory` adds them up per stage under 1F1B
  (stage ``s`` of ``p`` holds ``min(p − s, m)`` micro-batches' activations at its peak, and
  AdamW keeps weights, gradients and two moments: 4× the parameter bytes).
* :func:`recompute_plan` starts from full recompute and, per stage, turns it off for the layers
  that maximise the saved forward time within the stage's free memory (an exact knapsack,
  :func:`~lmforge.methods.omnibal.recompute.plan_stages`).

* :func:`measured_capacity` reads the memory a stage may use from the machine: on CUDA the free
  bytes of each rank's device (``torch.cuda.mem_get_info``), on a CPU the smaller of
  ``MemAvailable`` of ``/proc/meminfo`` and the free memory of the cgroup the process runs in
  (:func:`read_cpu_free`: in a container, ``/proc/meminfo`` shows the host), shared among the
  local ranks; both less a stated safety margin (:data:`MARGIN_PERCENT`,
  :data:`RANK_RESERVE_BYTES`). :func:`capacity_rule` is the modelled alternative (the
  reproduction's, fixed before its runs).

NOTE (free memory): the paper runs full recompute on the GPU and reads what is left. Here a stage's
free memory is its capacity minus its *modelled* full-recompute memory (:func:`stage_memory`), and
the capacity is measured before the run (:func:`measured_capacity`), stated (``--capacity-mb``) or
modelled (:func:`capacity_rule`). Measured before the run, "capacity − full-recompute memory" is
what the paper reads after it, up to what the model leaves out (the runtime's own buffers, covered
by the margin).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lmforge.methods.omnibal.pipeline import StepPlan, VLMConfig, build_layers, layout_of, micro_batch
from lmforge.methods.omnibal.recompute import plan_stages, recompute_delta_bytes, saved_activation_bytes
from lmforge.methods.omnibal.simulate import stage_costs

TILE_TOKENS = 256  # InternVL: one 448-px tile is 256 LLM tokens
ADAMW_STATE_FACTOR = 4  # weights, gradients, exp_avg, exp_avg_sq
MEMINFO = Path("/proc/meminfo")
CGROUP = Path("/sys/fs/cgroup")
# NOTE (cgroup v1's "no limit"): v1 writes an unlimited memory.limit_in_bytes as the largest page
# multiple below 2**63 (9223372036854771712 with 4 KiB pages); any limit from 2**62 bytes (4 EiB) up
# is read as that, not as a limit.
CGROUP_V1_UNLIMITED = 2**62
# NOTE (safety margin of the measured capacity): a rank may plan with its share of the free memory
# less 10% (other processes' growth, allocator fragmentation) and less a fixed reserve for the
# process itself, which the modelled stage memory leaves out: 512 MiB on a CPU (measured here: a
# process with torch and torch.distributed.pipelining imported holds about 300 MiB resident, plus
# gloo's buffers) and 1 GiB on CUDA (a CUDA context and NCCL's buffers; stated, not measured here:
# no GPU was available).
MARGIN_PERCENT = 10
RANK_RESERVE_BYTES = {"cpu": 512 * 2**20, "cuda": 2**30}


def scale_samples(vit: np.ndarray, tok: np.ndarray, patch_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """``(n_tiles, T)`` per sample for a model with ``patch_tokens`` tokens per tile.

    InternVL's ``token_num`` counts 256 tokens per tile plus the text; the text is scaled by
    ``patch_tokens / 256`` (at least one token, the loss needs one).
    """
    vit = np.asarray(vit, dtype=np.int64)
    text = np.asarray(tok, dtype=np.int64) - TILE_TOKENS * vit
    return vit, np.maximum(1, np.rint(text * patch_tokens / TILE_TOKENS)).astype(np.int64)


def packed_micro(tiles: np.ndarray, text: np.ndarray, groups: Sequence[np.ndarray]) -> list[tuple[int, int]]:
    """One packed micro-batch per group: the group's tiles and its text tokens, concatenated."""
    return [(int(tiles[g].sum()), int(text[g].sum())) for g in groups]


def padded_micro(tiles: np.ndarray, text: np.ndarray, batches: np.ndarray, patch_tokens: int
                 ) -> tuple[list[tuple[int, int]], list[int]]:
    """Baseline micro-batches: each row of ``batches`` (sample indices) padded to its longest sample.

    The ViT sees every tile of the micro-batch (images are not padded); the LLM sees
    ``rows · max L`` positions, written as text slots ``T = rows · max L − n_tiles · P`` (padding
    costs what text costs). Returns the micro-batches and each one's real (unpadded) token count.
    """
    micro, real = [], []
    for row in np.asarray(batches):
        lens = tiles[row] * patch_tokens + text[row]
        n = int(tiles[row].sum())
        micro.append((n, int(len(row) * lens.max()) - n * patch_tokens))
        real.append(int(lens.sum()))
    return micro, real


def step_plans(micro: Sequence[tuple[int, int]], n_micro: int, steps: int) -> list[StepPlan]:
    """Cut a micro-batch stream into ``steps`` single-replica steps of ``n_micro``."""
    if len(micro) < n_micro * steps:
        raise ValueError(f"{len(micro)} micro-batches are too few for {steps} steps of {n_micro}")
    return [StepPlan([list(micro[i * n_micro:(i + 1) * n_micro])]) for i in range(steps)]


@dataclass
class LayerMemory:
    """Per layer of the flat list: parameter bytes, saved-activation bytes, and ΔM of recompute."""

    param_bytes: list[int]
    act_bytes: list[int]
    delta_bytes: list[int]


def example_input(cfg: VLMConfig, shape: tuple[int, int], seed: int = 0) -> tuple[list[torch.nn.Module], torch.Tensor]:
    """The model's layers with their layout set for one micro-batch of ``(n_tiles, T)``, and its input."""
    layers = build_layers(cfg, seed)
    layout = layout_of(layers)
    plan = StepPlan([[shape]])
    layout.set_step(*plan.shape(0, cfg.patch_tokens))
    layout.set_micro(*shape)
    x, _ = micro_batch(cfg, plan, seed, 0, 0, 0)
    return layers, x


def layer_memory(layers: Sequence[torch.nn.Module], x: torch.Tensor) -> LayerMemory:
    """Measure :class:`LayerMemory` on one micro-batch (layers run in order on each other's output)."""
    mem = LayerMemory([], [], [])
    h = x
    for layer in layers:
        inp = h.detach().requires_grad_(True)
        mem.param_bytes.append(sum(p.numel() * p.element_size() for p in layer.parameters()))
        mem.act_bytes.append(saved_activation_bytes(layer, inp))
        mem.delta_bytes.append(recompute_delta_bytes(layer, inp))
        with torch.no_grad():
            h = layer(inp)
    return mem


def in_flight(n_stages: int, n_micro: int) -> list[int]:
    """Micro-batches whose activations stage ``s`` holds at its 1F1B peak: ``min(p − s, m)``."""
    return [min(n_stages - s, n_micro) for s in range(n_stages)]


def stage_memory(mem: LayerMemory, boundaries: Sequence[int], recompute: set[int], n_micro: int) -> list[int]:
    """Modelled peak bytes per stage: AdamW states plus in-flight activations.

    A recomputed layer keeps ``act − ΔM`` (its input), one that is not keeps ``act``.
    """
    n = len(mem.param_bytes)
    cuts = [0, *boundaries, n]
    flight = in_flight(len(cuts) - 1, n_micro)
    out = []
    for s in range(len(cuts) - 1):
        idx = range(cuts[s], cuts[s + 1])
        states = ADAMW_STATE_FACTOR * sum(mem.param_bytes[i] for i in idx)
        acts = sum(mem.act_bytes[i] - (mem.delta_bytes[i] if i in recompute else 0) for i in idx)
        out.append(states + flight[s] * acts)
    return out


def capacity_rule(mem: LayerMemory, equal: Sequence[int], n_micro: int) -> int:
    """The device capacity the reproduction assumes (fixed before any run).

    Halfway between what the equal split's fullest stage needs with full recompute and without any:
    full recompute fits, no recompute does not, as on the paper's GPUs.
    """
    everything = set(range(len(mem.param_bytes)))
    full = max(stage_memory(mem, equal, everything, n_micro))
    none = max(stage_memory(mem, equal, set(), n_micro))
    return full + (none - full) // 2


def read_mem_available(path: Path | None = None) -> int:
    """``MemAvailable`` of ``/proc/meminfo`` (or ``path``) in bytes.

    Raises:
        OSError: the file cannot be read.
        ValueError: it has no well-formed ``MemAvailable`` line (kernels before 3.14).
    """
    text = Path(MEMINFO if path is None else path).read_text()
    for line in text.splitlines():
        if line.startswith("MemAvailable:"):
            parts = line.split()
            if len(parts) == 3 and parts[1].isdigit() and parts[2] == "kB":
                return int(parts[1]) * 1024
            raise ValueError(f"malformed line {line.strip()!r}")
    raise ValueError("no MemAvailable line")


def _read_int(path: Path, raw: str | None = None) -> int:
    """The byte count in ``path`` (or in ``raw``, its text already read)."""
    raw = (path.read_text() if raw is None else raw).strip()
    if not (raw.isascii() and raw.isdigit()):
        raise ValueError(f"{path}: expected a byte count, got {raw[:40]!r}")
    return int(raw)


def read_cgroup_free(root: Path | None = None) -> dict[str, int]:
    """The free bytes of the memory cgroup mounted at ``root`` (default :data:`CGROUP`), per limit
    found: ``{}`` when neither version sets one.

    * v2: ``memory.max − memory.current`` (``memory.max`` of ``max``: no limit);
    * v1: ``memory/memory.limit_in_bytes − memory/memory.usage_in_bytes`` (a limit from
      :data:`CGROUP_V1_UNLIMITED` up: no limit).

    Both are floored at 0. A limit file that does not exist is no limit.

    NOTE (what the cgroup's usage counts): both usage files count the page cache of the cgroup,
    which the kernel can reclaim, so ``limit − usage`` errs low (safe for a plan). Only the cgroup
    mounted at ``root`` is read (a container's own, under Docker or Kubernetes): a process in a
    nested cgroup of a host is not followed to its own folder.

    Raises:
        OSError: a limit exists and the usage beside it cannot be read.
        ValueError: a file holds no byte count.
    """
    root = CGROUP if root is None else Path(root)
    out: dict[str, int] = {}
    try:
        raw = (root / "memory.max").read_text().strip()
    except (FileNotFoundError, NotADirectoryError):
        raw = None
    if raw is not None and raw != "max":
        limit = _read_int(root / "memory.max", raw)
        out["cgroup v2 memory.max - memory.current"] = max(0, limit - _read_int(root / "memory.current"))
    try:
        limit = _read_int(root / "memory" / "memory.limit_in_bytes")
    except (FileNotFoundError, NotADirectoryError):
        limit = None
    if limit is not None and limit < CGROUP_V1_UNLIMITED:
        usage = _read_int(root / "memory" / "memory.usage_in_bytes")
        out["cgroup v1 memory.limit_in_bytes - memory.usage_in_bytes"] = max(0, limit - usage)
    return out


def read_cpu_free(meminfo: Path | None = None, cgroup: Path | None = None) -> tuple[int, str, dict[str, int]]:
    """The free CPU memory of this process: the smaller of ``MemAvailable``
    (:func:`read_mem_available`) and the cgroup's free bytes (:func:`read_cgroup_free`).

    Returns:
        ``(free bytes, the source that bounded it, every source read → its free bytes)``; on a tie
        ``/proc/meminfo MemAvailable`` is named.
    """
    readings = {"/proc/meminfo MemAvailable": read_mem_available(meminfo), **read_cgroup_free(cgroup)}
    source = min(readings, key=readings.__getitem__)  # first of the smallest: MemAvailable on a tie
    return readings[source], source, readings


def capacity_from_free(free_bytes: int, ranks: int, device: str = "cpu") -> int:
    """A stage's capacity from free memory shared by ``ranks`` processes: the share
    ``⌊free / ranks⌋``, less :data:`MARGIN_PERCENT` % of it (rounded up) and
    :data:`RANK_RESERVE_BYTES` of ``device`` (at least 0)."""
    if ranks < 1:
        raise ValueError(f"ranks must be >= 1, got {ranks}")
    share = int(free_bytes) // ranks
    return max(0, share - -(-share * MARGIN_PERCENT // 100) - RANK_RESERVE_BYTES[device])


@dataclass
class MeasuredCapacity:
    """What :func:`measured_capacity` read, and the per-stage capacity it gives.

    Attributes:
        device: ``"cpu"`` or ``"cuda"``.
        read_from: the source that bounded ``free_bytes``: on a CPU ``"/proc/meminfo MemAvailable"``,
            ``"cgroup v2 memory.max - memory.current"`` or ``"cgroup v1 memory.limit_in_bytes -
            memory.usage_in_bytes"`` (the smallest of ``readings``); on CUDA ``"torch.cuda.mem_get_info"``.
        free_bytes: the free bytes read: the machine's (CPU, one entry) or each used device's (CUDA).
        ranks: the local ranks sharing each entry of ``free_bytes``.
        margin_fraction: :data:`MARGIN_PERCENT` / 100.
        reserve_bytes: the per-rank reserve (:data:`RANK_RESERVE_BYTES`).
        capacity: bytes every stage plans with: the smallest :func:`capacity_from_free` over the entries.
        readings: on a CPU, every source read and its free bytes (:func:`read_cpu_free`); on CUDA ``{}``.
    """

    device: str
    read_from: str
    free_bytes: list[int]
    ranks: list[int]
    margin_fraction: float
    reserve_bytes: int
    capacity: int
    readings: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def measured_capacity(device: str, local_ranks: int, meminfo: Path | None = None,
                      cgroup: Path | None = None) -> MeasuredCapacity:
    """The per-stage capacity from the memory free on this machine now (before the run).

    CPU: the smaller of ``MemAvailable`` of ``/proc/meminfo`` and the cgroup's free memory
    (:func:`read_cpu_free`), divided among the ``local_ranks`` processes that share the machine.
    CUDA: rank ``r`` uses device ``r mod device_count`` (as
    :func:`~lmforge.methods.omnibal.pipeline.train_steps` places it); each used device's free bytes
    (``torch.cuda.mem_get_info``) are divided among its ranks. Both less the safety margin (see
    :func:`capacity_from_free`); the smallest share is every stage's capacity.

    Args:
        device: ``"cpu"`` or ``"cuda"``.
        local_ranks: the run's processes on this machine (``lmforge train omnibal``: ``--stages``;
            the torchrun runtime measures nothing: it takes the recompute plan from ``--plan``).
        meminfo: the meminfo file (default :data:`MEMINFO`).
        cgroup: the cgroup mount (default :data:`CGROUP`).

    Raises:
        OSError, ValueError: the CPU's free memory cannot be read (see :func:`read_mem_available`,
            :func:`read_cgroup_free`).
        RuntimeError: CUDA's cannot (no device, or the driver call failed).
    """
    if local_ranks < 1:
        raise ValueError(f"local_ranks must be >= 1, got {local_ranks}")
    readings: dict[str, int] = {}
    if device == "cpu":
        got, read_from, readings = read_cpu_free(meminfo, cgroup)
        free, ranks = [got], [local_ranks]
    elif device == "cuda":
        count = torch.cuda.device_count()
        if count < 1:
            raise RuntimeError("no CUDA device")
        used = sorted({r % count for r in range(local_ranks)})
        free = [int(torch.cuda.mem_get_info(d)[0]) for d in used]
        ranks = [sum(1 for r in range(local_ranks) if r % count == d) for d in used]
        read_from = "torch.cuda.mem_get_info"
    else:
        raise ValueError(f"device must be cpu or cuda, got {device!r}")
    cap = min(capacity_from_free(f, k, device) for f, k in zip(free, ranks, strict=True))
    return MeasuredCapacity(device, read_from, free, ranks, MARGIN_PERCENT / 100, RANK_RESERVE_BYTES[device], cap,
                            readings)


def recompute_plan(mem: LayerMemory, fwd_s: Sequence[float], boundaries: Sequence[int], capacity: int,
                   n_micro: int, granularity: int | None = None) -> set[int]:
    """Layers that keep recompute ON: full recompute minus, per stage, the knapsack-chosen layers.

    A layer's weight is ``ΔM × in-flight micro-batches`` of its stage; its value is its forward time
    (what recompute repeats); a stage's budget is ``capacity`` minus its full-recompute memory.
    """
    n = len(mem.param_bytes)
    cuts = [0, *boundaries, n]
    flight = in_flight(len(cuts) - 1, n_micro)
    everything = set(range(n))
    free = [capacity - m for m in stage_memory(mem, boundaries, everything, n_micro)]
    weights = [0] * n
    for s in range(len(cuts) - 1):
        for i in range(cuts[s], cuts[s + 1]):
            weights[i] = mem.delta_bytes[i] * flight[s]
    if granularity is None:  # 4 KiB, coarser for large budgets so the knapsack table stays small
        granularity = max(1 << 12, -(-max(max(free), 1) // 200_000))
    off = plan_stages(weights, list(fwd_s), list(boundaries), free, granularity)
    return everything - {i for stage in off for i in stage}


def with_recompute(fwd: Sequence[float], bwd: Sequence[float], recompute: set[int]) -> list[float]:
    """Backward times when the layers in ``recompute`` repeat their forward first."""
    return [b + (f if i in recompute else 0.0) for i, (f, b) in enumerate(zip(fwd, bwd, strict=True))]


def slowest_stage(fwd: Sequence[float], bwd: Sequence[float], boundaries: Sequence[int]) -> float:
    """The slowest stage's forward + backward time per micro-batch."""
    return max(stage_costs([f + b for f, b in zip(fwd, bwd, strict=True)], list(boundaries)))
