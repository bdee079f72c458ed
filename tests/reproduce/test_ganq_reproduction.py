"""``lmforge reproduce ganq --quick`` (agent-small): the table has every method at 4 and 3 bits beside the
paper's OPT-125M row, GANQ's layer error is below RTN's, and the verdict is the written condition."""

from __future__ import annotations

import math

from lmforge.reproduce.base import ReproduceOptions, get


def test_ganq_reproduction_quick(tmp_path):
    res = get("ganq").fn(ReproduceOptions(out_dir=tmp_path, quick=True, seed=0))
    m = res.measured
    for method in ("rtn", "gptq", "awq", "ganq"):
        for bits in (4, 3):
            assert math.isfinite(m[f"{method}{bits}_ppl"]) and m[f"{method}{bits}_kl"] >= 0
    # Robust at this size with the paper's procedure (K = 3 here): far below RTN's error (0.03 vs 0.09 at
    # 3 bits); against GPTQ's it is a tie at 3 bits, so that order is reported, not asserted.
    assert all(m[f"ganq{b}_rel_error"] < 0.7 * m[f"rtn{b}_rel_error"] for b in (3, 4))
    # Fewer bits, more damage, for every method.
    assert all(m[f"{x}3_kl"] > m[f"{x}4_kl"] for x in ("rtn", "gptq", "awq", "ganq"))
    rows = {r[0]: r for r in res.tables[0].rows}
    assert rows["GANQ-3"][-1] == 35.98 and rows["GPTQ-3"][-1] == 52.48 and rows["FP32"][-1] == 27.66
    # The gap fraction is recomputed here from the measured perplexities.
    gap = (m["gptq3_ppl"] - m["ganq3_ppl"]) / (m["gptq3_ppl"] - m["fp_ppl"])
    assert abs(gap - m["gap_closed_3bit"]) < 1e-9
    assert res.held == (gap >= 0.5)
    from pathlib import Path

    assert res.figures and all(Path(f.path).is_file() and Path(f.path).stat().st_size > 1000 for f in res.figures)


def test_real_run_evaluator_is_the_shared_perplexity_and_a_plain_kl():
    """The real-model run scores perplexity and KL in one pass: the perplexity must be
    lmforge.compression.perplexity_of_ids's, the KL the mean over positions of sum p (log p - log q)."""
    import copy

    import torch

    from lmforge.compression import perplexity_of_ids
    from lmforge.models import load
    from lmforge.reproduce.ganq import _evaluate

    model, _ = load("zoo:agent-small")
    ids = torch.randint(0, model.config.vocab_size, (300,), generator=torch.Generator().manual_seed(0))
    ppl, kl0, ref = _evaluate(model, ids, 64, 128, None)
    # the same float32 logits reduced in another order (log_softmax + gather vs cross_entropy): equal
    # mean NLLs to float32 rounding (~1e-7 per token), i.e. log-perplexities within 1e-5 (a random
    # model's perplexity here is ~1.6e6, so a relative 1e-6 on the perplexity itself is at the edge)
    assert abs(math.log(ppl) - math.log(perplexity_of_ids(model, ids, 64))) < 1e-5 and kl0 == 0.0 and len(ref) == 2
    other = copy.deepcopy(model)
    with torch.no_grad():
        other.model.layers[0].mlp.down_proj.weight.mul_(0.5)
    _, kl, _ = _evaluate(other, ids, 64, 128, ref)
    with torch.no_grad():
        logq = [torch.log_softmax(other(input_ids=ids[b : b + 64][None]).logits[0, :-1].float(), -1) for b in (0, 64)]
    naive = sum(float((p.exp() * (p - q)).sum()) for p, q in zip(ref, logq)) / sum(p.shape[0] for p in ref)
    assert kl > 0 and abs(kl - naive) < 1e-5 * naive
