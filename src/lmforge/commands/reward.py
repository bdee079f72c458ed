"""``lmforge reward train | eval | judge | rate``: diverging preferences (Zhang et al., ICML 2025) and
RATE (Reber et al., ICML 2025). Heavy imports stay inside the functions."""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from lmforge.commands.groups import reward_app
from lmforge.common.errors import UserError

JsonOpt = Annotated[bool, typer.Option("--json", help="Print results as JSON on stdout.")]


def _emit(obj: Any) -> None:
    typer.echo(json.dumps(obj, indent=2, default=str))


def _check_lambda(lam: float | None) -> None:
    if lam is not None and (math.isnan(lam) or lam < 0):
        raise UserError(f"--lambda must be a number >= 0 or inf, got {lam}")


def _check_limit(limit: int | None) -> None:
    if limit is not None and limit < 1:
        raise UserError(f"--limit must be at least 1, got {limit}")


def _progress() -> bool:
    return os.environ.get("LMFORGE_NO_PROGRESS") != "1"


@reward_app.command("train")
def reward_train(
    head: Annotated[str, typer.Option(help="bt (Bradley-Terry) | meanvar (mean-variance, the paper's distributional model) | class (rating classifier).")],
    data: Annotated[Path, typer.Option(help="Per-annotator preferences: MultiPref or HelpSteer2 JSONL(.gz), or lmforge JSONL.")],
    out: Annotated[Path, typer.Option(help="Output folder: the reward model (safetensors, reward.json) and metrics.json.")],
    model: Annotated[str | None, typer.Option("--model", "-m", help="Body: a local HF model folder or zoo:NAME. Default: an MLP on the data's features_a/features_b.")] = None,
    body: Annotated[str, typer.Option(help="lm: causal LM with a head on the last token's hidden state; seqcls: AutoModelForSequenceClassification.")] = "lm",
    data_format: Annotated[str, typer.Option("--format", help="auto | multipref | helpsteer2 | lmforge.")] = "auto",
    bt_target: Annotated[str, typer.Option(help="bt: agg (majority label per pair) or all (every annotator's label).")] = "agg",
    loss: Annotated[str, typer.Option(help="meanvar: kl (the paper's, to the label histogram) or nll (distributional preference learning).")] = "kl",
    rho: Annotated[float, typer.Option(help="meanvar: correlation of r_A and r_B in Var(r_A - r_B).")] = 0.0,
    epochs: Annotated[int, typer.Option(help="Passes over the training pairs.")] = 40,
    lr: Annotated[float, typer.Option(help="Adam learning rate.")] = 3e-3,
    batch_size: Annotated[int, typer.Option(help="Pairs per step.")] = 128,
    dev_fraction: Annotated[float, typer.Option(help="Held out to fit lambda of the meanvar divergence score.")] = 0.1,
    test_fraction: Annotated[float, typer.Option(help="Held out for the metrics.")] = 0.1,
    limit: Annotated[int | None, typer.Option(help="Read at most this many pairs.")] = None,
    max_length: Annotated[int, typer.Option(help="Tokens per text (HF bodies).")] = 512,
    seed: Annotated[int, typer.Option(help="Seeds the split, initialisation and shuffling.")] = 0,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing output folder.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Train a BT / mean-variance / classification reward head on every annotator's label.

    Reports preference accuracy (high-agreement pairs) and Diverging-ID AUROC (diverging vs
    high-agreement pairs) on a held-out split; writes OUT (model, reward.json, metrics.json).
    """
    from lmforge.methods.diverging_prefs.apply import run_train
    from lmforge.methods.diverging_prefs.config import DivergingPrefsConfig

    # Before the data is read (and a model loaded): what would otherwise fail only at the split.
    if not (0 <= dev_fraction < 1 and 0 <= test_fraction < 1 and dev_fraction + test_fraction < 1):
        raise UserError(f"--dev-fraction ({dev_fraction}) and --test-fraction ({test_fraction}) must be in "
                        "[0, 1) and sum to less than 1")
    _check_limit(limit)
    cfg = DivergingPrefsConfig(head=head, bt_target=bt_target, meanvar_loss=loss, rho=rho, lr=lr, epochs=epochs,
                               batch_size=batch_size, seed=seed)
    record = run_train(data, out, cfg, model=model, body=body, fmt=data_format, dev_fraction=dev_fraction,
                       test_fraction=test_fraction, limit=limit, max_length=max_length, overwrite=overwrite,
                       progress=_progress())
    if as_json:
        _emit({k: v for k, v in record.items() if k != "loss_history"})
        return
    typer.echo(f"{head}: trained on {record['train_pairs']} pairs, final loss {record['loss_history'][-1]:.4f}; saved {out}")
    test = record.get("test") or {}
    if "preference_accuracy" in test:
        typer.echo(f"test: preference accuracy {test['preference_accuracy']:.3f}, "
                   f"Diverging-ID AUROC {test['diverging_id_auroc']:.3f} ({test['pairs']} pairs)")
    elif "error" in test:
        typer.echo(f"test metrics unavailable: {test['error']}")


@reward_app.command("eval")
def reward_eval(
    reward_model: Annotated[str, typer.Option(help="A folder from `lmforge reward train`, or any HF sequence-classification reward model folder.")],
    data: Annotated[Path, typer.Option(help="Per-annotator preferences (see `reward train`).")],
    data_format: Annotated[str, typer.Option("--format", help="auto | multipref | helpsteer2 | lmforge.")] = "auto",
    lam: Annotated[float | None, typer.Option("--lambda", help="meanvar: lambda of the divergence score lambda(sigma_A+sigma_B) - |mu_A-mu_B|.")] = None,
    dev_data: Annotated[Path | None, typer.Option(help="meanvar: fit lambda on these pairs (default: sigma alone).")] = None,
    limit: Annotated[int | None, typer.Option(help="Read at most this many pairs.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """Preference accuracy and Diverging-ID AUROC of a reward model on per-annotator pairs."""
    from lmforge.methods.diverging_prefs.apply import run_eval

    _check_lambda(lam)
    result = run_eval(reward_model, data, fmt=data_format, lam=lam, dev_data=dev_data, limit=limit)
    if as_json:
        _emit(result)
        return
    typer.echo(f"{result['pairs']} pairs ({result['diverging']} diverging, {result['high_agreement']} high-agreement): "
               f"preference accuracy {result['preference_accuracy']:.3f}, Diverging-ID AUROC {result['diverging_id_auroc']:.3f}")


def _chat_client(spec: str, base_url: str, api_key_env: str, temperature: float, max_tokens: int | None) -> Any:
    from lmforge.methods.minions.clients import HFChatClient, OpenAIChatClient

    kind, _, target = spec.partition(":")
    if not target.strip() or kind not in ("hf", "openai"):
        raise UserError(f"judge '{spec}' must be hf:PATH or openai:MODEL")
    if kind == "hf":
        return HFChatClient.from_spec(target, temperature=temperature, max_tokens=max_tokens or 256)
    return OpenAIChatClient(base_url, target, api_key_env=api_key_env, temperature=temperature, max_tokens=max_tokens)


@reward_app.command("judge")
def reward_judge(
    data: Annotated[Path, typer.Option(help="Per-annotator preferences (see `reward train`).")],
    judge: Annotated[str, typer.Option(help="hf:PATH (local model, or hf:zoo:NAME) or openai:MODEL (OpenAI-compatible API).")],
    reward_model: Annotated[str | None, typer.Option(help="A reward model whose divergence score filters pairs (see `reward eval`).")] = None,
    drop_fraction: Annotated[float, typer.Option(help="Drop this fraction of pairs with the highest divergence score.")] = 0.2,
    lam: Annotated[float | None, typer.Option("--lambda", help="meanvar: lambda of the divergence score (default: sigma alone).")] = None,
    data_format: Annotated[str, typer.Option("--format", help="auto | multipref | helpsteer2 | lmforge.")] = "auto",
    base_url: Annotated[str, typer.Option(help="openai: the API root.")] = "https://api.openai.com/v1",
    api_key_env: Annotated[str, typer.Option(help="openai: the environment variable holding the API key.")] = "OPENAI_API_KEY",
    max_tokens: Annotated[int | None, typer.Option(help="Judge tokens per verdict.")] = None,
    limit: Annotated[int | None, typer.Option(help="Read at most this many pairs.")] = None,
    as_json: JsonOpt = False,
) -> None:
    """LLM-as-judge on preference pairs, before and after dropping the diverging ones.

    Reports how often the judge picks a winner on high-agreement vs diverging pairs, and the same
    after dropping the pairs a reward model scores as most likely diverging.
    """
    from lmforge.methods.diverging_prefs.data import load_pairs
    from lmforge.methods.diverging_prefs.heads import load_reward_model
    from lmforge.methods.diverging_prefs.judge import filter_diverging, judge_pairs, judge_report
    from lmforge.methods.diverging_prefs.train import divergence_scores, predict

    _check_lambda(lam)
    if not 0.0 <= drop_fraction < 1.0:
        raise UserError(f"--drop-fraction must lie in [0, 1), got {drop_fraction}")
    pairs = load_pairs(data, data_format, limit=limit)
    # The reward model is loaded before the judge runs: a bad path must not cost every judge call.
    net, cfg = load_reward_model(reward_model) if reward_model is not None else (None, None)
    client = _chat_client(judge, base_url, api_key_env, 0.0, max_tokens)
    verdicts = judge_pairs(client, pairs, max_tokens=max_tokens)
    kept = None
    if net is not None:
        oa, ob = predict(net, pairs, cfg)
        div = divergence_scores(oa, ob, cfg, lam if lam is not None else (math.inf if cfg.head == "meanvar" else None))
        kept, _ = filter_diverging(pairs, div, drop_fraction=drop_fraction)
    report = judge_report(verdicts, pairs, kept)
    report["judge"] = getattr(client, "name", judge)
    if as_json:
        _emit(report)
        return
    a = report["all"]
    typer.echo(f"judge picks a winner on {a['picks_winner_on_high_agreement'] or 0:.0%} of high-agreement and "
               f"{a['picks_winner_on_diverging'] or 0:.0%} of diverging pairs")
    if kept is not None:
        d = report["dropped"]
        typer.echo(f"filter dropped {d['pairs']} pairs ({d['diverging']} diverging, {d['high_agreement']} high-agreement)")


def _read_rate_records(path: Path, limit: int | None) -> list[dict[str, Any]]:
    from lmforge.methods.diverging_prefs.data import json_records

    if not path.is_file():
        raise UserError(f"data file '{path}' does not exist")
    rows = []
    for lineno, where, rec in json_records(path):
        text = next((rec[k] for k in ("response", "completion", "text") if k in rec), None)
        if not isinstance(text, str):
            raise UserError(f"{where}: needs a string 'response' (or 'completion' / 'text')")
        prompt = rec.get("prompt", "")
        if not isinstance(prompt, str):
            raise UserError(f"{where}: 'prompt' must be a string")
        w = rec.get("w")
        if w is not None and (isinstance(w, bool) or w not in (0, 1)):
            raise UserError(f"{where}: 'w' must be 0 or 1, got {w!r}")
        rows.append({"id": str(rec.get("id", f"line-{lineno}")), "prompt": prompt, "response": text, "w": w})
        if limit is not None and len(rows) >= limit:
            break
    if not rows:
        raise UserError(f"'{path}' holds no records")
    return rows


@reward_app.command("rate")
def reward_rate(
    reward_model: Annotated[str, typer.Option(help="Any HF sequence-classification reward model folder, or one from `lmforge reward train` (safetensors only, no remote code).")],
    data: Annotated[Path, typer.Option(help="JSONL: 'response' (or 'completion'/'text'), optional 'prompt', 'id', and 'w' (0/1).")],
    attribute: Annotated[str, typer.Option(help="The attribute: built-in length | sentiment (classifier and rule rewriter), or any name when every record has 'w'.")],
    rewriter: Annotated[str, typer.Option(help="programmatic (built-in rule) | hf:PATH (local model, hf:zoo:NAME too) | openai:MODEL.")] = "programmatic",
    w1: Annotated[str | None, typer.Option(help="How the rewrite prompt names w=1 (built-ins: 'longer', 'positive sentiment').")] = None,
    w0: Annotated[str | None, typer.Option(help="How the rewrite prompt names w=0.")] = None,
    base_url: Annotated[str, typer.Option(help="openai: the API root.")] = "https://api.openai.com/v1",
    api_key_env: Annotated[str, typer.Option(help="openai: the environment variable holding the API key.")] = "OPENAI_API_KEY",
    temperature: Annotated[float, typer.Option(help="Rewriter temperature (the paper: 0.7).")] = 0.7,
    max_tokens: Annotated[int | None, typer.Option(help="Rewriter tokens per reply.")] = None,
    drop_failed: Annotated[bool, typer.Option(help="Leave out units whose rewrites did not flip the attribute (always counted).")] = False,
    paired_se: Annotated[bool, typer.Option("--paired-se", help="RATE's standard errors from the per-unit differences (paired) instead of the official code's unpaired formula, which is conservative.")] = False,
    limit: Annotated[int | None, typer.Option(help="Read at most this many records.")] = None,
    seed: Annotated[int, typer.Option(help="Seeds a sampling local rewriter.")] = 0,
    out: Annotated[Path | None, typer.Option(help="Also write the result (with every rewrite) to this JSON file.")] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing --out file.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """RATE: the causal effect of an attribute on a reward model, from rewrites of rewrites.

    Prints the naive, single-rewrite and RATE ATT / ATU / ATE with standard errors as the official code
    computes them (naive and RATE unpaired, single-rewrite paired; --paired-se for RATE's paired ones);
    rewrites that fail to flip the attribute are counted (and listed in --out).
    """
    from lmforge.common.io import atomic_write_json, check_output_file
    from lmforge.methods.rate.apply import load_scorer, run_rate
    from lmforge.methods.rate.config import RateConfig
    from lmforge.methods.rate.rewriters import BUILTIN, builtin_attribute, make_rewriter

    _check_limit(limit)
    if not (temperature >= 0 and math.isfinite(temperature)):
        raise UserError(f"--temperature must be a number >= 0, got {temperature}")
    if max_tokens is not None and max_tokens < 1:
        raise UserError(f"--max-tokens must be at least 1, got {max_tokens}")
    if out is not None:
        check_output_file(out, overwrite)
    rows = _read_rate_records(data, limit)
    texts = [r["response"] for r in rows]
    classifier = programmatic = None
    base = RateConfig(attribute=attribute)
    if attribute in BUILTIN:
        classifier, programmatic, base = builtin_attribute(attribute, texts)
    cfg = RateConfig(attribute=attribute, w1_string=w1 or base.w1_string, w0_string=w0 or base.w0_string,
                     temperature=temperature, max_tokens=max_tokens, drop_failed=drop_failed, paired_se=paired_se)
    if any(r["w"] is None for r in rows):
        if classifier is None:
            raise UserError(f"records lack 'w' and '{attribute}' is not a built-in attribute ({', '.join(BUILTIN)})")
        w = [classifier(r["response"]) if r["w"] is None else r["w"] for r in rows]
    else:
        w = [r["w"] for r in rows]
    rw = make_rewriter(rewriter, cfg, programmatic=programmatic, base_url=base_url, api_key_env=api_key_env, seed=seed)
    scorer = load_scorer(reward_model)
    result = run_rate([r["prompt"] for r in rows], texts, w, scorer, rw, cfg, classifier=classifier,
                      ids=[r["id"] for r in rows], keep_texts=out is not None)
    result["reward_model"] = reward_model
    if out is not None:
        atomic_write_json(out, result)
    summary = {k: v for k, v in result.items() if k != "units_detail"}
    if as_json:
        _emit(summary)
        return
    e = result["effects"]

    def num(x: float | None, fmt: str) -> str:  # None: undefined (no unit, or one: no standard error)
        return "n/a" if x is None else format(x, fmt)

    typer.echo(f"{attribute}: {result['w1']} units with w=1, {result['w0']} with w=0 (rewriter {result['rewriter']})")
    typer.echo(f"naive            {num(e['naive']['value'], '+.4f')} ± {num(e['naive']['se'], '.4f')}")
    for k in ("ATT", "ATU", "ATE"):
        s, r = e["single_rewrite"][k], e["rate"][k]
        typer.echo(f"{k}: single rewrite {num(s['value'], '+.4f')} ± {num(s['se'], '.4f')}   "
                   f"RATE {num(r['value'], '+.4f')} ± {num(r['se'], '.4f')}")
    f = result["failures"]
    if f["checked"]:
        typer.echo(f"rewrites that did not flip {attribute}: {f['rewrite_failed']} first, {f['rewrite_of_rewrite_failed']} "
                   f"second ({f['units_with_a_failed_rewrite']} units; {'left out' if drop_failed else 'kept in the estimates'})")
    else:
        typer.echo("rewrites were not checked: no classifier for this attribute")
