"""``lmforge reproduce simple-to-hard``: supervision strategies on miniature Table Readout.

Setup, fixed before the verdict run:

* **Model.** ``vlm-nano`` (committed; :mod:`lmforge.methods.simple_to_hard.base`), a LLaVA with a
  2-layer ViT and a 4-layer Llama (~1M parameters) pretrained here only on generic skills, equal in
  both modalities: reading cells and adding, then grid neighbours, highlighted neighbours of a named
  cell and reads of named cells (random highlighted sets, never paths or sums).
* **Task.** Miniature Table Readout (:mod:`lmforge.methods.simple_to_hard.mini`): 6 x 6 digit tables,
  SIMPLE paths 4-8 cells / <= 2 turns, HARD paths 12-18 cells / 4-6 turns.
* **Arms.** Image, Image + HARD text, Mix+ and Align-Mix+, each from the base on ``BUDGET`` examples
  composed by the official ``combine_data.py`` rules (:mod:`lmforge.methods.simple_to_hard.supervision`),
  batch 32, lr 1e-3 (``FINETUNE_LR``, NOTE), cosine; seeds ``--seed`` and ``--seed + 1``.
* **Scores.** Greedy accuracy on ``EVAL_HARD`` HARD images (the verdict), HARD text (the modality
  gap) and SIMPLE images; the gradient alignment cos(g_train, g_HARD-image) averaged over 4 probes
  per phase (:mod:`lmforge.methods.simple_to_hard.align`). As a diagnostic (not part of the verdict),
  the teacher-forced accuracy per CoT role on the SIMPLE-image records: which cell comes next (path
  following), its value (reading) and the running total (adding) (``experiment.response_token_accuracy``).

Conditions (the issue's, fixed before the verdict run), on the seed means:

1. Mix+ − Image >= 0.20 HARD-image accuracy;
2. Align-Mix+ >= Mix+;
3. the arms' mean alignment ranks them as their HARD-image accuracy does: Spearman >= 0.8.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from lmforge.reproduce.base import ClaimResult, Figure, ReproduceOptions, Table, figure, register_reproduction, save_figure

TITLE = ("Generalizing from SIMPLE to HARD Visual Reasoning: Can We Mitigate Modality Imbalance in VLMs? "
         "(Park et al., ICML 2025)")
ARMS = ("image", "image+hard-text", "mix+", "align-mix+")
# NOTE: 8000 examples per arm (250 steps of 32; was 6400 = 200 steps) with the two-phase vlm-nano
# (base.py NOTE). Measured from that base (1 thread, SIMPLE images, lr 1e-3, teacher-forced on 96
# puzzles, greedy on 48): 200 steps -> next cell 0.80, greedy SIMPLE images 0.46, on the edge of the
# issue's goal (0.8 / 0.5); 250 steps is what the 15-min budget on 2 threads leaves room for (the
# 200-step run took 497 s, of which 450 s training).
BUDGET = 8000
BUDGET_FULL = 25600
BUDGET_QUICK = 96
EVAL_HARD, EVAL_TEXT, EVAL_SIMPLE = 200, 100, 100
EVAL_QUICK = 4
SEEDS = 2
# NOTE: fine-tuning lr 1e-3 (pretraining keeps 3e-4, train.py NOTE). Measured from vlm-nano on SIMPLE
# images, 1 thread (issue 27 diagnostics, teacher-forced accuracy of the CoT's cell names = path
# following): 200 steps at 3e-4 / 1e-3 / 2e-3 -> 0.08 / 0.17 / 0.03 (2e-3 also wipes out reading:
# values 0.11); 600 steps at 3e-4 -> 0.28 (greedy SIMPLE-image 0.08) against 500 steps at 1e-3 -> 0.83
# (greedy 0.50). The text twin: 600 steps at 3e-4 -> 0.48, 900 at 1e-3 -> 0.97 (greedy SIMPLE-text 0.88).
FINETUNE_LR = 1e-3
GAP_MIN = 0.20
SPEARMAN_MIN = 0.8
PAPER = {"HARD-image accuracy, Table Readout (Align-Mix+ / Mix+ / Image)": "~0.88 / ~0.73 / ~0.25 (figure, read off)",
         "model": "EAGLE-X2-Llama3-8B, up to 240k examples"}


def conditions(mean_acc: dict[str, float], mean_align: dict[str, float]) -> dict[str, Any]:
    """The three conditions on the seed means, and the Spearman correlation they use."""
    from scipy.stats import spearmanr

    arms = list(mean_acc)
    import warnings

    with warnings.catch_warnings():  # constant accuracies: scipy warns and returns nan, handled below
        warnings.simplefilter("ignore")
        rho = float(spearmanr([mean_align[a] for a in arms], [mean_acc[a] for a in arms]).statistic)
    rho = rho if rho == rho else 0.0  # constant accuracies: no ranking, counted as 0
    return {"rho": rho,
            "mix+ - image >= 0.20": mean_acc["mix+"] - mean_acc["image"] >= GAP_MIN - 1e-9,
            "align-mix+ >= mix+": mean_acc["align-mix+"] >= mean_acc["mix+"] - 1e-9,
            "spearman(alignment, accuracy) >= 0.8": rho >= SPEARMAN_MIN - 1e-9}


@register_reproduction("simple-to-hard", TITLE, "Mix+ and Align-Mix+ vs Image supervision on miniature Table Readout "
                       "(a ~1M-parameter LLaVA trained here), with gradient alignment")
def run(cfg: ReproduceOptions) -> ClaimResult:
    import json

    from lmforge.methods.simple_to_hard import experiment, mini
    from lmforge.methods.simple_to_hard.base import load_base
    from lmforge.methods.simple_to_hard.train import TrainConfig

    t0 = time.time()
    budget = BUDGET_QUICK if cfg.quick else (BUDGET_FULL if cfg.full else BUDGET)
    n_eval = (EVAL_QUICK,) * 3 if cfg.quick else (EVAL_HARD, EVAL_TEXT, EVAL_SIMPLE)
    base, tok = load_base()
    runs: list[experiment.ArmResult] = []
    for s in range(SEEDS):
        seed = cfg.seed + s
        pools = experiment.make_pools(budget // 2, budget // 2, seed)
        ev = {"hard-image": mini.generate("HARD", n_eval[0], 10_000 + seed),
              "hard-text": mini.generate("HARD", n_eval[1], 20_000 + seed),
              "simple-image": mini.generate("SIMPLE", n_eval[2], 30_000 + seed)}
        probe = experiment.hard_probe_batch(tok, mini.generate("HARD", 16, 40_000 + seed))
        # the sub-skills of a SIMPLE-image CoT, teacher-forced (which cell next, its value, the total)
        roles = [experiment.example(p, "image2answer") for p in ev["simple-image"]]
        for arm in ARMS:
            r = experiment.run_arm(base, tok, arm, budget, pools, ev, probe, seed, role_examples=roles,
                                   cfg=TrainConfig(lr=FINETUNE_LR, seed=seed))
            runs.append(r)
            if cfg.progress:
                print(f"[simple-to-hard] seed {seed} {arm}: {r.accuracy} ({r.train_seconds} s)", flush=True)
    (Path(cfg.out_dir) / "runs.json").write_text(json.dumps(
        [{k: getattr(r, k) for k in ("strategy", "seed", "budget", "steps", "train_seconds", "accuracy",
                                      "converted_hard_image", "alignment", "roles")} for r in runs], indent=1))

    def mean(arm: str, f) -> float:
        xs = [f(r) for r in runs if r.strategy == arm]
        return sum(xs) / len(xs)

    acc = {a: mean(a, lambda r: r.accuracy["hard-image"]) for a in ARMS}
    ali = {a: mean(a, lambda r: r.mean_alignment) for a in ARMS}
    cond = conditions(acc, ali)
    held = all(v for k, v in cond.items() if k != "rho")
    rows = []
    for r in runs:
        gap = r.accuracy["hard-text"] - r.accuracy["hard-image"]
        rows.append([r.strategy, r.seed, r.steps, round(r.accuracy["hard-image"], 3), round(r.accuracy["hard-text"], 3),
                     round(gap, 3), round(r.accuracy["simple-image"], 3), round(r.converted_hard_image, 3),
                     round(r.mean_alignment, 4),
                     " / ".join(f"{r.roles.get(k, float('nan')):.2f}" for k in ("cell", "value", "total")),
                     r.train_seconds])
    fig, ax = figure(1, 2, figsize=(9, 3.2))
    ax[0].bar(list(ARMS), [acc[a] for a in ARMS], color="#4c72b0")
    ax[0].set_ylabel("HARD-image accuracy (seed mean)")
    ax[0].tick_params(axis="x", labelrotation=20)
    ax[1].scatter([ali[a] for a in ARMS], [acc[a] for a in ARMS])
    for a in ARMS:
        ax[1].annotate(a, (ali[a], acc[a]), fontsize=8)
    ax[1].set_xlabel("mean cos(g_train, g_HARD-image)")
    ax[1].set_ylabel("HARD-image accuracy")
    fig_path = save_figure(fig, Path(cfg.out_dir) / "simple_to_hard.png")
    measured = {
        "HARD-image accuracy (image / image+hard-text / mix+ / align-mix+)": " / ".join(f"{acc[a]:.3f}" for a in ARMS),
        "mean alignment (same order)": " / ".join(f"{ali[a]:.4f}" for a in ARMS),
        "mix+ - image": round(acc["mix+"] - acc["image"], 3),
        "align-mix+ - mix+": round(acc["align-mix+"] - acc["mix+"], 3),
        "spearman(alignment, accuracy)": round(cond["rho"], 3),
        "budget (examples per arm) / seeds": f"{budget} / {SEEDS}",
        "conditions": {k: v for k, v in cond.items() if k != "rho"},
    }
    notes = [
        "Miniature: 6x6 digit tables drawn as 8x8 glyph cells, a ~1M-parameter LLaVA trained here; the CoT "
        "writes a running total and the text table names every cell (mini.py NOTEs). Absolute numbers are "
        "not comparable with the paper's 8B VLM; the direction is the claim.",
        "Align-Mix+ splits the same budget between its two phases (supervision.py NOTE); the paper's "
        "alignment measure is reconstructed as a gradient cosine (align.py NOTE).",
    ]
    if cfg.quick:
        notes.append(f"--quick: {BUDGET_QUICK} examples per arm and {EVAL_QUICK} puzzles per split; the verdict "
                     "is not meaningful at this size.")
    return ClaimResult(
        name="simple-to-hard", title=TITLE,
        claim="Mixing image, text and image-via-text supervision with HARD text (Mix+) lifts HARD-image "
              "accuracy far above image-only supervision, aligning first (Align-Mix+) lifts it further, and "
              "gradient alignment with HARD images ranks the strategies.",
        paper=PAPER, measured=measured, held=held,
        tables=[Table("Per arm and seed", ["arm", "seed", "steps", "HARD image", "HARD text", "text - image",
                                           "SIMPLE image", "HARD image converted", "alignment",
                                           "SIMPLE-image TF cell / value / total", "train s"], rows)],
        figures=[Figure(str(fig_path), "HARD-image accuracy per arm, and against mean gradient alignment")],
        notes=notes, seconds=round(time.time() - t0, 1))
