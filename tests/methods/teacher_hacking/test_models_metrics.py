"""Teacher/student LMs over the oracle's ids: their sequence log-probs are a proper distribution and match
a naive per-token loop; sampling matches them; the Monte-Carlo sequence KLs match exact enumeration; a
teacher trained on a small oracle sample is imperfect (golden > 0) yet better than an untrained model;
the distillation loop's bookkeeping."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch
from scipy import stats

from lmforge.methods.teacher_hacking.config import TeacherHackingConfig
from lmforge.methods.teacher_hacking.models import (
    TinyShape,
    build_lm,
    nll_loss,
    response_logits,
    sample,
    sequence_log_prob,
    train_mle,
)
from lmforge.methods.teacher_hacking.oracle import EOS, MarkovOracle
from lmforge.methods.teacher_hacking.train import EvalSet, distill, loss_mask, offline_dataset, token_loss

torch.set_num_threads(1)


def _tiny() -> tuple[MarkovOracle, torch.nn.Module]:
    orc = MarkovOracle(n_symbols=3, n_topics=1, branching=2, prompt_len=1, max_response_len=3, seed=0,
                       eos_prob=(0.2, 0.4))
    model = build_lm(TinyShape(16, 1, 2, 32), orc.vocab_size, 8, seed=0)
    with torch.no_grad():  # sharper than the 0.02 init so the test distribution is far from uniform
        for p in model.parameters():
            p.mul_(20.0)
    return orc, model


def test_model_sequence_probs_sum_to_one_and_match_naive_loop() -> None:
    orc, model = _tiny()
    every = orc.enumerate_responses(torch.tensor([2]))
    lp = sequence_log_prob(model, every)
    assert abs(float(torch.exp(lp).sum()) - 1.0) < 1e-5
    for i in (0, 3, 17, len(every) - 1):
        ids = every.prompts[i].tolist()
        total = 0.0
        for t, tok in enumerate(every.responses[i].tolist()):
            if t == orc.max_response_len:
                break  # forced EOS
            with torch.no_grad():
                logp = torch.log_softmax(model(torch.tensor([ids])).logits[0, -1], -1)
            total += float(logp[tok])
            if tok == EOS:
                break
            ids.append(tok)
        assert total == pytest.approx(float(lp[i]), abs=1e-4)


def test_model_samples_follow_model_log_probs() -> None:
    orc, model = _tiny()
    prompt = torch.tensor([[1]])
    n = 20_000
    batch = sample(model, prompt.repeat(n, 1), orc.max_response_len, torch.Generator().manual_seed(0))
    counts = collections.Counter(tuple(r) for r in batch.responses.tolist())
    every = orc.enumerate_responses(prompt[0])
    probs = torch.exp(sequence_log_prob(model, every)).numpy()
    observed = np.array([counts.get(tuple(r), 0) for r in every.responses.tolist()])
    assert observed.sum() == n
    big = probs * n >= 5  # chi-square on the cells with enough expected counts, the rest pooled
    obs = np.append(observed[big], observed[~big].sum())
    exp = np.append(probs[big] * n, probs[~big].sum() * n)
    _, p_value = stats.chisquare(obs, exp * obs.sum() / exp.sum())
    assert p_value > 1e-3


def test_mc_sequence_kls_match_exact_enumeration() -> None:
    orc, student = _tiny()
    teacher = build_lm(TinyShape(16, 1, 2, 32), orc.vocab_size, 8, seed=1)
    prompt = torch.tensor([3])
    every = orc.enumerate_responses(prompt)
    lo, ls, lt = orc.log_prob(every), sequence_log_prob(student, every), sequence_log_prob(teacher, every)
    po, pt = torch.exp(lo), torch.exp(lt)
    exact_golden = float((po * torch.where(po > 0, lo - ls, torch.zeros_like(lo))).sum())
    exact_proxy = float((pt * (lt - ls)).sum())
    n = 20_000
    gen = torch.Generator().manual_seed(2)
    ora = orc.sample(n, gen, prompt.repeat(n, 1))
    tea = sample(teacher, prompt.repeat(n, 1), orc.max_response_len, gen)
    ev = EvalSet(ora, orc.log_prob(ora), tea, sequence_log_prob(teacher, tea))
    assert ev.golden(student) == pytest.approx(exact_golden, rel=0.05)
    assert ev.proxy(student) == pytest.approx(exact_proxy, rel=0.05)


@pytest.fixture(scope="module")
def trained() -> dict:
    cfg = TeacherHackingConfig(n_symbols=8, n_topics=2, max_response_len=8, teacher_data=150, teacher_steps=60,
                               batch_size=16, eval_prompts=64)
    orc = MarkovOracle(n_symbols=cfg.n_symbols, n_topics=cfg.n_topics, max_response_len=cfg.max_response_len,
                       prompt_len=cfg.prompt_len, seed=0)
    gen = torch.Generator().manual_seed(0)
    teacher = build_lm(TinyShape(32, 1, 2, 64), orc.vocab_size, 16, seed=1)
    untrained = build_lm(TinyShape(32, 1, 2, 64), orc.vocab_size, 16, seed=1)
    losses = train_mle(teacher, orc.sample(cfg.teacher_data, gen), cfg.teacher_steps, 16, 3e-3, gen)
    prompts = orc.sample_prompts(64, gen).repeat_interleave(2, 0)
    ora = orc.sample(len(prompts), gen, prompts)
    return {"orc": orc, "teacher": teacher, "untrained": untrained, "losses": losses, "ora": ora, "gen": gen,
            "ora_lp": orc.log_prob(ora), "prompts": prompts}


def test_trained_teacher_is_imperfect_but_learned(trained: dict) -> None:
    golden_teacher = float((trained["ora_lp"] - sequence_log_prob(trained["teacher"], trained["ora"])).mean())
    golden_untrained = float((trained["ora_lp"] - sequence_log_prob(trained["untrained"], trained["ora"])).mean())
    assert trained["losses"][-1] < trained["losses"][0]
    assert golden_teacher > 0.05  # imperfect: KL(oracle‖teacher) > 0 beyond Monte-Carlo noise
    assert golden_teacher < 0.8 * golden_untrained  # yet much closer to the oracle than an untrained model


def test_token_losses_vanish_at_equality_and_offline_cache(trained: dict) -> None:
    orc, teacher = trained["orc"], trained["teacher"]
    data, logits = offline_dataset(teacher, trained["prompts"][:10], 3, orc.max_response_len, trained["gen"])
    assert len(data) == 30 and torch.equal(data.prompts[:3], trained["prompts"][:1].repeat(3, 1))
    with torch.no_grad():
        assert torch.allclose(logits, response_logits(teacher, data), atol=1e-5)
    mask = loss_mask(data)
    assert not mask[:, -1].any() and mask.sum() == data.mask[:, :-1].sum()
    for name in ("forward_kl", "reverse_kl", "jsd"):
        assert float(token_loss(name, logits, logits, mask)) == pytest.approx(0.0, abs=1e-6)
    with pytest.raises(ValueError):
        token_loss("nope", logits, logits, mask)
    with torch.no_grad():
        assert float(nll_loss(teacher, data)) > 0


@pytest.mark.parametrize("regime", ["offline", "online_teacher", "online_student"])
def test_distill_moves_student_toward_teacher(trained: dict, regime: str) -> None:
    orc, teacher = trained["orc"], trained["teacher"]
    gen = torch.Generator().manual_seed(5)
    tea = sample(teacher, trained["prompts"], orc.max_response_len, gen)
    ev = EvalSet(trained["ora"], trained["ora_lp"], tea, sequence_log_prob(teacher, tea))
    student = build_lm(TinyShape(16, 1, 2, 32), orc.vocab_size, 16, seed=2)
    p0, g0 = ev.proxy(student), ev.golden(student)
    curve = distill(student, teacher, orc, regime, trained["prompts"][:40], steps=30, batch_size=16, lr=3e-3,
                    eval_set=ev, generator=gen, gens_per_prompt=2, n_eval_points=5)
    assert curve.steps[0] == 0 and curve.steps[-1] == 30 and len(curve.train_loss) == 30
    assert curve.proxy[0] == pytest.approx(p0) and curve.golden[0] == pytest.approx(g0)
    assert curve.proxy[-1] < curve.proxy[0]  # distillation reduces KL(teacher‖student)
    assert curve.proxy[-1] == pytest.approx(ev.proxy(student))  # the last point is the returned student
    if regime == "offline":
        assert curve.info["dataset_size"] == 80


def test_config_checks() -> None:
    assert TeacherHackingConfig(n_prompts=100, gens_per_prompt=5).dataset_size == 500
    with pytest.raises(ValueError):
        TeacherHackingConfig(loss="tv")
    with pytest.raises(ValueError):
        TeacherHackingConfig(student_shape=TinyShape(128, 4, 4, 256))
    with pytest.raises(ValueError):
        TeacherHackingConfig(steps=10)


def test_student_is_sfted_on_the_teachers_oracle_sample_first(monkeypatch) -> None:
    """As the paper: one oracle dataset gives both initial SFT checkpoints. By default the student's
    SFT runs on the very sequences the teacher was trained on, for student_sft_steps steps, and leaves
    the student closer to the oracle than a random init; student_sft_steps=0 skips it, and
    student_sft_data > 0 draws a separate sample."""
    from lmforge.methods.teacher_hacking import harness

    calls: list[tuple[object, int]] = []
    real = harness.train_mle
    monkeypatch.setattr(harness, "train_mle", lambda m, data, steps, *a: calls.append((data, steps)) or real(m, data, steps, *a))
    small = dict(n_symbols=8, n_topics=2, max_response_len=8, teacher_data=120, teacher_steps=40, batch_size=16,
                 eval_prompts=32, eval_samples_per_prompt=2)
    sft = harness.build_setup(TeacherHackingConfig(student_sft_steps=30, **small))
    assert len(calls) == 2 and calls[1][0] is calls[0][0] and calls[1][1] == 30
    calls.clear()
    rand = harness.build_setup(TeacherHackingConfig(student_sft_steps=0, **small))
    assert len(calls) == 1
    assert sft.info["student0_golden"] < rand.info["student0_golden"]
    calls.clear()
    harness.build_setup(TeacherHackingConfig(student_sft_steps=30, student_sft_data=50, **small))
    assert calls[1][0] is not calls[0][0] and len(calls[1][0].prompts) == 50
