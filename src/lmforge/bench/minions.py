"""``lmforge bench minions``: MINION, MINIONS and the two baselines on long-document QA.

Each (protocol, question) cell answers one question about one document through
:func:`lmforge.methods.minions.apply.run_protocol` with its own :class:`CostLedger`, is scored by
:func:`lmforge.eval.longdoc.score_answer` and saved at once to ``OUT/results.json`` (atomic rewrite),
so an interrupted run resumes where it stopped. The summary puts, per protocol, the accuracy, the
remote tokens and dollars per question, and the paper's two ratios against ``remote-only``: how many
times cheaper the remote side is, and what fraction of remote-only's accuracy is kept.

Data: the official FinanceBench / LongHealth / QASPER files (:mod:`lmforge.eval.longdoc`) or the
built-in synthetic multi-hop numeric reports.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from lmforge.common.errors import UserError
from lmforge.common.io import atomic_write_json
from lmforge.eval.longdoc import DocQA, score_answer
from lmforge.methods.minions.apply import PROTOCOLS, MinionsConfig, run_protocol
from lmforge.methods.minions.clients import ChatClient, StructuredOutputError
from lmforge.methods.minions.ledger import CostLedger

RESULTS = "results.json"
# Minions (Narayan et al., ICML 2025), abstract: remote cost reduction and share of remote-only quality.
PAPER = {"minion": {"cost_reduction": 30.4, "quality_recovered": 0.87},
         "minions": {"cost_reduction": 5.7, "quality_recovered": 0.979}}


@dataclass
class BenchSetup:
    """What a run compares; stored in results.json so that a resume can check it is the same run."""

    local: str
    remote: str
    data: str
    protocols: list[str] = field(default_factory=lambda: list(PROTOCOLS))
    config: dict[str, Any] = field(default_factory=dict)
    prices: dict[str, Any] | None = None
    # Everything else that changes a cell's result: endpoints, token budgets, data options.
    clients: dict[str, Any] = field(default_factory=dict)
    data_options: dict[str, Any] = field(default_factory=dict)


def check_protocols(protocols: Sequence[str]) -> list[str]:
    out = []
    for p in protocols:
        for name in str(p).split(","):
            name = name.strip()
            if not name:
                continue
            if name not in PROTOCOLS:
                raise UserError(f"unknown protocol {name!r}; use one of {', '.join(PROTOCOLS)}")
            if name not in out:
                out.append(name)
    if not out:
        raise UserError("no protocol to run")
    return out


# The protocols that hand the local model the whole document (chunking off).
UNCHUNKED = ("minion", "local-only")


def first_local_prompt(protocol: str, document: str, question: str) -> list[dict[str, str]]:
    """What MINION or local-only first hands the local model, built as the protocol builds it: for
    local-only its one call; for MINION the worker's system message, which holds the whole document
    (the remote's first message follows it, so the real prompt is a little longer)."""
    if protocol == "local-only":
        from lmforge.methods.minions.apply import _direct_prompt

        return _direct_prompt(document, question)
    if protocol == "minion":
        from lmforge.methods.minions import prompts

        return [{"role": "system", "content": prompts.minion_worker_system(document, question)}]
    raise ValueError(f"{protocol} chunks the document; it has no whole-document prompt")


def prompt_tokens(local: Any, messages: list[dict[str, str]]) -> int:
    """Tokens of ``messages`` as ``local`` reads them: an in-process model's rendered prompt (chat
    template or plain rendering, BOS included) encoded as :func:`lmforge.common.generation.generate`
    encodes it; else the sum of ``local.count_tokens`` over the messages' contents."""
    if hasattr(local, "render") and hasattr(local, "tokenizer"):
        from lmforge.common.generation import encode_prompt

        return len(encode_prompt(local.tokenizer, local.render(messages)))
    return sum(int(local.count_tokens(m["content"])) for m in messages)


def check_unchunked_fit(items: Sequence[DocQA], local: ChatClient | None, protocols: Sequence[str]) -> None:
    """Refuse, before anything is run or written, a document that MINION or local-only would give whole
    to a local model whose positions it does not fit (with the client's ``max_tokens`` kept for the
    reply): such a run would only measure truncation. What is counted is the protocol's first local
    prompt (:func:`first_local_prompt`: the document with its instructions, the question and the chat
    template), not the document alone. A client that does not know its context (a served model) is
    not checked."""
    unchunked = [p for p in protocols if p in UNCHUNKED]
    if not unchunked or local is None or not hasattr(local, "context_limit") or not hasattr(local, "count_tokens"):
        return
    limit = local.context_limit()
    if limit is None:
        return
    reserve = int(getattr(local, "max_tokens", 0) or 0)
    for it in items:
        for p in unchunked:
            n = prompt_tokens(local, first_local_prompt(p, it.document, it.question))
            if n + reserve > limit:
                doc = local.count_tokens(it.document)
                raise UserError(f"question {it.id}: {p} gives the local model the whole document (no chunking), a "
                                f"prompt of {n} tokens (the document alone {doc} tokens), and it has {limit} "
                                f"positions ({reserve} kept for its answer): run only minions and remote-only, "
                                "or use shorter documents")


def _load_results(path: Path, setup: dict[str, Any], overwrite: bool) -> dict[str, Any]:
    import json

    if path.is_file() and not overwrite:
        try:
            data = json.loads(path.read_text())
        except (OSError, json.JSONDecodeError) as exc:
            raise UserError(f"cannot resume from {path}: {exc}; pass --overwrite to start afresh") from None
        if not isinstance(data, dict) or not isinstance(data.get("cells"), dict):
            raise UserError(f"{path} is not a minions results file; use another --out or pass --overwrite")
        if data.get("setup") != setup:
            raise UserError(f"{path} holds a different run (models, data, protocols or settings); "
                            "use another --out or pass --overwrite")
        return data
    return {"setup": setup, "cells": {}}


def run_bench(items: Sequence[DocQA], local: ChatClient | None, remote: ChatClient | None, out: Path,
              setup: BenchSetup, *, cfg: MinionsConfig | None = None, ledger_factory: Callable[[], CostLedger] = CostLedger,
              overwrite: bool = False, progress: bool = True) -> dict[str, Any]:
    """Run every protocol of ``setup`` on every item; returns ``{"setup", "cells", "summary"}``.

    A question whose remote JSON never validates is scored 0 with its error and its partial ledger
    kept; a client error (unreachable server, bad key) stops the run, finished cells stay saved.
    """
    if not items:
        raise UserError("no questions to run")
    protocols = check_protocols(setup.protocols)
    check_unchunked_fit(items, local, protocols)
    base = cfg or MinionsConfig()
    setup = replace(setup, protocols=protocols, config={k: v for k, v in asdict(base).items() if k != "protocol"})
    from lmforge.common.io import check_output_folder

    check_output_folder(out)
    out.mkdir(parents=True, exist_ok=True)
    path = out / RESULTS
    data = _load_results(path, asdict(setup), overwrite)
    todo = [(p, it) for p in protocols for it in items if f"{p}|{it.id}" not in data["cells"]]
    from lmforge.common.progress import make_progress

    prog = make_progress() if progress else None
    task = prog.add_task("minions bench", total=len(todo), info="") if prog else None
    if prog:
        prog.start()
    try:
        for protocol, item in todo:
            ledger = ledger_factory()
            t0 = time.perf_counter()
            try:
                rec = run_protocol(local, remote, item.document, item.question,
                                   replace(base, protocol=protocol), ledger=ledger)
                error = None
            except StructuredOutputError as exc:
                rec = {"protocol": protocol, "answer": None, "ledger": ledger.to_dict(), "details": {}}
                error = str(exc)
            except UserError as exc:
                # A client failure (unreachable server, bad key) ends the run; what this question had
                # already spent is kept beside the finished cells and shown.
                data["aborted"] = {"protocol": protocol, "id": item.id, "error": str(exc), "ledger": ledger.to_dict()}
                atomic_write_json(path, data)
                if prog:
                    prog.stop()
                    prog = None
                import sys

                print(ledger.render(), file=sys.stderr)
                raise
            answer = rec["answer"]
            data["cells"][f"{protocol}|{item.id}"] = {
                "protocol": protocol, "id": item.id, "question": item.question, "gold": item.answer,
                "answer": answer, "score": score_answer(item, answer) if answer else 0.0, "error": error,
                "ledger": rec["ledger"], "seconds": round(time.perf_counter() - t0, 3),
                "details": rec.get("details", {}),
            }
            atomic_write_json(path, data)
            if prog:
                prog.advance(task)
    finally:
        if prog:
            prog.stop()
    data.pop("aborted", None)
    data["summary"] = summarize(data, [it.id for it in items])
    atomic_write_json(path, data)
    return data


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else float("nan")


def summarize(data: dict[str, Any], ids: Sequence[str] | None = None) -> dict[str, Any]:
    """Per protocol: accuracy, mean tokens and dollars per question, and the ratios to remote-only.

    ``cost_reduction`` is remote-only's mean remote dollars over the protocol's (remote tokens when
    the remote model has no price); ``quality_recovered`` is the protocol's accuracy over remote-only's.
    """
    cells = [c for c in data["cells"].values() if ids is None or c["id"] in set(ids)]
    out: dict[str, Any] = {}
    for p in data["setup"]["protocols"]:
        mine = [c for c in cells if c["protocol"] == p]
        if not mine:
            continue
        side = lambda c, s: c["ledger"]["sides"].get(s, {})  # noqa: E731
        out[p] = {
            "n": len(mine),
            "accuracy": _mean([c["score"] for c in mine]),
            "errors": sum(1 for c in mine if c["error"]),
            "remote_prompt_tokens": _mean([side(c, "remote").get("prompt_tokens", 0) for c in mine]),
            "remote_completion_tokens": _mean([side(c, "remote").get("completion_tokens", 0) for c in mine]),
            "remote_calls": _mean([side(c, "remote").get("calls", 0) for c in mine]),
            "remote_dollars": _mean([side(c, "remote").get("dollars", 0.0) for c in mine]),
            "local_tokens": _mean([side(c, "local").get("total_tokens", 0) for c in mine]),
            "local_calls": _mean([side(c, "local").get("calls", 0) for c in mine]),
        }
    ref = out.get("remote-only")
    for p, row in out.items():
        row["cost_reduction"] = row["quality_recovered"] = None
        if ref is None or p == "remote-only":
            continue
        use_dollars = ref["remote_dollars"] > 0
        num = ref["remote_dollars"] if use_dollars else ref["remote_prompt_tokens"] + ref["remote_completion_tokens"]
        den = row["remote_dollars"] if use_dollars else row["remote_prompt_tokens"] + row["remote_completion_tokens"]
        row["cost_reduction"] = num / den if den > 0 else None
        row["cost_measure"] = "dollars" if use_dollars else "tokens"
        row["quality_recovered"] = row["accuracy"] / ref["accuracy"] if ref["accuracy"] > 0 else None
    return out


def render_summary(summary: dict[str, Any]) -> str:
    """A text table of :func:`summarize`, with the paper's ratios beside ours."""
    head = ["protocol", "n", "accuracy", "remote tok/q", "remote $/q", "local tok/q", "cheaper", "quality kept",
            "paper"]
    rows = [head]
    for p, r in summary.items():
        paper = PAPER.get(p)
        rows.append([p, str(r["n"]), f"{r['accuracy']:.3f}",
                     f"{r['remote_prompt_tokens'] + r['remote_completion_tokens']:,.0f}", f"{r['remote_dollars']:.5f}",
                     f"{r['local_tokens']:,.0f}",
                     "—" if r["cost_reduction"] is None else f"{r['cost_reduction']:.1f}x",
                     "—" if r["quality_recovered"] is None else f"{r['quality_recovered']:.1%}",
                     "" if paper is None else f"{paper['cost_reduction']}x at {paper['quality_recovered']:.1%}"])
    widths = [max(len(row[i]) for row in rows) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(row, widths)))
                     for row in rows)
