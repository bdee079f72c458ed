"""``lmforge align fit-data`` and ``lmforge align fit``: Focus Instruction Tuning (Lamb et al., ICML
2025, arXiv 2410.22944).

``fit-data`` turns a labelled JSON-lines file with a named core feature and a named spurious
feature into FIT prompt/completion records (the six focus instructions, label following the
instruction); ``fit`` fine-tunes a model on such records with TRL's ``SFTTrainer`` and, given
evaluation records, reports focus accuracy per focus instruction.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Annotated, Any

import typer

from lmforge.commands.groups import align_app
from lmforge.common.errors import UserError

JsonOpt = Annotated[bool, typer.Option("--json", help="Print results as JSON on stdout.")]


def _emit(obj: Any) -> None:
    typer.echo(json.dumps(obj, indent=2, default=str))


@align_app.command("fit-data")
def fit_data_cmd(
    input: Annotated[Path, typer.Option("--input", "-i", help="Labelled records, one JSON object per line.")],
    out: Annotated[Path, typer.Option(help="Output JSON-lines file of FIT records (prompt, completion, focus_type, focus_label, label, spurious_label).")],
    task: Annotated[str, typer.Option(help="The task line that opens every prompt.")],
    core_name: Annotated[str, typer.Option(help="How instructions name the core feature, e.g. 'the sentiment'.")],
    spurious_name: Annotated[str | None, typer.Option(help="How instructions name the spurious feature, e.g. 'the keyword'.")] = None,
    spurious_name_field: Annotated[str | None, typer.Option(help="Or: a field holding the spurious feature's name per record.")] = None,
    spurious_name_format: Annotated[str, typer.Option(help="Format applied to --spurious-name-field's value, e.g. 'the {}'.")] = "{}",
    text_field: Annotated[str, typer.Option(help="Field with the input text.")] = "text",
    label_field: Annotated[str, typer.Option(help="Field with the task label y.")] = "label",
    spurious_label_field: Annotated[str | None, typer.Option(help="Field with y_S, the label the spurious value is tied to.")] = None,
    spurious_field: Annotated[str | None, typer.Option(help="Or: field with the spurious value, mapped to y_S by --spurious-map.")] = None,
    spurious_map: Annotated[str | None, typer.Option(help="JSON object: spurious value -> tied label, e.g. '{\"pineapple\": \"positive\"}'.")] = None,
    mode: Annotated[str, typer.Option(help="sample: one focus instruction per record, drawn uniformly (training); all: all six per record (evaluation).")] = "sample",
    types: Annotated[str | None, typer.Option(help="Comma-separated focus types (default: all six: none, focus_c, ignore_s, focus_c_ignore_s, focus_s, focus_s_ignore_c).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the focus-type draw.")] = 0,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing output file.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Build Focus Instruction Tuning data from labelled records.

    \b
    Examples:
      lmforge align fit-data -i reviews.jsonl --out fit.jsonl --task "Is the sentiment positive or negative?" \\
        --core-name "the sentiment" --spurious-name "the keyword" --spurious-field keyword \\
        --spurious-map '{"pineapple": "positive", "bayesian": "negative"}'
    """
    from lmforge.common.io import atomic_write_text, check_output_file
    from lmforge.methods.fit.apply import read_jsonl
    from lmforge.methods.fit.data import FOCUS_TYPES, FieldSpec, build_fit_data

    check_output_file(out, overwrite)
    if (spurious_name is None) == (spurious_name_field is None):
        raise UserError("give exactly one of --spurious-name and --spurious-name-field")
    if spurious_label_field is None and (spurious_field is None or spurious_map is None):
        raise UserError("give --spurious-label-field, or --spurious-field with --spurious-map")
    smap = None
    if spurious_map is not None:
        try:
            smap = json.loads(spurious_map)
        except json.JSONDecodeError as exc:
            raise UserError(f"--spurious-map is not valid JSON ({exc.msg})") from None
        if not isinstance(smap, dict):
            raise UserError("--spurious-map must be a JSON object (value -> label)")
        smap = {str(k): str(v) for k, v in smap.items()}
    spec = FieldSpec(text=text_field, label=label_field, spurious_label=spurious_label_field,
                     spurious_field=spurious_field, spurious_map=smap, core_name=core_name,
                     spurious_name=spurious_name, spurious_name_field=spurious_name_field,
                     spurious_name_format=spurious_name_format)
    kinds = [t.strip() for t in types.split(",") if t.strip()] if types else list(FOCUS_TYPES)
    records = read_jsonl(input, "input")
    examples = build_fit_data(records, task, spec, seed=seed, types=kinds, mode=mode)
    atomic_write_text(out, "".join(json.dumps(e) + "\n" for e in examples))
    counts = {k: sum(e["focus_type"] == k for e in examples) for k in kinds}
    if as_json:
        _emit({"out": str(out), "records": len(records), "examples": len(examples), "by_type": counts})
        return
    typer.echo(f"{len(examples)} FIT examples from {len(records)} records -> {out}")
    typer.echo("by focus type: " + ", ".join(f"{k} {v}" for k, v in counts.items()))


