"""``lmforge train dsla`` and ``lmforge serve-sim``: DSLA-Serve (Ro et al., ICML 2025).

``train dsla`` orders a model's layers by last-token attention entropy, chain-converts the first
``--layers`` of them to dual-state linear attention (local MSE, then the official distillation loss),
checkpoints after every stage (rerunning the same command resumes) and writes ``dsla.safetensors``
(the DSLA parameters only), ``stages.json`` and ``dsla.json``. ``serve-sim`` replays a load file
against the base model with the official swap policy, converting the trained layers under load and
restoring them when it drains, and writes the policy trace.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Annotated, Any

import typer

from lmforge.commands.groups import top_app, train_app
from lmforge.common.errors import UserError

JsonOpt = Annotated[bool, typer.Option("--json", help="Print results as JSON on stdout.")]
PickleOpt = Annotated[bool, typer.Option("--allow-pickle", help="Also load pickle weights (*.bin); they can run code.")]
RemoteOpt = Annotated[bool, typer.Option("--trust-remote-code", help="Run the model folder's own Python code.")]
MAX_CONV_RATE = 0.75


def _emit(obj: Any) -> None:
    typer.echo(json.dumps(obj, indent=2, default=str))


@train_app.command("dsla")
def train_dsla_cmd(
    model: Annotated[str, typer.Option("--model", "-m", help="A local HF Llama-style causal LM folder, real:NAME, .gguf or zoo:NAME.")],
    out: Annotated[Path, typer.Option(help="Output folder: dsla.safetensors, stages.json, dsla.json. Rerunning the same command resumes after the last finished stage.")],
    layers: Annotated[int, typer.Option(help="How many layers to convert, lowest attention entropy first (at most 75% of the layers, the official cap).")] = 4,
    local_steps: Annotated[int, typer.Option(help="Per stage: MSE steps fitting the new layer to the teacher's attention output (0: skip).")] = 60,
    joint_steps: Annotated[int, typer.Option(help="Per stage: steps of the official loss CE + alpha*KL + beta*MSE.")] = 30,
    lr: Annotated[float, typer.Option(help="AdamW learning rate of the DSLA parameters.")] = 1e-3,
    alpha: Annotated[float, typer.Option(help="KL weight (official soft_loss: 0.001).")] = 0.001,
    beta: Annotated[float, typer.Option(help="Hidden-state MSE weight (official align_loss: 0.01).")] = 0.01,
    hidden_index: Annotated[str, typer.Option(help="output: MSE on each converted layer's output (the paper); official: transformers' hidden_states[l], the official code's off-by-one.")] = "output",
    energy_init: Annotated[bool, typer.Option(help="Fold ||teacher||/||DSLA|| into o_proj before training (a deviation: the official init's outputs are 50-110x too large).")] = False,
    single_state: Annotated[bool, typer.Option(help="The single-state GLA ablation instead of DSLA's two states.")] = False,
    data: Annotated[Path | None, typer.Option(help="Training text: .jsonl with a 'text' field, .json, or plain text. Default: the Paul Graham essays' calibration split.")] = None,
    windows: Annotated[int, typer.Option(help="Training windows drawn from the text.")] = 64,
    seq_len: Annotated[int, typer.Option(help="Tokens per window.")] = 256,
    batch_size: Annotated[int, typer.Option(help="Windows per step.")] = 4,
    seed: Annotated[int, typer.Option(help="Seed of the windows and of the DSLA initialisation.")] = 0,
    overwrite: Annotated[bool, typer.Option(help="Delete an existing output folder and start again.")] = False,
    allow_pickle: PickleOpt = False,
    trust_remote_code: RemoteOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Chain-distil a model's lowest-entropy attention layers into dual-state linear attention.

    \b
    Examples:
      lmforge train dsla -m real:smollm2-135m-instruct --layers 4 --out runs/dsla
      lmforge train dsla -m path/to/llama --layers 8 --energy-init --data corpus.jsonl --out runs/dsla8
    """
    import copy

    import torch

    from lmforge.common.io import atomic_write_json
    from lmforge.data.calibration import read_texts, token_windows
    from lmforge.methods.dsla.convert import attention_modules
    from lmforge.methods.dsla.distill import DistillConfig, chain_distill
    from lmforge.methods.dsla.layer import DSLAConfig
    from lmforge.methods.dsla.order import entropy_order
    from lmforge.models import load

    for name, val, low in (("--layers", layers, 1), ("--local-steps", local_steps, 0), ("--joint-steps", joint_steps, 0),
                           ("--windows", windows, 1), ("--seq-len", seq_len, 2), ("--batch-size", batch_size, 1)):
        if val < low:
            raise UserError(f"{name} must be at least {low}, got {val}")
    if lr <= 0 or alpha < 0 or beta < 0:
        raise UserError("--lr must be positive and --alpha/--beta non-negative")
    if hidden_index not in ("output", "official"):
        raise UserError(f"--hidden-index must be output or official, not {hidden_index!r}")
    if out.exists() and not out.is_dir():
        raise UserError(f"--out '{out}' is a file, not a folder")
    if out.exists() and any(out.iterdir()) and not (out / "stages.json").is_file() and not overwrite:
        raise UserError(f"output '{out}' exists and is not a DSLA run to resume; pass --overwrite to replace it")
    if data is not None and not data.is_file():
        raise UserError(f"--data file {data} does not exist")
    teacher, tok = load(model, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code)
    attention_modules(teacher)  # one line naming the class when the attention is not Llama-style
    n_layers = teacher.config.num_hidden_layers
    cap = int(MAX_CONV_RATE * n_layers)
    if layers > cap:
        raise UserError(f"--layers {layers} is over the official cap of 75% of the model's {n_layers} layers ({cap})")
    if data is None:
        from lmforge.data import essays

        texts = essays.split("calibration")
    else:
        texts = read_texts(data)
    train = torch.cat(token_windows(tok, texts, windows, seq_len, seed))
    order, entropies = entropy_order(teacher, train[:1])
    chosen = order[:layers]
    cfg = DistillConfig(local_steps=local_steps, joint_steps=joint_steps, lr=lr, alpha=alpha, beta=beta,
                        hidden_index=hidden_index, energy_init=energy_init, batch_size=batch_size, seed=seed)
    dcfg = DSLAConfig(n_states=1 if single_state else 2, seed=seed)
    if overwrite and out.exists():
        shutil.rmtree(out)
    say = (lambda m: None) if as_json or os.environ.get("LMFORGE_NO_PROGRESS") == "1" else (
        lambda m: typer.echo(m, err=True))
    say(f"conversion order (ascending entropy): {order}; converting {chosen}")
    student = copy.deepcopy(teacher)
    logs = chain_distill(student, teacher, chosen, train, cfg, dcfg, ckpt_dir=out, progress=say)
    record = {"model": model, "layers": chosen, "order": order, "entropies": entropies, "n_layers": n_layers,
              "dsla": {"n_states": dcfg.n_states, "seed": seed},
              "stages": [{"layer": s.layer, "local_mse_last": s.local_mse[-1] if s.local_mse else None,
                          "joint_loss_last": s.joint_loss[-1] if s.joint_loss else None,
                          "energy_factor": s.energy_factor} for s in logs]}
    atomic_write_json(out / "dsla.json", record)
    if as_json:
        _emit(record)
        return
    typer.echo(f"converted {len(logs)} layers {chosen} of {n_layers}; saved to {out} (dsla.safetensors, stages.json, "
               "dsla.json)")


