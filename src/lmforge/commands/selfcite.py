"""``lmforge align selfcite-bon``, ``lmforge align selfcite-simpo`` and ``lmforge bench citations``:
SelfCite (Chuang et al., ICML 2025, arXiv 2502.09604).

* ``selfcite-bon`` reranks every citation of a response by best-of-N sampling with the
  context-ablation reward, resumable per document;
* ``selfcite-simpo`` builds the official preference pairs from its output (chosen = reranked,
  rejected = original padded to the same citation count) and trains SimPO with LoRA;
* ``bench citations`` scores citation recall, precision and F1 against gold supporting sentences.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
from pathlib import Path
from typing import Annotated, Any

import typer

from lmforge.commands.groups import align_app, bench_app
from lmforge.common.errors import UserError

_DOCS_HELP = ("Documents: JSON list or JSON lines of objects with 'context' (the document) and 'query' (the "
              "question); optional 'idx' (default: the position) and 'prediction' or 'response' (a response "
              "in the <statement>..<cite>[s-e]</cite></statement> format to rerank; without one, one is sampled "
              "as officially, temperature 0.95, top-p 0.7).")


def _read_objects(path: Path, what: str) -> list[dict[str, Any]]:
    from lmforge.common.io import read_json_objects

    return read_json_objects(path, what)


def _documents(path: Path) -> list[dict[str, Any]]:
    docs = []
    seen: set[str] = set()
    for i, obj in enumerate(_read_objects(path, "documents")):
        for key in ("context", "query"):
            if not isinstance(obj.get(key), str) or not obj[key].strip():
                raise UserError(f"{path}: document {i}: needs a non-empty string '{key}'")
        response = obj.get("prediction", obj.get("response"))
        if response is not None and not isinstance(response, str):
            raise UserError(f"{path}: document {i}: 'prediction' must be a string")
        idx = str(obj.get("idx", i))
        if idx in seen:
            raise UserError(f"{path}: idx {idx!r} appears twice")
        seen.add(idx)
        docs.append({"idx": idx, "context": obj["context"], "query": obj["query"], "response": response,
                     "raw_idx": obj.get("idx", i)})
    return docs


def _load(model: str, dtype: str) -> tuple[Any, Any]:
    from lmforge.models.load import load

    return load(model, dtype=dtype)


@align_app.command("selfcite-bon")
def selfcite_bon_cmd(
    model: Annotated[str, typer.Option("--model", "-m", help="The model that samples and judges its own citations: a local HF folder, a .gguf, real:NAME or zoo:NAME.")],
    data: Annotated[Path, typer.Option(help=_DOCS_HELP)],
    out: Annotated[Path, typer.Option(help="Output folder: bon.jsonl (per document: context, query, old_prediction, prediction, statements, every branch's candidates and rewards) and summary.json.")],
    n: Annotated[int, typer.Option("--n", help="Citation samples per <cite> (official 10).")] = 10,
    reward_method: Annotated[str, typer.Option(help="drop_and_hold (the paper's reward), drop or hold (its halves).")] = "drop_and_hold",
    length_limit: Annotated[int, typer.Option(help="Penalise (-1000) a candidate citing more than this many tokens over more than one sentence (official 384; 0: off).")] = 384,
    temperature: Annotated[float, typer.Option(help="Temperature of the citation samples (official 1.2).")] = 1.2,
    top_p: Annotated[float, typer.Option(help="Top-p of the citation samples (official 0.9).")] = 0.9,
    max_response_tokens: Annotated[int, typer.Option(help="Length limit of a sampled response (official 1024).")] = 1024,
    chat: Annotated[bool, typer.Option(help="Wrap the prompt in the tokenizer's chat template (as the official code does).")] = True,
    dtype: Annotated[str, typer.Option(help="Model dtype: float32 or bfloat16 (2x faster on CPUs with AMX/AVX512-BF16).")] = "float32",
    batch_size: Annotated[int, typer.Option(help="Prompts per forward pass when scoring.")] = 8,
    seed: Annotated[int, typer.Option(help="Sampling seed.")] = 0,
    limit: Annotated[int | None, typer.Option(help="Only the first LIMIT documents.")] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace a finished output folder.")] = False,
    progress: Annotated[bool, typer.Option(help="Show a progress bar.")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON on stdout.")] = False,
) -> None:
    """Best-of-N citation reranking (SelfCite): at every <cite> of a response, sample N citations,
    score each with log p(statement | cited sentences only) - log p(statement | context without
    them), and keep the best.

    Resumable: an interrupted run leaves OUT/bon.partial.jsonl; the same command continues after the
    documents already done.
    """
    from lmforge.methods.selfcite.bon import BoNSettings
    from lmforge.methods.selfcite.reward import RewardSettings

    settings = BoNSettings(n=n, temperature=temperature, top_p=top_p, max_response_tokens=max_response_tokens,
                           seed=seed)
    reward = RewardSettings(method=reward_method, length_limit=length_limit, batch_size=batch_size, chat=chat)
    if limit is not None and limit < 1:
        raise UserError(f"--limit must be >= 1, got {limit}")
    if dtype not in ("float32", "bfloat16", "bf16", "fp32"):
        raise UserError(f"--dtype must be float32 or bfloat16, got {dtype!r}")
    docs = _documents(data)[:limit]
    final = out / "bon.jsonl"
    partial = out / "bon.partial.jsonl"
    if out.exists() and not out.is_dir():
        raise UserError(f"output '{out}' is a file; give a folder")
    if final.exists() and not overwrite:
        raise UserError(f"output '{final}' already exists; pass --overwrite to replace it")
    from lmforge.common.io import check_output_folder

    check_output_folder(out)
    done: dict[str, dict[str, Any]] = {}
    if partial.exists() and not overwrite:
        for line in partial.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                break  # a line cut by the interruption: redo that document
            done[str(row["idx"])] = row
        # rewrite the partial file with the complete rows only, so appending never follows a cut line
        from lmforge.common.io import atomic_write_text

        atomic_write_text(partial, "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in done.values()))
    summary = _run_bon(model, dtype, docs, done, out, partial, settings, reward, progress)
    if not as_json:
        typer.echo(f"{summary['documents']} documents, {summary['branches reranked']} citations reranked, "
                   f"{summary['changed']} responses changed; malformed tags {summary['malformed']}, spans outside "
                   f"the document {summary['out_of_document']}")
        typer.echo(f"saved to {final}")
    else:
        typer.echo(json.dumps(summary, indent=2))


def _run_bon(model_spec: str, dtype: str, docs: list[dict[str, Any]], done: dict[str, dict[str, Any]], out: Path,
             partial: Path, settings: Any, reward: Any, progress: bool) -> dict[str, Any]:
    from lmforge.common.io import atomic_write_json, atomic_write_text
    from lmforge.common.progress import make_progress
    from lmforge.methods.selfcite.bon import best_of_n, sample_response
    from lmforge.methods.selfcite.format import postprocess, split_sentences

    todo = [d for d in docs if d["idx"] not in done]
    if todo:
        model, tok = _load(model_spec, dtype)
        out.mkdir(parents=True, exist_ok=True)
        mode = "a" if done else "w"
        with open(partial, mode, encoding="utf-8") as fh, make_progress() as bar:
            task = bar.add_task("selfcite-bon", total=len(todo), info="", visible=progress)
            position = {d["idx"]: k for k, d in enumerate(docs)}
            for d in todo:
                # per-document seeds (seed + position in the file): a resumed run samples what an
                # uninterrupted one would have
                doc_settings = dataclasses.replace(settings, seed=settings.seed + 1009 * position[d["idx"]])
                sents = split_sentences(d["context"])
                response = d["response"]
                if response is None:
                    response = sample_response(model, tok, sents, d["query"], doc_settings, chat=reward.chat)
                res = best_of_n(model, tok, sents, d["query"], response, doc_settings, reward)
                post = postprocess(res.response, sents)
                old = postprocess(response, sents)
                row = {"idx": d["raw_idx"], "context": d["context"], "query": d["query"], "old_prediction": response,
                       "prediction": res.response,
                       "statements": [{"statement": s.text, "citation": [
                           {"start_sentence_idx": c.start, "end_sentence_idx": c.end, "cite": c.cite}
                           for c in (s.citations or [])]} for s in post.statements],
                       "malformed": old.malformed, "out_of_document": old.out_of_document,
                       "branches": [b.to_json() for b in res.branches]}
                fh.write(json.dumps(row, ensure_ascii=False) + "\n")
                fh.flush()
                os.fsync(fh.fileno())
                done[d["idx"]] = row
                bar.advance(task)
    rows = [done[d["idx"]] for d in docs]
    atomic_write_text(out / "bon.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    summary = {"documents": len(rows),
               "branches reranked": sum(1 for r in rows for b in r["branches"] if b["chosen"] is not None),
               "changed": sum(r["prediction"] != r["old_prediction"] for r in rows),
               "malformed": sum(r["malformed"] for r in rows),
               "out_of_document": sum(r["out_of_document"] for r in rows),
               "settings": {"n": settings.n, "temperature": settings.temperature, "top_p": settings.top_p,
                            "reward": reward.method, "length_limit": reward.length_limit, "chat": reward.chat}}
    atomic_write_json(out / "summary.json", summary)
    partial.unlink(missing_ok=True)
    return summary


def _pairs_from(path: Path, balance: bool, seed: int) -> tuple[list[dict[str, str]], dict[str, Any]]:
    """Preference pairs from selfcite-bon's bon.jsonl (needs the documents for the prompt) or from
    rows that carry them: ``context``+``query`` (or ``prompt``), ``chosen``/``prediction`` and
    ``rejected``/``old_prediction``."""
    from lmforge.methods.selfcite.balance import balance_rejected
    from lmforge.methods.selfcite.format import build_prompt, split_sentences

    rng = random.Random(seed)
    pairs: list[dict[str, str]] = []
    stats = {"rows": 0, "identical (skipped)": 0, "statement-count mismatch (unbalanced)": 0,
             "ran out of placements (partly balanced)": 0,
             "citations rejected before / after": [0, 0], "citations chosen": 0}
    for i, obj in enumerate(_read_objects(path, "preference rows")):
        stats["rows"] += 1
        chosen = obj.get("chosen", obj.get("prediction"))
        rejected = obj.get("rejected", obj.get("reject", obj.get("old_prediction")))
        if not isinstance(chosen, str) or not isinstance(rejected, str):
            raise UserError(f"{path}: row {i}: needs string 'chosen' (or 'prediction') and 'rejected' (or "
                            "'old_prediction')")
        if isinstance(obj.get("prompt"), str):
            prompt, n_sent = obj["prompt"], None
        elif isinstance(obj.get("context"), str) and isinstance(obj.get("query"), str):
            sents = split_sentences(obj["context"])
            prompt, n_sent = build_prompt(sents, obj["query"]), len(sents)
        else:
            raise UserError(f"{path}: row {i}: needs 'prompt', or 'context' and 'query'")
        chosen, rejected = chosen.strip(), rejected.strip()
        if chosen == rejected:
            stats["identical (skipped)"] += 1  # as the official make_preference_data.py
            continue
        if balance:
            res = balance_rejected(rejected, chosen, rng=rng, n_sentences=n_sent)
            if not res.coverages:
                stats["statement-count mismatch (unbalanced)"] += 1
            elif res.reached_max_tries:
                stats["ran out of placements (partly balanced)"] += 1
            else:
                stats["citations rejected before / after"][0] += res.coverages["total_cites_reject_before_edit"]
                stats["citations rejected before / after"][1] += res.coverages["total_cites_reject_after_edit"]
                stats["citations chosen"] += res.coverages["total_cites_chosen_after_edit"]
            chosen, rejected = res.chosen, res.rejected
        pairs.append({"prompt": prompt, "chosen": chosen, "rejected": rejected})
    if not pairs:
        raise UserError(f"{path}: no usable pair (chosen equals rejected in every row)")
    return pairs, stats


@align_app.command("selfcite-simpo")
def selfcite_simpo_cmd(
    model: Annotated[str, typer.Option("--model", "-m", help="The model to train (the one that produced the pairs): a local HF folder, real:NAME or zoo:NAME.")],
    pairs: Annotated[Path, typer.Option(help="Rows with 'chosen' (or 'prediction', the reranked response), 'rejected' (or 'old_prediction') and 'prompt' or 'context'+'query'; JSON list or JSON lines.")],
    out: Annotated[Path, typer.Option(help="Output folder: the LoRA adapter (or, with --merge, the merged model), pairs.jsonl (what was trained on) and selfcite_simpo.json.")],
    balance: Annotated[bool, typer.Option(help="Pad the rejected response with fake non-overlapping citations to the chosen's count (official); --no-balance trains on the raw pairs.")] = True,
    beta: Annotated[float, typer.Option(help="SimPO beta (official 10).")] = 10.0,
    gamma_beta_ratio: Annotated[float, typer.Option(help="SimPO gamma/beta (official 0.3).")] = 0.3,
    lr: Annotated[float, typer.Option(help="Learning rate (official 3e-7, a full fine-tune of an 8B model).")] = 3e-7,
    epochs: Annotated[float, typer.Option(help="Epochs (official 1).")] = 1.0,
    max_steps: Annotated[int, typer.Option(help="Stop after this many steps (-1: epochs decide).")] = -1,
    lora_r: Annotated[int, typer.Option(help="LoRA rank (all linear layers).")] = 16,
    merge: Annotated[bool, typer.Option(help="Merge the adapter into the weights and save a plain model.")] = False,
    seed: Annotated[int, typer.Option(help="Seed of the balancing and of training (official 42).")] = 42,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing output folder.")] = False,
    progress: Annotated[bool, typer.Option(help="Show progress bars.")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON on stdout.")] = False,
) -> None:
    """SimPO on SelfCite preference pairs: chosen = the best-of-N response, rejected = the original,
    length-balanced so both cite equally many sentences (else the model learns to cite more)."""
    from lmforge.common.io import atomic_dir, atomic_write_json, atomic_write_text, check_output_dir
    from lmforge.methods.selfcite.train import SimPOSettings, train_simpo

    settings = SimPOSettings(beta=beta, gamma_beta_ratio=gamma_beta_ratio, lr=lr, epochs=epochs,
                             max_steps=max_steps, lora_r=lora_r, lora_alpha=2 * lora_r, seed=seed)
    check_output_dir(out, overwrite)
    from lmforge.common.progress import progress_enabled

    rows, stats = _pairs_from(pairs, balance, seed)
    base, tok = _load(model, "float32")
    progress = progress and progress_enabled() and not as_json  # Trainer bars print logs on stdout
    with atomic_dir(out, overwrite=overwrite) as tmp:
        res = train_simpo(base, tok, rows, settings, out_dir=tmp, progress=progress, merge=merge)
        atomic_write_text(tmp / "pairs.jsonl", "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
        summary = {"pairs": len(rows), "balanced": balance, "data": stats, "steps": res["global_step"],
                   "final loss": res["losses"][-1] if res["losses"] else None,
                   "reward accuracy (last logged)": res["reward_accuracies"][-1] if res["reward_accuracies"] else None,
                   "settings": {"beta": beta, "gamma_beta_ratio": gamma_beta_ratio, "lr": lr, "epochs": epochs,
                                "max_steps": max_steps, "lora_r": lora_r, "merge": merge, "seed": seed}}
        atomic_write_json(tmp / "selfcite_simpo.json", summary)
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
    else:
        typer.echo(f"{len(rows)} pairs ({'balanced' if balance else 'not balanced'}), {res['global_step']} steps; "
                   f"saved to {out}")


@bench_app.command("citations")
def bench_citations_cmd(
    pred: Annotated[Path, typer.Option(help="Predictions: LongBench-Cite style (objects with 'idx' and 'statements' [{'statement', 'citation': [{'start_sentence_idx', 'end_sentence_idx'}]}], or 'prediction' text with its 'context'); JSON list or JSON lines. selfcite-bon's bon.jsonl works.")],
    gold: Annotated[Path, typer.Option(help="Gold: objects with 'idx' and 'statements' [{'statement', 'support': [sentence ids]}]; with a 'context', support ids are checked against its sentences.")],
    matcher: Annotated[str, typer.Option(help="Pair predicted with gold statements by 'order' or by normalised 'text'.")] = "order",
    as_json: Annotated[bool, typer.Option("--json", help="Print the scores as JSON.")] = False,
) -> None:
    """Citation recall, precision and F1 against gold supporting sentences, in LongBench-Cite's
    structure (per statement: fully / partially / not supported; per citation: relevant or not; F1
    per response, averaged). The judge is the gold set, not GPT-4o."""
    from lmforge.methods.selfcite.format import split_sentences
    from lmforge.methods.selfcite.metrics import read_longbench_cite, score_dataset

    if matcher not in ("order", "text"):
        raise UserError(f"--matcher must be order or text, got {matcher!r}")
    data = read_longbench_cite(pred, gold)
    for obj in _read_objects(gold, "gold records"):
        if isinstance(obj.get("context"), str):
            n = len(split_sentences(obj["context"]))
            for st in obj.get("statements") or []:
                bad = [i for i in (st.get("support") or []) if isinstance(i, int) and not 0 <= i < n]
                if bad:
                    raise UserError(f"{gold}: idx {obj.get('idx')!r}: support sentence {bad[0]} is outside the "
                                    f"document ({n} sentences)")
    if not data.records:
        raise UserError(f"no prediction in {pred} matches a gold idx in {gold}")
    scores = score_dataset(data.pairs(), matcher=matcher)
    scores.update({"missing gold": len(data.missing_gold), "missing prediction": len(data.missing_prediction)})
    if as_json:
        typer.echo(json.dumps(scores, indent=2))
        return
    typer.echo(f"citation recall {scores['recall']:.4f}  precision {scores['precision']:.4f}  F1 {scores['f1']:.4f}"
               f"  ({scores['n']} responses, {scores['statements']} statements, {scores['citations']} citations)")
    if data.missing_gold or data.missing_prediction:
        typer.echo(f"not scored: {len(data.missing_gold)} predictions without gold, "
                   f"{len(data.missing_prediction)} gold records without a prediction")
