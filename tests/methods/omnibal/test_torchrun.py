"""The runtime on ranks torchrun starts (``-m lmforge.methods.omnibal.torchrun``).

(a) bad arguments and a missing torchrun environment are one ``error:`` line and exit 2, before any
    process group is joined (in-process): non-ASCII digits in RANK, no MASTER_ADDR/MASTER_PORT, and a
    ``--plan`` made for another stage count or device, combined with ``--boundaries``, or missing a
    key; a plan from ``lmforge train omnibal`` gives its BMP boundaries and recompute set;
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
from tests.cli.helpers import call
from tests.cli.test_omnibal_cli import _lengths

MODEL = ["--vit-layers", "2", "--llm-layers", "3", "--d-model", "16", "--patch-tokens", "4", "--vit-mlp-ratio", "4"]
ENV = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2"}
MASTER = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}
ONE = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"}


def _setenv(monkeypatch, env: dict[str, str]) -> None:
    for k in (*ENV, *MASTER):
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)


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
    ({**ENV, "RANK": "\u00b2"}, ["--pp", "2"], "RANK='\u00b2'"),  # "²".isdigit() is True, int("²") raises
    ({**ENV, "WORLD_SIZE": "\u0662"}, ["--pp", "2"], "WORLD_SIZE='\u0662'"),  # Arabic-Indic two
    (ENV, ["--pp", "2"], "MASTER_ADDR=None MASTER_PORT=None"),  # all else valid: stops before the rendezvous
    (ONE, ["--pp", "1"], "MASTER_ADDR=None"),  # torch's env:// reads both for one rank too
    ({**ENV, **MASTER, "MASTER_PORT": "http"}, ["--pp", "2"], "MASTER_PORT='http'"),
    ({**ENV, **MASTER, "MASTER_PORT": "70000"}, ["--pp", "2"], "port 1..65535"),
    ({**ENV, "MASTER_ADDR": "127.0.0.1"}, ["--pp", "2"], "MASTER_PORT=None"),
])
def test_bad_arguments_are_one_line(tmp_path, monkeypatch, capsys, env, args, message):
    _setenv(monkeypatch, env)
    assert T.main([*args, *MODEL, "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error:") and message in err[0], err
    assert not (tmp_path / "o").exists()


@pytest.fixture
def plan_file(tmp_path, monkeypatch, capsys):
    """An omnibal.json from `lmforge train omnibal` for the test model: 2 stages on the CPU."""
    lengths, out = tmp_path / "lengths.json", tmp_path / "plan"
    _lengths(lengths)
    code, _, err = call(monkeypatch, capsys, "train", "omnibal", "--lengths", str(lengths), "--out", str(out),
                        "--steps", "0", "--stages", "2", "--micro-batches", "4", "--vit-cap", "9", "--token-cap",
                        "2600", "--dp", "2", "--rounds", "5", "--capacity-source", "modelled", *MODEL)
    assert code == 0, err
    return out / "omnibal.json"


def test_a_plan_gives_its_partition_and_recompute_set(plan_file):
    report = json.loads(plan_file.read_text())
    args = T._parser().parse_args(["--pp", "2", "--plan", str(plan_file), "--out", "o"])
    cfg, bounds, rec, tiles, text = T._config(args)
    assert bounds == report["partition"]["bmp"] and rec == set(report["recompute"]["recomputed_layers"])
    assert [tiles, text] == report["model"]["profiled_shape"]
    assert (cfg.vit_layers, cfg.llm_layers, cfg.d_model, cfg.patch_tokens, cfg.vit_mlp_ratio) == (2, 3, 16, 4, 4)
    args = T._parser().parse_args(["--pp", "2", "--plan", str(plan_file), "--out", "o", "--recompute", "1"])
    assert T._config(args)[2] == {1}  # --recompute replaces the plan's set on the plan's partition


def _drop(report: dict, key: str) -> dict:
    a, _, b = key.partition(".")
    if b:
        del report[a][b]
    else:
        del report[a]
    return report


@pytest.mark.parametrize(("edit", "args", "message"), [
    (None, ["--pp", "4", "--micro-batches", "4"],
     "was made for 2 stages on cpu, this run has --pp 4 --device cpu: make the plan with "
     "`lmforge train omnibal --stages 4 --device cpu` on the target machine"),
    (None, ["--pp", "2", "--backend", "nccl", "--device", "cuda"],
     "was made for 2 stages on cpu, this run has --pp 2 --device cuda: make the plan with "
     "`lmforge train omnibal --stages 2 --backend nccl --device cuda` on the target machine"),
    (None, ["--pp", "2", "--boundaries", "3"], "--boundaries with --plan"),
    ("partition", ["--pp", "2"], "no partition.bmp"),
    ("recompute", ["--pp", "2"], "no recompute.recomputed_layers"),
    ("recompute.recomputed_layers", ["--pp", "2"], "no recompute.recomputed_layers"),
    ("run", ["--pp", "2"], "no run.device"),  # a plan written before run.device existed
    ("model.d_model", ["--pp", "2"], "no model.d_model"),
    ("not json", ["--pp", "2"], "cannot read it as JSON"),
    ("list", ["--pp", "2"], "no model.vit_layers"),
])
def test_bad_plans_are_one_line(tmp_path, monkeypatch, capsys, plan_file, edit, args, message):
    _setenv(monkeypatch, {**ENV, **MASTER})
    if edit == "not json":
        plan_file.write_text("{oops")
    elif edit == "list":
        plan_file.write_text("[]")
    elif edit is not None:
        plan_file.write_text(json.dumps(_drop(json.loads(plan_file.read_text()), edit)))
    capsys.readouterr()
    assert T.main([*args, "--plan", str(plan_file), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --") and message in err[0], err
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
