"""``lmforge agent mor-data``, ``mor-train`` and ``mor-run``: MoRAgent (Han et al., ICML 2025),
Mixture-of-Roles parameter-efficient tuning of one model that plays three agent roles.

- ``mor-data``: function-calling records (xLAM style, or a seeded sample of a packaged BFCL category)
  into verified three-role trajectories (reasoner, executor, summarizer), JSON lines, with a report
  of what was dropped and why (:mod:`lmforge.methods.moragent.data`).
- ``mor-train``: a MoR adapter (or the equal-parameter LoRA baseline) on the top decoder layers of a
  model, trained on those trajectories; the folder holds the adapter only, never the base weights
  (:mod:`lmforge.methods.moragent.train`).
- ``mor-run``: the three-role agent loop (:mod:`lmforge.methods.moragent.agent`) on BFCL entries
  (AST accuracy by BFCL's checker) or on xLAM records (exact match of the calls against the gold
  answers), with or without an adapter.

Every option is checked, and every input file read, before a model is loaded.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path
from typing import Annotated, Any

import typer

from lmforge.commands.groups import agent_app
from lmforge.common.errors import UserError

ADAPTERS = ("mor", "lora")
DTYPES = ("bfloat16", "float32")
_MODEL_HELP = "The base model: a local HF folder, a .gguf, real:NAME or zoo:NAME."
_BFCL_HELP = ("Packaged BFCL categories instead of --input, comma-separated: simple_python, multiple, "
              "parallel, parallel_multiple{} (needs the bfcl-eval package).")
_INPUT_HELP = ("Function-calling records, a JSON list or JSON lines of xLAM-style objects: 'query', 'tools' "
               "(each with 'name' and 'parameters'), 'answers' (the gold calls, each {{'name', 'arguments'}}); "
               "'tools'/'answers' may be JSON strings as in the xLAM-60k dump.{}")


# ---------------------------------------------------------------------------------- option checks


def _at_least(flag: str, value: int | float, minimum: int | float = 1) -> None:
    if value < minimum:
        raise UserError(f"{flag} must be at least {minimum}, got {value}")


def _int_list(flag: str, text: str) -> tuple[int, ...]:
    try:
        values = tuple(int(v) for v in text.split(","))
    except ValueError:
        raise UserError(f"{flag} takes comma-separated integers (e.g. 3,3,2), got {text!r}") from None
    return values


def _mor_config(rank: int, routed: str, top_k: str) -> Any:
    """The MoR shape, validated (a top-k larger than its group is a one-line UserError)."""
    from lmforge.methods.moragent.layer import MoRConfig

    return MoRConfig(rank=rank, routed=_int_list("--routed", routed), top_k=_int_list("--top-k", top_k))


def _one_source(input_file: Path | None, bfcl: str | None) -> None:
    if (input_file is None) == (bfcl is None):
        raise UserError("give exactly one of --input FILE and --bfcl CATEGORY")


def _categories(text: str, allow_irrelevance: bool) -> list[str]:
    from lmforge.data.bfcl import CATEGORIES

    cats = [c.strip() for c in text.split(",") if c.strip()]
    known = [c for c in CATEGORIES if allow_irrelevance or c != "irrelevance"]
    for c in cats or [text]:
        if c == "irrelevance" and not allow_irrelevance:
            raise UserError("--bfcl irrelevance has no gold calls to build trajectories on; "
                            f"use {', '.join(known)}")
        if c not in known:
            raise UserError(f"unknown BFCL category {c!r} for --bfcl; known: {', '.join(known)}")
    return list(dict.fromkeys(cats))


def _bfcl_entries(categories: list[str], n: int, seed: int) -> list[Any]:
    from lmforge.data.bfcl import sample

    return [rec for cat in categories for rec in sample(cat, seed, n)]


def _as_record(entry: Any) -> dict[str, Any]:
    """A BFCL entry as the xLAM-style record the agent reads (irrelevance: no gold calls)."""
    from lmforge.methods.moragent.data import from_bfcl

    if entry.ground_truth is not None:
        return from_bfcl(entry)
    users = [m["content"] for m in entry.messages if m.get("role") == "user"]
    return {"query": users[-1] if users else "", "tools": list(entry.functions), "answers": [], "id": entry.id}


def _report_path(out: Path) -> Path:
    """``traj.jsonl`` -> ``traj.report.json`` beside it."""
    stem = out.name[: -len(out.suffix)] if out.suffix else out.name
    return out.with_name(f"{stem}.report.json")


# ------------------------------------------------------------------------------------- mor-data


def _make_completer(spec: str, base_url: str | None, key_env: str, max_tokens: int) -> Any:
    from lmforge.methods.moragent.data import make_completer

    if spec == "template":
        return make_completer(spec)
    from lmforge.methods.minions.apply import is_local_model

    if base_url is None and not is_local_model(spec):
        raise UserError(f"--completer {spec!r} is not 'template', zoo:NAME or a local model folder; "
                        "give --base-url to use a model served by an OpenAI-compatible server")
    return make_completer(spec, base_url=base_url, max_tokens=max_tokens, key_env=key_env, require_key=False)


def _drop_summary(report: dict[str, Any]) -> str:
    by = report["dropped_by_reason"]
    return ", ".join(f"{reason} {count}" for reason, count in by.items())


@agent_app.command("mor-data")
def mor_data(
    out: Annotated[Path, typer.Option(help="Trajectory file to write (JSON lines, one trajectory a line: 'segments' of {role, text} with roles user, reasoner, executor, observation, summarizer, and 'meta'); the data report goes beside it as OUT.report.json (total, kept, dropped, dropped_by_reason, drops).")],
    input_file: Annotated[Path | None, typer.Option("--input", help=_INPUT_HELP.format(""))] = None,
    bfcl: Annotated[str | None, typer.Option(help=_BFCL_HELP.format(""))] = None,
    n: Annotated[int, typer.Option(help="With --bfcl: entries sampled per category.")] = 50,
    seed: Annotated[int, typer.Option(help="With --bfcl: seed of the sample (the same seed gives the same entries).")] = 0,
    completer: Annotated[str, typer.Option(help="Who writes the reasoner and summarizer texts: 'template' (deterministic, no model), zoo:NAME or a local HF folder (in-process), or a model name served at --base-url.")] = "template",
    base_url: Annotated[str | None, typer.Option(help="OpenAI-compatible /v1 URL of the server running --completer.")] = None,
    key_env: Annotated[str, typer.Option(help="Environment variable holding the served completer's API key (keys are never taken on the command line).")] = "OPENAI_API_KEY",
    max_tokens: Annotated[int, typer.Option(help="Completion tokens per role text of a model completer.")] = 128,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing OUT and OUT.report.json.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report's counts as JSON on stdout.")] = False,
) -> None:
    """Build verified three-role trajectories (reasoner -> executor -> observation -> ... -> summarizer)
    from function-calling records.

    Every gold call runs against a deterministic tool stub; a record is dropped, and counted under its
    reason, when a call fails (call_error), a reasoner text names the wrong next role (bad_next_role),
    or the summary states a value the observations do not hold (ungrounded_summary) or none of them
    (summary_mentions_nothing). Writes OUT (the kept trajectories) and OUT.report.json.
    """
    from lmforge.common.io import atomic_write_json, check_output_file

    _one_source(input_file, bfcl)
    _at_least("--n", n)
    _at_least("--max-tokens", max_tokens)
    categories = _categories(bfcl, allow_irrelevance=False) if bfcl is not None else []
    report_path = _report_path(out)
    check_output_file(out, overwrite)
    check_output_file(report_path, overwrite)
    from lmforge.methods.moragent.data import build_trajectories, read_function_calls, write_trajectories

    if input_file is not None:
        records, source = read_function_calls(input_file), {"input": str(input_file)}
    else:
        records = [_as_record(e) for e in _bfcl_entries(categories, n, seed)]
        source = {"bfcl": categories, "n": n, "seed": seed}
    kept, report = build_trajectories(records, _make_completer(completer, base_url, key_env, max_tokens))
    if not kept:
        raise UserError(f"no trajectory kept of {report['total']} records (dropped: {_drop_summary(report)}); "
                        "nothing written")
    write_trajectories(kept, out)
    atomic_write_json(report_path, {**report, "source": source, "completer": completer})
    counts = {k: report[k] for k in ("total", "kept", "dropped", "dropped_by_reason")}
    if as_json:
        typer.echo(json.dumps({**counts, "out": str(out), "report": str(report_path)}, indent=2))
    else:
        typer.echo(f"kept {report['kept']} of {report['total']} records (dropped {report['dropped']}: "
                   f"{_drop_summary(report)}); wrote {out} and {report_path}")


# ------------------------------------------------------------------------------------ mor-train


def _check_train_options(adapter: str, layers: int | None, steps: int, lr: float, batch_size: int, max_len: int,
                         warmup: int | None) -> None:
    if adapter not in ADAPTERS:
        raise UserError(f"--adapter must be one of {', '.join(ADAPTERS)}, got {adapter!r}")
    for flag, value in (("--layers", 1 if layers is None else layers), ("--steps", steps), ("--batch-size", batch_size)):
        _at_least(flag, value)
    _at_least("--max-len", max_len, 2)
    if warmup is not None:
        _at_least("--warmup", warmup, 0)
    if not lr > 0:
        raise UserError(f"--lr must be > 0, got {lr}")


def _train_with_progress(model: Any, tok: Any, examples: list[Any], settings: Any) -> dict[str, Any]:
    from lmforge.common.progress import make_progress
    from lmforge.methods.moragent.train import train_adapter

    with make_progress() as prog:
        task = prog.add_task("mor-train", total=settings.steps, info="")
        settings.log = lambda step, loss: prog.update(task, advance=1, info=f"loss {loss:.4f}")
        try:
            return train_adapter(model, tok, examples, settings)
        finally:
            settings.log = None


@agent_app.command("mor-train")
def mor_train(
    model: Annotated[str, typer.Option("--model", "-m", help=_MODEL_HELP)],
    data: Annotated[Path, typer.Option(help="Trajectories written by `lmforge agent mor-data` (JSON lines; every segment needs a role tag among user, reasoner, executor, observation, summarizer).")],
    out: Annotated[Path, typer.Option(help="Adapter folder to write (the adapter only, never the base weights): mor_adapter.safetensors + mor_config.json for MoR, adapter_model.safetensors + adapter_config.json (peft) for LoRA, and mor_train.json (the adapter info, settings, per-step losses).")],
    adapter: Annotated[str, typer.Option(help="mor (Mixture-of-Roles: per-role routed expert groups with shared experts) or lora (the baseline: one LoRA on the same layers and projections, its rank picked to match MoR's trainable-parameter count).")] = "mor",
    layers: Annotated[int | None, typer.Option(help="Adapt the top N decoder layers (all seven projections of each); default all of them, the official configuration (on CPU, a few top layers are what fits).")] = None,
    rank: Annotated[int, typer.Option(help="Rank of every MoR expert; 16 is the official (hard-coded) rank (LoRA: the rank follows from the parameter match).")] = 16,
    routed: Annotated[str, typer.Option(help="Routed experts per role group (reasoner,executor,summarizer); the paper's 4,4,3.")] = "4,4,3",
    top_k: Annotated[str, typer.Option(help="Experts the router keeps per group (reasoner,executor,summarizer), each at most its group's --routed size; the paper's 3,3,2.")] = "3,3,2",
    steps: Annotated[int, typer.Option(help="Optimiser steps (AdamW, linear warm-up, cosine decay).")] = 60,
    # NOTE: the paper's lr (5e-5, from a third-party digest, unconfirmed) goes with 4 epochs of ~80k
    # samples per role; 1e-3 suits the short runs this command is used for here.
    lr: Annotated[float, typer.Option(help="Peak learning rate (the paper's run, 4 epochs of ~80k samples per role, is reported to use 5e-5; short runs need more).")] = 1e-3,
    batch_size: Annotated[int, typer.Option(help="Trajectories per step.")] = 8,
    warmup: Annotated[int | None, typer.Option(help="Warm-up steps (default: a tenth of --steps, at most 10).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the adapter's initialisation and the batch order.")] = 0,
    max_len: Annotated[int, typer.Option(help="Trajectories longer than this many tokens are left out (and counted).")] = 384,
    bf16: Annotated[bool, typer.Option("--bf16/--no-bf16", help="Autocast the matmuls to bfloat16 (the adapter and optimiser stay float32).")] = True,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing --out folder.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON on stdout.")] = False,
) -> None:
    """Train a MoR adapter (or the equal-parameter LoRA baseline) on three-role trajectories.

    The loss is the cross-entropy on each role's own tokens (user and observation tokens are context),
    plus MoR's auxiliary routing losses. The base model is loaded in float32 and stays frozen.
    """
    _check_train_options(adapter, layers, steps, lr, batch_size, max_len, warmup)
    config = _mor_config(rank, routed, top_k)
    from lmforge.common.io import check_output_dir
    from lmforge.methods.moragent.data import read_trajectories

    trajectories = read_trajectories(data)
    check_output_dir(out, overwrite)

    import torch

    from lmforge.methods.moragent.train import TrainSettings, add_adapter, encode_examples, save_adapter
    from lmforge.models.load import load

    base, tok = load(model, dtype=torch.float32)
    examples, too_long = encode_examples(tok, trajectories, max_len=max_len)
    if not examples:
        raise UserError(f"all {len(trajectories)} trajectories in {data} are longer than --max-len {max_len} tokens")
    n_layers = layers if layers is not None else int(base.config.num_hidden_layers)
    net, info = add_adapter(base, adapter, list(range(-n_layers, 0)), config=config, seed=seed)
    settings = TrainSettings(steps=steps, lr=lr, batch_size=batch_size, seed=seed, bf16=bf16,
                             warmup=warmup if warmup is not None else min(10, steps // 10))
    train_log = _train_with_progress(net, tok, examples, settings)
    log = {"model": model, "data": str(data), "adapter": info, "mor_config": config.to_dict(),
           "settings": {**{k: v for k, v in vars(settings).items() if k != "log"}, "max_len": max_len},
           "trajectories": len(trajectories), "too_long": too_long, **train_log}
    save_adapter(net, out, log, overwrite=overwrite)
    summary = {"adapter": adapter, "trainable": info["trainable"], "layers": info["layers"], "rank": info["rank"],
               "examples": len(examples), "too_long": too_long, "final_loss": train_log["losses"][-1], "out": str(out)}
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
    else:
        typer.echo(f"trainable parameters: {info['trainable']:,} ({adapter}, rank {info['rank']}, decoder layers "
                   f"{info['layers']}); {len(examples)} trajectories ({too_long} too long); final loss "
                   f"{summary['final_loss']:.4f}; saved the adapter to {out}")


# -------------------------------------------------------------------------------------- mor-run


def calls_match(calls: list[dict[str, Any] | None], answers: list[dict[str, Any]]) -> bool:
    """The episode's calls equal the gold answers as a multiset (order-free, as parallel calls are);
    an unparsable call (None) never matches."""
    if len(calls) != len(answers) or any(c is None for c in calls):
        return False
    left = list(answers)
    for call in calls:
        hit = next((i for i, a in enumerate(left)
                    if a["name"] == call["name"] and a["arguments"] == call["arguments"]), None)  # type: ignore[index]
        if hit is None:
            return False
        left.pop(hit)
    return True


def _bfcl_verdict(episode: Any, entry: Any) -> tuple[bool, str]:
    """BFCL's AST verdict on the episode's calls (irrelevance: right when it called nothing)."""
    from lmforge.eval.bfcl_ast import check_calls
    from lmforge.methods.moragent.agent import bfcl_calls

    calls = bfcl_calls(episode)
    if entry.ground_truth is None:
        return not calls, ("called" if calls else "")
    verdict = check_calls(entry.functions, calls, entry.ground_truth, entry.category)
    return verdict.valid, verdict.kind


def _accuracy(rows: list[dict[str, Any]]) -> dict[str, Any]:
    correct = sum(r["correct"] for r in rows)
    return {"episodes": len(rows), "correct": correct, "accuracy": correct / len(rows) if rows else None}


def _score(episodes: list[Any], entries: list[Any] | None) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Per-episode rows (Episode.to_dict plus the verdict) and the results' scores."""
    rows = []
    for i, ep in enumerate(episodes):
        if entries is not None:
            ok, kind = _bfcl_verdict(ep, entries[i])
            rows.append({**ep.to_dict(), "index": i, "category": entries[i].category, "correct": ok, "error": kind})
        else:
            rows.append({**ep.to_dict(), "index": i, "correct": calls_match(ep.calls, ep.record["answers"])})
    scores: dict[str, Any] = {"metric": "bfcl_ast" if entries is not None else "exact_match", **_accuracy(rows),
                              "ended": dict(Counter(ep.ended for ep in episodes))}
    if entries is not None:
        cats = dict.fromkeys(r["category"] for r in rows)
        scores["by_category"] = {c: _accuracy([r for r in rows if r["category"] == c]) for c in cats}
    return rows, scores


