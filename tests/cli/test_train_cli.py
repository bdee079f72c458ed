"""``lmforge train``: bad input is one line with exit status 2 and nothing written; a run lowers the
loss, saves a model that transformers loads, and a run interrupted after a checkpoint resumes to the
exact weights of an uninterrupted one."""

from __future__ import annotations

import json

import pytest
import torch

from lmforge.common import trainer
from lmforge.common.errors import UserError
from lmforge.common.trainer import TrainJob, run_training
from tests.cli.helpers import call, one_error_line

MODEL = "zoo:agent-small"  # shipped with lmforge: no build in the tests


@pytest.mark.parametrize(
    "args,needle",
    [
        (["--fp8"], "--fp8 needs --parametrization mus"),
        (["--optimizer", "galore", "--rank", "4", "--refresh", "0"], "refresh interval must be a positive"),
        (["--optimizer", "galore", "--rank", "4", "--refresh", "-3"], "refresh interval must be a positive"),
        (["--optimizer", "galore"], "needs --rank"),
        (["--optimizer", "adafactor"], "unknown optimizer"),
        (["--parametrization", "mup"], "unknown parametrization"),
        (["--parametrization", "mus", "--optimizer", "galore", "--rank", "4"], "its own optimizer"),
        (["--steps", "0"], "--steps must be at least 1"),
        (["--weight-decay", "-1"], "--weight-decay must be >= 0"),
        (["--warmup", "-5"], "--warmup must be >= 0"),
        (["--ckpt-every", "-1"], "--ckpt-every must be >= 0"),
        (["--clip", "-1"], "--clip must be >= 0"),
        (["--min-lr-ratio", "5"], "--min-lr-ratio must lie in [0, 1]"),
        (["--seq-len", "100000"], "exceeds the model's 1024 positions"),
    ],
)
def test_bad_input_is_one_line_exit_2_nothing_written(monkeypatch, capsys, tmp_path, args, needle):
    out = tmp_path / "m"
    code, _, err = call(monkeypatch, capsys, "train", "-m", MODEL, "--out", str(out), *args)
    assert code == 2
    assert needle in one_error_line(err)
    assert not out.exists()


def test_fp8_refusal_explains_why(monkeypatch, capsys, tmp_path):
    code, _, err = call(monkeypatch, capsys, "train", "-m", MODEL, "--out", str(tmp_path / "m"), "--fp8")
    line = one_error_line(err)
    assert code == 2 and "static" in line and "unit-scaled" in line


def test_existing_output_needs_overwrite(monkeypatch, capsys, tmp_path):
    out = tmp_path / "m"
    out.mkdir()
    (out / "keep.txt").write_text("user data")
    code, _, err = call(monkeypatch, capsys, "train", "-m", MODEL, "--out", str(out), "--steps", "1")
    assert code == 2 and "--overwrite" in one_error_line(err)
    assert (out / "keep.txt").read_text() == "user data"


def test_train_lowers_loss_and_saves_a_loadable_model(monkeypatch, capsys, tmp_path):
    out = tmp_path / "m"
    code, stdout, err = call(monkeypatch, capsys, "train", "-m", MODEL, "--out", str(out), "--steps", "12",
                             "--lr", "3e-3", "--warmup", "0", "--seq-len", "64", "--batch-size", "4", "--json")
    assert code == 0, err
    res = json.loads(stdout)
    assert len(res["losses"]) == 12
    assert sum(res["losses"][-3:]) / 3 < sum(res["losses"][:3]) / 3  # it learned something
    assert res["state_bytes"] == res["adamw_state_bytes"]  # AdamW's two moments, fp32, every parameter
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out)
    assert (out / "model.safetensors").is_file() and (out / "tokenizer.json").is_file()
    assert json.loads((out / "train.json").read_text())["losses"] == res["losses"]
    assert not (tmp_path / ".m.ckpt").exists()  # checkpoints are gone once the model is saved
    assert model.config.num_hidden_layers == 4


@pytest.mark.parametrize("extra", [
    {},
    {"optimizer": "galore", "rank": 4, "refresh": 2},
    {"parametrization": "mus", "fp8": True, "lr": 0.03},
], ids=["adamw", "galore", "mus-fp8"])
def test_interrupted_run_resumes_to_the_same_weights(monkeypatch, tmp_path, extra):
    torch.set_num_threads(1)
    # No warm-up: the checkpoint (step 3 of 6) falls inside the cosine decay, where a resumed run
    # that took its peak lr from the checkpoint's decayed groups would drift.
    kw = dict(model=MODEL, steps=6, lr=3e-3, warmup=0, batch_size=2, seq_len=32, ckpt_every=3, progress=False)
    kw.update(extra)
    full = run_training(TrainJob(out=str(tmp_path / "full"), **kw))

    real = trainer.batch_at

    def crash_at_4(stream, step, *a):
        if step == 4:
            raise KeyboardInterrupt
        return real(stream, step, *a)

    monkeypatch.setattr(trainer, "batch_at", crash_at_4)
    with pytest.raises(KeyboardInterrupt):
        run_training(TrainJob(out=str(tmp_path / "part"), **kw))
    assert (tmp_path / ".part.ckpt" / "ckpt.pt").is_file() and not (tmp_path / "part").exists()
    monkeypatch.setattr(trainer, "batch_at", real)
    logs: list[str] = []
    resumed = run_training(TrainJob(out=str(tmp_path / "part"), **kw), log=logs.append)
    assert resumed.resumed_from == 3 and any("resuming from step 3" in m for m in logs)
    assert resumed.losses == pytest.approx(full.losses, abs=1e-6)
    if full.fp8 is not None:  # the counters cover all six steps, the three before the resume too
        assert resumed.fp8["per_layer"] == full.fp8["per_layer"]
    from safetensors.torch import load_file

    a = load_file(tmp_path / "full" / "model.safetensors")
    b = load_file(tmp_path / "part" / "model.safetensors")
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-6) for k in a)


