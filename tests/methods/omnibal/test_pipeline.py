"""The OmniBal runtime: torch.distributed.pipelining (1F1B) composed with data parallelism, on gloo.

Every check compares the distributed run with :func:`reference_grads`, a single-process replay of
the same steps (same weights, micro-batches, padding and optimizer), in float64:

(a) padding is exact: a micro-batch's logits on its real positions, and its loss, do not depend on
    how far the step pads the ViT batch and the LLM sequence (no spawn);
(b) 2 stages on 2 processes, unequal boundaries, 4 micro-batches, 3 steps whose shapes change (the
    third repeats the first's shape, so the cached stage/schedule is reused): the first step's
    gradient of every parameter and every step's loss equal the reference;
(c) recomputation (the projector, a ViT and two LLM blocks, on both stages) leaves the gradients
    and the losses unchanged; the projector sits on stage 0, whose recompute runs after 1F1B's
    warm-up forwards have moved the layout on to a later micro-batch;
(d) pp=2 × dp=2 on 4 processes (AdamW, replicas with different micro-batch counts and shapes):
    both replicas hold the reference gradient over the union of micro-batches (mean over
    replicas of each replica's mean loss), and each replica's losses match over the steps;
(e) (gpu) the 2-stage check on NCCL, when 2 CUDA devices exist;
(f) one stage on one rank (world size 1, recompute on): on gloo/CPU, and (gpu) on NCCL with one CUDA
    device, where the gradients and losses must equal the CPU replay to float64 round-off (CUDA's
    kernels sum in other orders) and the CPU run's.
"""

from __future__ import annotations

import pytest
import torch

from lmforge.methods.omnibal.pipeline import (
    StepPlan,
    VLMConfig,
    build_layers,
    launch,
    layout_of,
    loss_fn,
    micro_batch,
    reference_grads,
    train_steps,
)

CFG = VLMConfig(vit_layers=2, llm_layers=3, d_model=16, n_heads=2, vit_mlp_ratio=4, llm_mlp_ratio=2,
                patch_tokens=4, in_dim=8, vocab=32, dtype=torch.float64)
# Layers: 0 embed, 1-2 ViT, 3 projector, 4-6 LLM, 7 head. Stage 0 = [0, 5), stage 1 = [5, 8).
CUTS = [0, 5, 8]
RECOMPUTE = {2, 3, 4, 6}
SEED, LR = 11, 0.05
PLANS_PP = [
    StepPlan([[(2, 5), (1, 7), (3, 3), (0, 6)]]),   # padded (3 tiles, 7 text, L 15)
    StepPlan([[(1, 4), (2, 9), (2, 2), (1, 1)]]),   # (2, 9, 17)
    StepPlan([[(3, 2), (0, 7), (1, 11), (2, 5)]]),  # (3, 11, 15): new (text differs)
    StepPlan([[(3, 3), (2, 7), (1, 4), (0, 2)]]),   # (3, 7, 15): the first step's shape again
]
PLANS_DP = [
    StepPlan([[(2, 5), (1, 7), (3, 3), (0, 6)], [(1, 2), (1, 3), (2, 2)]]),
    StepPlan([[(1, 4), (2, 9), (2, 2), (1, 1)], [(0, 5), (0, 9)]]),
]


def _max_err(grads: dict, ref: dict) -> float:
    assert set(grads) == set(ref)
    err = 0.0
    for i in ref:
        assert set(grads[i]) == set(ref[i]), i
        for name in ref[i]:
            err = max(err, (grads[i][name] - ref[i][name]).abs().max().item())
    return err


def _merge_grads(results: list[dict], replica: int) -> dict:
    merged: dict = {}
    for r in results:
        if r["replica"] == replica:
            assert not set(merged) & set(r["grads"])
            merged.update(r["grads"])
    return merged


def _with_and_without_recompute(rank: int, world: int, device: str = "cpu") -> dict:
    """Two runs in one set of processes (one spawn): plain, then with recomputation."""
    kw = dict(lr=LR, return_grads=True, device=device)
    return {"plain": train_steps(rank, world, 2, 1, CFG, CUTS, set(), PLANS_PP, SEED, **kw),
            "recompute": train_steps(rank, world, 2, 1, CFG, CUTS, RECOMPUTE, PLANS_PP, SEED, **kw)}


@pytest.fixture(scope="module")
def reference_pp() -> dict:
    return reference_grads(CFG, PLANS_PP, SEED, lr=LR)


@pytest.fixture(scope="module")
def pp_runs() -> list[dict]:
    return launch(2, _with_and_without_recompute, timeout_s=120)


