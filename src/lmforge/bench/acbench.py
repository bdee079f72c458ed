"""``lmforge bench acbench``: the ACBench suite over models x compressions, resumable.

A run is a grid of cells (model, setting, task); a setting is ``original`` or a compression spec
``METHOD[:key=value,...]`` (``gptq:bits=4,group_size=64``). For each model the original is loaded
once and kept beside each compressed variant, so every cell also reports the answer NLL of the gold
completions and their KL against the original, and each compressed setting gets ACBench's analysis
(ERank per layer, top-k ranking agreement, energy histograms) on probe texts from the tasks.

Files, all under ``--out``:

* ``results.json``: the run's settings and every finished cell, rewritten atomically after each
  cell; a rerun with the same settings resumes and never recomputes a finished cell.
* ``data/``: the built-in task files (official formats) when no ``--data`` folder is given.
* ``models/``: each compressed model, saved by ``lmforge compress`` (loadable with transformers),
  reused on resume.
* ``report.html`` / ``report.md`` and figures: see :mod:`lmforge.bench.report`.
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lmforge.bench.tasks import CAPABILITIES, Context, EpisodicTask, Item, SingleTurnTask, get_task, parse_task_list
from lmforge.bench.tasks import check_scoring
from lmforge.common.errors import UserError

__all__ = ["BenchOptions", "Setting", "parse_setting", "run_acbench", "RESULTS_VERSION"]

RESULTS_VERSION = 1
ORIGINAL = "original"


@dataclass(frozen=True)
class Setting:
    """A model variant: the original, or a compression method with ``key=value`` overrides."""

    label: str
    method: str | None = None
    overrides: tuple[str, ...] = ()

    @property
    def slug(self) -> str:
        return re.sub(r"[^A-Za-z0-9._-]+", "_", self.label).strip("_") or "original"


def parse_setting(spec: str) -> Setting:
    """``METHOD[:key=value,key=value]``; the method and every key are checked now (one-line errors)."""
    from lmforge.compression import get_method, make_config

    spec = spec.strip()
    if spec in ("", ORIGINAL, "none"):
        return Setting(ORIGINAL)
    method, _, rest = spec.partition(":")
    method = method.strip().lower()
    get_method(method)
    overrides = tuple(p.strip() for p in rest.split(",") if p.strip())
    for o in overrides:
        if "=" not in o:
            raise UserError(f"--compress {spec!r}: {o!r} is not key=value")
    try:
        make_config(method, overrides=list(overrides))
    except UserError as exc:
        raise UserError(f"--compress {spec!r}: {exc}") from None
    label = method + (":" + ",".join(overrides) if overrides else "")
    return Setting(label, method, overrides)


@dataclass
class BenchOptions:
    """Everything a run needs (the CLI's flags)."""

    models: list[str]
    out: Path
    compress: list[str] = field(default_factory=list)
    tasks: list[str] | None = None
    limit: int | None = None
    data_dir: Path | None = None
    prompt_format: str = "auto"
    seed: int = 0
    batch_size: int = 16
    calib_samples: int = 64
    calib_seq_len: int = 256
    embedder: str = "trigram"
    scoring: str = "official"  # "official" | "lmforge" (Context.scoring)
    length_buckets: tuple[int, ...] = (4000, 8000)
    max_steps: int = 30
    analysis_texts: int = 24
    overwrite: bool = False
    allow_pickle: bool = False
    trust_remote_code: bool = False
    report: bool = True
    progress: bool = True
    builtin_sizes: dict[str, int] = field(default_factory=dict)
    builtin_profile: str = "auto"  # zoo | real | auto (zoo when every model is a zoo model)
    # At most this many new tokens per answer (None: each task's own limit); a budget knob for CPU runs.
    max_new_tokens: int | None = None
    dtype: str = "auto"  # inference dtype (lmforge.common.runtime.resolve_dtype); compression stays fp32
    threads: int | None = None  # torch threads (None: torch's choice); recorded in results.json
    task_limits: dict[str, int] = field(default_factory=dict)  # per-task --limit overrides
    shots: int = 0  # worked examples before each WorfBench prompt (Context.shots); 0 = WorfBench's zero-shot


# --------------------------------------------------------------------------------------------------
# Results file


def _cell_key(model: str, setting: str, task: str) -> str:
    return f"{model}|{setting}|{task}"


def _fingerprint(files: dict[str, list[Path]]) -> dict[str, str]:
    return {f"{name}/{p.name}": hashlib.sha256(p.read_bytes()).hexdigest()[:16]
            for name, paths in sorted(files.items()) for p in paths}


class ResultsStore:
    """``results.json``: settings plus finished cells and analyses, written atomically each time."""

    def __init__(self, path: Path, header: dict[str, Any], overwrite: bool) -> None:
        from lmforge.common.io import atomic_write_json

        self.path = path
        self._write = atomic_write_json
        self.data: dict[str, Any] = {"version": RESULTS_VERSION, "header": header, "cells": {}, "analysis": {}}
        if path.is_file() and not overwrite:
            try:
                old = json.loads(path.read_text(encoding="utf-8"))
            except json.JSONDecodeError as exc:
                raise UserError(f"{path}:{exc.lineno}: the results file is not valid JSON; "
                                "move it away or pass --overwrite") from None
            if old.get("version") != RESULTS_VERSION or old.get("header") != header:
                diff = sorted(k for k in set(header) | set(old.get("header", {}))
                              if header.get(k) != old.get("header", {}).get(k))
                raise UserError(f"{path} holds a run with other settings ({', '.join(diff) or 'version'}); "
                                "use another --out, or --overwrite to start afresh")
            self.data = old

    def done(self, key: str) -> bool:
        return key in self.data["cells"]

    def put_cell(self, key: str, cell: dict[str, Any]) -> None:
        self.data["cells"][key] = cell
        self._write(self.path, self.data)

    def put_analysis(self, key: str, value: dict[str, Any]) -> None:
        self.data["analysis"][key] = value
        self._write(self.path, self.data)


# --------------------------------------------------------------------------------------------------
# Data


BUILTIN_PROFILES = ("auto", "zoo", "real")


def builtin_profile(requested: str, models: list[str]) -> str:
    """``zoo`` or ``real`` built-in data: ``auto`` is ``zoo`` when every model is a zoo model."""
    if requested not in BUILTIN_PROFILES:
        raise UserError(f"--builtin-data must be one of {', '.join(BUILTIN_PROFILES)}, not {requested!r}")
    if requested != "auto":
        return requested
    return "zoo" if models and all(m.startswith("zoo:") for m in models) else "real"


def builtin_data(folder: Path, seed: int, tasks: list[str], sizes: dict[str, int] | None = None,
                 profile: str = "zoo") -> dict[str, list[Path]]:
    """Write the built-in files of ``tasks`` into ``folder`` (kept if already there); name -> paths.

    ``profile`` is ``zoo`` (the formats lmforge's tiny models were trained on) or ``real`` (the original
    content where it ships in a package: the Paul Graham haystack and the San Francisco needle)."""
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for name in tasks:
        task = get_task(name)
        task.generate_for(folder, seed + _stable(name), (sizes or {}).get(name, task.default_n), profile)
        out[name] = task.paths(folder)
    return out


def _stable(name: str) -> int:
    return int(hashlib.sha256(name.encode()).hexdigest()[:6], 16)


def user_data(folder: Path, tasks: list[str]) -> dict[str, list[Path]]:
    """The task files of a user's data folder; a task with none is a one-line error naming them."""
    if not folder.is_dir():
        raise UserError(f"--data {folder}: not a folder")
    out = {}
    for name in tasks:
        task = get_task(name)
        paths = task.paths(folder)
        if not paths:
            raise UserError(f"--data {folder}: no {' or '.join(task.files)} for task {name} "
                            "(run with --tasks to choose the tasks you have files for)")
        out[name] = paths
    return out


# --------------------------------------------------------------------------------------------------
# Models


def _prompt_format(requested: str, model_spec: str, tokenizer: Any) -> str:
    if requested not in ("auto", "chat", "plain", "zoo"):
        raise UserError(f"--prompt-format must be auto, chat, plain or zoo, not {requested!r}")
    if requested != "auto":
        return requested
    from lmforge.models.load import resolve_spec

    if (resolve_spec(model_spec) / "zoo.json").is_file():
        return "zoo"
    return "chat" if getattr(tokenizer, "chat_template", None) else "plain"


def compressed_folder(out: Path, model_spec: str, setting: Setting) -> Path:
    """Where a run folder keeps a compressed model (with its ``compression.json``)."""
    return out / "models" / re.sub(r"[^A-Za-z0-9._-]+", "_", model_spec).strip("_") / setting.slug


def _compressed(opts: BenchOptions, model_spec: str, setting: Setting) -> Path:
    """The compressed model's folder under ``out/models`` (compressed now unless already there)."""
    from lmforge.compression import CompressionJob, make_config, run_compression

    folder = compressed_folder(opts.out, model_spec, setting)
    if (folder / "config.json").is_file():
        return folder
    assert setting.method is not None
    job = CompressionJob(
        method=setting.method, model=model_spec, out=str(folder),
        config=make_config(setting.method, overrides=list(setting.overrides)),
        calib_samples=opts.calib_samples, seq_len=opts.calib_seq_len, seed=opts.seed, measure_ppl=False,
        overwrite=False, allow_pickle=opts.allow_pickle, trust_remote_code=opts.trust_remote_code,
        layer_errors=False, progress=opts.progress,
    )
    run_compression(job)
    return folder


def _dense_cache(model: Any) -> None:
    """Packed quantized layers keep their dequantized weight after the first use.

    NOTE: the benchmark measures what the quantized weights compute, not the packed kernels' speed;
    the dequantized weight (the same values, the same math as the packed matmul up to summation
    order) doubles throughput on CPU at the cost of one dense copy of each layer.
    """
    from lmforge.common.qlinear import CodebookQuantLinear, UniformQuantLinear

    for m in model.modules():
        if isinstance(m, (UniformQuantLinear, CodebookQuantLinear)):
            m.cache_weight = True


def get_embedder(name: str) -> Callable[..., Any]:
    """``trigram`` (lmforge's deterministic default) or ``minilm`` (the offline MiniLM package)."""
    from lmforge.eval import metrics

    if name == "trigram":
        return metrics.trigram_embed
    if name == "minilm":
        return metrics.minilm_embedder()
    raise UserError(f"--embedder must be trigram or minilm, not {name!r}")


# --------------------------------------------------------------------------------------------------
# Cells


def _mean_metrics(rows: list[dict[str, float]]) -> dict[str, float]:
    keys = [k for k, v in rows[0].items() if isinstance(v, (int, float))]
    return {k: float(sum(float(r[k]) for r in rows) / len(rows)) for k in keys}


def _generate_texts(model: Any, tok: Any, items: list[Item], batch_size: int, advance: Callable[[int], None]) -> list[str]:
    """Greedy completions of ``items`` (grouped by decoding limits), advancing a bar per batch."""
    from lmforge.common.generation import generate

    out: list[str] = [""] * len(items)
    groups: dict[tuple[int, tuple[str, ...]], list[int]] = {}
    for i, it in enumerate(items):
        groups.setdefault((it.max_new_tokens, it.stop), []).append(i)
    for (max_new, stop), idx in groups.items():
        # Similar lengths together, so padding stays small within each batch.
        idx = sorted(idx, key=lambda i: len(items[i].prompt), reverse=True)
        for s in range(0, len(idx), batch_size):
            chunk = idx[s : s + batch_size]
            res = generate(model, tok, [items[i].prompt for i in chunk], max_new_tokens=max_new, stop=list(stop),
                           batch_size=batch_size)
            for i, r in zip(chunk, res):
                out[i] = r.text
            advance(len(chunk))
    return out


def _single_turn_cell(task: SingleTurnTask, items: list[Item], model: Any, base: Any, tok: Any,
                      ctx: Context, opts: BenchOptions, advance: Callable[[int], None],
                      base_cache: dict[Any, Any] | None = None) -> dict[str, Any]:
    from lmforge.bench.divergence import answer_divergence

    cell = score_single_turn(task, items, model, tok, ctx, batch_size=opts.batch_size, advance=advance)
    div = answer_divergence(model, base, tok, [(it.prompt, it.reference) for it in items], batch_size=opts.batch_size,
                            base_cache=base_cache)
    for row, n, k in zip(cell["per_item"], div["nll"], div["kl"]):
        row["nll"], row["kl"] = n, k
    cell["metrics"]["answer_nll"] = float(sum(div["nll"]) / len(items))
    cell["metrics"]["answer_kl"] = float(sum(div["kl"]) / len(items))
    return cell


def score_single_turn(task: SingleTurnTask, items: list[Item], model: Any, tok: Any, ctx: Context, *,
                      batch_size: int = 16, advance: Callable[[int], None] | None = None) -> dict[str, Any]:
    """Greedy answers of an in-memory ``model`` to ``items``, scored by the task's official scorer.

    Returns ``{"metrics", "per_item", "floor"}`` (and ``"buckets"`` where items carry one): the mean of
    each score, the per-item responses and scores, and the floor, what an empty answer scores on the
    same items. This is a cell of :func:`run_acbench` without the answer NLL/KL against an original,
    for callers that hold the model in memory (a reproduction comparing many pruned copies).
    """
    if not items:
        raise UserError(f"task {task.name}: no records to run")
    responses = _generate_texts(model, tok, items, batch_size, advance or (lambda _n: None))
    scores = [task.score(it, r, ctx) for it, r in zip(items, responses)]
    per_item = [{"id": it.id, "response": r, **s, **{f"meta_{m}": v for m, v in it.meta.items()}}
                for it, r, s in zip(items, responses, scores)]
    metrics = _mean_metrics(scores)
    # The floor: what an empty answer scores on the same items (BFCL: the irrelevance share, since
    # making no call is right there; 0 for most tasks). A capability is only above floor above this.
    floor = sum(task.score(it, "", ctx)[task.primary] for it in items) / len(items)
    cell: dict[str, Any] = {"metrics": metrics, "per_item": per_item, "floor": float(floor)}
    buckets: dict[str, list[float]] = {}
    for it, s in zip(items, scores):
        if "bucket" in it.meta:
            buckets.setdefault(it.meta["bucket"], []).append(s[task.primary])
    if buckets:
        cell["buckets"] = {b: {"n": len(v), task.primary: sum(v) / len(v)} for b, v in buckets.items()}
    return cell


def _episodic_cell(task: EpisodicTask, records: list[Any], model: Any, base: Any, tok: Any,
                   ctx: Context, opts: BenchOptions, advance: Callable[[int], None],
                   base_cache: dict[Any, Any] | None = None) -> dict[str, Any]:
    from lmforge.bench.divergence import answer_divergence
    from lmforge.common.generation import generate

    def policy(observations: list[str]) -> list[str]:
        res = generate(model, tok, observations, max_new_tokens=task.action_tokens, stop=["\n"],
                       batch_size=opts.batch_size)
        return [r.text for r in res]

    episodes = task.rollout(policy, records, ctx)
    advance(len(records))
    pairs = task.expert_pairs(records, ctx)
    div = answer_divergence(model, base, tok, pairs, batch_size=opts.batch_size, base_cache=base_cache)
    metrics = _mean_metrics([{k: v for k, v in e.items() if isinstance(v, (int, float))} for e in episodes])
    metrics["answer_nll"] = float(sum(div["nll"]) / max(1, len(pairs)))
    metrics["answer_kl"] = float(sum(div["kl"]) / max(1, len(pairs)))
    return {"metrics": metrics, "per_item": episodes}


# --------------------------------------------------------------------------------------------------
# The run


def _interleave(lists: list[list[Any]]) -> list[Any]:
    """Round-robin over the files of a task, so ``--limit`` keeps every file (format) represented."""
    out: list[Any] = []
    for i in range(max((len(x) for x in lists), default=0)):
        out.extend(x[i] for x in lists if i < len(x))
    return out


def _analysis_texts(task_items: dict[str, list[Item]], n: int) -> list[str]:
    """Probe texts for the analysis: prompt + gold completion, round-robin over the tasks."""
    pools = [[it.prompt + it.reference for it in items] for items in task_items.values() if items]
    out: list[str] = []
    i = 0
    while len(out) < n and any(i < len(p) for p in pools):
        out.extend(p[i] for p in pools if i < len(p))
        i += 1
    return out[:n]


def build_task_items(files: dict[str, list[Path]], tasks: list[str], ctx: Context, *, limit: int | None = None,
                     task_limits: dict[str, int] | None = None, max_new_tokens: int | None = None) -> dict[str, list[Any]]:
    """Each task's records from its files: single-turn items or episodic records, round-robin over the
    files, cut to the task's limit (``task_limits`` over ``limit``), answers capped at ``max_new_tokens``."""
    out: dict[str, list[Any]] = {}
    for t in tasks:
        task = get_task(t)
        if isinstance(task, SingleTurnTask):
            per_file = [task.items(p, ctx) for p in files[t]]
        else:
            assert isinstance(task, EpisodicTask)
            per_file = [task.load(p, ctx) for p in files[t]]
        out[t] = _interleave(per_file)[: (task_limits or {}).get(t, limit)]
        if max_new_tokens is not None and isinstance(task, SingleTurnTask):
            for it in out[t]:
                it.max_new_tokens = min(it.max_new_tokens, max_new_tokens)
    return out


def run_acbench(opts: BenchOptions) -> dict[str, Any]:
    """Run (or resume) the grid; returns the results dict (also in ``out/results.json``)."""
    from lmforge.common.progress import console, make_progress
    from lmforge.models.load import load

    if not opts.models:
        raise UserError("give at least one --model")
    if opts.max_new_tokens is not None and opts.max_new_tokens < 1:
        raise UserError(f"--max-new-tokens must be at least 1, got {opts.max_new_tokens}")
    from lmforge.common.runtime import check_threads, resolve_dtype, runtime_record, set_threads

    check_threads(opts.threads)
    torch_dtype = resolve_dtype(opts.dtype)
    if opts.limit is not None and opts.limit < 1:
        raise UserError(f"--limit must be at least 1, got {opts.limit}")
    if opts.shots < 0:
        raise UserError(f"--shots must be 0 or more, got {opts.shots}")
    tasks = parse_task_list(opts.tasks)
    settings = [Setting(ORIGINAL)] + [parse_setting(s) for s in opts.compress]
    labels = [s.label for s in settings]
    if len(set(labels)) != len(labels):
        raise UserError("the same --compress setting is given twice")
    embed = get_embedder(opts.embedder)
    check_scoring(opts.scoring)
    from lmforge.models.load import resolve_spec

    for spec in opts.models:
        resolve_spec(spec)  # a missing model is an error before anything is written
    opts.out.mkdir(parents=True, exist_ok=True)
    files = user_data(opts.data_dir, tasks) if opts.data_dir else builtin_data(
        opts.out / "data", opts.seed, tasks, opts.builtin_sizes, builtin_profile(opts.builtin_profile, opts.models))
    header = {
        "models": list(opts.models), "settings": labels, "tasks": tasks, "limit": opts.limit,
        "task_limits": dict(sorted(opts.task_limits.items())),
        "prompt_format": opts.prompt_format, "seed": opts.seed, "embedder": opts.embedder, "scoring": opts.scoring,
        "length_buckets": list(opts.length_buckets), "max_steps": opts.max_steps,
        "calib": [opts.calib_samples, opts.calib_seq_len], "data": _fingerprint(files),
        "max_new_tokens": opts.max_new_tokens, "dtype": str(torch_dtype).removeprefix("torch."),
    }
    if opts.shots:  # only when set, so that zero-shot run folders written before the option still resume
        header["shots"] = opts.shots
    store = ResultsStore(opts.out / "results.json", header, opts.overwrite)

    for model_spec in opts.models:
        todo = [(s, t) for s in settings for t in tasks if not store.done(_cell_key(model_spec, s.label, t))]
        todo_analysis = [s for s in settings[1:] if f"{model_spec}|{s.label}" not in store.data["analysis"]]
        if not todo and not todo_analysis:
            continue
        set_threads(opts.threads)
        base, tok = load(model_spec, allow_pickle=opts.allow_pickle, trust_remote_code=opts.trust_remote_code,
                         dtype=torch_dtype)
        from lmforge.common.generation import max_positions

        ctx = Context(tokenizer=tok, fmt=_prompt_format(opts.prompt_format, model_spec, tok), seed=opts.seed,
                      embed=embed, length_buckets=tuple(opts.length_buckets), max_positions=max_positions(base),
                      max_steps=opts.max_steps, scoring=opts.scoring, shots=opts.shots)
        task_items = build_task_items(files, tasks, ctx, limit=opts.limit, task_limits=opts.task_limits,
                                      max_new_tokens=opts.max_new_tokens)
        # The original's log-probs at the gold completions, kept from its own cells: the compressed
        # settings' KL then needs no second forward of the original (a miss, after a resume, runs it).
        base_lp: dict[Any, Any] = {}
        for setting in settings:
            todo_here = [t for s, t in todo if s == setting]
            if not todo_here and setting not in todo_analysis:
                continue
            if setting.method is None:
                model = base
            else:
                # NOTE: compression (calibration, Hessians) always runs in float32; only evaluation
                # takes --dtype.
                model, _ = load(str(_compressed(opts, model_spec, setting)), allow_pickle=False, dtype=torch_dtype)
                _dense_cache(model)
            ref = None if setting.method is None else base
            for t in todo_here:
                task = get_task(t)
                recs = task_items[t]
                if not recs:
                    raise UserError(f"task {t}: no records to run")
                start = time.perf_counter()
                with make_progress() as prog:
                    bar = prog.add_task(f"{setting.label} / {t}", total=len(recs), info=model_spec)

                    def advance(n: int, _bar: Any = bar, _prog: Any = prog) -> None:
                        _prog.advance(_bar, n)

                    if isinstance(task, SingleTurnTask):
                        cell = _single_turn_cell(task, recs, model, ref, tok, ctx, opts, advance, base_lp)
                    else:
                        assert isinstance(task, EpisodicTask)
                        cell = _episodic_cell(task, recs, model, ref, tok, ctx, opts, advance, base_lp)
                cell.update(model=model_spec, setting=setting.label, task=t, capability=task.capability,
                            primary=task.primary, scale=task.scale, n=len(recs), seconds=round(time.perf_counter() - start, 2),
                            prompt_format=ctx.fmt, runtime=runtime_record(torch_dtype))
                store.put_cell(_cell_key(model_spec, setting.label, t), cell)
            if setting in todo_analysis:
                from lmforge.bench.divergence import compare_internals

                texts = _analysis_texts({t: v for t, v in task_items.items() if isinstance(get_task(t), SingleTurnTask)},
                                        opts.analysis_texts)
                if texts:
                    store.put_analysis(f"{model_spec}|{setting.label}", compare_internals(model, base, tok, texts))
            del model
    if opts.report:
        from lmforge.bench.report import write_report

        write_report(store.data, opts.out)
        if opts.progress:
            console.print(f"report: {opts.out / 'report.html'}")
    return store.data


def summarize(data: dict[str, Any]) -> dict[str, Any]:
    """Per model and setting: each task's headline metric and its relative change against the
    original, and per capability the mean of its tasks' headline metrics (each on a 0-1 scale: NIAH's
    0-10 divided by 10) with that mean's relative change.

    NOTE: ACBench reports per-task scores and discusses drops per capability without one fixed
    aggregation formula; here scores are averaged before the ratio is taken, which weighs each task
    by what the original can do: a task at the floor (score ~0) adds nothing, instead of a huge
    relative swing from noise (a mean of per-task ratios let T-Eval reason's 0.02 -> 0.01 read -50%).
    """
    out: dict[str, Any] = {}
    for c in data["cells"].values():
        m = out.setdefault(c["model"], {}).setdefault(c["setting"], {"tasks": {}, "capabilities": {}})
        m["tasks"][c["task"]] = {"capability": c["capability"], "metric": c["primary"],
                                 "value": c["metrics"][c["primary"]], "scale": c.get("scale", 1.0),
                                 # episodic cells have no empty answer: their floor is 0 (the start
                                 # state never counts towards AgentBoard's progress rate)
                                 "floor": c.get("floor", 0.0),
                                 "answer_nll": c["metrics"]["answer_nll"], "answer_kl": c["metrics"]["answer_kl"]}
    for by_setting in out.values():
        base = by_setting.get(ORIGINAL, {"tasks": {}})["tasks"]
        for entry in by_setting.values():
            scores: dict[str, list[tuple[float, float]]] = {}
            floors: dict[str, list[float]] = {}
            for t, v in entry["tasks"].items():
                floors.setdefault(v["capability"], []).append(v["floor"] / v["scale"])
                b = base.get(t, {}).get("value")
                v["relative"] = None if not b else (v["value"] - b) / abs(b)
                if b is not None:
                    scores.setdefault(v["capability"], []).append((v["value"] / v["scale"], b / v["scale"]))
            caps = {}
            for cap in CAPABILITIES:
                if cap in scores:
                    mine = sum(x for x, _ in scores[cap]) / len(scores[cap])
                    orig = sum(y for _, y in scores[cap]) / len(scores[cap])
                    caps[cap] = {"score": mine, "original": orig,
                                 "relative": (mine - orig) / orig if orig > 0 else None,
                                 "floor": sum(floors[cap]) / len(floors[cap])}
            entry["capabilities"] = caps
    return out