def test_a_checkpoint_of_another_run_is_not_resumed(tmp_path):
    kw = dict(model=MODEL, steps=2, batch_size=2, seq_len=32, ckpt_every=1, progress=False)
    job = TrainJob(out=str(tmp_path / "m"), **kw)
    other = TrainJob(out=str(tmp_path / "m"), **{**kw, "lr": 0.5})
    assert job.key() != other.key()
    ck = tmp_path / ".m.ckpt"
    ck.mkdir()
    torch.save({"key": other.key(), "step": 1, "model": {}, "opt": {}, "losses": [9.0]}, ck / "ckpt.pt")
    logs: list[str] = []
    res = run_training(job, log=logs.append)
    assert res.resumed_from == 0 and len(res.losses) == 2 and any("another run" in m for m in logs)


def test_too_little_text_is_a_user_error():
    stream = torch.arange(10)
    with pytest.raises(UserError, match="fewer than one window"):
        trainer.batch_at(stream, 0, 0, 2, 32, None)


def test_lr_schedule_closed_form():
    # warm-up reaches the peak linearly, the cosine ends at min_ratio, halfway is the mean
    assert trainer.lr_factor(0, 100, 10, 0.1) == pytest.approx(0.1)
    assert trainer.lr_factor(9, 100, 10, 0.1) == pytest.approx(1.0)
    assert trainer.lr_factor(10, 100, 10, 0.1) == pytest.approx(1.0)
    assert trainer.lr_factor(55, 100, 10, 0.1) == pytest.approx(0.55)
    assert trainer.lr_factor(100, 100, 10, 0.1) == pytest.approx(0.1)


def test_projected_optimizer_keeps_less_state_and_the_model_loads(monkeypatch, capsys, tmp_path):
    out = tmp_path / "g"
    code, stdout, err = call(monkeypatch, capsys, "train", "-m", MODEL, "--out", str(out), "--steps", "4",
                             "--optimizer", "galore", "--rank", "8", "--refresh", "2", "--seq-len", "32",
                             "--batch-size", "2", "--json")
    assert code == 0, err
    res = json.loads(stdout)
    # agent-small's projected linears are 128 wide: their Adam moments shrink to 8/128; the
    # embeddings, norms and head keep full AdamW state, so the total lies between.
    assert 0 < res["state_bytes"] < res["adamw_state_bytes"]
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(out)


def test_rank_larger_than_a_layer_is_one_line(monkeypatch, capsys, tmp_path):
    code, _, err = call(monkeypatch, capsys, "train", "-m", MODEL, "--out", str(tmp_path / "g"), "--steps", "1",
                        "--optimizer", "orthogonal", "--rank", "4096")
    line = one_error_line(err)
    assert code == 2 and "4096" in line and "proj" in line  # names the layer and the rank
    assert not (tmp_path / "g").exists()


def test_mus_fp8_run_saves_a_mus_model_that_resumes_training(monkeypatch, capsys, tmp_path):
    from lmforge.methods.unit_scaling.apply import is_mus
    from lmforge.methods.unit_scaling.model import load_mus

    out = tmp_path / "mus"
    code, stdout, err = call(monkeypatch, capsys, "train", "-m", MODEL, "--out", str(out), "--steps", "6",
                             "--parametrization", "mus", "--fp8", "--lr", "0.03", "--seq-len", "32",
                             "--batch-size", "4", "--json")
    assert code == 0, err
    res = json.loads(stdout)
    fp8 = res["fp8"]
    # Unit-scaled forward casts lose almost nothing; the gradients are cast directly (the paper's
    # default, no loss scale), and a mean-reduced loss puts many of them below E5M2's subnormals.
    assert fp8["overflow_rate"] == 0.0
    assert fp8["activation_underflow_rate"] < 0.05 and fp8["weight_underflow_rate"] < 0.05
    assert fp8["gradient_underflow_rate"] > max(fp8["activation_underflow_rate"], fp8["weight_underflow_rate"])
    assert set(fp8["per_layer"]) and all(set(v) == {"activation", "weight", "gradient"} for v in fp8["per_layer"].values())
    model = load_mus(out)
    assert is_mus(model) and all(lin.fp8 for lin in model.hidden_linears().values())
    # Lion keeps one moment per parameter: half of AdamW's two.
    assert res["state_bytes"] * 2 == res["adamw_state_bytes"]
    # An FP8 µS folder trains on only in FP8 (else train.json would not count the casts) ...
    code, _, err = call(monkeypatch, capsys, "train", "-m", str(out), "--out", str(tmp_path / "y"), "--steps", "1",
                        "--parametrization", "mus")
    assert code == 2 and "pass --fp8" in one_error_line(err)
    # A µS folder trains on only as µS ...
    code, _, err = call(monkeypatch, capsys, "train", "-m", str(out), "--out", str(tmp_path / "x"), "--steps", "1")
    assert code == 2 and "is a µS model" in one_error_line(err)
    # ... and continues from its own weights (the first loss is the trained model's, not a fresh init's).
    code, stdout, err = call(monkeypatch, capsys, "train", "-m", str(out), "--out", str(tmp_path / "more"),
                             "--steps", "2", "--parametrization", "mus", "--fp8", "--lr", "0.01", "--seq-len", "32",
                             "--batch-size", "4", "--json")
    assert code == 0, err
    # (a fresh µS init with the same seed would give exactly res["losses"][0] on the same first batch)
    assert json.loads(stdout)["losses"][0] < res["losses"][0] - 0.05
