"""DistiLLM-2 wiring: config checks, DPO-format data, batching, the training loop and LoRA."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from lmforge.common.errors import UserError
from lmforge.methods.distillm2 import losses as L
from lmforge.methods.distillm2 import train as T
from lmforge.methods.distillm2.config import DistillConfig
from lmforge.methods.distillm2.data import Pair, load_pairs, load_prompts, write_pairs

from .conftest import prompts

torch.set_num_threads(1)


@pytest.mark.parametrize("alpha", [0.0, -0.1, 1.5, float("nan")])
def test_config_rejects_alpha_outside_unit_interval(alpha: float) -> None:
    with pytest.raises(UserError, match="alpha must be in"):
        DistillConfig(alpha=alpha)


def test_config_defaults_and_other_checks() -> None:
    cfg = DistillConfig()
    # the released code's defaults
    assert (cfg.alpha, cfg.beta, cfg.gradual_beta, cfg.update_alpha) == (0.1, 0.5, False, False)
    assert (cfg.temperature, cfg.top_p, cfg.lr, cfg.lora_r, cfg.lora_alpha) == (0.8, 0.95, 5e-5, 16, 128)
    assert DistillConfig(alpha=1.0).alpha == 1.0
    for bad in ({"loss": "dpo"}, {"beta": 1.2}, {"epochs": 0}, {"baseline_data": "x"}, {"top_p": 0.0}):
        with pytest.raises(UserError):
            DistillConfig(**bad)


def _pairs(tok) -> list[Pair]:
    from lmforge.common.generation import encode_prompt

    p = ["a b", "c d e f"]
    ch = [" c d e", " f"]
    rj = [" h", " g a b c d"]
    ids = lambda s: tok(s, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]  # noqa: E731
    return [Pair(p[i], ch[i], rj[i], encode_prompt(tok, p[i]), ids(ch[i]), ids(rj[i])) for i in range(2)]


def test_collate_marks_exactly_the_response_targets(tiny) -> None:
    _, _, tok = tiny
    pairs = _pairs(tok)
    batch = T.collate_pairs(pairs, tok.pad_token_id)
    assert batch["input_ids"].shape[0] == 4  # chosen rows first, then rejected rows
    logits = torch.zeros(4, batch["input_ids"].shape[1], 5)
    _, mask = T.shifted(logits, batch)
    tgt = batch["input_ids"][:, 1:]
    rows = [p.chosen_ids for p in pairs] + [p.rejected_ids for p in pairs]
    for r, resp in enumerate(rows):
        assert tgt[r][mask[r]].tolist() == resp


def test_batch_loss_is_independent_of_padding(tiny) -> None:
    """The padded, batched distillm2 loss equals the loss from each sequence run alone, unpadded."""
    teacher, student, tok = tiny
    pairs = _pairs(tok)
    batch = T.collate_pairs(pairs, tok.pad_token_id)
    with torch.no_grad():
        s = student(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
        t = teacher(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    cfg = DistillConfig(alpha=0.1)
    got = float(T.batch_loss(cfg, s, t, batch, beta=0.5, alpha=(0.1, 0.1)))

    def alone(ids: list[int], n_prompt: int, fn) -> float:
        x = torch.tensor([ids])
        with torch.no_grad():
            ls, lt = student(input_ids=x).logits[:, :-1], teacher(input_ids=x).logits[:, :-1]
        m = torch.zeros(1, len(ids) - 1, dtype=torch.bool)
        m[0, n_prompt - 1:] = True
        return float(fn(ls, lt, 0.1, m))

    skl = sum(alone(p.prompt_ids + p.chosen_ids, len(p.prompt_ids), L.skew_kl) for p in pairs) / 2
    srkl = sum(alone(p.prompt_ids + p.rejected_ids, len(p.prompt_ids), L.skew_reverse_kl) for p in pairs) / 2
    assert got == pytest.approx(0.5 * skl + 0.5 * srkl, rel=1e-5)

    # Baselines: forward KL with baseline_data="teacher" uses only the chosen rows.
    kl_t = float(T.batch_loss(DistillConfig(loss="kl", baseline_data="teacher"), s, t, batch, beta=0.5, alpha=(0.1, 0.1)))
    kl_alone = sum(alone(p.prompt_ids + p.chosen_ids, len(p.prompt_ids), lambda a, b, _, m: L.forward_kl(a, b, m))
                   for p in pairs) / 2
    assert kl_t == pytest.approx(kl_alone, rel=1e-5)


def test_distill_regenerates_student_responses_each_epoch(tiny, monkeypatch) -> None:
    teacher, student, tok = tiny
    calls: list[str] = []
    real = T.sample_responses

    def spy(model, *a, **k):
        calls.append("teacher" if model is teacher else "student")
        return real(model, *a, **k)

    monkeypatch.setattr(T, "sample_responses", spy)
    before = copy.deepcopy(student.state_dict())
    t_before = copy.deepcopy(teacher.state_dict())
    cfg = DistillConfig(epochs=3, batch_size=4, max_new_tokens=6, lr=1e-3, gen_batch_size=8)
    res = T.distill(teacher, student, tok, prompts(8), cfg)
    assert calls == ["teacher", "student", "student", "student"]
    assert len(res.history) == 3 * 2 and [h["epoch"] for h in res.history] == [0, 0, 1, 1, 2, 2]
    # the caller's student and the teacher are untouched; the returned student moved
    assert all(torch.equal(before[k], v) for k, v in student.state_dict().items())
    assert all(torch.equal(t_before[k], v) for k, v in teacher.state_dict().items())
    assert any(not torch.equal(before[k], v) for k, v in res.student.state_dict().items())
    # the pairs keep the teacher responses and hold the last epoch's student responses
    assert len(res.pairs) == 8 and all(p.chosen_ids and p.rejected_ids for p in res.pairs)

    calls.clear()
    T.distill(teacher, student, tok, prompts(8), DistillConfig(epochs=2, batch_size=8, max_new_tokens=4,
                                                               regenerate_student=False))
    assert calls == ["teacher", "student"]


def test_distill_lowers_kl_to_teacher(tiny) -> None:
    """Training on the distillm2 loss moves the student towards the teacher on held-out teacher samples."""
    teacher, student, tok = tiny
    from lmforge.methods.distillm2.data import build_pairs, sample_responses

    held = prompts(16, seed=7)
    t_out = sample_responses(teacher, tok, held, max_new_tokens=8, temperature=1.0, top_p=1.0, seed=3)
    ev = T.collate_pairs(build_pairs(tok, held, t_out, t_out), tok.pad_token_id)

    def kl(model) -> float:
        with torch.no_grad():
            s = model(input_ids=ev["input_ids"], attention_mask=ev["attention_mask"]).logits
            t = teacher(input_ids=ev["input_ids"], attention_mask=ev["attention_mask"]).logits
        s, m = T.shifted(s, ev)
        return float(L.forward_kl(s, T.shifted(t, ev)[0], m))

    cfg = DistillConfig(epochs=2, batch_size=8, max_new_tokens=8, lr=5e-3, warmup_ratio=0.0, seed=1)
    res = T.distill(teacher, student, tok, prompts(32, seed=2), cfg)
    assert kl(res.student) < 0.9 * kl(student)


def test_schedules_recorded_in_history(tiny) -> None:
    teacher, student, tok = tiny
    cfg = DistillConfig(epochs=2, batch_size=4, max_new_tokens=4, gradual_beta=True, update_alpha=True, alpha=0.2)
    res = T.distill(teacher, student, tok, prompts(8), cfg)
    total = len(res.history)
    for h in res.history:
        assert h["beta"] == pytest.approx(L.beta_schedule(int(h["step"]), total, True))
        if h["epoch"] == 0:  # adaptive alpha is off in the first epoch
            assert h["alpha_skl"] == 0.2 and h["alpha_srkl"] == 0.2
        else:
            assert 0.01 - 1e-6 <= h["alpha_skl"] <= 0.2 + 1e-6 and 0.01 - 1e-6 <= h["alpha_srkl"] <= 0.2 + 1e-6
    assert res.history[-1]["beta"] == pytest.approx(0.75)


def test_lora_trains_adapters_only(tiny) -> None:
    teacher, student, tok = tiny
    cfg = DistillConfig(epochs=1, batch_size=4, max_new_tokens=4, lr=1e-2, lora=True, lora_r=4, lora_alpha=8)
    res = T.distill(teacher, student, tok, prompts(8), cfg)
    trainable = [n for n, p in res.student.named_parameters() if p.requires_grad]
    assert trainable and all("lora_" in n for n in trainable)
    merged = res.student.merge_and_unload()
    base = dict(student.named_parameters())
    changed = [n for n, p in merged.named_parameters() if not torch.equal(p, base[n])]
    # only linear projections change (LoRA on all linear layers); embeddings and norms do not
    assert changed and all(n.endswith("proj.weight") for n in changed)


def test_pairs_roundtrip_and_loader_errors(tiny, tmp_path: Path) -> None:
    _, _, tok = tiny
    pairs = _pairs(tok)
    path = write_pairs(tmp_path / "pairs.jsonl", pairs)
    back = load_pairs(path, tok)
    assert [p.to_json() for p in back] == [p.to_json() for p in pairs]
    # text-only DPO lines are tokenized: prompt with BOS, responses + EOS
    plain = tmp_path / "plain.jsonl"
    plain.write_text("\n".join(json.dumps({"prompt": p.prompt, "chosen": p.chosen, "rejected": p.rejected})
                               for p in pairs) + "\n")
    assert [p.to_json() for p in load_pairs(plain, tok)] == [p.to_json() for p in pairs]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": "a", "chosen": "b", "rejected": "c"}) + "\n"
                   + json.dumps({"prompt": "a", "chosen": "b"}) + "\n")
    with pytest.raises(UserError) as exc:
        load_pairs(bad, tok)
    assert str(exc.value) == f"{bad}:2: missing field 'rejected'" and "\n" not in str(exc.value)
    bad.write_text('{"prompt": "a", "chosen": 3, "rejected": "c"}\n')
    with pytest.raises(UserError, match=":1: field 'chosen' must be a string"):
        load_pairs(bad, tok)
    for wrong in (len(tok), -5):  # ids the embedding has no row for
        bad.write_text(json.dumps({"prompt": "a", "chosen": "b", "rejected": "c", "chosen_ids": [1, wrong]}) + "\n")
        with pytest.raises(UserError, match=f":1: field 'chosen_ids' holds token id {wrong}, outside"):
            load_pairs(bad, tok)


def test_load_prompts(tmp_path: Path) -> None:
    (tmp_path / "p.txt").write_text("a b\n\n c d\n")
    assert load_prompts(tmp_path / "p.txt") == ["a b", " c d"]
    (tmp_path / "p.jsonl").write_text('{"prompt": "x"}\n{"text": "y"}\n')
    with pytest.raises(UserError, match="p.jsonl:2: missing field 'prompt'"):
        load_prompts(tmp_path / "p.jsonl")


def test_bf16_autocast_first_step_loss_matches_float32(tiny) -> None:
    """bf16=True runs the forwards under autocast: the first step's loss (same data, same start) is the
    float32 one up to bf16 rounding, and not bit-identical (the flag does something)."""
    teacher, student, tok = tiny
    losses = {}
    for flag in (False, True):
        cfg = DistillConfig(epochs=1, batch_size=4, max_new_tokens=4, lr=1e-3, seed=3, bf16=flag)
        res = T.distill(teacher, student, tok, prompts(4), cfg)
        losses[flag] = res.history[0]["loss"]
    assert losses[True] != losses[False]
    assert losses[True] == pytest.approx(losses[False], rel=0.05)