def _check_adapter_folder(folder: Path) -> None:
    from lmforge.methods.moragent.adapter import CONFIG_FILE

    if not folder.is_dir():
        raise UserError(f"--adapter {folder} is not a folder")
    if not (folder / CONFIG_FILE).is_file() and not (folder / "adapter_config.json").is_file():
        raise UserError(f"--adapter {folder} is not an adapter folder (no {CONFIG_FILE} for MoR, "
                        "no adapter_config.json for LoRA); train one with `lmforge agent mor-train`")
    if not (folder / CONFIG_FILE).is_file() and not (folder / "adapter_model.safetensors").is_file():
        raise UserError(f"--adapter {folder}: a LoRA adapter folder needs adapter_model.safetensors "
                        "(pickle weights are not loaded)")


def _run_records(bfcl: str | None, input_file: Path | None, n: int, seed: int
                 ) -> tuple[list[Any] | None, list[dict[str, Any]]]:
    """(the BFCL entries or None, the xLAM-style records the agent runs on)."""
    if bfcl is not None:
        entries = _bfcl_entries(_categories(bfcl, allow_irrelevance=True), n, seed)
        return entries, [_as_record(e) for e in entries]
    from lmforge.methods.moragent.data import read_function_calls

    return None, read_function_calls(input_file)  # type: ignore[arg-type]


