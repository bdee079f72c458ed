"""Simple-to-hard visual reasoning (Park et al., ICML 2025): data, training and evaluation commands.

- ``lmforge bench s2h-data``: the official tasks (Table Readout, Grid Navigation, Visual Analogy)
  written in the official layout (one JSON per data type, images beside them), for any VLM trainer.
- ``lmforge train s2h-base``: pretrain the tiny base VLM (``vlm-nano``) on generic skills.
- ``lmforge train s2h``: fine-tune a tiny VLM on miniature Table Readout with a supervision strategy.
- ``lmforge bench s2h``: accuracy of a tiny VLM on SIMPLE/HARD x image/text, or its answer on one image.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated

import typer

from lmforge.commands.groups import bench_app, train_app
from lmforge.common.errors import UserError

TASK_HELP = "Task: table-readout, grid-navigation or visual-analogy."


def _sizes(items: list[str]) -> dict[str, tuple[int, int]]:
    out: dict[str, tuple[int, int]] = {}
    for it in items:
        m = re.fullmatch(r"([a-z_]+)=(\d+)(?:\.\.(\d+))?", it.strip())
        if not m:
            raise UserError(f"--size {it!r}: expected NAME=LO..HI or NAME=N (e.g. rows=7..9)")
        lo = int(m.group(2))
        out[m.group(1)] = (lo, int(m.group(3)) if m.group(3) else lo)
    return out


@bench_app.command("s2h-data")
def s2h_data(
    task: Annotated[str, typer.Option(help=TASK_HELP)],
    out: Annotated[Path, typer.Option(help="Output root: writes OUT/TASK/LEVEL/{raw.json, images/, text2answer+cot.json, image2answer+cot.json, image2answer+text+cot.json, image2text+cot.json}.")],
    level: Annotated[str, typer.Option(help="SIMPLE or HARD.")] = "SIMPLE",
    n: Annotated[int, typer.Option(help="Puzzles to generate.")] = 100,
    seed: Annotated[int, typer.Option(help="Generator seed (the same seed gives the same puzzles).")] = 0,
    size: Annotated[list[str], typer.Option(help="Narrow a size range inside the official one, e.g. --size rows=7..9 (repeatable).")] = [],  # noqa: B006
    cot: Annotated[bool, typer.Option(help="Write the official chain of thought (files named +cot).")] = True,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing OUT/TASK/LEVEL folder.")] = False,
) -> None:
    """Generate one level of an S2H task in the official file layout (LLaVA conversation JSON).

    The folder is built beside its target and renamed, so nothing is left behind on failure.
    """
    from lmforge.methods.simple_to_hard.tasks import write_split

    path = write_split(task, level, n, seed, out, cot=cot, overwrite=overwrite, **_sizes(size))
    typer.echo(f"wrote {n} {level} puzzles to {path}")


@train_app.command("s2h-base")
def s2h_base(
    out: Annotated[Path, typer.Option(help="Output folder for the base VLM (a transformers LLaVA checkpoint + vlm.json card).")],
    steps: Annotated[int, typer.Option(help="Phase-1 batches of 32 (cell reads in image and text tables, additions).")] = 3000,
    spatial_steps: Annotated[int, typer.Option(help="Phase-2 batches of 32 (grid neighbours, highlighted neighbours, named reads; 0 skips phase 2).")] = 1500,
    init: Annotated[Path | None, typer.Option(help="Continue from a phase-1 checkpoint with its vlm.json card (skips phase 1; the committed vlm-nano was built this way).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the weights and the data.")] = 0,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing --out folder.")] = False,
) -> None:
    """Pretrain the tiny S2H base VLM on generic skills only, equal in image and text: phase 1 reads
    cells and adds digits, phase 2 drills grid neighbours and highlighted cells (never paths or sums).
    From scratch both phases take about 25 minutes on 2 cores."""
    from lmforge.methods.simple_to_hard.base import build_base

    if steps < 1:
        raise UserError("--steps must be at least 1")
    if spatial_steps < 0:
        raise UserError("--spatial-steps must be 0 or more")
    if out.exists() and not overwrite:
        raise UserError(f"{out} exists; pass --overwrite to replace it")
    card = build_base(out, steps=steps, seed=seed, overwrite=overwrite, spatial_steps=spatial_steps, init=init)
    typer.echo(json.dumps(card["probe"]))


@train_app.command("s2h")
def s2h_train(
    strategy: Annotated[str, typer.Option(help="Supervision: text, image, image-3ep, image-via-text, image+text, mix, mix+, align-mix+, image-via-text+, image+hard-text (official combine_data.py options).")],
    out: Annotated[Path, typer.Option(help="Output folder: the fine-tuned LLaVA checkpoint (loads with LlavaForConditionalGeneration) and train.json (phases, losses, alignment probes).")],
    budget: Annotated[int, typer.Option(help="Training examples in total, composed and split across epochs as combine_data.py does (the reproduction uses 8000 an arm).")] = 8000,
    base: Annotated[Path | None, typer.Option(help="Base VLM folder (default: the committed vlm-nano).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the data and the batch order.")] = 0,
    lr: Annotated[float, typer.Option(help="Peak learning rate (cosine, 3% warm-up); the reproduction's fine-tuning lr (see its NOTE).")] = 1e-3,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing --out folder.")] = False,
) -> None:
    """Fine-tune a tiny VLM on miniature Table Readout with one supervision strategy."""
    from lmforge.methods.simple_to_hard import experiment, mini, supervision, vlm
    from lmforge.methods.simple_to_hard.base import load_base
    from lmforge.methods.simple_to_hard.train import TrainConfig

    supervision.plan(strategy, budget)  # unknown strategy / tiny budget: before anything loads
    if not lr > 0:
        raise UserError("--lr must be positive")
    if out.exists() and not overwrite:
        raise UserError(f"{out} exists; pass --overwrite to replace it")
    model, tok = load_base(base)
    pools = experiment.make_pools(budget // 2, budget // 2, seed)
    ev = {"hard-image": mini.generate("HARD", 50, 10_000 + seed)}
    probe = experiment.hard_probe_batch(tok, mini.generate("HARD", 16, 40_000 + seed))
    import os

    r = experiment.run_arm(model, tok, strategy, budget, pools, ev, probe, seed, cfg=TrainConfig(lr=lr, seed=seed),
                           keep_model=True, progress=os.environ.get("LMFORGE_NO_PROGRESS") != "1")
    phases = [{"option": ph.option, "epochs": ph.epochs, "repeat_simple": ph.repeat_simple,
               "examples": {f"{lv} {dt}": k for (lv, dt), k in ph.counts.items()}}
              for ph in supervision.plan(strategy, budget)]
    tmp = out.with_name(out.name + ".tmp")
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)
    vlm.save(r.model, tok, tmp, {"strategy": strategy, "budget": budget, "seed": seed, "lr": lr,
                                  "base": str(base or "vlm-nano")})
    (tmp / "train.json").write_text(json.dumps({"phases": phases, "steps": r.steps, "train_seconds": r.train_seconds,
                                                "hard_image_accuracy_50": r.accuracy["hard-image"],
                                                "alignment": r.alignment, "losses": r.losses}, indent=1))
    if out.exists():
        shutil.rmtree(out)
    tmp.rename(out)
    typer.echo(f"{strategy}: {r.steps} steps in {r.train_seconds} s; HARD-image accuracy on 50: "
               f"{r.accuracy['hard-image']:.2f}; saved {out}")


@bench_app.command("s2h")
def s2h_bench(
    model: Annotated[Path | None, typer.Option(help="A tiny S2H VLM folder (default: the committed vlm-nano).")] = None,
    n: Annotated[int, typer.Option(help="Puzzles per split (SIMPLE/HARD x image/text).")] = 100,
    seed: Annotated[int, typer.Option(help="Seed of the evaluation puzzles.")] = 0,
    image: Annotated[Path | None, typer.Option(help="Answer one miniature Table Readout image (48x48 PNG) instead; needs --start and --end.")] = None,
    start: Annotated[str | None, typer.Option(help="With --image: the path's first cell (a1..f6).")] = None,
    end: Annotated[str | None, typer.Option(help="With --image: the path's last cell.")] = None,
    out: Annotated[Path | None, typer.Option(help="Write the accuracies (JSON) here.")] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing --out file.")] = False,
) -> None:
    """Accuracy of a tiny VLM on miniature Table Readout, SIMPLE/HARD x image/text."""
    from lmforge.common.io import atomic_write_json, check_output_file
    from lmforge.methods.simple_to_hard import experiment, mini, vlm
    from lmforge.methods.simple_to_hard.base import load_base

    if out is not None:
        check_output_file(out, overwrite)
    if image is not None:
        from PIL import Image, UnidentifiedImageError

        cells = {mini.cell_name(r, c) for r in range(mini.N) for c in range(mini.N)}
        if start not in cells or end not in cells:
            raise UserError("--image needs --start and --end, each a cell a1..f6")
        try:
            arr = mini.validate_image(Image.open(image))
        except (FileNotFoundError, UnidentifiedImageError, OSError) as e:
            raise UserError(f"cannot read {image} as an image: {e}") from None
        m, tok = load_base(model)
        resp = vlm.generate(m, tok, [f"<image> image yellow path {start} to {end} total ?"], [arr],
                            max_new_tokens=experiment.MAX_NEW_TOKENS)[0]
        typer.echo(resp)
        return
    if n < 1:
        raise UserError("--n must be at least 1")
    m, tok = load_base(model)
    splits = {f"{lv.lower()}-{mod}": mini.generate(lv, n, 50_000 + seed + i)
              for i, (lv, mod) in enumerate((lv, mod) for lv in ("SIMPLE", "HARD") for mod in ("image", "text"))}
    acc, conv = experiment.evaluate(m, tok, splits)
    rec = {"accuracy": acc, "hard_image_converted": conv, "n": n, "seed": seed}
    typer.echo(json.dumps(rec))
    if out is not None:
        atomic_write_json(out, rec)
