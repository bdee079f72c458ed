"""Balanced Model Partitioning (BMP): choose the pipeline-stage boundaries of a VLM's layer stack.

OmniBal (Yao et al., ICML 2025, arXiv 2407.20761), method section, Balanced Model Partitioning: with the
forward/backward time of every ViT and LLM layer profiled, 1) take a greedy *anchor* partition into
N stages, 2) form the candidates whose stage boundaries each lie within ±1 layer of the anchor's
(at most 3^(N-1), 27 for N = 4), 3) rank them by the variance of stage time and then by the summed
communication of their cuts, 4) run the best few for a short while (the paper: about 20 iterations)
and keep the fastest. Here step 4 calls a ``runner(boundaries) -> seconds``; the default runner is
the 1F1B simulator of :mod:`lmforge.methods.omnibal.simulate` on the profiled costs.

No kept library does this: ``torch.distributed.pipelining`` (checked in torch 2.13) runs pipeline
schedules on a split the user gives (``pipeline``/``SplitPoint``) but has no partition search and no
schedule simulator. OmniBal's official repository (ModelTC/OmniBal) releases only the data-balancing
(ISF) code; no BMP code is released.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from lmforge.methods.omnibal.simulate import _check_boundaries, simulate_1f1b, stage_costs


def _check_sizes(n_layers: int, n_stages: int) -> None:
    if n_stages < 1:
        raise ValueError(f"n_stages must be >= 1, got {n_stages}")
    if n_layers < n_stages:
        raise ValueError(f"cannot split {n_layers} layers into {n_stages} non-empty stages")


def equal_split(n_layers: int, n_stages: int) -> list[int]:
    """Equal-layer split (Megatron's uniform pipeline split): boundaries of the baseline partition.

    Layers are divided as evenly as possible; when ``n_layers % n_stages = r > 0`` the *first* r
    stages get one extra layer. (Megatron-LM itself requires divisibility unless the first/last stage
    sizes are given; earliest-first is the choice made here for the remainder.)

    Args:
        n_layers: L.
        n_stages: N.

    Returns:
        The N-1 interior boundaries.
    """
    _check_sizes(n_layers, n_stages)
    q, r = divmod(n_layers, n_stages)
    sizes = [q + (1 if s < r else 0) for s in range(n_stages)]
    return list(itertools.accumulate(sizes))[:-1]


def greedy_anchor(costs: Sequence[float], n_stages: int) -> list[int]:
    """The anchor partition: boundary k at the cut whose prefix cost is closest to ``k · total / N``.

    Args:
        costs: per-layer cost (OmniBal: forward + backward time).
        n_stages: N.

    Returns:
        N-1 strictly increasing boundaries in ``1..L-1`` (every stage non-empty).
    """
    n = len(costs)
    _check_sizes(n, n_stages)
    # NOTE: the paper gives no code for its greedy anchor (no official BMP code is released). Chosen
    # rule: for k = 1..N-1 the boundary is the cut c in 1..L-1 whose prefix sum sum(costs[:c]) is
    # closest to k·total/N (ties to the earlier cut); then a forward pass raises each boundary to at
    # least max(previous + 1, k) and a backward pass lowers it to at most min(next - 1, L - N + k),
    # so the boundaries are strictly increasing and every stage keeps at least one layer.
    prefix = list(itertools.accumulate(float(c) for c in costs))  # prefix[c-1] = sum(costs[:c])
    total = prefix[-1]
    cuts: list[int] = []
    for k in range(1, n_stages):
        target = k * total / n_stages
        cuts.append(min(range(1, n), key=lambda c: (abs(prefix[c - 1] - target), c)))
    for k in range(len(cuts)):
        cuts[k] = max(cuts[k], k + 1, cuts[k - 1] + 1 if k else 1)
    for k in reversed(range(len(cuts))):
        cuts[k] = min(cuts[k], n - n_stages + k + 1, cuts[k + 1] - 1 if k + 1 < len(cuts) else n - 1)
    return cuts


def neighbour_partitions(anchor: Sequence[int], n_layers: int) -> list[tuple[int, ...]]:
    """All valid partitions whose every boundary is within ±1 of the anchor's (sorted, unique).

    Args:
        anchor: the anchor's N-1 boundaries.
        n_layers: L.

    Returns:
        Up to 3^(N-1) boundary tuples, each strictly increasing within ``1..L-1``; the anchor is one.
    """
    anchor = _check_boundaries(anchor, n_layers)
    out = set()
    for cand in itertools.product(*[(b - 1, b, b + 1) for b in anchor]):
        if all(1 <= b <= n_layers - 1 for b in cand) and all(a < b for a, b in zip(cand, cand[1:])):
            out.add(cand)
    return sorted(out)


def exhaustive_partitions(n_layers: int, n_stages: int) -> list[tuple[int, ...]]:
    """Every partition of L layers into N non-empty contiguous stages (``C(L-1, N-1)`` of them)."""
    _check_sizes(n_layers, n_stages)
    return list(itertools.combinations(range(1, n_layers), n_stages - 1))


@dataclass(frozen=True)
class Candidate:
    """One ranked partition.

    Attributes:
        boundaries: the N-1 interior cuts.
        stage_times: per-stage forward + backward time of one micro-batch.
        variance: population variance of ``stage_times``.
        comm: summed communication (bytes) over the cuts.
    """

    boundaries: tuple[int, ...]
    stage_times: tuple[float, ...]
    variance: float
    comm: float

    @property
    def slowest(self) -> float:
        """The slowest stage's time."""
        return max(self.stage_times)


def _cut_bytes(comm_bytes_per_cut: Sequence[float] | None, n_layers: int) -> list[float]:
    if comm_bytes_per_cut is None:
        return [0.0] * (n_layers - 1)
    if len(comm_bytes_per_cut) not in (n_layers - 1, n_layers):
        raise ValueError(f"comm_bytes_per_cut has {len(comm_bytes_per_cut)} entries, expected L-1 = {n_layers - 1}"
                         f" (or L = {n_layers}, the per-layer output sizes)")
    return [float(x) for x in comm_bytes_per_cut[: n_layers - 1]]


def rank_candidates(fwd: Sequence[float], bwd: Sequence[float], comm_bytes_per_cut: Sequence[float] | None,
                    candidates: Sequence[Sequence[int]]) -> list[Candidate]:
    """Rank partitions by (variance of stage forward+backward time, summed bytes of their cuts).

    Args:
        fwd: per-layer forward time.
        bwd: per-layer backward time.
        comm_bytes_per_cut: bytes crossing the cut before layer c at index ``c-1`` (the output size of
            layer c-1), length L-1; a length-L sequence (every layer's output size, the last unused)
            is accepted; None means no communication cost.
        candidates: boundary tuples.

    Returns:
        The candidates as :class:`Candidate`, best first (remaining ties: lexicographic boundaries).
    """
    n = len(fwd)
    if len(bwd) != n:
        raise ValueError(f"fwd has {n} layers, bwd {len(bwd)}")
    cut_bytes = _cut_bytes(comm_bytes_per_cut, n)
    per_layer = [float(a) + float(b) for a, b in zip(fwd, bwd)]
    out = []
    for cand in candidates:
        cuts = _check_boundaries(cand, n)
        times = stage_costs(per_layer, cuts)
        mean = sum(times) / len(times)
        var = sum((t - mean) ** 2 for t in times) / len(times)
        out.append(Candidate(cuts, tuple(times), var, sum(cut_bytes[c - 1] for c in cuts)))
    out.sort(key=lambda c: (c.variance, c.comm, c.boundaries))
    return out


def simulated_runner(fwd: Sequence[float], bwd: Sequence[float], n_micro: int,
                     comm_bytes_per_cut: Sequence[float] | None = None,
                     bandwidth: float | None = None) -> Callable[[Sequence[int]], float]:
    """A ``runner(boundaries) -> seconds``: the 1F1B makespan of that partition on the profiled costs.

    Args:
        fwd: per-layer forward time of one micro-batch.
        bwd: per-layer backward time.
        n_micro: micro-batches per iteration.
        comm_bytes_per_cut: as in :func:`rank_candidates`.
        bandwidth: bytes per second between neighbouring stages; None means transfers are free.

    Returns:
        The runner.
    """
    n = len(fwd)
    cut_bytes = _cut_bytes(comm_bytes_per_cut, n)

    def run(boundaries: Sequence[int]) -> float:
        cuts = _check_boundaries(boundaries, n)
        comm = [0.0 if bandwidth is None else cut_bytes[c - 1] / bandwidth for c in cuts]
        return simulate_1f1b(stage_costs(fwd, cuts), stage_costs(bwd, cuts), n_micro, comm)

    return run


@dataclass
class BMPResult:
    """Outcome of :func:`bmp_search`.

    Attributes:
        anchor: the greedy anchor's boundaries.
        equal_split: the equal-layer baseline's boundaries.
        candidates: every ±1 neighbour of the anchor, ranked (best first).
        measured: runner time of each candidate that was run (the top ``top_k``), by boundaries.
        chosen: the fastest measured candidate's boundaries.
        chosen_time: its runner time.
    """

    anchor: tuple[int, ...]
    equal_split: tuple[int, ...]
    candidates: list[Candidate]
    measured: dict[tuple[int, ...], float] = field(default_factory=dict)
    chosen: tuple[int, ...] = ()
    chosen_time: float = float("inf")

    def candidate(self, boundaries: Sequence[int]) -> Candidate:
        """The ranked :class:`Candidate` with these boundaries."""
        key = tuple(boundaries)
        for c in self.candidates:
            if c.boundaries == key:
                return c
        raise KeyError(key)


def bmp_search(fwd: Sequence[float], bwd: Sequence[float], comm_bytes_per_cut: Sequence[float] | None,
               n_stages: int, n_micro: int, top_k: int = 3,
               runner: Callable[[Sequence[int]], float] | None = None,
               bandwidth: float | None = None) -> BMPResult:
    """OmniBal's BMP: anchor → ±1 neighbours → rank by (variance, communication) → run the top k.

    Args:
        fwd: profiled per-layer forward time (ViT layers, then LLM layers, in pipeline order).
        bwd: profiled per-layer backward time.
        comm_bytes_per_cut: as in :func:`rank_candidates`.
        n_stages: pipeline stages N.
        n_micro: micro-batches per iteration (used by the default runner).
        top_k: how many of the best-ranked candidates to run.
        runner: ``runner(boundaries) -> seconds`` (OmniBal: ~20 real training iterations); default
            :func:`simulated_runner` on the profiled costs.
        bandwidth: bytes/s for the default runner's transfers (None: free).

    Returns:
        A :class:`BMPResult`; ties between measured times go to the better-ranked candidate.
    """
    n = len(fwd)
    _check_sizes(n, n_stages)
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    per_layer = [float(a) + float(b) for a, b in zip(fwd, bwd)]
    anchor = tuple(greedy_anchor(per_layer, n_stages))
    ranked = rank_candidates(fwd, bwd, comm_bytes_per_cut, neighbour_partitions(anchor, n))
    run = runner if runner is not None else simulated_runner(fwd, bwd, n_micro, comm_bytes_per_cut, bandwidth)
    result = BMPResult(anchor=anchor, equal_split=tuple(equal_split(n, n_stages)), candidates=ranked)
    for cand in ranked[:top_k]:
        t = float(run(cand.boundaries))
        result.measured[cand.boundaries] = t
        if t < result.chosen_time:
            result.chosen, result.chosen_time = cand.boundaries, t
    return result
