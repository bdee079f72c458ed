"""``lmforge align teacher-hacking``: run the oracle → teacher → student harness of Tiapkin et al.

"On Teacher Hacking in Language Model Distillation" (ICML 2025, arXiv 2502.02671). The command builds
the Markov oracle, trains an imperfect teacher on a small oracle sample, distils a smaller student from
the chosen data sources, and writes the proxy / golden curves with the power-law detector's verdicts
(``curves.json``) and a proxy-vs-golden plot. See :mod:`lmforge.methods.teacher_hacking`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from lmforge.commands.groups import align_app
from lmforge.common.errors import UserError


@align_app.command("teacher-hacking")
def teacher_hacking_cmd(
    out: Annotated[Path, typer.Option(help="Output folder: curves.json and proxy_vs_golden.png.")],
    regimes: Annotated[str, typer.Option(help="Comma-separated data sources: offline, online_teacher, online_student.")] = "offline,online_teacher,online_student",
    steps: Annotated[int, typer.Option(help="Distillation steps per run.")] = 700,
    n_prompts: Annotated[int, typer.Option(help="Training prompts (the offline set has gens-per-prompt generations for each).")] = 500,
    gens_per_prompt: Annotated[int, typer.Option(help="Teacher generations per prompt in the offline set.")] = 1,
    teacher_data: Annotated[int, typer.Option(help="Oracle sequences the teacher is trained on (few = imperfect teacher).")] = 500,
    teacher_steps: Annotated[int, typer.Option(help="Teacher training steps (maximum likelihood on its oracle sample).")] = 250,
    student_sft_steps: Annotated[int, typer.Option(help="Student SFT steps on the teacher's oracle sample before distillation (the paper SFTs both; 0 = random init).")] = 250,
    eval_prompts: Annotated[int, typer.Option(help="Held-out prompts (2 oracle and 2 teacher samples each) for the metrics.")] = 256,
    loss: Annotated[str, typer.Option(help="Token-level divergence: forward_kl (paper), reverse_kl or jsd.")] = "forward_kl",
    lr: Annotated[float, typer.Option(help="Student learning rate (Adam).")] = 3e-3,
    seed: Annotated[int, typer.Option(help="Seed of data, sampling and initialisation.")] = 0,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing output folder.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print results as JSON on stdout.")] = False,
) -> None:
    """Distil a student from an imperfect teacher of a known oracle and track proxy and golden metrics."""
    import json

    import torch

    from lmforge.common.io import atomic_dir, atomic_write_json, check_output_dir
    from lmforge.methods.teacher_hacking.config import REGIMES, TeacherHackingConfig
    from lmforge.methods.teacher_hacking.harness import build_setup, run_regime

    chosen = [r.strip() for r in regimes.split(",") if r.strip()]
    bad = [r for r in chosen if r not in REGIMES]
    if bad or not chosen:
        raise UserError(f"unknown regime(s) {bad or regimes!r}; use a comma-separated subset of {', '.join(REGIMES)}")
    try:
        cfg = TeacherHackingConfig(steps=steps, n_prompts=n_prompts, gens_per_prompt=gens_per_prompt,
                                   teacher_data=teacher_data, teacher_steps=teacher_steps,
                                   student_sft_steps=student_sft_steps, eval_prompts=eval_prompts,
                                   loss=loss, lr=lr, seed=seed)
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    check_output_dir(out, overwrite)
    torch.set_num_threads(1)  # tiny models: threads cost more than they give

    setup = build_setup(cfg)
    runs = [run_regime(setup, r) for r in chosen]
    payload = {
        "paper": "On Teacher Hacking in Language Model Distillation (Tiapkin et al., ICML 2025)",
        "setup": setup.info,
        "config": {k: (str(v) if not isinstance(v, (int, float, str)) else v) for k, v in vars(cfg).items()},
        "runs": [{**r.summary(), "curve": r.curve.to_dict()} for r in runs],
    }
    with atomic_dir(out, overwrite=overwrite) as tmp:
        atomic_write_json(tmp / "curves.json", payload)
        _plot(tmp / "proxy_vs_golden.png", runs, setup.info["teacher_golden"])
    if as_json:
        typer.echo(json.dumps(payload, indent=2, default=str))
        return
    typer.echo(f"teacher golden KL(oracle||teacher) = {setup.info['teacher_golden']:.3f} nats/seq")
    for r in runs:
        s = r.summary()
        typer.echo(f"{s['regime']:<15} proxy {s['proxy_start']:.3f} -> {s['proxy_end']:.3f}   golden "
                   f"{s['golden_start']:.3f} -> min {s['golden_min']:.3f} (step {s['golden_min_step']}) -> "
                   f"{s['golden_end']:.3f}   detector {'FIRED' if s['detector_fired'] else 'quiet'}")
    typer.echo(f"wrote {out}")


def _plot(path: Path, runs: list, teacher_golden: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.5))
    for r in runs:
        ax.plot(r.curve.proxy, r.curve.golden, "-o", ms=3, label=r.curve.regime)
    ax.axhline(teacher_golden, ls=":", color="grey", label="KL(oracle‖teacher)")
    ax.invert_xaxis()
    ax.set_xlabel("proxy KL(teacher‖student)")
    ax.set_ylabel("golden KL(oracle‖student)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
