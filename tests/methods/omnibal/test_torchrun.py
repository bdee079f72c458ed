"""The runtime on ranks torchrun starts (``-m lmforge.methods.omnibal.torchrun``).

(a) bad arguments and a missing torchrun environment are one ``error:`` line and exit 2, before any
    process group is joined (in-process);
(b) torchrun with 2 gloo processes (pp = 2, float64, SGD, recompute on two layers): every step's loss
    on the last stage equals :func:`reference_grads`' single-process replay of the plans the ranks
    wrote, to 1e-10; the ranks read RANK/WORLD_SIZE/LOCAL_RANK from torchrun's environment;
(c) (gpu) the same with 1 process on NCCL and ``cuda:LOCAL_RANK``.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

from lmforge.methods.omnibal import torchrun as T
from lmforge.methods.omnibal.pipeline import StepPlan, VLMConfig, reference_grads

MODEL = ["--vit-layers", "2", "--llm-layers", "3", "--d-model", "16", "--patch-tokens", "4", "--vit-mlp-ratio", "4"]
ENV = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}


def test_synthetic_plans_are_seeded_and_in_range():
    plans = T.synthetic_plans(3, 2, 4, 6, 10, seed=5)
    assert [p.micro for p in plans] == [p.micro for p in T.synthetic_plans(3, 2, 4, 6, 10, seed=5)]
    assert all(p.dp == 2 and all(len(r) == 4 for r in p.micro) for p in plans)
    assert all(3 <= n <= 6 and 5 <= t <= 10 for p in plans for r in p.micro for n, t in r)


@pytest.mark.parametrize(("env", "args", "message"), [
    ({}, ["--pp", "2"], "RANK=None"),
    ({**ENV, "RANK": "2"}, ["--pp", "2"], "inconsistent"),
    (ENV, ["--pp", "2", "--micro-batches", "1"], "micro-batches"),
    (ENV, ["--pp", "2", "--boundaries", "0"], "bad pipeline boundaries"),
    (ENV, ["--pp", "2", "--boundaries", "3,5"], "2 boundaries for --pp 2"),
    (ENV, ["--pp", "2", "--recompute", "99"], "outside"),
    (ENV, ["--pp", "3"], "not a multiple"),
    (ENV, ["--pp", "2", "--backend", "nccl"], "nccl"),
    (ENV, ["--pp", "2", "--dtype", "float7"], "--dtype"),
])
def test_bad_arguments_are_one_line(tmp_path, monkeypatch, capsys, env, args, message):
    for k in ENV:
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert T.main([*args, *MODEL, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and message in err[0], err
    assert not (tmp_path / "o").exists()


def _torchrun(tmp_path, nproc: int, pp: int, backend: str, device: str) -> list[dict]:
    out = tmp_path / "ranks"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
           "-m", "lmforge.methods.omnibal.torchrun", "--pp", str(pp), "--out", str(out), *MODEL, "--steps", "3",
           "--micro-batches", "4", "--dtype", "float64", "--optimizer", "sgd", "--lr", "0.05", "--seed", "3",
           "--recompute", "2,4", "--backend", backend, "--device", device]
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"}
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads((out / f"rank{r}.json").read_text()) for r in range(nproc)]


@pytest.mark.parametrize(("nproc", "pp", "backend", "device"), [
    (2, 2, "gloo", "cpu"),
    pytest.param(1, 1, "nccl", "cuda", marks=[
        pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]),
])
def test_torchrun_ranks_match_single_process(tmp_path, nproc, pp, backend, device):
    ranks = _torchrun(tmp_path, nproc, pp, backend, device)
    assert [(r["rank"], r["stage"], r["replica"], r["world"]) for r in ranks] == [(i, i, 0, nproc)
                                                                                  for i in range(nproc)]
    assert all(r["local_rank"] == r["rank"] and r["local_world"] == nproc for r in ranks)
    assert ranks[0]["device"] == ("cpu" if device == "cpu" else "cuda:0")
    assert ranks[0]["recompute"] == [2, 4] and len(ranks[0]["boundaries"]) == pp - 1
    cfg = VLMConfig(vit_layers=2, llm_layers=3, d_model=16, patch_tokens=4, vit_mlp_ratio=4, dtype=torch.float64)
    plans = [StepPlan(p) for p in ranks[0]["plans"]]
    assert all(r["plans"] == ranks[0]["plans"] for r in ranks)
    ref = reference_grads(cfg, plans, 3, lr=0.05)
    tol = 1e-10 if device == "cpu" else 1e-9
    assert ranks[-1]["losses"] == pytest.approx([s[0] for s in ref["losses"]], abs=tol)
    assert len(ranks[0]["step_seconds"]) == 3 and ranks[0]["step_seconds"] == ranks[-1]["step_seconds"]
