"""Review of the response-position and teacher-cache paths: the private cache :func:`distill` makes
when the caller passes none stays within a memory bound (``lmforge align distill`` kept O(batch)
teacher logits before the cache existed), a head the pre-hook does not reach never passes full
logits off as gathered ones, and a cache never serves a teacher it was not bound to."""

from __future__ import annotations

import copy
import gc
import weakref
from types import SimpleNamespace

import pytest
import torch

from lmforge.methods.distillm2 import train as T
from lmforge.methods.distillm2.config import DistillConfig
from lmforge.methods.distillm2.data import sample_responses

from .conftest import prompts

torch.set_num_threads(1)


def _recording_cache(monkeypatch) -> list[T.TeacherCache]:
    made: list[T.TeacherCache] = []

    class Recording(T.TeacherCache):
        def __init__(self, *args, **kwargs) -> None:
            super().__init__(*args, **kwargs)
            made.append(self)

    monkeypatch.setattr(T, "TeacherCache", Recording)
    return made


def _stored_bytes(cache: T.TeacherCache) -> int:
    return sum(e.numel() * e.element_size() for e in cache.entries.values())


def test_private_cache_keeps_nothing_when_no_later_epoch_reads_it(tiny, monkeypatch) -> None:
    teacher, student, tok = tiny
    made = _recording_cache(monkeypatch)
    cfg = DistillConfig(epochs=1, batch_size=4, max_new_tokens=5, gen_batch_size=8)
    T.distill(teacher, student, tok, prompts(8, seed=2), cfg)
    assert len(made) == 1 and made[0].misses == 16
    assert made[0].entries == {}  # one epoch: a stored row would never be read


def test_private_cache_is_bounded_and_gives_the_uncached_run(tiny, monkeypatch) -> None:
    teacher, student, tok = tiny
    ps = prompts(8, seed=3)
    t_out = sample_responses(teacher, tok, ps, max_new_tokens=6, seed=1)
    cfg = DistillConfig(loss="distillm2", epochs=3, batch_size=4, max_new_tokens=6, lr=1e-3, gen_batch_size=8,
                        seed=7)
    made = _recording_cache(monkeypatch)

    def run(limit: int) -> tuple[list[float], T.TeacherCache]:
        monkeypatch.setattr(T, "PRIVATE_CACHE_BYTES", limit, raising=False)
        res = T.distill(teacher, student, tok, ps, cfg, teacher_responses=t_out)
        return [h["loss"] for h in res.history], made[-1]

    full_hist, full = run(1 << 30)
    total = _stored_bytes(full)
    assert len(full.entries) == 8 and full.hits == 16  # epochs 2 and 3 read the teacher's rows
    limit = total // 2
    half_hist, half = run(limit)
    assert 0 < len(half.entries) < 8
    assert _stored_bytes(half) <= limit
    none_hist, none = run(0)
    assert none.entries == {} and none.hits == 0
    # a bound changes what is recomputed, never the values
    assert half_hist == pytest.approx(none_hist, rel=1e-5)
    assert full_hist == pytest.approx(none_hist, rel=1e-5)


class _Unhooked(torch.nn.Module):
    """A model whose logits are ``h @ head.weight.T``: the module ``get_output_embeddings`` returns is
    never called, so a pre-hook on it never fires."""

    def __init__(self, base) -> None:  # noqa: ANN001
        super().__init__()
        self.base = base

    def get_output_embeddings(self):  # noqa: ANN201
        return self.base.lm_head

    def forward(self, input_ids, attention_mask):  # noqa: ANN001, ANN201
        h = self.base.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        return SimpleNamespace(logits=h @ self.base.lm_head.weight.T)


