"""``lmforge align selective-dpo``: Selective DPO (Gao et al., ICML 2025, arXiv 2502.09650).

Scores every preference pair's difficulty (mean held-out DPO loss of reference runs on random half
splits), keeps the easiest τ share and runs DPO over it easy to hard; saves the model and the
difficulty of every pair.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated

import typer

from lmforge.commands.groups import align_app
from lmforge.common.errors import UserError


def _parse_seeds(text: str) -> tuple[int, ...]:
    try:
        seeds = tuple(int(s) for s in text.split(",") if s.strip())
    except ValueError:
        raise UserError(f"--seeds must be comma-separated integers, got '{text}'") from None
    if not seeds or len(set(seeds)) != len(seeds):
        raise UserError(f"--seeds must name distinct integers, got '{text}'")
    return seeds


def _read_scores(path: Path, n: int) -> list[float]:
    from lmforge.common.io import parse_json_lines, read_user_text

    rows = parse_json_lines(path, read_user_text(path, "difficulty"))
    scores = []
    for line, obj in rows:
        if not isinstance(obj, dict) or not isinstance(obj.get("difficulty"), (int, float)):
            raise UserError(f"{path}:{line}: expected an object with a numeric 'difficulty'")
        scores.append(float(obj["difficulty"]))
    if len(scores) != n:
        raise UserError(f"{path}: {len(scores)} difficulty scores for {n} preference pairs")
    return scores


@align_app.command("selective-dpo")
def selective_dpo_cmd(
    model: Annotated[str, typer.Option("--model", "-m", help="The SFT model (reference and start): a local Hugging Face folder, or zoo:NAME.")],
    data: Annotated[Path, typer.Option(help="Preference pairs: JSON lines with string fields prompt, chosen, rejected.")],
    out: Annotated[Path, typer.Option(help="Output folder: the trained model, difficulty.jsonl and selective_dpo.json.")],
    tau: Annotated[float, typer.Option(help="Share of pairs kept, the easiest first, in (0, 1] (paper: 0.5).")] = 0.5,
    beta: Annotated[float, typer.Option(help="DPO beta, for the difficulty runs and the final run (paper: 0.01).")] = 0.01,
    lr: Annotated[float, typer.Option(help="Learning rate of the final DPO run (paper: 6e-7 to 1e-6 for 7B models; tiny models need ~1e-3).")] = 1e-6,
    ref_lr: Annotated[float, typer.Option(help="Learning rate of the reference (difficulty) runs (official recipe: 6e-6 with LoRA).")] = 6e-6,
    batch_size: Annotated[int, typer.Option(help="Pairs per optimizer step (paper: 128).")] = 128,
    epochs: Annotated[int, typer.Option(help="Epochs of every DPO run (paper: 1).")] = 1,
    seeds: Annotated[str, typer.Option(help="Comma-separated seeds of the half splits (paper: 41,42,43).")] = "41,42,43",
    checkpoints: Annotated[int, typer.Option(help="Held-out evaluations per reference run (paper: 5).")] = 5,
    lora_r: Annotated[int, typer.Option(help="LoRA rank of the reference runs (paper: 16); 0 trains all weights.")] = 16,
    scores: Annotated[Path | None, typer.Option(help="Reuse difficulty scores: a difficulty.jsonl from an earlier run on the same data (skips the reference runs).")] = None,
    engine: Annotated[str, typer.Option(help="Final DPO run: 'native' (lmforge's loop) or 'trl' (trl.DPOTrainer with a sequential sampler).")] = "native",
    seed: Annotated[int, typer.Option(help="Seed of the final run.")] = 42,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing output folder.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON on stdout.")] = False,
) -> None:
    """Selective DPO: drop the hardest preference pairs, then DPO over the rest easy to hard.

    Difficulty of a pair = its DPO loss under reference models that never trained on it, averaged
    over every seed and checkpoint: for each seed the pairs are split in random halves, a DPO run on
    each half scores the other half at evenly spaced checkpoints.
    """
    if not 0.0 < tau <= 1.0:
        raise UserError(f"--tau must lie in (0, 1], got {tau}")
    if engine not in ("native", "trl"):
        raise UserError(f"--engine must be 'native' or 'trl', got '{engine}'")
    seed_tuple = _parse_seeds(seeds)

    import numpy as np
    from scipy.stats import spearmanr

    from lmforge.common.io import atomic_dir, atomic_write_json, atomic_write_text, check_output_dir
    from lmforge.data.preferences import LINE_KEY, load_preferences
    from lmforge.methods.selective_dpo.config import SelectiveDPOConfig
    from lmforge.methods.selective_dpo.core import easy_to_hard
    from lmforge.methods.selective_dpo.train import selective_dpo, trl_sequential_dpo
    from lmforge.models import load

    check_output_dir(out, overwrite)
    records = load_preferences(data)
    given = None if scores is None else _read_scores(scores, len(records))
    try:
        cfg = SelectiveDPOConfig(tau=tau, beta=beta, lr=lr, ref_lr=ref_lr, batch_size=batch_size, epochs=epochs,
                                 seeds=seed_tuple, n_checkpoints=checkpoints, ref_lora_r=lora_r, seed=seed)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    base, tok = load(model)
    say = (lambda msg: None) if as_json or os.environ.get("LMFORGE_NO_PROGRESS") == "1" else (
        lambda msg: typer.echo(msg, err=True))
    try:
        if engine == "native":
            res = selective_dpo(base, tok, records, cfg, scores=given, progress=say)
            policy, diff, order, curve = res.model, res.difficulty, res.order, res.train_losses
        else:
            from lmforge.methods.selective_dpo.train import compute_difficulty, encode_preferences

            if given is None:
                diff = compute_difficulty(base, encode_preferences(tok, records), cfg, tok.pad_token_id, progress=say)
                diff_scores = diff.scores
            else:
                diff, diff_scores = None, np.asarray(given)
            order = easy_to_hard(diff_scores, cfg.tau)
            import copy
            import tempfile

            policy = copy.deepcopy(base)
            with tempfile.TemporaryDirectory() as tmp:
                trainer = trl_sequential_dpo(policy, tok, [records[i] for i in order], cfg, tmp, ref_model=base)
            curve = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    except ValueError as exc:
        raise UserError(str(exc)) from None
    diff_scores = np.asarray(given) if given is not None else diff.scores
    rank = np.empty(len(records), dtype=int)
    rank[np.argsort(diff_scores, kind="stable")] = np.arange(len(records))
    kept = set(order.tolist())
    agreement = None
    if given is None and len(seed_tuple) > 1:
        ps = diff.per_seed()
        # None where a seed's scores are all equal (scipy's NaN: no rank correlation is defined).
        agreement = [None if rho != rho else rho for rho in
                     (float(spearmanr(ps[i], ps[j])[0]) for i in range(len(ps)) for j in range(i + 1, len(ps)))]
    summary = {
        "model": model, "data": str(data), "out": str(out), "pairs": len(records), "kept": len(order),
        "config": {k: (list(v) if isinstance(v, tuple) else v) for k, v in vars(cfg).items()}, "engine": engine,
        "difficulty_source": "given" if given is not None else "reference runs",
        "seed_spearman": agreement,
        "difficulty_kept_max": float(diff_scores[order].max()),
        "difficulty_mean": float(diff_scores.mean()),
        "train_loss_first": curve[0] if curve else None, "train_loss_last": curve[-1] if curve else None,
    }
    with atomic_dir(out, overwrite=overwrite) as tmp:
        policy.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        lines = []
        for i, rec in enumerate(records):
            row = {"line": rec[LINE_KEY], "difficulty": float(diff_scores[i]), "rank": int(rank[i]), "kept": i in kept}
            if "id" in rec:
                row["id"] = rec["id"]
            if given is None:
                row["per_seed"] = [float(x) for x in diff.per_seed()[:, i]]
            lines.append(json.dumps(row))
        atomic_write_text(tmp / "difficulty.jsonl", "\n".join(lines) + "\n")
        atomic_write_json(tmp / "selective_dpo.json", {**summary, "order": order.tolist(), "train_losses": curve})
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
        return
    typer.echo(f"selective-dpo: kept {len(order)} of {len(records)} pairs (tau {tau}), trained easy to hard")
    if agreement:
        typer.echo(f"difficulty agreement across seeds (Spearman): {', '.join('n/a' if a is None else f'{a:.3f}' for a in agreement)}")
    typer.echo(f"saved to {out} (difficulty.jsonl and selective_dpo.json inside)")