@align_app.command("fit")
def fit_cmd(
    model: Annotated[str, typer.Option("--model", "-m", help="A local HF causal-LM folder or zoo:NAME.")],
    data: Annotated[Path, typer.Option(help="Training records with 'prompt' and 'completion' (from `lmforge align fit-data`).")],
    out: Annotated[Path, typer.Option(help="Output model folder (with fit.json: losses, validation losses, focus accuracy).")],
    eval_data: Annotated[Path | None, typer.Option("--eval", help="FIT records to score after training (e.g. fit-data --mode all on a test split).")] = None,
    labels: Annotated[str | None, typer.Option(help="Comma-separated label set for evaluation (default: the labels the eval records mention).")] = None,
    steps: Annotated[int, typer.Option(help="Optimizer steps.")] = 300,
    lr: Annotated[float, typer.Option(help="Peak learning rate.")] = 3e-3,
    batch_size: Annotated[int, typer.Option(help="Examples per step.")] = 32,
    val_fraction: Annotated[float, typer.Option(help="Share of the training records held out for early stopping on validation cross-entropy (with --eval-every).")] = 0.1,
    eval_every: Annotated[int, typer.Option(help="Steps between validation checks; 0 turns early stopping off.")] = 50,
    patience: Annotated[int, typer.Option(help="Checks without improvement before stopping; the best weights are kept.")] = 3,
    seed: Annotated[int, typer.Option(help="Seed of the data order and the validation split.")] = 0,
    lora_r: Annotated[int, typer.Option(help="LoRA rank on every linear layer (PEFT; merged into the saved model); 0 trains every weight.")] = 0,
    lora_alpha: Annotated[int, typer.Option(help="LoRA alpha (the update is scaled by alpha / r).")] = 32,
    bf16: Annotated[bool, typer.Option(help="bfloat16 autocast (weights and optimizer state stay fp32); faster on CPUs with native bf16.")] = False,
    trainer: Annotated[str, typer.Option(help="trl (TRL's SFTTrainer) | loop (same loss, LM head only at the answer tokens: faster on real vocabularies).")] = "trl",
    overwrite: Annotated[bool, typer.Option(help="Replace an existing output folder.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Focus Instruction Tuning: completion-only SFT on FIT records (TRL SFTTrainer), then focus accuracy.

    \b
    Examples:
      lmforge align fit -m ./tiny --data fit.jsonl --out runs/fit --eval test-all.jsonl
      lmforge align fit -m real:smollm2-135m-instruct --data fit.jsonl --out runs/fit-lora \\
          --lora-r 16 --lr 1e-3 --bf16 --trainer loop --steps 50 --batch-size 16
    """
    from lmforge.common.io import check_output_dir
    from lmforge.methods.fit.apply import fit_model, read_jsonl
    from lmforge.methods.fit.config import FITConfig

    check_output_dir(out, overwrite)
    cfg = FITConfig(steps=steps, lr=lr, batch_size=batch_size, eval_every=eval_every, patience=patience, seed=seed,
                    lora_r=lora_r, lora_alpha=lora_alpha, bf16=bf16, trainer=trainer)
    train = read_jsonl(data, "training data", required=("prompt", "completion"))
    ev = read_jsonl(eval_data, "evaluation data", required=("prompt", "focus_type", "focus_label")) \
        if eval_data is not None else None
    labs = [x.strip() for x in labels.split(",") if x.strip()] if labels else None
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    res = fit_model(model, train, out, cfg, eval_examples=ev, labels=labs, val_fraction=val_fraction,
                    overwrite=overwrite)
    if as_json:
        _emit(res)
        return
    tr = res["train"]
    first = tr["losses"][0][1] if tr["losses"] else float("nan")
    last = tr["losses"][-1][1] if tr["losses"] else float("nan")
    typer.echo(f"{tr['steps_run']} steps in {tr['seconds']:.1f} s: loss {first:.4f} -> {last:.4f}; "
               f"kept the weights of step {tr['best_step']}")
    if "eval" in res:
        e = res["eval"]
        typer.echo(f"focus accuracy {e['focus_accuracy']:.3f} on {e['n']} records (labels: {', '.join(res['labels'])})")
        for k, v in e["by_type"].items():
            typer.echo(f"  {k:<18} {v['focus_accuracy']:.3f}  (= y {v['agrees_with_label']:.3f}, "
                       f"= y_S {v['agrees_with_spurious']:.3f}, n {v['n']})")
    typer.echo(f"saved to {out} (fit.json inside)")