def test_response_logits_gather_when_the_hook_does_not_fire_even_if_widths_agree(tiny) -> None:
    teacher, _, _ = tiny
    model = _Unhooked(teacher)
    ids = torch.tensor([[5, 6, 7, 8], [9, 10, 11, 12]])
    att = torch.ones_like(ids)
    index = torch.tensor([[1, 2, 2, 2], [0, 1, 2, 2]])  # as wide as the sequence
    with torch.no_grad():
        got = T.response_logits(model, ids, att, index)
        full = model(input_ids=ids, attention_mask=att).logits
    torch.testing.assert_close(got, full.gather(1, index.unsqueeze(-1).expand(-1, -1, full.shape[-1])))


def test_teacher_sub_batch_with_an_unhooked_head_gives_the_right_rows(tiny) -> None:
    """The cache recomputes only the rows it lacks, cut to their own width: that width can equal the
    whole batch's response width, which must not make the un-hooked full logits look gathered."""
    teacher, _, _ = tiny
    model = _Unhooked(teacher)
    # row 0: prompt 2 + response 9 (11 tokens, cached); row 1: prompt 5 + response 4 (9 tokens, computed)
    rows = [([3, 4], list(range(10, 19))), ([3, 4, 5, 6, 7], [20, 21, 22, 23])]
    width = max(len(a) + len(b) for a, b in rows)
    ids = torch.zeros(2, width, dtype=torch.long)
    att = torch.zeros_like(ids)
    comp = torch.zeros_like(ids)
    for i, (a, b) in enumerate(rows):
        ids[i, :len(a) + len(b)] = torch.tensor(a + b)
        att[i, :len(a) + len(b)] = 1
        comp[i, len(a):len(a) + len(b)] = 1
    batch = {"input_ids": ids, "attention_mask": att, "completion_mask": comp}
    index, mask, _ = T.response_index(batch)
    assert index.shape[1] == 9 == int(att[1].sum())  # the computed row's width equals R
    with torch.no_grad():
        full = model(input_ids=ids, attention_mask=att).logits
    want = full.gather(1, index.unsqueeze(-1).expand(-1, -1, full.shape[-1]))
    cache = T.TeacherCache()
    keys = [("k", 0), ("k", 1)]
    cache.entries[keys[0]] = want[0, :9].clone()
    got = T._teacher_logits(model, batch, index, mask, keys, [False, False], cache, False)
    assert (cache.hits, cache.misses) == (1, 1)
    torch.testing.assert_close(got[1, :4], want[1, :4], rtol=1e-5, atol=1e-5)


def test_teacher_cache_neither_keeps_its_teacher_alive_nor_serves_a_successor(tiny) -> None:
    teacher, _, _ = tiny
    cache = T.TeacherCache()
    first = copy.deepcopy(teacher)
    cache.bind(first)
    ref = weakref.ref(first)
    del first
    gc.collect()
    assert ref() is None
    # a new teacher (possibly at the dead one's address) gets no rows computed from the old one
    with pytest.raises(ValueError, match="another teacher"):
        cache.bind(copy.deepcopy(teacher))


class _TwoHeads(torch.nn.Module):
    """Calls its head twice and mixes the outputs across positions: gathered head inputs would mix the
    wrong positions, so two hooked calls must fall back to the plain logits."""

    def __init__(self, base) -> None:  # noqa: ANN001
        super().__init__()
        self.base = base

    def get_output_embeddings(self):  # noqa: ANN201
        return self.base.lm_head

    def forward(self, input_ids, attention_mask):  # noqa: ANN001, ANN201
        h = self.base.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        a = self.base.lm_head(h)
        b = self.base.lm_head(h)  # e.g. an auxiliary head
        return SimpleNamespace(logits=a + torch.roll(b, 1, dims=1))


def test_response_logits_with_a_head_called_twice_gathers_plain_logits(tiny) -> None:
    teacher, _, _ = tiny
    model = _TwoHeads(teacher)
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    att = torch.ones_like(ids)
    index = torch.tensor([[2, 3, 4]])
    with torch.no_grad():
        got = T.response_logits(model, ids, att, index)
        full = model(input_ids=ids, attention_mask=att).logits
    torch.testing.assert_close(got, full.gather(1, index.unsqueeze(-1).expand(-1, -1, full.shape[-1])))