def test_padding_is_exact():
    layers = build_layers(CFG, SEED)
    layout = layout_of(layers)
    alone = StepPlan([[(2, 5)]])
    padded = StepPlan([[(2, 5), (4, 1), (0, 12)]])  # 4 tiles, 12 text slots, L 17 (vs 8 + 5)
    outs = []
    for plan in (alone, padded):
        layout.set_step(*plan.shape(0, CFG.patch_tokens))
        layout.set_micro(2, 5)
        x, y = micro_batch(CFG, plan, SEED, 0, 0, 0)
        h = x
        for layer in layers:
            h = layer(h)
        outs.append((h[0, :13], loss_fn(h, y), y[0, :13]))
    assert padded.shape(0, CFG.patch_tokens) == (4, 12, 17)
    assert torch.equal(outs[0][2], outs[1][2])
    torch.testing.assert_close(outs[0][0], outs[1][0], rtol=0, atol=1e-12)
    assert abs(outs[0][1].item() - outs[1][1].item()) < 1e-12


def test_two_stages_match_single_process(pp_runs, reference_pp):
    runs = [r["plain"] for r in pp_runs]
    assert [r["stage"] for r in runs] == [0, 1]
    assert _max_err(_merge_grads(runs, 0), reference_pp["grads"]) < 1e-10
    # Every step's loss (steps 2-4 follow SGD updates and shape changes).
    ref_losses = [step[0] for step in reference_pp["losses"]]
    assert runs[1]["losses"] == pytest.approx(ref_losses, abs=1e-10)
    assert runs[0]["losses"] == []
    # A shape is built once: the fourth step reuses the first step's stage and schedule.
    assert runs[0]["shapes"] == [(3, 7, 15), (2, 9, 17), (3, 11, 15), (3, 7, 15)]
    assert runs[0]["new_shape"] == [True, True, True, False]
    assert len(runs[0]["step_seconds"]) == 4 and all(t > 0 for t in runs[0]["step_seconds"])
    assert runs[0]["step_seconds"] == runs[1]["step_seconds"]  # max over ranks, on every rank


def test_recompute_leaves_gradients_unchanged(pp_runs):
    plain = _merge_grads([r["plain"] for r in pp_runs], 0)
    recomputed = _merge_grads([r["recompute"] for r in pp_runs], 0)
    assert _max_err(recomputed, plain) < 1e-12
    assert pp_runs[1]["recompute"]["losses"] == pytest.approx(pp_runs[1]["plain"]["losses"], abs=1e-12)


def test_data_parallel_composes_with_pipeline():
    ref = reference_grads(CFG, PLANS_DP, SEED, lr=1e-2, optimizer="adamw")
    runs = launch(4, train_steps, 2, 2, CFG, [4], {3}, PLANS_DP, SEED, 1e-2, optimizer="adamw",
                  return_grads=True, timeout_s=120)
    assert [(r["replica"], r["stage"]) for r in runs] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    for replica in (0, 1):
        assert _max_err(_merge_grads(runs, replica), ref["grads"]) < 1e-10
        last = runs[2 * replica + 1]
        assert last["losses"] == pytest.approx([step[replica] for step in ref["losses"]], abs=1e-10)
    # The two replicas padded differently (their own maxima), and the union is what was averaged:
    # one replica's micro-batches alone give a different gradient.
    assert runs[0]["shapes"][0] != runs[2]["shapes"][0]
    alone = reference_grads(CFG, [StepPlan(PLANS_DP[0].micro[:1])], SEED, lr=1e-2, optimizer="adamw")
    assert _max_err(alone["grads"], ref["grads"]) > 1e-4


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2,
                    reason="needs 2 CUDA devices (NCCL allows one rank per device)")
def test_two_stages_on_nccl(reference_pp):
    results = launch(2, _with_and_without_recompute, "cuda", backend="nccl", timeout_s=300)
    runs = [r["plain"] for r in results]
    assert _max_err(_merge_grads(runs, 0), reference_pp["grads"]) < 1e-10
    assert runs[1]["losses"] == pytest.approx([s[0] for s in reference_pp["losses"]], abs=1e-10)
    assert _max_err(_merge_grads([r["recompute"] for r in results], 0), _merge_grads(runs, 0)) < 1e-12


def _one_rank(backend: str, device: str) -> dict:
    return launch(1, train_steps, 1, 1, CFG, [], RECOMPUTE, PLANS_PP, SEED, LR, return_grads=True,
                  device=device, backend=backend, timeout_s=300)[0]


@pytest.mark.parametrize(("backend", "device", "tol"), [
    ("gloo", "cpu", 1e-12),
    pytest.param("nccl", "cuda", 1e-9, marks=[
        pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]),
])
def test_one_stage_on_one_rank_matches_single_process(reference_pp, backend, device, tol):
    """World size 1: a 1-stage Schedule1F1B (its recompute too), the process group's barriers and the
    all-reduce of step times on ``backend``; on NCCL this is the CUDA path a single lent GPU can run."""
    run = _one_rank(backend, device)
    assert run["stage"] == 0 and run["replica"] == 0 and set(run["grads"]) == set(range(8))
    assert _max_err(run["grads"], reference_pp["grads"]) < tol
    assert run["losses"] == pytest.approx([s[0] for s in reference_pp["losses"]], abs=tol)
    assert run["new_shape"] == [True, True, True, False]
    if device == "cuda":
        cpu = _one_rank("gloo", "cpu")
        assert _max_err(run["grads"], cpu["grads"]) < tol
        assert run["losses"] == pytest.approx(cpu["losses"], abs=tol)
