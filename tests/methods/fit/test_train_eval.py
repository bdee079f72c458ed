"""FIT training and evaluation against independent computations (TRL's eval loss, a naive loop)."""

from __future__ import annotations


import pytest
import torch
import torch.nn.functional as F

from lmforge.data import spurious as sp
from lmforge.methods.fit.config import FITConfig
from lmforge.methods.fit.data import build_fit_data
from lmforge.methods.fit.evaluate import focus_accuracy, label_logprobs, predict
from lmforge.methods.fit.train import train_sft, validation_loss
from lmforge.common.errors import UserError
from tests.methods.fit.conftest import SPEC, TASK, tiny_model

torch.set_num_threads(1)


def _naive_logprob(model, tok, prompt: str, cont: str) -> float:
    # Full sequence through the model, log-softmax at every position, sum over the continuation.
    p = tok(prompt)["input_ids"]
    c = tok(cont, add_special_tokens=False)["input_ids"]
    ids = torch.tensor([p + c])
    with torch.no_grad():
        logp = F.log_softmax(model(input_ids=ids).logits[0].double(), -1)
    return float(sum(logp[len(p) - 1 + i, t] for i, t in enumerate(c)))


def test_label_scores_and_predictions_match_a_naive_loop(fit_tok):
    model = tiny_model(fit_tok, seed=3).eval()
    ex = build_fit_data(sp.make_split(1, 6, 0.5), TASK, SPEC, mode="all")[:12]
    rows = label_logprobs(model, fit_tok, [e["prompt"] for e in ex], sp.LABELS, batch_size=5)
    for e, row in zip(ex, rows):
        for lab, got in zip(sp.LABELS, row):
            assert got == pytest.approx(_naive_logprob(model, fit_tok, e["prompt"], " " + lab), abs=1e-4)
    preds = predict(model, fit_tok, [e["prompt"] for e in ex], sp.LABELS)
    assert preds == [sp.LABELS[0] if r[0] >= r[1] else sp.LABELS[1] for r in rows]


def test_multi_token_labels_take_the_pair_path_and_match_the_naive_loop(fit_tok):
    # Labels of one token are scored from one forward per prompt (the test above); a label set
    # with a multi-token label goes through score_continuations pair by pair.
    model = tiny_model(fit_tok, seed=4).eval()
    labels = ["positive", "not good"]
    assert len(fit_tok(" not good", add_special_tokens=False)["input_ids"]) > 1
    ex = build_fit_data(sp.make_split(7, 4, 0.5), TASK, SPEC, mode="all")[:6]
    rows = label_logprobs(model, fit_tok, [e["prompt"] for e in ex], labels, batch_size=4)
    for e, row in zip(ex, rows):
        for lab, got in zip(labels, row):
            assert got == pytest.approx(_naive_logprob(model, fit_tok, e["prompt"], " " + lab), abs=1e-4)


def test_focus_accuracy_counts():
    ex = [{"focus_type": "focus_c", "focus_label": "a", "label": "a", "spurious_label": "b"},
          {"focus_type": "focus_c", "focus_label": "a", "label": "a", "spurious_label": "a"},
          {"focus_type": "focus_s", "focus_label": "b", "label": "a", "spurious_label": "b"}]
    r = focus_accuracy(ex, ["b", "a", "b"])
    assert r["focus_accuracy"] == pytest.approx(2 / 3)
    assert r["by_type"]["focus_c"] == {"focus_accuracy": 0.5, "agrees_with_label": 0.5, "agrees_with_spurious": 1.0,
                                       "n": 2}
    assert r["by_type"]["focus_s"]["focus_accuracy"] == 1.0
    with pytest.raises(UserError):
        focus_accuracy(ex, ["a"])


def test_validation_loss_equals_trl_eval_loss(fit_tok):
    # TRL's completion-only eval loss (prompt masked, EOS appended) vs our scoring of the same pairs.
    import datasets
    from trl import SFTConfig, SFTTrainer

    model = tiny_model(fit_tok, seed=1)
    ex = build_fit_data(sp.make_split(2, 24, 0.9), TASK, SPEC, seed=2)
    mine = validation_loss(model, fit_tok, ex, batch_size=7)
    args = SFTConfig(output_dir="/tmp/unused-fit-eval", per_device_eval_batch_size=8, report_to=[], use_cpu=True,
                     completion_only_loss=True, disable_tqdm=True, save_strategy="no")
    ds = datasets.Dataset.from_list([{"prompt": e["prompt"], "completion": e["completion"]} for e in ex])
    tr = SFTTrainer(model=model, args=args, processing_class=fit_tok, train_dataset=ds, eval_dataset=ds)
    # TRL averages over tokens across the whole eval set when batches carry num_items_in_batch; with
    # one batch per call the two definitions coincide, so evaluate in a single batch.
    tr.args.per_device_eval_batch_size = len(ex)
    theirs = tr.evaluate()["eval_loss"]
    assert mine == pytest.approx(theirs, rel=1e-4)


