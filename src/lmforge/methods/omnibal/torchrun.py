"""The OmniBal runtime on ranks that torchrun starts: ``torchrun ... -m lmforge.methods.omnibal.torchrun``.

:func:`~lmforge.methods.omnibal.pipeline.launch` spawns the ranks of one machine itself (file://
rendezvous). On more ranks and nodes, ``torchrun`` starts one process per rank and this module runs
the same :func:`~lmforge.methods.omnibal.pipeline.train_steps` in each:

* :func:`env_grid` reads what torchrun sets in every process: ``RANK`` (global rank),
  ``WORLD_SIZE``, ``LOCAL_RANK`` (the rank on its node: its CUDA device ``cuda:LOCAL_RANK``) and
  ``LOCAL_WORLD_SIZE``; ``MASTER_ADDR`` and ``MASTER_PORT`` are read by
  ``torch.distributed.init_process_group`` (the ``env://`` rendezvous).
* The process grid is ``dp × pp`` with ``dp = WORLD_SIZE / pp``: rank ``r`` is stage ``r mod pp``
  of replica ``r div pp`` (:func:`~lmforge.methods.omnibal.pipeline.train_steps`), so a replica's
  stages are consecutive ranks: on one node when ``pp`` divides the ranks per node.
* The model, partition and recompute plan are given (``--boundaries``, ``--recompute``, model
  sizes) or read from an ``omnibal.json`` written by ``lmforge train omnibal`` (``--plan``: the
  model, BMP's partition, the recompute plan, the profiled micro-batch shape). A plan is for the
  stage count and device it was made for (``partition.stages``, ``run.device``): make it with
  ``lmforge train omnibal --stages PP --device DEVICE`` on the target machine, where its memory
  capacity is measured (this runtime measures nothing). ``--boundaries`` is refused with
  ``--plan``: the plan's recompute set was chosen for its own partition. Micro-batch shapes
  are drawn from ``--seed`` (:func:`synthetic_plans`) and the data are random, as in
  :func:`~lmforge.methods.omnibal.pipeline.micro_batch`: the runtime is for timing and exactness
  checks, not for training on a data set.
* Each rank writes ``rank{RANK}.json`` into ``--out`` (a shared file system for several nodes):
  its stage, replica, per-step seconds and, on a last stage, its replica's losses.

Bad arguments print one ``error: ...`` line and exit 2 before any process group is joined.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Sequence
from datetime import timedelta
from pathlib import Path
from typing import Any

import numpy as np
import torch

from lmforge.common.errors import UserError
from lmforge.methods.omnibal.bmp import equal_split
from lmforge.methods.omnibal.pipeline import StepPlan, VLMConfig, stage_cuts

DTYPES = {"float32": torch.float32, "float64": torch.float64}


def env_grid() -> tuple[int, int, int, int]:
    """``(RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE)`` as torchrun sets them.

    Raises:
        UserError: a variable is missing or not a non-negative integer (not started by torchrun).
    """
    vals = []
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        raw = os.environ.get(name)
        if raw is None or not (raw.isascii() and raw.isdigit()):  # "²".isdigit(), but int("²") raises
            raise UserError(f"{name}={raw!r} in the environment: start this module with torchrun "
                            "(torchrun --nproc-per-node N -m lmforge.methods.omnibal.torchrun ...)")
        vals.append(int(raw))
    rank, world, local_rank, local_world = vals
    if world < 1 or rank >= world or local_rank >= local_world:
        raise UserError(f"inconsistent torchrun variables RANK={rank} WORLD_SIZE={world} "
                        f"LOCAL_RANK={local_rank} LOCAL_WORLD_SIZE={local_world}")
    return rank, world, local_rank, local_world


def synthetic_plans(steps: int, dp: int, n_micro: int, tiles: int, text: int, seed: int) -> list[StepPlan]:
    """``steps`` plans of ``n_micro`` micro-batches per replica, each ``(n_tiles, T)`` drawn uniformly
    from ``[⌊tiles/2⌋, tiles] × [max(1, ⌊text/2⌋), text]`` by ``seed`` (the same on every rank)."""
    rng = np.random.default_rng(seed)
    lo_n, lo_t = tiles // 2, max(1, text // 2)
    return [StepPlan([[(int(rng.integers(lo_n, tiles + 1)), int(rng.integers(lo_t, text + 1)))
                       for _ in range(n_micro)] for _ in range(dp)]) for _ in range(steps)]


def _ints(raw: str | None, what: str) -> list[int] | None:
    if raw is None:
        return None
    try:
        return [int(v) for v in raw.split(",") if v.strip()]
    except ValueError:
        raise UserError(f"{what} must be comma-separated integers, got {raw!r}") from None


def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="torchrun ... -m lmforge.methods.omnibal.torchrun",
                                 description="OmniBal's pipeline runtime (1F1B x data parallel) on torchrun's ranks.")
    ap.add_argument("--pp", type=int, required=True, help="pipeline stages per replica (dp = WORLD_SIZE / pp)")
    ap.add_argument("--out", type=Path, required=True, help="folder for rank{RANK}.json")
    ap.add_argument("--plan", type=Path, help="omnibal.json from `lmforge train omnibal`: model, BMP partition, "
                                              "recompute plan, micro-batch shape")
    ap.add_argument("--boundaries", help="interior stage cuts, e.g. 5,12 (default: the plan's BMP pick, else equal)")
    ap.add_argument("--recompute", help="recomputed layer indices, e.g. 2,3 (default: the plan's, else none)")
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--micro-batches", type=int, default=4, help="per replica and step (1F1B: at least pp)")
    ap.add_argument("--tiles", type=int, help="largest tiles per micro-batch (default: the plan's shape, else 2)")
    ap.add_argument("--text", type=int, help="largest text tokens per micro-batch (default: the plan's, else 8)")
    ap.add_argument("--backend", default="gloo", help="gloo (CPU) or nccl (CUDA)")
    ap.add_argument("--device", default="cpu", help="cpu, or cuda (each rank on cuda:LOCAL_RANK)")
    ap.add_argument("--vit-layers", type=int, default=2)
    ap.add_argument("--llm-layers", type=int, default=4)
    ap.add_argument("--d-model", type=int, default=32)
    ap.add_argument("--patch-tokens", type=int, default=4)
    ap.add_argument("--vit-mlp-ratio", type=int, default=4)
    ap.add_argument("--dtype", default="float32", help="float32 or float64")
    ap.add_argument("--optimizer", default="adamw", help="adamw or sgd")
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per rank")
    ap.add_argument("--timeout", type=float, default=600.0, help="process-group timeout in seconds")
    return ap


def env_master() -> tuple[str, int]:
    """``(MASTER_ADDR, MASTER_PORT)``, which ``init_process_group``'s ``env://`` rendezvous reads.

    NOTE: checked whatever WORLD_SIZE is: torch's ``env://`` handler reads both for one rank too.

    Raises:
        UserError: one is missing, or the port is not an integer in 1..65535.
    """
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not addr or not port or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise UserError(f"MASTER_ADDR={addr!r} MASTER_PORT={port!r} in the environment: the env:// rendezvous "
                        "needs a host and a port 1..65535 (torchrun sets both)")
    return addr, int(port)


def _read_plan(args: argparse.Namespace) -> dict[str, Any]:
    """``--plan``'s model sizes, micro-batch shape, BMP boundaries and recompute set, checked against
    ``--pp``, ``--device`` and ``--boundaries``.

    Raises:
        UserError: unreadable, a key missing or ill-typed, made for another stage count or device,
            or ``--boundaries`` given too.
    """
    path = args.plan
    if args.boundaries is not None:
        raise UserError(f"--boundaries with --plan {path}: the plan's recompute set was chosen for its own "
                        "partition; drop --boundaries, or --plan (then give --recompute)")
    try:
        report = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"--plan {path}: cannot read it as JSON ({' '.join(str(exc).split())})") from None

    def get(*keys: str) -> Any:
        node: Any = report
        for k in keys:
            if not isinstance(node, dict) or k not in node:
                raise UserError(f"--plan {path}: no {'.'.join(keys)}: not an omnibal.json from "
                                "`lmforge train omnibal`")
            node = node[k]
        return node

    def ints(*keys: str) -> list[int]:
        val = get(*keys)
        if not (isinstance(val, list) and all(isinstance(v, int) and not isinstance(v, bool) for v in val)):
            raise UserError(f"--plan {path}: {'.'.join(keys)} must be a list of integers, got {val!r}")
        return val

    sizes = {k: get("model", k) for k in ("vit_layers", "llm_layers", "d_model", "patch_tokens", "vit_mlp_ratio")}
    plan = {"sizes": sizes, "shape": ints("model", "profiled_shape"), "bmp": ints("partition", "bmp"),
            "recompute": ints("recompute", "recomputed_layers"), "stages": get("partition", "stages"),
            "device": get("run", "device")}
    bad = [k for k, v in (*((f"model.{k}", v) for k, v in sizes.items()), ("partition.stages", plan["stages"]))
           if not isinstance(v, int) or isinstance(v, bool)]
    if bad or len(plan["shape"]) != 2:
        raise UserError(f"--plan {path}: not an omnibal.json from `lmforge train omnibal` (bad "
                        f"{', '.join(bad) or 'model.profiled_shape'})")
    if plan["stages"] != args.pp or plan["device"] != args.device:
        nccl = " --backend nccl" if args.device == "cuda" else ""
        raise UserError(f"--plan {path} was made for {plan['stages']} stages on {plan['device']}, this run has "
                        f"--pp {args.pp} --device {args.device}: make the plan with `lmforge train omnibal "
                        f"--stages {args.pp}{nccl} --device {args.device}` on the target machine")
    return plan


def _config(args: argparse.Namespace) -> tuple[VLMConfig, list[int], set[int], int, int]:
    """The model, boundaries, recompute set and micro-batch maxima from the arguments (and ``--plan``)."""
    plan: dict[str, Any] = {}
    if args.plan is not None:
        plan = _read_plan(args)
        sizes, shape = plan["sizes"], plan["shape"]
    else:
        sizes = {k: getattr(args, k) for k in ("vit_layers", "llm_layers", "d_model", "patch_tokens",
                                                "vit_mlp_ratio")}
        shape = [2, 8]
    if args.dtype not in DTYPES:
        raise UserError(f"--dtype must be float32 or float64, got {args.dtype!r}")
    for name, val, low in (("--pp", args.pp, 1), ("--steps", args.steps, 1), ("--micro-batches", args.micro_batches, 1),
                           ("--threads", args.threads, 1), *((f"--{k.replace('_', '-')}", v, 1) for k, v in
                                                             sizes.items())):
        if val < low:
            raise UserError(f"{name} must be at least {low}, got {val}")
    if args.micro_batches < args.pp:
        raise UserError(f"1F1B needs at least as many micro-batches as stages: --micro-batches {args.micro_batches} "
                        f"< --pp {args.pp}")
    # NOTE: the same model as `lmforge train omnibal` builds from these sizes (two heads when d is even).
    cfg = VLMConfig(n_heads=2 if sizes["d_model"] % 2 == 0 else 1, dtype=DTYPES[args.dtype], **sizes)
    bounds = _ints(args.boundaries, "--boundaries")
    if bounds is None:
        bounds = (list(plan["bmp"]) if plan
                  else equal_split(cfg.n_layers, args.pp) if args.pp <= cfg.n_layers else [])
    if len(bounds) != args.pp - 1:
        raise UserError(f"{len(bounds)} boundaries for --pp {args.pp} (need {args.pp - 1})")
    stage_cuts(bounds, cfg.n_layers)  # raises on empty stages
    rec = _ints(args.recompute, "--recompute")
    rec_set = set(rec if rec is not None else (plan["recompute"] if plan else []))
    bad = sorted(i for i in rec_set if not 0 <= i < cfg.n_layers)
    if bad:
        raise UserError(f"--recompute layers {bad} are outside 0..{cfg.n_layers - 1}")
    tiles = args.tiles if args.tiles is not None else int(shape[0])
    text = args.text if args.text is not None else int(shape[1])
    if tiles < 0 or text < 1:
        raise UserError(f"need --tiles >= 0 and --text >= 1, got {tiles} and {text}")
    return cfg, bounds, rec_set, tiles, text


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Validate, join the process group (``env://``), run :func:`train_steps`, write this rank's JSON."""
    import torch.distributed as dist

    from lmforge.methods.omnibal.pipeline import train_steps

    rank, world, local_rank, local_world = env_grid()
    if args.backend not in ("gloo", "nccl") or args.device not in ("cpu", "cuda"):
        raise UserError(f"--backend gloo|nccl and --device cpu|cuda, got {args.backend!r} / {args.device!r}")
    if (args.backend == "nccl") != (args.device == "cuda"):
        raise UserError("use --backend nccl with --device cuda, and gloo with cpu (gloo sends CPU tensors only)")
    cfg, bounds, rec, tiles, text = _config(args)
    if args.device == "cuda" and local_rank >= torch.cuda.device_count():
        raise UserError(f"LOCAL_RANK {local_rank} has no CUDA device ({torch.cuda.device_count()} visible)")
    if world % args.pp:
        raise UserError(f"WORLD_SIZE {world} is not a multiple of --pp {args.pp}")
    env_master()
    dp = world // args.pp
    plans = synthetic_plans(args.steps, dp, args.micro_batches, tiles, text, args.seed)
    device = "cpu"
    if args.device == "cuda":
        device = f"cuda:{local_rank}"
        torch.cuda.set_device(local_rank)
    torch.set_num_threads(args.threads)
    dist.init_process_group(args.backend, timeout=timedelta(seconds=args.timeout))
    try:
        res = train_steps(rank, world, args.pp, dp, cfg, bounds, rec, plans, args.seed, args.lr,
                          optimizer=args.optimizer, device=device)
    finally:
        dist.destroy_process_group()
    out = {"rank": rank, "world": world, "local_rank": local_rank, "local_world": local_world, "pp": args.pp,
           "dp": dp, "backend": args.backend, "device": device, "boundaries": bounds, "recompute": sorted(rec),
           "model": {"vit_layers": cfg.vit_layers, "llm_layers": cfg.llm_layers, "d_model": cfg.d_model,
                     "patch_tokens": cfg.patch_tokens, "vit_mlp_ratio": cfg.vit_mlp_ratio, "dtype": args.dtype},
           "plans": [p.micro for p in plans],
           **{k: res[k] for k in ("stage", "replica", "step_seconds", "local_seconds", "new_shape", "losses")}}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"rank{rank}.json").write_text(json.dumps(out))
    return out


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point for ``torchrun ... -m lmforge.methods.omnibal.torchrun ARGS``; returns the exit status."""
    args = _parser().parse_args(argv)
    try:
        run(args)
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
