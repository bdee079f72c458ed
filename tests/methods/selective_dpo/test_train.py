"""Selective DPO wiring: TRL agreement, the training order, the reference runs, data and loader."""

from __future__ import annotations

import copy
import json

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from lmforge.common.errors import UserError
from lmforge.data.preferences import HARD_KINDS, load_preferences, max_digit_pairs, max_digit_sft, write_preferences
from lmforge.methods.selective_dpo.config import SelectiveDPOConfig
from lmforge.methods.selective_dpo.core import dpo_loss, half_split
from lmforge.methods.selective_dpo.toy import toy_tokenizer
from lmforge.methods.selective_dpo.train import (EncodedPairs, compute_difficulty, dpo_train, encode_preferences,
                                                 pair_logps, selective_dpo)


@pytest.fixture(scope="module")
def tok():
    return toy_tokenizer()


def _tiny(tok, seed: int) -> LlamaForCausalLM:
    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=2, num_key_value_heads=2, max_position_embeddings=64,
                      bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id)
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg).eval()


def test_loss_matches_trl_dpotrainer_on_the_same_pairs(tok, tmp_path):
    """A real trl.DPOTrainer (sequential sampler, CPU) computes the same batch loss as
    core.dpo_loss on lmforge's summed completion log-probs, with a reference that differs."""
    from datasets import Dataset
    from trl import DPOConfig, DPOTrainer

    policy, ref = _tiny(tok, 0), _tiny(tok, 1)
    recs = max_digit_pairs(6, 3)
    ds = Dataset.from_list([{k: r[k] for k in ("prompt", "chosen", "rejected")} for r in recs])
    args = DPOConfig(output_dir=str(tmp_path), beta=0.5, per_device_train_batch_size=6, use_cpu=True, bf16=False,
                     train_sampling_strategy="sequential", report_to=[], max_steps=1, disable_tqdm=True)
    trainer = DPOTrainer(model=policy, ref_model=ref, args=args, train_dataset=ds, processing_class=tok)
    batch = next(iter(trainer.get_train_dataloader()))
    with torch.no_grad():
        trl_loss = float(trainer.compute_loss(trainer.model, batch))
    pairs = encode_preferences(tok, recs)
    # Same token ids and scored positions as TRL's tokenization (prompt, completion, EOS), chosen rows first.
    for row, (ids, flags) in enumerate(pairs.chosen + pairs.rejected):
        assert batch["input_ids"][row, : len(ids)].tolist() == ids
        assert batch["completion_mask"][row, : len(ids)].bool().tolist() == flags
        assert batch["completion_mask"][row, len(ids):].sum() == 0
    pc, pr = pair_logps(policy, pairs, tok.pad_token_id)
    rc, rr = pair_logps(ref, pairs, tok.pad_token_id)
    ours = float(dpo_loss(pc, pr, rc, rr, 0.5)[0].mean())
    assert abs(trl_loss - np.log(2)) > 1e-3  # the check is not the trivial policy == reference case
    assert ours == pytest.approx(trl_loss, abs=1e-5)


class _Spy(EncodedPairs):
    """EncodedPairs that records every training batch's indices."""

    seen: list[list[int]]

    def subset(self, idx):
        self.seen.append(list(idx))
        return super().subset(idx)


def test_dpo_train_consumes_the_given_order_sequentially(tok):
    recs = max_digit_pairs(23, 0)
    enc = encode_preferences(tok, recs)
    spy = _Spy(enc.chosen, enc.rejected)
    spy.seen = []
    model = _tiny(tok, 0)
    ref = pair_logps(model, enc, tok.pad_token_id)
    order = list(np.random.default_rng(0).permutation(23))
    dpo_train(model, spy, *ref, order, beta=0.1, lr=1e-3, batch_size=5, pad_id=tok.pad_token_id, epochs=2)
    assert [i for b in spy.seen for i in b] == order + order
    assert [len(b) for b in spy.seen] == [5, 5, 5, 5, 3] * 2


