"""ISF against a transcription of the official loop, its invariants, the metrics against a naive loop."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader

from lmforge.common.errors import UserError
from lmforge.data.vlm_lengths import internvl_subset_sizes, load_lengths, sample_internvl_lengths
from lmforge.methods.omnibal.isf import group_sums, isf, random_pack
from lmforge.methods.omnibal.metrics import balance_metrics, megatron_random_batches
from lmforge.methods.omnibal.sampler import ISFBatchSampler
from lmforge.methods.omnibal.search import initial_caps, search_caps


# --- a transcription of the official dataset.py loop, on [idx, vit, tok] lists ---------------------
def _official_pack(items, seed, vit_max, llm_max):
    rng = np.random.RandomState(seed)
    index = list(range(len(items)))
    rng.shuffle(index)
    groups, sv, st, cur = [], 0, 0, []
    for pos, sid in enumerate(index):
        v, t = items[sid][1], items[sid][2]
        if v > vit_max or t > llm_max:
            continue
        sv += v
        st += t
        if sv > vit_max or st > llm_max:
            groups.append(cur)
            sv, st, cur = v, t, [items[sid]]
        else:
            cur.append(items[sid])
        if pos == len(items) - 1 and cur:
            groups.append(cur)
    return groups


def _official_iter(items, seed, vit_thresh, vit_max, llm_thresh, llm_max, iter_time):
    groups = _official_pack(items, seed, vit_max, llm_max)
    if iter_time == 1:
        return groups
    out = []
    for i in range(iter_time - 1):
        need = []
        for g in groups:
            if sum(x[1] for x in g) == vit_thresh or sum(x[2] for x in g) >= llm_thresh:
                out.append(g)
            else:
                need.extend(g)
        groups = _official_pack(need, seed + i, vit_max, llm_max)
    if need:
        out.extend(_official_pack(need, seed + i, vit_max, llm_max))
    return out


def _lengths(n, seed, oversize=0):
    rng = np.random.default_rng(seed)
    vit = rng.choice([1, 1, 2, 3, 5], size=n)
    tok = vit * 64 + rng.integers(10, 200, size=n)
    if oversize:
        idx = rng.choice(n, size=oversize, replace=False)
        tok[idx] = 10_000
    return vit.astype(np.int64), tok.astype(np.int64)


@pytest.mark.parametrize(("seed", "rounds", "oversize"), [(0, 1, 0), (1, 5, 0), (2, 50, 3), (3, 20, 0)])
def test_isf_equals_the_official_loop(seed, rounds, oversize):
    vit, tok = _lengths(700, seed, oversize)
    items = [[i, int(v), int(t)] for i, (v, t) in enumerate(zip(vit, tok, strict=True))]
    ref = _official_iter(items, 1024, 9, 9, 896 - 128, 896, rounds)
    got = isf(vit, tok, 9, 896, rounds=rounds, seed=1024, keep_tail=False)
    assert [[x[0] for x in g] for g in ref] == [g.tolist() for g in got.groups]


def test_isf_invariants_nothing_lost_or_duplicated_caps_respected():
    vit, tok = _lengths(3000, 7, oversize=11)
    res = isf(vit, tok, 9, 896, rounds=50)
    flat = np.concatenate(res.groups)
    assert len(flat) == len(set(flat.tolist()))  # no duplicate
    oversize = set(np.flatnonzero(tok > 896).tolist())
    assert set(res.skipped.tolist()) == oversize and len(oversize) == 11
    assert set(flat.tolist()) | oversize == set(range(3000))  # none lost
    gv, gt = group_sums(res.groups, vit, tok)
    assert gv.max() <= 9 and gt.max() <= 896
    # the filtering works: nearly all groups are full, a random pack is far from it
    full = (gv == 9) | (gt >= 896 - 128)
    rv, rt = group_sums(random_pack(np.arange(3000), vit, tok, 1024, 9, 896), vit, tok)
    assert full.mean() > 0.9 > ((rv == 9) | (rt >= 768)).mean() + 0.2


def test_official_tail_quirk_drops_the_last_group_and_keep_tail_does_not():
    vit, tok = _lengths(200, 3)
    # make the last shuffled sample oversized
    order = np.arange(200)
    np.random.RandomState(1024).shuffle(order)
    tok[order[-1]] = 5000
    lost = isf(vit, tok, 9, 896, rounds=1, keep_tail=False)
    kept = isf(vit, tok, 9, 896, rounds=1)
    n_lost = sum(map(len, lost.groups))
    assert sum(map(len, kept.groups)) == 199 > n_lost


def _naive_metrics(item_vit, item_tok, dp, mb):
    # the official get_pad_dist_ratio written as loops over ranks, micro-batches, and items
    pad = allt = 0
    llm_by_rank, vit_by_rank = [], []
    for rank in range(dp):
        bucket = (len(item_tok) // (mb * dp)) * mb
        g = torch.Generator()
        g.manual_seed(0)
        idx = [rank * bucket + x for x in torch.randperm(bucket, generator=g).tolist()]
        ls, vs = [], []
        for k in range(0, len(idx) - mb + 1, mb):
            batch = idx[k:k + mb]
            m = max(item_tok[i] for i in batch)
            pad += sum(m - item_tok[i] for i in batch)
            allt += m * mb
            ls.append(m)
            vs.append(sum(item_vit[i] for i in batch))
        llm_by_rank.append(ls)
        vit_by_rank.append(vs)
    lr, vr = [], []
    for k in range(len(llm_by_rank[0])):
        col = [llm_by_rank[r][k] for r in range(dp)]
        lr.append(sum(max(col) - c for c in col) / (max(col) * dp))
        col = [vit_by_rank[r][k] for r in range(dp)]
        vr.append(sum(max(col) - c for c in col) / max(max(col) * dp, 1))
    return pad / allt, sum(vr) / len(vr), sum(lr) / len(lr)


@pytest.mark.parametrize(("dp", "mb"), [(8, 4), (3, 1), (2, 5)])
def test_metrics_equal_a_naive_loop(dp, mb):
    vit, tok = _lengths(997, 11)
    m = balance_metrics(vit, tok, dp, mb)
    ref = _naive_metrics(vit.tolist(), tok.tolist(), dp, mb)
    assert (m.pad_ratio, m.dist_ratio_vit, m.dist_ratio_llm) == pytest.approx(ref, rel=1e-12)
    assert m.dist_ratio_llm > 0.01 and (mb == 1 or m.pad_ratio > 0.05)  # non-trivial data (mb 1 never pads)


def test_metrics_closed_forms():
    same = balance_metrics(np.full(64, 2), np.full(64, 100), 4, 4)
    assert (same.pad_ratio, same.dist_ratio_vit, same.dist_ratio_llm) == (0.0, 0.0, 0.0)
    # one micro-batch per rank, 2 ranks: lengths (100, 50) and (60, 60) -> pad 50/(2·100+2·60)
    m = balance_metrics(np.array([1, 0, 2, 2]), np.array([100, 50, 60, 60]), 2, 2)
    assert m.pad_ratio == pytest.approx(50 / 320)
    assert m.dist_ratio_llm == pytest.approx(40 / 200)
    assert m.dist_ratio_vit == pytest.approx(3 / 8)


def test_megatron_sampler_shards_are_disjoint_and_cover_the_buckets():
    shards = [megatron_random_batches(103, 4, r, 3) for r in range(3)]
    flat = np.concatenate([s.ravel() for s in shards])
    assert len(set(flat.tolist())) == len(flat) == 3 * (103 // 12) * 4
    assert set(shards[1].ravel().tolist()) == set(range(32, 64))


def test_cap_search_start_and_choice():
    vit, tok = _lengths(4000, 5)
    qv, qt, step = initial_caps(vit, tok)
    binned = np.ceil(tok / 256) * 256
    assert step == ((binned.mean() // vit.mean() + 1) // 16) * 16 and qt == 4096 and qv == 4096 // step
    res = search_caps(vit, tok, dp_size=4, micro_bs=4, rounds=5)
    hits = [t for t in res.trials if 4 <= t.mean_group <= 5]
    assert hits and min(hits, key=lambda t: t.metrics.total).vit_cap == res.vit_cap
    assert res.token_floor == res.token_cap - 128


def test_sampler_yields_every_group_once_across_ranks_and_works_in_a_dataloader():
    vit, tok = _lengths(900, 9)
    samplers = [ISFBatchSampler(vit, tok, 9, 896, rank=r, dp_size=3, rounds=10) for r in range(3)]
    seen = [tuple(b) for s in samplers for b in s]
    groups = {tuple(g.tolist()) for g in samplers[0].result.groups}
    assert len(seen) == len(set(seen)) == len(groups) - samplers[0].dropped
    assert set(seen) <= groups
    samplers[0].set_epoch(1)
    assert [tuple(b) for b in samplers[0]] != [tuple(b) for b in ISFBatchSampler(vit, tok, 9, 896, 0, 3, 10)]
    loader = DataLoader(list(zip(vit.tolist(), tok.tolist(), strict=True)), batch_sampler=samplers[1],
                        collate_fn=lambda items: (sum(v for v, _ in items), sum(t for _, t in items)))
    sums = list(loader)
    assert len(sums) == len(samplers[1]) and max(t for _, t in sums) <= 896 and max(v for v, _ in sums) <= 9


def test_fitted_generator_keeps_the_source_cells():
    sizes = internvl_subset_sizes()
    assert sum(sizes.values()) == 70_706
    vit, tok = sample_internvl_lengths(seed=1)
    assert len(vit) == 70_706
    assert np.bincount(vit).tolist() == [0, 6387, 0, 23977, 652, 39690]  # the source's vit_num counts
    # tokens per tile stay InternVL-like: every sample holds its 256 image tokens per tile or close
    assert np.median(tok / vit) > 256
    a, _ = sample_internvl_lengths(1000, seed=3)
    b, _ = sample_internvl_lengths(1000, seed=3)
    assert (a == b).all() and len(a) == 1000


@pytest.mark.parametrize(("records", "message"), [
    ([{"vit_num": 1}], "has no 'token_num'"),
    ([{"vit_num": -1, "token_num": 5}], "vit_num=-1"),
    ([{"vit_num": 1, "token_num": True}], "token_num=True"),
    ({"a": {"nothing": 1}}, "no 'token_lengths'"),
    ([], "no records"),
])
def test_load_lengths_rejects_bad_records(tmp_path, records, message):
    p = tmp_path / "lengths.json"
    p.write_text(json.dumps(records))
    with pytest.raises(UserError, match=message):
        load_lengths(p)


def test_load_lengths_reads_the_official_wrap_file(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x.json").write_text(json.dumps([{"vit_num": 2, "token_num": 600, "image_flags": 2}]))
    (tmp_path / "wrap.json").write_text(json.dumps({"x": {"token_lengths": "d/x.json"}}))
    vit, tok = load_lengths(tmp_path / "wrap.json")
    assert vit.tolist() == [2] and tok.tolist() == [600]


def test_sampler_from_result_equals_packing_again():
    vit, tok = _lengths(600, 4)
    a = ISFBatchSampler(vit, tok, 9, 896, rank=1, dp_size=2, rounds=7, seed=5)
    b = ISFBatchSampler.from_result(isf(vit, tok, 9, 896, rounds=7, seed=5), rank=1, dp_size=2)
    assert [list(x) for x in a] == [list(x) for x in b] and len(a) == len(b) > 0
