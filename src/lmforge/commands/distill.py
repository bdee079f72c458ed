"""``lmforge align distill``: distil a teacher into a student (DistiLLM-2, Ko et al., ICML 2025).

Losses: ``distillm2`` (skew KL on teacher responses + skew reverse KL on student responses), and the
baselines ``kl``, ``rkl``, ``gjsd`` (TRL/GKD generalized JSD), ``skl`` (skew KL). See
:mod:`lmforge.methods.distillm2`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from lmforge.commands.groups import align_app
from lmforge.common.errors import UserError


def _vocab_key(tok: object) -> dict[str, int]:
    get_vocab = getattr(tok, "get_vocab", None)
    return dict(get_vocab()) if callable(get_vocab) else {}


def check_same_tokenizer(teacher_tok: object, student_tok: object) -> None:
    """A one-line UserError unless the two tokenizers have the same vocabulary (token -> id).

    Token-level distillation compares distributions over the same vocabulary index by index.
    """
    vt, vs = _vocab_key(teacher_tok), _vocab_key(student_tok)
    if vt != vs:
        only_t = len(set(vt) - set(vs))
        only_s = len(set(vs) - set(vt))
        raise UserError(
            f"teacher and student tokenizers differ (vocab sizes {len(vt)} vs {len(vs)}; {only_t} tokens only in the "
            f"teacher, {only_s} only in the student, or different ids); token-level distillation needs one tokenizer"
        )


@align_app.command("distill")
def distill_cmd(
    teacher: Annotated[str, typer.Option(help="Teacher model: a local Hugging Face folder or zoo:NAME.")],
    student: Annotated[str, typer.Option(help="Student model: a local Hugging Face folder or zoo:NAME.")],
    out: Annotated[Path, typer.Option(help="Output folder: the trained student, distill.json, pairs.jsonl.")],
    loss: Annotated[str, typer.Option(help="distillm2 | kl | rkl | gjsd | skl.")] = "distillm2",
    prompts: Annotated[Path | None, typer.Option(help="Prompts: .jsonl with a 'prompt' field, or one prompt per line.")] = None,
    pairs: Annotated[Path | None, typer.Option(help="DPO-format .jsonl (prompt, chosen, rejected): its prompts and teacher responses (chosen) are used; student responses are regenerated.")] = None,
    alpha: Annotated[float, typer.Option(help="Skew alpha in (0, 1] (paper and code: 0.1).")] = 0.1,
    beta: Annotated[float, typer.Option(help="Weight of the skew reverse KL term (released code: 0.5).")] = 0.5,
    gradual_beta: Annotated[bool, typer.Option("--gradual-beta", help="beta rises 0.5 -> 0.75 over the first half of training (paper).")] = False,
    update_alpha: Annotated[bool, typer.Option("--update-alpha", help="Per-sequence adaptive alpha from epoch 2 (paper).")] = False,
    gjsd_beta: Annotated[float, typer.Option(help="Generalized JSD beta for --loss gjsd (TRL convention: 0 = KL, 1 = reverse KL).")] = 0.5,
    baseline_data: Annotated[str, typer.Option(help="Responses a baseline loss uses: both | teacher | student.")] = "both",
    epochs: Annotated[int, typer.Option(help="Epochs; student responses are regenerated before each.")] = 3,
    lr: Annotated[float, typer.Option(help="AdamW learning rate (paper: 5e-5 with LoRA).")] = 5e-5,
    batch_size: Annotated[int, typer.Option(help="Prompts per optimizer step.")] = 8,
    max_new_tokens: Annotated[int, typer.Option(help="Response length cap when sampling.")] = 64,
    temperature: Annotated[float, typer.Option(help="Sampling temperature (paper: 0.8).")] = 0.8,
    top_p: Annotated[float, typer.Option(help="Nucleus threshold (paper: 0.95).")] = 0.95,
    lora: Annotated[bool, typer.Option("--lora", help="Train PEFT LoRA adapters on all linear layers, merged on save.")] = False,
    lora_r: Annotated[int, typer.Option(help="LoRA rank (paper: 16).")] = 16,
    lora_alpha: Annotated[int, typer.Option(help="LoRA alpha (released config: 128).")] = 128,
    seed: Annotated[int, typer.Option(help="Seed of sampling and data order.")] = 0,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing output folder.")] = False,
    as_json: Annotated[bool, typer.Option("--json", help="Print results as JSON on stdout.")] = False,
) -> None:
    """Distil TEACHER into STUDENT on PROMPTS with DistiLLM-2 or a baseline loss; save the student."""
    import json

    import torch

    from lmforge.common.io import atomic_dir, atomic_write_json, check_output_dir
    from lmforge.methods.distillm2.config import DistillConfig
    from lmforge.methods.distillm2.data import load_pairs, load_prompts, write_pairs
    from lmforge.methods.distillm2.train import distill
    from lmforge.models.load import load

    cfg = DistillConfig(loss=loss, alpha=alpha, beta=beta, gradual_beta=gradual_beta, update_alpha=update_alpha,
                        gjsd_beta=gjsd_beta, baseline_data=baseline_data, epochs=epochs, lr=lr,
                        batch_size=batch_size, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p,
                        lora=lora, lora_r=lora_r, lora_alpha=lora_alpha, seed=seed)
    if (prompts is None) == (pairs is None):
        raise UserError("give exactly one of --prompts and --pairs")
    check_output_dir(out, overwrite)
    prompt_list = load_prompts(prompts) if prompts is not None else None

    t_model, t_tok = load(teacher)
    s_model, s_tok = load(student)
    check_same_tokenizer(t_tok, s_tok)
    n_t = sum(p.numel() for p in t_model.parameters())
    n_s = sum(p.numel() for p in s_model.parameters())
    if n_s > n_t:
        typer.echo(f"warning: the student ({n_s:,} parameters) is larger than the teacher ({n_t:,})", err=True)

    teacher_responses = None
    if pairs is not None:
        given = load_pairs(pairs, t_tok)
        prompt_list = [p.prompt for p in given]
        teacher_responses = [(p.chosen, p.chosen_ids) for p in given]
    assert prompt_list is not None
    torch.manual_seed(seed)
    res = distill(t_model, s_model, t_tok, prompt_list, cfg, teacher_responses=teacher_responses, copy_student=False)
    model = res.student.merge_and_unload() if cfg.lora else res.student
    record = {"method": "distillm2", "loss": cfg.loss, "teacher": teacher, "student": student,
              "teacher_parameters": n_t, "student_parameters": n_s, "prompts": len(prompt_list),
              "config": cfg.to_dict(), "epochs": res.epochs, "steps": len(res.history),
              "final_loss": res.history[-1]["loss"] if res.history else None, "history": res.history}
    with atomic_dir(out, overwrite=overwrite) as tmp:
        model.save_pretrained(tmp)
        s_tok.save_pretrained(tmp)
        write_pairs(tmp / "pairs.jsonl", res.pairs)
        atomic_write_json(tmp / "distill.json", record)
    summary = {k: v for k, v in record.items() if k != "history"} | {"out": str(out)}
    if as_json:
        typer.echo(json.dumps(summary, indent=2, default=str))
    else:
        typer.echo(f"distilled {student} from {teacher} with {cfg.loss}: {summary['steps']} steps, "
                   f"final loss {summary['final_loss']:.4f}; saved to {out}")
