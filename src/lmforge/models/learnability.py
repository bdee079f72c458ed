"""Learnability evaluation of zoo models: held-out prompts, greedy decoding, task scorers.

Metrics (each on a held-out stream the training data never draws from):

- ``toolcall_exact_match``: the generated JSON call equals the gold call.
- ``needle_<L>_exact_match``: the code retrieved from a context of about L tokens.
- ``workflow_node_f1``: WorfBench node F1 of the generated plan.
- ``textworld_success``: blocksworld episodes solved within 3 steps per block.
"""

from __future__ import annotations

import random
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from lmforge.common.generation import generate
from lmforge.data import corpus, needle, textworld, toolcalls, workflow
from lmforge.eval.metrics import mean, node_f1


def _rng(spec_seed: int, stream: str) -> random.Random:
    return random.Random(f"{spec_seed}:eval-{stream}")


def needle_examples(tok: PreTrainedTokenizerBase, rng: random.Random, n: int, length: int,
                    n_needles: int = 4) -> list[dict[str, Any]]:
    """``n`` needle records whose prompt is at most ``length`` tokens (within about a sentence:
    the haystack is shrunk one sentence at a time from an estimate), as ``n_tokens`` records."""
    out = []
    for _ in range(n):
        n_sent = max(2, length // 9)
        # Shrink the haystack until the prompt fits in ``length`` tokens.
        while True:
            state = rng.getstate()
            rec = needle.example(rng, n_sentences=n_sent, n_needles=n_needles)
            size = len(tok(needle.prompt(rec)).input_ids)
            if size > length and n_sent > 2:
                n_sent -= 1
                rng.setstate(state)
                continue
            break
        rec["n_tokens"] = size
        out.append(rec)
    return out


def evaluate_zoo_model(model: PreTrainedModel, tok: PreTrainedTokenizerBase, spec: Any,
                       progress: bool = True, batch_size: int = 16) -> dict[str, float]:
    """Greedy-decoding metrics on held-out prompts (see module docstring)."""
    ev = spec.evals
    metrics: dict[str, float] = {}

    recs = toolcalls.generate(_rng(spec.seed, "toolcall"), ev.toolcall)
    outs = generate(model, tok, [toolcalls.prompt(r) for r in recs], max_new_tokens=64,
                    stop=["\n"], batch_size=batch_size, progress=progress)
    metrics["toolcall_exact_match"] = mean([toolcalls.exact_match(o.text, r) for o, r in zip(outs, recs)])
    metrics["toolcall_valid_json"] = mean([toolcalls.parse_call(o.text) is not None for o in outs])

    recs = workflow.generate(_rng(spec.seed, "workflow"), ev.workflow)
    outs = generate(model, tok, [workflow.prompt(r) for r in recs], max_new_tokens=160,
                    batch_size=batch_size, progress=progress)
    metrics["workflow_node_f1"] = mean(
        [node_f1(workflow.parse_plan(o.text)[0], r["nodes"], r["edges"])["f1"] for o, r in zip(outs, recs)])

    for length in ev.needle_lengths:
        if length > model.config.max_position_embeddings:
            continue
        recs = needle_examples(tok, _rng(spec.seed, f"needle-{length}"), ev.needle, length)
        outs = generate(model, tok, [needle.prompt(r) for r in recs], max_new_tokens=8,
                        stop=["\n"], batch_size=batch_size, progress=progress)
        metrics[f"needle_{length}_exact_match"] = mean([needle.exact_match(o.text, r) for o, r in zip(outs, recs)])
        metrics[f"needle_{length}_mean_tokens"] = mean([r["n_tokens"] for r in recs])

    episodes = textworld.generate(_rng(spec.seed, "textworld"), ev.textworld)
    envs = [textworld.BlocksWorld(e["init"], e["goal"], max_steps=3 * len({b for s in e["init"] for b in s}))
            for e in episodes]
    # Step every unfinished episode together: one batched generate call per turn.
    while True:
        live = [env for env in envs if not env.done()]
        if not live:
            break
        outs = generate(model, tok, [env.observation() for env in live], max_new_tokens=12,
                        stop=["\n"], batch_size=batch_size)
        for env, o in zip(live, outs):
            env.step(o.text)
    metrics["textworld_success"] = mean([env.success() for env in envs])
    metrics["textworld_invalid_rate"] = sum(e.invalid for e in envs) / max(1, sum(e.steps for e in envs))
    return metrics


__all__ = ["evaluate_zoo_model", "needle_examples", "corpus"]