@top_app.command("serve-sim")
def serve_sim_cmd(
    model: Annotated[Path, typer.Option("--model", "-m", help="A `lmforge train dsla` output folder (its base model is loaded from dsla.json).")],
    load_file: Annotated[Path, typer.Option("--load", help="Requests, JSON lines: {\"arrival_s\": number >= 0 (non-decreasing), \"prompt_tokens\": int >= 1, \"max_new_tokens\": int >= 1}.")],
    out: Annotated[Path | None, typer.Option(help="Write the policy trace here (JSON lines).")] = None,
    time_scale: Annotated[float, typer.Option(help="Multiply the official cooldown (60 s) and poll interval (5 s); 1 is the official policy.")] = 1.0,
    dtype: Annotated[str, typer.Option(help="Serving dtype: bfloat16 or float32.")] = "bfloat16",
    seed: Annotated[int, typer.Option(help="Seed of the random prompt tokens.")] = 0,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing trace file.")] = False,
    allow_pickle: PickleOpt = False,
    trust_remote_code: RemoteOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Serve a simulated request stream with DSLA-Serve's swap policy (convert under load, restore when it drains).

    \b
    Example:
      lmforge serve-sim -m runs/dsla --load requests.jsonl --time-scale 0.01 --out trace.jsonl
    """
    from lmforge.common.io import check_output_file
    from lmforge.methods.dsla.serve import read_load_file

    meta_path = model / "dsla.json"
    if not meta_path.is_file() or not (model / "dsla.safetensors").is_file():
        raise UserError(f"{model} is not a `lmforge train dsla` output (no dsla.json / dsla.safetensors)")
    if time_scale <= 0:
        raise UserError(f"--time-scale must be positive, got {time_scale}")
    if dtype not in ("bfloat16", "float32"):
        raise UserError(f"--dtype must be bfloat16 or float32, not {dtype!r}")
    if out is not None:
        check_output_file(out, overwrite)
    requests = read_load_file(load_file)
    import torch
    from safetensors.torch import load_file as read_safetensors

    from lmforge.common.io import atomic_write_text
    from lmforge.methods.dsla.convert import load_dsla_state, restore_layers
    from lmforge.methods.dsla.layer import DSLAConfig
    from lmforge.methods.dsla.policy import SwapPolicy
    from lmforge.methods.dsla.serve import ServeRuntime, engine_serve_fn
    from lmforge.models import load

    meta = json.loads(meta_path.read_text())
    base, tok = load(meta["model"], allow_pickle=allow_pickle, trust_remote_code=trust_remote_code, dtype=dtype)
    state = {k: v.to(getattr(torch, dtype)) for k, v in read_safetensors(str(model / "dsla.safetensors")).items()}
    trained = [layer for layer in meta["layers"] if any(f".layers.{layer}." in k for k in state)]
    dcfg = DSLAConfig(n_states=meta["dsla"]["n_states"], seed=meta["dsla"]["seed"])

    def convert(layer: int) -> None:
        load_dsla_state(base, {k: v for k, v in state.items() if f".layers.{layer}." in k}, dcfg)

    runtime = ServeRuntime(SwapPolicy(n_layers=meta["n_layers"], order=trained), convert,
                           lambda layer: restore_layers(base, [layer]), engine_serve_fn(base, tok, seed),
                           time_scale=time_scale)
    trace = runtime.run(requests, tail_s=float("inf"))
    summary = trace.summary()
    if out is not None:
        lines = []
        for e in trace.events:
            lines.append(json.dumps({"time_s": e.time_s, "kind": e.kind, "ref": e.ref, "queue_len": e.queue_len,
                                     "max_prompt": e.max_prompt, "converted": list(e.converted),
                                     "duration_s": e.duration_s}))
        atomic_write_text(out, "\n".join(lines) + "\n")
    if as_json:
        _emit(summary)
        return
    swaps = trace.swaps()
    typer.echo(f"{len(requests)} requests; {len(swaps)} swaps: " + ", ".join(f"{k} {layer}" for k, layer in swaps))
    lat = trace.latencies_s()
    if lat:
        typer.echo(f"latency (virtual s): median {sorted(lat)[len(lat) // 2]:.3f}, max {max(lat):.3f}")
    if out is not None:
        typer.echo(f"trace: {out}")
