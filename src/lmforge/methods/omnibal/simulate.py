"""Stage costs of a layer partition and an exact event-driven simulator of a 1F1B pipeline.

OmniBal (Yao et al., ICML 2025, arXiv 2407.20761), method section, Balanced Model Partitioning: the
candidate partitions are compared by the time of a pipelined training iteration. This module gives
that time from profiled per-layer costs: :func:`stage_costs` sums layer costs per stage, and
:func:`simulate_1f1b` is the makespan of a non-interleaved 1F1B schedule (PipeDream-flush, the op
order of ``torch.distributed.pipelining.Schedule1F1B``) with per-boundary transfer times.

No kept library does this: ``torch.distributed.pipelining`` (checked in torch 2.13) has the
schedules that *run* a pipeline but no partition search and no simulator of a schedule's time
(torch's old ``torch.distributed.pipeline.sync.balance`` is gone, and DeepSpeed/Megatron are not
installed). OmniBal's official repository (ModelTC/OmniBal) releases only the data-balancing (ISF)
code, no BMP.

Model: every stage runs its ops strictly in its 1F1B order, one at a time. An op starts when its
stage is free and its input has arrived: F of micro-batch i on stage s needs F(i) on s-1 finished
plus ``comm[s-1]``; B(i) on s needs B(i) on s+1 finished plus ``comm[s]``; B(i) on the last stage
needs its own F(i). Sends are asynchronous (a transfer never blocks the sending stage).
NOTE: torch's ``Schedule1F1B`` fuses each send with the next receive and waits on both, which can
add stalls this model leaves out; with ``comm = 0`` the two agree.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

FWD, BWD = "F", "B"


def _check_boundaries(boundaries: Sequence[int], n_layers: int) -> tuple[int, ...]:
    """Validated interior cuts: integers, strictly increasing, each within ``1..n_layers-1``."""
    cuts = tuple(int(b) for b in boundaries)
    if any(int(b) != b for b in boundaries):
        raise ValueError(f"boundaries must be integers, got {list(boundaries)}")
    for b in cuts:
        if not 1 <= b <= n_layers - 1:
            raise ValueError(f"boundary {b} is outside 1..{n_layers - 1} (n_layers={n_layers}): "
                             "every stage needs at least one layer")
    for a, b in zip(cuts, cuts[1:]):
        if b <= a:
            raise ValueError(f"boundaries must be strictly increasing, got {list(cuts)}")
    return cuts


def stage_costs(layer_costs: Sequence[float], boundaries: Sequence[int]) -> list[float]:
    """Sum of layer costs per pipeline stage.

    Args:
        layer_costs: cost of each of the L layers, in model order.
        boundaries: the N-1 interior cut indices ``b_1 < ... < b_{N-1}``; stage s holds layers
            ``b_s .. b_{s+1}-1`` with ``b_0 = 0`` and ``b_N = L``. An empty sequence is one stage.

    Returns:
        The N stage costs.

    Raises:
        ValueError: a boundary outside ``1..L-1`` or boundaries not strictly increasing.
    """
    n = len(layer_costs)
    if n == 0:
        raise ValueError("layer_costs is empty")
    cuts = (0, *_check_boundaries(boundaries, n), n)
    return [float(sum(layer_costs[a:b])) for a, b in zip(cuts, cuts[1:])]


def one_f_one_b_order(stage: int, n_stages: int, n_micro: int) -> list[tuple[str, int]]:
    """The op order of one stage in non-interleaved 1F1B.

    ``min(p-1-s, m)`` warm-up forwards, then one forward and one backward alternately, then the
    remaining backwards. This is the order of torch's ``Schedule1F1B`` (which counts one more warm-up
    forward and then runs "1B1F": the same sequence).

    Args:
        stage: stage index s.
        n_stages: p.
        n_micro: m.

    Returns:
        ``[(kind, micro_batch), ...]`` with kind ``"F"`` or ``"B"``.
    """
    warm = min(n_stages - 1 - stage, n_micro)
    ops = [(FWD, i) for i in range(warm)]
    for i in range(n_micro - warm):
        ops += [(FWD, warm + i), (BWD, i)]
    ops += [(BWD, i) for i in range(n_micro - warm, n_micro)]
    return ops


@dataclass(frozen=True)
class PipelineTrace:
    """Result of :func:`simulate_1f1b_trace`.

    Attributes:
        makespan: time from the first op's start (0) to the last op's end.
        busy: per-stage compute time, ``m · (fwd[s] + bwd[s])``.
        starts: ``starts[s][(kind, i)]`` is the start time of that op on stage s.
    """

    makespan: float
    busy: tuple[float, ...]
    starts: tuple[dict[tuple[str, int], float], ...]

    @property
    def bubble(self) -> tuple[float, ...]:
        """Per-stage idle time within the makespan."""
        return tuple(self.makespan - b for b in self.busy)


def _comm_list(comm: float | Sequence[float], p: int) -> list[float]:
    if isinstance(comm, (int, float)):
        out = [float(comm)] * (p - 1)
    else:
        out = [float(c) for c in comm]
        if len(out) != p - 1:
            raise ValueError(f"comm has {len(out)} entries, expected one per boundary ({p - 1})")
    if any(not c >= 0 for c in out):
        raise ValueError(f"comm times must be >= 0, got {out}")
    return out


def simulate_1f1b_trace(fwd: Sequence[float], bwd: Sequence[float], n_micro: int,
                        comm: float | Sequence[float] = 0.0) -> PipelineTrace:
    """Event-driven simulation of a non-interleaved 1F1B pipeline; see :func:`simulate_1f1b`.

    Returns:
        A :class:`PipelineTrace` (makespan, per-stage busy time, op start times).
    """
    p = len(fwd)
    if p == 0 or len(bwd) != p:
        raise ValueError(f"fwd and bwd need the same non-zero length, got {len(fwd)} and {len(bwd)}")
    if n_micro < 1:
        raise ValueError(f"n_micro must be >= 1, got {n_micro}")
    f = [float(x) for x in fwd]
    b = [float(x) for x in bwd]
    if any(not x >= 0 for x in f + b):
        raise ValueError("op times must be >= 0")
    c = _comm_list(comm, p)

    orders = [one_f_one_b_order(s, p, n_micro) for s in range(p)]
    nxt = [0] * p  # index of each stage's next op
    idle = [True] * p
    arrived: list[set[tuple[str, int]]] = [set() for _ in range(p)]  # inputs present on each stage
    for i in range(n_micro):
        arrived[0].add((FWD, i))  # the first stage's inputs are there at t = 0
    starts: list[dict[tuple[str, int], float]] = [{} for _ in range(p)]
    events: list[tuple[float, int, str, int, str, int]] = []  # (time, seq, what, stage, kind, mb)
    seq = 0

    def push(t: float, what: str, stage: int, kind: str, mb: int) -> None:
        nonlocal seq
        heapq.heappush(events, (t, seq, what, stage, kind, mb))
        seq += 1

    def try_start(s: int, now: float) -> None:
        if not idle[s] or nxt[s] == len(orders[s]):
            return
        op = orders[s][nxt[s]]
        if op not in arrived[s]:
            return
        idle[s] = False
        nxt[s] += 1
        starts[s][op] = now
        push(now + (f[s] if op[0] == FWD else b[s]), "done", s, *op)

    makespan = 0.0
    for s in range(p):
        try_start(s, 0.0)
    while events:
        now, _, what, s, kind, mb = heapq.heappop(events)
        if what == "arrive":
            arrived[s].add((kind, mb))
            try_start(s, now)
            continue
        idle[s] = True  # an op finished on stage s
        makespan = max(makespan, now)
        if kind == FWD:
            if s + 1 < p:
                push(now + c[s], "arrive", s + 1, FWD, mb)
            else:
                arrived[s].add((BWD, mb))  # the loss is on the last stage: its B needs only its F
        elif s > 0:
            push(now + c[s - 1], "arrive", s - 1, BWD, mb)
        try_start(s, now)
    if any(nxt[s] != len(orders[s]) for s in range(p)):  # cannot happen for 1F1B; guards edits
        raise RuntimeError("pipeline simulation deadlocked")
    busy = tuple(n_micro * (f[s] + b[s]) for s in range(p))
    return PipelineTrace(makespan=makespan, busy=busy, starts=tuple(starts))


def simulate_1f1b(fwd: Sequence[float], bwd: Sequence[float], n_micro: int,
                  comm: float | Sequence[float] = 0.0) -> float:
    """Makespan of one iteration of a non-interleaved 1F1B pipeline (PipeDream-flush).

    Exact event-driven simulation, see the module docstring for the model. With uniform stages
    (``t_f``, ``t_b``) and no communication this is ``(m + p - 1)(t_f + t_b)``.

    Args:
        fwd: forward time of one micro-batch on each of the p stages.
        bwd: backward time of one micro-batch on each stage.
        n_micro: number of micro-batches m (>= 1).
        comm: transfer time across each of the p-1 stage boundaries (``comm[s]`` is between stages
            s and s+1, the same both ways); a scalar applies to every boundary.

    Returns:
        The makespan (same unit as the inputs).
    """
    return simulate_1f1b_trace(fwd, bwd, n_micro, comm).makespan