def test_selective_dpo_trains_on_the_easiest_tau_easy_to_hard(tok, monkeypatch):
    import lmforge.methods.selective_dpo.train as train_mod

    recs = max_digit_pairs(40, 1)
    scores = np.random.default_rng(2).random(40)
    seen = {}

    def spy_train(model, pairs, rc, rr, order, **kw):
        seen["order"] = list(order)
        return []

    monkeypatch.setattr(train_mod, "dpo_train", spy_train)
    model = _tiny(tok, 0)
    before = copy.deepcopy(model.state_dict())
    res = selective_dpo(model, tok, recs, SelectiveDPOConfig(tau=0.25, batch_size=4), scores=scores)
    assert seen["order"] == sorted(range(40), key=lambda i: scores[i])[:10] == res.order.tolist()
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())  # the reference is untouched


def test_reference_runs_hold_out_each_pair_once_per_seed(tok, monkeypatch):
    """Every loss recorded for a pair comes from a run that did not train on it, at the checkpoints."""
    import lmforge.methods.selective_dpo.train as train_mod

    recs = max_digit_pairs(30, 2)
    enc = encode_preferences(tok, recs)
    trained_on: list[set[int]] = []
    real = train_mod.dpo_train

    def spy_train(model, pairs, rc, rr, order, **kw):
        trained_on.append(set(order))
        return real(model, pairs, rc, rr, order, **kw)

    monkeypatch.setattr(train_mod, "dpo_train", spy_train)
    cfg = SelectiveDPOConfig(seeds=(41, 42), n_checkpoints=3, batch_size=5, ref_lr=1e-3, ref_lora_r=0, beta=0.1)
    model = _tiny(tok, 0)
    diff = compute_difficulty(model, enc, cfg, tok.pad_token_id)
    assert diff.losses.shape == (2, 3, 30) and not np.isnan(diff.losses).any()
    assert np.allclose(diff.scores, diff.losses.reshape(-1, 30).mean(0))
    for si, seed in enumerate((41, 42)):
        first, second = half_split(30, seed)
        assert trained_on[2 * si] == set(second.tolist()) and trained_on[2 * si + 1] == set(first.tolist())
        assert diff.steps[si] == [[1, 2, 3], [1, 2, 3]]  # 3 steps of 5 pairs per half of 15
    # Warm-up (ceil(0.1 * 3) = 1 step) gives step 1 a learning rate of 0 (transformers' schedule), so the
    # first checkpoint still scores the reference itself: log 2 for every pair; later ones moved.
    assert np.allclose(diff.losses[:, 0], np.log(2), atol=1e-6)
    assert not np.allclose(diff.losses[:, 2], np.log(2), atol=1e-4)


def test_reference_runs_with_lora_train_only_adapters(tok):
    recs = max_digit_pairs(20, 3)
    enc = encode_preferences(tok, recs)
    cfg = SelectiveDPOConfig(seeds=(41,), n_checkpoints=2, batch_size=5, ref_lr=1e-2, ref_lora_r=4, beta=0.5)
    model = _tiny(tok, 0)
    before = copy.deepcopy(model.state_dict())
    diff = compute_difficulty(model, enc, cfg, tok.pad_token_id)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert not np.allclose(diff.losses[0, 1], np.log(2))  # the adapters moved the held-out losses


def test_generator_plants_the_requested_hard_pairs():
    recs = max_digit_pairs(500, 7, hard_fraction=0.2, flipped_share=0.5)
    kinds = [r["kind"] for r in recs]
    assert kinds.count("flipped") == 50 and kinds.count("arbitrary") == 50
    for r in recs:
        digits = [int(x) for x in r["prompt"].split(":")[1].replace("->", "").split()]
        want = {"max": max, "min": min, "first": lambda d: d[0], "last": lambda d: d[-1]}[r["rule"]](digits)
        assert r["answer"] == f" {want}"
        assert int(r["chosen"]) in digits and int(r["rejected"]) in digits and r["chosen"] != r["rejected"]
        if r["kind"] == "clean":
            assert r["chosen"] == r["answer"]
        elif r["kind"] == "flipped":
            assert r["rejected"] == r["answer"]
        else:
            assert r["answer"] not in (r["chosen"], r["rejected"])
    assert max_digit_pairs(50, 7) == max_digit_pairs(50, 7) != max_digit_pairs(50, 8)
    # Near-miss label noise: the runner-up under the rule is preferred over the correct answer.
    runner = {"max": lambda d: sorted(d)[-2], "min": lambda d: sorted(d)[1], "first": lambda d: d[1],
              "last": lambda d: d[-2]}
    for r in max_digit_pairs(300, 3, flipped_share=1.0, flip="runner_up"):
        if r["kind"] == "flipped":
            digits = [int(x) for x in r["prompt"].split(":")[1].replace("->", "").split()]
            assert r["chosen"] == f" {runner[r['rule']](digits)}" and r["rejected"] == r["answer"]
    sft = max_digit_sft(400, 0, rules=("max",), p_correct=1.0)
    assert all(a == f" {max(int(x) for x in p.split(':')[1].replace('->', '').split())}" for p, a in sft)
    assert set(HARD_KINDS) == {"flipped", "arbitrary"}


