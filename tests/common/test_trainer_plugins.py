"""The trainer's plug-in points: a registered optimizer factory is what trains (its two steps give the
weights of a naive SGD loop), unknown names are one-line user errors listing what is registered, a
folder goes to the parametrization whose model type it carries, and a plain run imports no method."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from lmforge.common import trainer
from lmforge.common.errors import UserError
from lmforge.common.trainer import (
    OptimizerFactory,
    Parametrization,
    TrainJob,
    register_optimizer,
    register_parametrization,
    run_training,
)

MODEL = "zoo:agent-small"  # committed: loads without a build
TEXTS = ["the quick brown fox jumps over the lazy dog and then runs back home again. " * 4] * 20


def test_a_registered_optimizer_is_the_one_that_trains(monkeypatch, tmp_path):
    torch.set_num_threads(1)
    calls = []

    def sgd(job, model):
        calls.append((job.optimizer, type(model).__name__))
        return torch.optim.SGD(model.parameters(), lr=job.lr)

    monkeypatch.setitem(trainer.OPTIMIZER_FACTORIES, "sgd-test", OptimizerFactory(name="sgd-test", build=sgd))
    job = TrainJob(model=MODEL, out=str(tmp_path / "m"), optimizer="sgd-test", steps=2, lr=0.5, warmup=0,
                   min_lr_ratio=0.5, clip=0.0, batch_size=2, seq_len=32, ckpt_every=0, progress=False)
    res = run_training(job, texts=TEXTS)
    assert calls == [("sgd-test", "LlamaForCausalLM")]
    assert res.state_bytes == 0 < res.adamw_state_bytes  # plain SGD keeps no state

    # The naive loop: the same batches and schedule, p -= lr * grad by hand.
    from lmforge.models import load

    model, tok = load(MODEL)
    start = {k: v.clone() for k, v in model.state_dict().items()}
    model.train()
    stream = trainer.token_stream(tok, TEXTS)
    for step in range(2):
        lr = 0.5 * trainer.lr_factor(step, 2, 0, 0.5)
        ids = trainer.batch_at(stream, step, 0, 2, 32, tok.bos_token_id)
        model(input_ids=ids, labels=ids).loss.backward()
        with torch.no_grad():
            for p in model.parameters():
                if p.grad is not None:
                    p -= lr * p.grad
                    p.grad = None
    from safetensors.torch import load_file

    saved = load_file(tmp_path / "m" / "model.safetensors")
    ref = {k: v.detach() for k, v in model.state_dict().items()}
    assert saved.keys() <= ref.keys()
    assert all(torch.allclose(saved[k], ref[k], atol=1e-6) for k in saved)
    assert any(not torch.equal(saved[k], start[k]) for k in saved)  # it did move


def test_unknown_names_are_one_line_errors_naming_the_registered_ones(monkeypatch):
    monkeypatch.setitem(trainer.OPTIMIZER_FACTORIES, "sgd-test",
                        OptimizerFactory(name="sgd-test", build=lambda job, model: None))
    with pytest.raises(UserError) as err:
        TrainJob(model=MODEL, out="unused", optimizer="adafactor")
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("unknown optimizer 'adafactor'; choose one of adamw, ")
    assert "galore" in msg and "sgd-test" in msg  # the methods' factories were loaded before the lookup
    with pytest.raises(UserError, match=r"^unknown parametrization 'mup'; choose sp or mus$"):
        TrainJob(model=MODEL, out="unused", parametrization="mup")
    TrainJob(model=MODEL, out="unused", optimizer="sgd-test")  # not projected: needs no --rank
    with pytest.raises(UserError, match=r"^--parametrization mus trains with its own optimizer \(Lion"):
        TrainJob(model=MODEL, out="unused", optimizer="sgd-test", parametrization="mus")


def test_a_second_registration_or_a_transformers_model_type_is_a_bug(monkeypatch):
    monkeypatch.setattr(trainer, "OPTIMIZER_FACTORIES", dict(trainer.OPTIMIZER_FACTORIES))
    monkeypatch.setattr(trainer, "PARAMETRIZATION_FACTORIES", dict(trainer.PARAMETRIZATION_FACTORIES))
    f = OptimizerFactory(name="sgd-test", build=lambda job, model: None)
    assert register_optimizer(f) is f and register_optimizer(f) is f  # the same record again is fine
    with pytest.raises(ValueError, match="registered twice"):
        register_optimizer(OptimizerFactory(name="sgd-test", build=lambda job, model: None))
    with pytest.raises(ValueError, match="transformers type"):
        register_parametrization(Parametrization(name="llama-like", model_type="llama"))


def test_a_folder_goes_to_the_parametrization_of_its_model_type(monkeypatch, tmp_path):
    monkeypatch.setattr(trainer, "PARAMETRIZATION_FACTORIES", dict(trainer.PARAMETRIZATION_FACTORIES))
    monkeypatch.setattr(trainer, "_plugins_loaded", True)  # the registry as it stands, no method imports
    fake = register_parametrization(Parametrization(name="fake", label="Fake", model_type="lmforge-test-fake",
                                                    load=lambda folder, job: torch.nn.Linear(1, 1)))
    cases = {"ours": {"model_type": "lmforge-test-fake"}, "hf": {"model_type": "llama"},
             "other": {"model_type": "lmforge-test-unknown"}, "odd": [1, 2]}
    for name, cfg in cases.items():
        (tmp_path / name).mkdir()
        (tmp_path / name / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "none").mkdir()
    assert trainer._owner(tmp_path / "ours") is fake
    assert [trainer._owner(tmp_path / n) for n in ("hf", "other", "odd", "none")] == [None] * 4
    job = TrainJob(model=str(tmp_path / "ours"), out=str(tmp_path / "out"), progress=False)
    with pytest.raises(UserError, match=r"is a Fake model; train it with --parametrization fake$"):
        run_training(job, texts=TEXTS)
    assert not (tmp_path / "out").exists()


def test_a_plain_run_imports_no_method_and_a_plugin_name_loads_them(tmp_path):
    code = f"""
import sys
from lmforge.common.trainer import TrainJob, run_training
texts = {TEXTS!r}
res = run_training(TrainJob(model={MODEL!r}, out={str(tmp_path / 'm')!r}, steps=1, batch_size=1, seq_len=16,
                            ckpt_every=0, progress=False), texts=texts)
print(len(res.losses), sorted(m for m in sys.modules if m.startswith("lmforge.methods")))
TrainJob(model={MODEL!r}, out="unused", optimizer="galore", rank=2)
print("lmforge.methods.grad_transforms" in sys.modules)
"""
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600,
                         env={**__import__("os").environ, "OMP_NUM_THREADS": "1"})
    assert res.returncode == 0, res.stderr[-2000:]
    assert res.stdout.split("\n")[:2] == ["1 []", "True"]