@agent_app.command("mor-run")
def mor_run(
    model: Annotated[str, typer.Option("--model", "-m", help=_MODEL_HELP)],
    out: Annotated[Path, typer.Option(help="Output folder: episodes.jsonl (per record: id, index, why the episode ended, its parsed calls, its segments, whether it was right) and results.json (accuracy overall and per BFCL category, or exact match for --input; episodes counted by how they ended; the settings).")],
    adapter: Annotated[Path | None, typer.Option(help="Adapter folder from `lmforge agent mor-train` (MoR or LoRA); none runs the base model.")] = None,
    bfcl: Annotated[str | None, typer.Option(help=_BFCL_HELP.format(", irrelevance") + " Scored by BFCL's AST checker.")] = None,
    input_file: Annotated[Path | None, typer.Option("--input", help=_INPUT_HELP.format(" Scored by exact match of the calls (order-free) against 'answers'."))] = None,
    n: Annotated[int, typer.Option(help="With --bfcl: entries sampled per category.")] = 50,
    seed: Annotated[int, typer.Option(help="With --bfcl: seed of the sample (the same as mor-data's gives the same entries).")] = 0,
    max_steps: Annotated[int, typer.Option(help="Role segments the agent may generate per episode (then it ends as step_limit).")] = 8,
    max_new_tokens: Annotated[int, typer.Option(help="Token budget of each generated segment.")] = 96,
    batch_size: Annotated[int, typer.Option(help="Episodes per forward pass.")] = 16,
    dtype: Annotated[str, typer.Option(help="Base model dtype: bfloat16 or float32 (a MoR adapter computes in float32 either way).")] = "bfloat16",
    overwrite: Annotated[bool, typer.Option(help="Replace an existing --out folder.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the scores as JSON on stdout.")] = False,
) -> None:
    """Run the three-role agent (reasoner -> executor -> observation -> ... -> summarizer) on BFCL entries
    or function-calling records, greedy, and score its calls."""
    from lmforge.common.io import atomic_dir, atomic_write_json, atomic_write_text, check_output_dir

    _one_source(input_file, bfcl)
    for flag, value in (("--n", n), ("--max-steps", max_steps), ("--max-new-tokens", max_new_tokens),
                        ("--batch-size", batch_size)):
        _at_least(flag, value)
    if dtype not in DTYPES:
        raise UserError(f"--dtype must be one of {', '.join(DTYPES)}, got {dtype!r}")
    if adapter is not None:
        _check_adapter_folder(adapter)
    entries, records = _run_records(bfcl, input_file, n, seed)
    check_output_dir(out, overwrite)

    import torch

    from lmforge.common.progress import progress_enabled
    from lmforge.methods.moragent.agent import run_agent
    from lmforge.methods.moragent.train import load_adapter
    from lmforge.models.load import load

    # bfloat16 works with both adapters (checked): MoR's parameters stay float32 and its layer casts the
    # input up and the sum back to bfloat16; peft loads LoRA weights in float32 and casts likewise.
    net, tok = load(model, dtype=torch.bfloat16 if dtype == "bfloat16" else torch.float32)
    if adapter is not None:
        net = load_adapter(net, adapter)
    episodes = run_agent(net, tok, records, max_steps=max_steps, batch_size=batch_size,
                         max_new_tokens=dict.fromkeys(("reasoner", "executor", "summarizer"), max_new_tokens),
                         progress=progress_enabled())
    rows, scores = _score(episodes, entries)
    results = {**scores, "model": model, "adapter": str(adapter) if adapter is not None else None,
               "source": {"bfcl": bfcl, "n": n, "seed": seed} if bfcl is not None else {"input": str(input_file)},
               "settings": {"max_steps": max_steps, "max_new_tokens": max_new_tokens, "dtype": dtype}}
    with atomic_dir(out, overwrite=overwrite) as tmp:
        atomic_write_text(tmp / "episodes.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        atomic_write_json(tmp / "results.json", results)
    if as_json:
        typer.echo(json.dumps(scores, indent=2))
    else:
        ended = ", ".join(f"{k} {v}" for k, v in scores["ended"].items())
        typer.echo(f"{scores['metric']} accuracy {scores['correct']}/{scores['episodes']} = {scores['accuracy']:.3f} "
                   f"(episodes ended: {ended}); saved to {out}")