def test_loader_reads_back_and_names_bad_lines(tmp_path):
    recs = max_digit_pairs(5, 0)
    path = write_preferences(tmp_path / "p.jsonl", recs)
    back = load_preferences(path)
    assert [{k: r[k] for k in ("prompt", "chosen", "rejected")} for r in back] == \
        [{k: r[k] for k in ("prompt", "chosen", "rejected")} for r in recs]
    assert [r["_line"] for r in back] == [1, 2, 3, 4, 5]
    # A record's own "line" field is the user's data: kept, and not taken for the file line.
    own = tmp_path / "own.jsonl"
    own.write_text("\n" + json.dumps({"prompt": "a", "chosen": "b", "rejected": "c", "line": 99}) + "\n")
    (rec,) = load_preferences(own)
    assert rec["line"] == 99 and rec["_line"] == 2
    # Written back, the file holds the user's fields only.
    again = write_preferences(tmp_path / "again.jsonl", [rec])
    assert json.loads(again.read_text()) == {"prompt": "a", "chosen": "b", "rejected": "c", "line": 99}
    bad = tmp_path / "bad.jsonl"
    lines = [json.dumps({"prompt": "a", "chosen": "b", "rejected": "c"}), "",
             json.dumps({"prompt": "a", "rejected": "c"})]
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(UserError, match=r"bad.jsonl:3: missing field 'chosen'"):
        load_preferences(bad)
    bad.write_text(json.dumps({"prompt": "a", "chosen": "b"}) + "\n")
    with pytest.raises(UserError, match=r":1: missing field 'rejected'"):
        load_preferences(bad)
    bad.write_text(json.dumps({"prompt": "a", "chosen": 3, "rejected": "c"}) + "\n")
    with pytest.raises(UserError, match=r":1: field 'chosen' must be a string"):
        load_preferences(bad)
    bad.write_text("[1, 2]\n")
    with pytest.raises(UserError, match=r":1: expected a JSON object"):
        load_preferences(bad)
    bad.write_text("{oops\n")
    with pytest.raises(UserError, match=r":1: not valid JSON"):
        load_preferences(bad)
    bad.write_text("\n")
    with pytest.raises(UserError, match="no preference pairs"):
        load_preferences(bad)
    with pytest.raises(UserError, match="not found"):
        load_preferences(tmp_path / "missing.jsonl")


def test_native_loop_and_trl_dpotrainer_leave_the_same_weights(tok, tmp_path):
    """Four steps over the same ordered pairs: lmforge's loop and trl.DPOTrainer (sequential sampler,
    AdamW, warm-up + cosine, clipping at 1.0, CPU fp32) end at the same parameters."""
    from lmforge.methods.selective_dpo.train import trl_sequential_dpo

    recs = max_digit_pairs(16, 5)
    cfg = SelectiveDPOConfig(beta=0.5, lr=1e-2, batch_size=4, warmup_ratio=0.25, seed=0)
    start = _tiny(tok, 0)
    native = copy.deepcopy(start)
    enc = encode_preferences(tok, recs)
    ref = pair_logps(start, enc, tok.pad_token_id)
    dpo_train(native, enc, *ref, list(range(16)), beta=cfg.beta, lr=cfg.lr, batch_size=4, pad_id=tok.pad_token_id,
              warmup_ratio=cfg.warmup_ratio, max_grad_norm=cfg.max_grad_norm)
    via_trl = copy.deepcopy(start)
    trainer = trl_sequential_dpo(via_trl, tok, recs, cfg, str(tmp_path), ref_model=copy.deepcopy(start))
    assert trainer.state.global_step == 4
    moved = max((p - q).abs().max().item() for p, q in zip(native.parameters(), start.parameters()))
    assert moved > 1e-3  # the runs trained
    for (name, p), q in zip(native.named_parameters(), trainer.model.parameters()):
        assert torch.allclose(p, q, atol=1e-5), name
