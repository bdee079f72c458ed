"""ISF, Iterative Sampling and Filtering (OmniBal §3.2; ModelTC/OmniBal ``dataset.py``).

Samples are ``(vit_num, token_num)`` pairs. One pass (:func:`random_pack`) shuffles the pool with a
seeded ``numpy.random.RandomState`` and packs greedily: a sample joins the open group unless either
sum would pass its cap (ViT cap ``Q_v`` tiles, token cap ``Q_t``), in which case the group closes and
the sample opens the next one; a sample larger than a cap on its own is skipped. :func:`isf` keeps
the groups that are full (``vit == Q'_v`` or ``tokens ≥ Q'_t``, the official floors ``Q'_v = Q_v``
and ``Q'_t = Q_t − 128``) and re-packs everything else with seed ``seed + i``, for up to
``rounds − 1`` re-packs (the official ``iter_time``, 50 in its test); what is left after the last
round is packed as it falls. One group is one device micro-batch.

The shuffle and the loop order are the official ones, so with ``keep_tail=False`` the groups equal
the official code's, group for group (the test checks it against a transcription of the loop).

Checked: no kept library packs two-resource bins this way (``torch.utils.data`` has samplers, not
packers; LLaVA's length-grouped sampler sorts, it does not pack), so it is written here, in numpy
and Python (70k samples, 50 rounds: about a second; the official Cython is not needed).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

TOKEN_SLACK = 128  # the official floor: Q'_t = Q_t - 128


@dataclass
class ISFResult:
    """Packed groups (arrays of sample indices) and what was skipped.

    Attributes:
        groups: one array of sample indices per group (micro-batch), in output order.
        skipped: indices of samples larger than a cap on their own (the official code skips them).
        kept_per_round: how many full groups each filtering round kept.
        caps: ``(vit_cap, token_cap, vit_floor, token_floor)``.
    """

    groups: list[np.ndarray]
    skipped: np.ndarray
    kept_per_round: list[int] = field(default_factory=list)
    caps: tuple[int, int, int, int] = (0, 0, 0, 0)

    def sizes(self) -> np.ndarray:
        """Samples per group."""
        return np.array([len(g) for g in self.groups], dtype=np.int64)


def random_pack(ids: np.ndarray, vit: np.ndarray, tok: np.ndarray, seed: int, vit_cap: int, token_cap: int,
                keep_tail: bool = True) -> list[np.ndarray]:
    """One greedy pass over a seeded shuffle of ``ids`` (the official ``_random_groups``).

    Args:
        ids: sample indices in pool order (the shuffle permutes positions in this array).
        vit: ``vit_num`` of every sample (indexed by sample index).
        tok: ``token_num`` of every sample.
        seed: the ``RandomState`` seed of the shuffle.
        vit_cap: the ViT cap ``Q_v``.
        token_cap: the token cap ``Q_t``.
        keep_tail: close the last open group even when the last shuffled sample was skipped.
            # NOTE: the official loop appends the open group only at the last position of the
            # shuffle, so when that sample is oversized the final group is silently dropped (its
            # samples are lost). ``keep_tail=True`` (the default) keeps it; ``False`` is the
            # official behaviour, kept for the equivalence test.
    """
    order = np.arange(len(ids))
    np.random.RandomState(seed).shuffle(order)
    perm = ids[order].tolist()
    v_all, t_all = vit.tolist(), tok.tolist()
    groups: list[np.ndarray] = []
    cur: list[int] = []
    sv = st = 0
    last = len(perm) - 1
    for pos, s in enumerate(perm):
        v, t = v_all[s], t_all[s]
        if v > vit_cap or t > token_cap:
            continue
        sv += v
        st += t
        if sv > vit_cap or st > token_cap:
            groups.append(np.asarray(cur, dtype=np.int64))
            cur, sv, st = [s], v, t
        else:
            cur.append(s)
        if pos == last and cur:
            groups.append(np.asarray(cur, dtype=np.int64))
            cur = []
    if keep_tail and cur:
        groups.append(np.asarray(cur, dtype=np.int64))
    return groups


def isf(vit: np.ndarray, tok: np.ndarray, vit_cap: int, token_cap: int, rounds: int = 50, seed: int = 1024,
        vit_floor: int | None = None, token_floor: int | None = None, keep_tail: bool = True) -> ISFResult:
    """Iterative sampling and filtering (the official ``iter_random_groups``).

    Args:
        vit: ``vit_num`` per sample.
        tok: ``token_num`` per sample.
        vit_cap: ViT cap ``Q_v`` (tiles per micro-batch).
        token_cap: token cap ``Q_t``.
        rounds: the official ``iter_time``: one pack plus up to ``rounds − 1`` filter-and-re-pack
            rounds (1 = plain random packing).
        seed: seed of the first shuffle; re-pack ``i`` uses ``seed + i``.
        vit_floor: a group with exactly this many tiles is full (default ``vit_cap``).
        token_floor: a group with at least this many tokens is full (default ``token_cap − 128``).
        keep_tail: see :func:`random_pack`.
    """
    vit = np.asarray(vit, dtype=np.int64)
    tok = np.asarray(tok, dtype=np.int64)
    if vit.shape != tok.shape or vit.ndim != 1:
        raise ValueError("vit and tok must be 1-D arrays of the same length")
    if rounds < 1:
        raise ValueError(f"rounds must be >= 1, got {rounds}")
    vit_floor = vit_cap if vit_floor is None else vit_floor
    token_floor = token_cap - TOKEN_SLACK if token_floor is None else token_floor
    ids = np.arange(len(vit), dtype=np.int64)
    skipped = ids[(vit > vit_cap) | (tok > token_cap)]
    groups = random_pack(ids, vit, tok, seed, vit_cap, token_cap, keep_tail)
    out: list[np.ndarray] = []
    kept: list[int] = []
    if rounds > 1:
        for i in range(rounds - 1):
            pending: list[np.ndarray] = []
            n_kept = 0
            for g in groups:
                if int(vit[g].sum()) == vit_floor or int(tok[g].sum()) >= token_floor:
                    out.append(g)
                    n_kept += 1
                else:
                    pending.append(g)
            kept.append(n_kept)
            pool = np.concatenate(pending) if pending else np.zeros(0, dtype=np.int64)
            groups = random_pack(pool, vit, tok, seed + i, vit_cap, token_cap, keep_tail)
            if not pending:
                break
    # After the last round the official code re-packs the pool with the last seed, which gives the
    # same groups as the re-pack just made: append them.
    out.extend(groups)
    return ISFResult(groups=out, skipped=skipped, kept_per_round=kept,
                     caps=(int(vit_cap), int(token_cap), int(vit_floor), int(token_floor)))


def group_sums(result_groups: list[np.ndarray], vit: np.ndarray, tok: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-group ViT tiles and tokens (what one packed micro-batch costs)."""
    gv = np.array([int(vit[g].sum()) for g in result_groups], dtype=np.int64)
    gt = np.array([int(tok[g].sum()) for g in result_groups], dtype=np.int64)
    return gv, gt