def test_training_lowers_loss_and_early_stopping_keeps_the_best(fit_tok):
    model = tiny_model(fit_tok, seed=0)
    train = build_fit_data(sp.make_split(3, 256, 0.9), TASK, SPEC, seed=0)
    val = build_fit_data(sp.make_split(4, 32, 0.9), TASK, SPEC, seed=1)
    before = validation_loss(model, fit_tok, val)
    cfg = FITConfig(steps=24, lr=1e-2, batch_size=16, eval_every=6, patience=10, seed=0)
    rep = train_sft(model, fit_tok, train, cfg, val_examples=val)
    assert rep.steps_run == 24
    assert [s for s, _ in rep.eval_losses] == [6, 12, 18, 24]
    best_step, best_loss = min(rep.eval_losses, key=lambda x: x[1])
    assert rep.best_step == best_step
    # The weights kept are the best checkpoint's: their validation loss is the recorded minimum.
    assert validation_loss(model, fit_tok, val) == pytest.approx(best_loss, rel=1e-4)
    assert best_loss < before


def test_patience_stops_training(fit_tok):
    model = tiny_model(fit_tok, seed=0)
    # Training always answers "positive", validation always "negative" on the same prompts: once the
    # constant answer is learned the validation loss rises, so patience 1 stops the run early.
    train = [dict(e, completion=" positive") for e in build_fit_data(sp.make_split(5, 64, 0.9), TASK, SPEC)]
    val = [dict(e, completion=" negative") for e in train[:16]]
    cfg = FITConfig(steps=40, lr=1e-2, batch_size=8, eval_every=2, patience=1, warmup_ratio=0.0)
    rep = train_sft(model, fit_tok, train, cfg, val_examples=val)
    assert rep.steps_run < 40
    losses = [l for _, l in rep.eval_losses]
    assert rep.best_step == rep.eval_losses[losses.index(min(losses))][0]


def test_config_checks():
    with pytest.raises(UserError):
        FITConfig(steps=0)
    with pytest.raises(UserError):
        FITConfig(lr=0)
    with pytest.raises(UserError):
        FITConfig(warmup_ratio=1.0)


def test_loop_loss_equals_validation_loss_and_its_gradient_matches_trl(fit_tok):
    # The loop's batch loss (LM head only at completion positions) is the mean completion-token CE
    # that validation_loss computes through score_continuations; its gradient equals the gradient
    # of TRL's completion-only training loss on the same batch.
    import datasets
    from trl import SFTConfig, SFTTrainer

    from lmforge.common.scoring import encode_pair
    from lmforge.methods.fit.train import completion_loss

    model = tiny_model(fit_tok, seed=2)
    ex = build_fit_data(sp.make_split(6, 12, 0.9), TASK, SPEC, seed=3)
    rows = [encode_pair(fit_tok, e["prompt"], e["completion"] + fit_tok.eos_token) for e in ex]
    loss = completion_loss(model, rows, fit_tok.pad_token_id)
    assert float(loss.detach()) == pytest.approx(validation_loss(model, fit_tok, ex), rel=1e-5)
    loss.backward()
    mine = {n: p.grad.clone() for n, p in model.named_parameters()}
    model.zero_grad()
    args = SFTConfig(output_dir="/tmp/unused-fit-grad", per_device_train_batch_size=len(ex), report_to=[],
                     use_cpu=True, completion_only_loss=True, disable_tqdm=True, save_strategy="no")
    ds = datasets.Dataset.from_list([{"prompt": e["prompt"], "completion": e["completion"]} for e in ex])
    tr = SFTTrainer(model=model, args=args, processing_class=fit_tok, train_dataset=ds)
    batch = tr.data_collator([tr.train_dataset[i] for i in range(len(ex))])
    out = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"])
    out.loss.backward()
    for n, p in model.named_parameters():
        assert torch.allclose(mine[n], p.grad, rtol=1e-4, atol=1e-7), n


def test_loop_with_lora_trains_adapters_only_and_merges(fit_tok):
    model = tiny_model(fit_tok, seed=0)
    train = build_fit_data(sp.make_split(3, 128, 0.9), TASK, SPEC, seed=0)
    val = build_fit_data(sp.make_split(4, 32, 0.9), TASK, SPEC, seed=1)
    before = validation_loss(model, fit_tok, val)
    emb = model.get_input_embeddings().weight.detach().clone()
    q = model.model.layers[0].self_attn.q_proj.weight.detach().clone()
    cfg = FITConfig(steps=30, lr=2e-2, batch_size=16, lora_r=4, lora_alpha=8, lora_dropout=0.0, trainer="loop",
                    eval_every=10, patience=5, seed=0)
    rep = train_sft(model, fit_tok, train, cfg, val_examples=val)
    assert rep.steps_run == 30 and [s for s, _ in rep.eval_losses] == [10, 20, 30]
    # Merged back into plain Linear layers; the embedding (not a LoRA target) is untouched, the
    # attention weight moved by a rank-<=4 update.
    assert type(model.model.layers[0].self_attn.q_proj) is torch.nn.Linear
    assert torch.equal(model.get_input_embeddings().weight, emb)
    delta = model.model.layers[0].self_attn.q_proj.weight.detach() - q
    assert 0 < int(torch.linalg.matrix_rank(delta, rtol=1e-5)) <= 4
    best_loss = min(l for _, l in rep.eval_losses)
    assert validation_loss(model, fit_tok, val) == pytest.approx(best_loss, rel=1e-4)
    assert best_loss < before
