"""The zoo: deterministic builds, the cache, learnability of agent-nano's formats, and loading."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
from safetensors.torch import load_file

from lmforge.models import zoo


def _short(spec: zoo.ZooSpec, steps: int) -> zoo.ZooSpec:
    return dataclasses.replace(spec, train=dataclasses.replace(spec.train, steps=steps, eval_every=10, ckpt_every=8))


def test_short_build_is_deterministic(tmp_path):
    spec = _short(zoo.ZOO["agent-nano"], 20)
    a = zoo.build(spec, tmp_path / "a", progress=False, evaluate=False)
    b = zoo.build(spec, tmp_path / "b", progress=False, evaluate=False)
    ca = json.loads((tmp_path / "a" / "curves.json").read_text())
    cb = json.loads((tmp_path / "b" / "curves.json").read_text())
    assert ca["losses"] == cb["losses"] and ca["probes"] == cb["probes"]
    wa, wb = load_file(tmp_path / "a" / "model.safetensors"), load_file(tmp_path / "b" / "model.safetensors")
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)
    assert a["digest"] == b["digest"]
    # A different seed gives a different model: the equality above is not vacuous.
    c = dataclasses.replace(spec, seed=1)
    zoo.build(c, tmp_path / "c", progress=False, evaluate=False)
    wc = load_file(tmp_path / "c" / "model.safetensors")
    assert not all(torch.equal(wa[k], wc[k]) for k in wa)


def test_resume_from_checkpoint_matches_uninterrupted(tmp_path, monkeypatch):
    spec = _short(zoo.ZOO["agent-nano"], 12)
    full = zoo.build(spec, tmp_path / "full", progress=False, evaluate=False)
    # Interrupt the same build at step 9 (a checkpoint was written after step 8), then resume.
    work = tmp_path / ".part.work"
    work.mkdir()
    real, calls = zoo.make_batch, []

    def dying_make_batch(*args, **kwargs):
        calls.append(1)
        if len(calls) == 10:
            raise KeyboardInterrupt
        return real(*args, **kwargs)

    monkeypatch.setattr(zoo, "make_batch", dying_make_batch)
    with pytest.raises(KeyboardInterrupt):
        zoo.train(spec, work, progress=False)
    monkeypatch.setattr(zoo, "make_batch", real)
    assert torch.load(work / "ckpt.pt", weights_only=False)["state"]["step"] == 8
    model, _, state = zoo.train(spec, work, progress=False)
    ref = load_file(tmp_path / "full" / "model.safetensors")
    got = model.state_dict()
    assert all(torch.equal(ref[k], got[k]) for k in ref)
    assert full["params"] == sum(p.numel() for p in model.parameters())
    assert state.step == 12


def test_cache_is_keyed_by_spec_hash():
    a = zoo.ZOO["agent-nano"]
    b = dataclasses.replace(a, seed=3)
    assert zoo.cache_dir(a) != zoo.cache_dir(b)
    assert zoo.cache_dir(a).is_relative_to(zoo.cache_root())
    # The description is documentation, not part of the key.
    assert zoo.cache_dir(dataclasses.replace(a, description="other")) == zoo.cache_dir(a)


def test_nano_is_small_and_loads_through_public_api(nano_dir, nano):
    model, tok = nano
    meta = json.loads((nano_dir / "zoo.json").read_text())
    assert meta["params"] <= 1_000_000
    assert sum(p.numel() for p in model.parameters()) == meta["params"]
    assert (nano_dir / "model.safetensors").is_file()
    assert model.config.model_type == "llama"
    assert tok.is_fast


def test_nano_learned_something(nano_dir):
    """Training lowered the answer loss well below the uniform-guess loss ln(V)."""
    curves = json.loads((nano_dir / "curves.json").read_text())
    losses = [loss for _, _, loss in curves["losses"]]
    vocab = json.loads((nano_dir / "config.json").read_text())["vocab_size"]
    assert sum(losses[:5]) / 5 > 0.9 * torch.log(torch.tensor(float(vocab))).item()
    assert sum(losses[-10:]) / 10 < 0.6 * sum(losses[:5]) / 5


def test_encode_segments_masks_prompt(zoo_tokenizer):
    ids, flags = zoo.encode_pair(zoo_tokenizer, "Tools:\nUser: hi\nCall:", ' {"name": "x"}')
    batch = zoo.collate([(ids, flags)], zoo_tokenizer.pad_token_id)
    labelled = [i for i, f in zip(ids, flags) if f]
    assert zoo_tokenizer.decode(labelled) == ' {"name": "x"}' + zoo_tokenizer.eos_token
    assert (batch["labels"] != -100).sum().item() == len(labelled)
    assert ids[0] == zoo_tokenizer.bos_token_id


def test_lr_schedule_warmup_and_floor():
    s = zoo.ZOO["agent-small"].train
    assert zoo.lr_at(0, s) == pytest.approx(s.lr / s.warmup)
    assert zoo.lr_at(s.warmup, s) == pytest.approx(s.lr)
    assert zoo.lr_at(s.steps, s) == pytest.approx(s.lr * s.min_lr_ratio)


def test_packaged_demo_model_matches_its_spec():
    """The committed agent-small weights carry the digest of the current spec (else ensure_built
    would silently retrain)."""
    spec = zoo.ZOO["agent-small"]
    folder = zoo.PACKAGED_DIR / spec.name
    if not folder.exists():
        pytest.skip("agent-small is not committed in this checkout")
    assert zoo.packaged_dir(spec) == folder
    size = sum(f.stat().st_size for f in folder.iterdir())
    assert size <= 25 * 2**20


@pytest.mark.slow
@pytest.mark.timeout(0)
def test_rebuilding_agent_small_reproduces_committed_weights(tmp_path):
    spec = zoo.ZOO["agent-small"]
    folder = zoo.PACKAGED_DIR / spec.name
    zoo.build(spec, tmp_path / "rebuilt", progress=False, evaluate=False)
    ref = load_file(folder / "model.safetensors")
    got = load_file(tmp_path / "rebuilt" / "model.safetensors")
    assert all(torch.equal(ref[k], got[k]) for k in ref)


def test_packaged_demo_model_still_does_its_tasks():
    """A regression guard on the committed weights and tokenizer: greedy tool calls and workflow
    plans on fresh held-out prompts (a stream neither training nor `zoo build` uses). Needle
    retrieval is not checked: the committed model scores 0 there (see README)."""
    import random

    from lmforge.common.generation import generate
    from lmforge.data import toolcalls, workflow
    from lmforge.eval.metrics import node_f1
    from lmforge.models import load

    spec = zoo.ZOO["agent-small"]
    if zoo.packaged_dir(spec) is None:
        pytest.skip("agent-small is not committed in this checkout")
    model, tok = load(str(zoo.packaged_dir(spec)))
    meta = json.loads((zoo.packaged_dir(spec) / "zoo.json").read_text())
    rng = random.Random("test-packaged")
    recs = toolcalls.generate(rng, 48)
    outs = generate(model, tok, [toolcalls.prompt(r) for r in recs], max_new_tokens=64, stop=["\n"])
    em = sum(toolcalls.exact_match(o.text, r) for o, r in zip(outs, recs)) / len(recs)
    # 48 samples: allow sampling noise around the recorded 200-sample figure. NOTE: the bound was
    # recorded - 0.15 (0.195), one sample below the 10/48 (0.208) measured here, so a single greedy
    # near-tie decided differently by another CPU's rounding could fail it; - 0.25 (5 of 48) still
    # fails a broken model (0) and leaves a margin of five samples.
    assert em >= meta["metrics"]["toolcall_exact_match"] - 0.25
    wrecs = workflow.generate(rng, 24)
    outs = generate(model, tok, [workflow.prompt(r) for r in wrecs], max_new_tokens=160)
    f1 = sum(node_f1(workflow.parse_plan(o.text)[0], r["nodes"], r["edges"])["f1"]
             for o, r in zip(outs, wrecs)) / len(wrecs)
    assert f1 >= meta["metrics"]["workflow_node_f1"] - 0.15


def test_checkpoint_of_another_spec_is_not_resumed(tmp_path):
    a = _short(zoo.ZOO["agent-nano"], 8)
    b = dataclasses.replace(a, train=dataclasses.replace(a.train, lr=1e-3))
    work = tmp_path / "work"
    work.mkdir()
    zoo.train(dataclasses.replace(a, train=dataclasses.replace(a.train, steps=20)), work, progress=False)
    assert torch.load(work / "ckpt.pt", weights_only=False)["digest"] != b.digest()
    model, _, state = zoo.train(b, work, progress=False)
    fresh_dir = tmp_path / "fresh"
    fresh_dir.mkdir()
    ref, _, _ = zoo.train(b, fresh_dir, progress=False)
    assert state.step == 8
    assert all(torch.equal(p, q) for p, q in zip(model.state_dict().values(), ref.state_dict().values()))


@pytest.mark.parametrize("override", [
    {"threads": 0}, {"name": "../x"}, {"vocab_size": 10},
])
def test_bad_spec_values_are_rejected(override):
    with pytest.raises(ValueError):
        dataclasses.replace(zoo.ZOO["agent-nano"], **override)


@pytest.mark.parametrize("field,value", [
    ("ckpt_every", 0), ("eval_every", 0), ("needle_start", 0), ("needle_floor_end", 0.35),
    ("mixture", (("needle", 0.0),)), ("mixture", (("chess", 1.0),)),
])
def test_bad_schedules_are_rejected(field, value):
    with pytest.raises(ValueError):
        dataclasses.replace(zoo.ZOO["agent-small"].train, **{field: value})


def test_bad_shape_is_rejected():
    with pytest.raises(ValueError, match="multiple"):
        dataclasses.replace(zoo.ZOO["agent-small"].shape, heads=5)

