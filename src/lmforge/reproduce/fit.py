"""``lmforge reproduce fit``: Focus Instruction Tuning against SFT(y) on a spurious-keyword suite.

Lamb et al., "Focus On This, Not That! Steering LLMs with Adaptive Feature Specification" (ICML
2025, arXiv 2410.22944): fine-tuning on focus instructions (focus on / ignore the core or the
spurious feature, the label following the instruction) makes a model steerable: told to focus on
the core feature and ignore the spurious one it stays accurate where the spurious correlation is
reversed (the flipped split), where SFT on the task label collapses; told to focus on the spurious
feature it answers with the label that feature is tied to.

Here: the synthetic suite of :mod:`lmforge.data.spurious` (sentiment phrase = core, a keyword from
a named family = spurious, co-occurrence 0.9 in training; iid / high / low / flipped test splits,
and the same four on a held-out family never seen in training). Two tiny Llamas with the same
initialisation and tokenizer are fine-tuned with the same schedule through TRL's ``SFTTrainer``:
SFT(y) on the plain prompt, FIT on the six focus instructions drawn per example. Evaluation is
label-set scoring (argmax of the label log-likelihood).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from lmforge.reproduce.base import ClaimResult, Figure, ReproduceOptions, Table, register_reproduction

TITLE = "Focus Instruction Tuning (Lamb, Davies, Paren, Torr, Pinto; ICML 2025)"
TASK = "Is the sentiment positive or negative?"
SPLITS = ("iid", "high", "low", "flipped")
# The condition, fixed before any run (thresholds in absolute focus accuracy):
COLLAPSE_DROP = 0.15   # SFT(y) "collapses": flipped accuracy at least this far below its iid accuracy
HOLD_MIN = 0.80        # FIT focus(C)+ignore(S) "holds" on flipped: at least this ...
HOLD_MARGIN = 0.15     # ... and at least this far above SFT(y) on flipped
TRACK_MIN = 0.80       # FIT focus(S) "tracks y_S" on flipped: agrees with y_S at least this often
PAPER = {
    "claim": "FIT steers behaviour at inference time: focus(C)/ignore(S) keep focus accuracy high on the flipped "
             "and shifted test sets where the baselines collapse; focus(S) follows the spurious feature",
    "setting": "SS (binary SST-5 + 'Pineapple'/'Bayesian' keywords), SMNLI (MNLI + genre), BBQ; Llama-3.1-8B-"
               "Instruct, Mistral-7B-Instruct-v0.3, Vicuna-13B with LoRA; rho_train = 0.9 (notes)",
    "SMNLI FIT focus accuracy, all six instructions, iid/high/low/flipped (Fig. 3a radar, read off)":
        "about 80-95% on every split for every model",
    "SMNLI few-shot / SFT(y_focus) on focus(S) types (Fig. 3a)": "about 20-60%: the baselines do not follow focus(S)",
    "SMNLI under feature-value shift, unseen genres (Fig. 3b)":
        "FIT about 80-95% for ∅/focus(C)/ignore(S) types, about 20-40% for focus(S) types",
    "exact numbers": "not in the notes ([verify]); the figure values above are read off the project page's plots",
}


def _tiny_model(tok: Any, seed: int, hidden: int, layers: int) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=4 * hidden, num_hidden_layers=layers,
                      num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=128,
                      tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, initializer_range=0.02)
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg)


def verdict(table: dict[str, dict[str, float]]) -> dict[str, bool]:
    """The three checks and the verdict, from ``table[row][split]`` focus accuracies (rows ``sft``,
    ``fit:focus_c_ignore_s``, ``fit:focus_s``). Written before any run; the test recomputes it."""
    sft, core, spur = table["sft"], table["fit:focus_c_ignore_s"], table["fit:focus_s"]
    checks = {
        "SFT(y) collapses on flipped": sft["iid"] - sft["flipped"] >= COLLAPSE_DROP,
        "FIT focus(C)+ignore(S) holds on flipped": core["flipped"] >= HOLD_MIN
        and core["flipped"] >= sft["flipped"] + HOLD_MARGIN,
        "FIT focus(S) tracks y_S on flipped": spur["flipped"] >= TRACK_MIN,
    }
    checks["held"] = all(checks.values())
    return checks


def _plot(path: Path, table: dict[str, dict[str, float]], rows: list[str], splits: list[str], title: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.6))
    w = 0.8 / len(rows)
    for i, r in enumerate(rows):
        ax.bar([j + i * w for j in range(len(splits))], [table[r][s] for s in splits], width=w, label=r)
    ax.set_xticks([j + 0.4 - w / 2 for j in range(len(splits))], splits)
    ax.set_ylim(0, 1.3)
    ax.set_ylabel("focus accuracy")
    ax.axhline(0.5, color="grey", lw=0.8, ls="--")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, ncol=3, loc="upper center")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _arm(opts: ReproduceOptions, negation: float, n_train: int, n_test: int, cfg: Any, hidden: int,
         layers: int) -> dict[str, Any]:
    """Train SFT(y) and FIT from one initialisation on a suite with core negation rate ``negation``
    and score both; returns the focus-accuracy table, the raw evaluations and the training reports."""
    from lmforge.data import spurious as sp
    from lmforge.methods.fit.data import FOCUS_TYPES, FieldSpec, build_fit_data, sft_data
    from lmforge.methods.fit.evaluate import evaluate_examples
    from lmforge.methods.fit.train import train_sft
    from lmforge.models.tokenizer import train_tokenizer

    suite = sp.suite(opts.seed, n_train, n_test, n_val=20 if opts.quick else 200, negation=negation)
    spec = FieldSpec(label="label", spurious_label="keyword_label", core_name=sp.CORE_NAME, spurious_name=None,
                     spurious_name_field="family", spurious_name_format="the {}")
    # One BPE over every prompt form, held-out family included, so an unseen keyword is one token
    # whose embedding training never touches (an unseen feature, not an unknown token).
    texts = [e["prompt"] + e["completion"] for recs in suite.values()
             for e in build_fit_data(recs[:200], TASK, spec, mode="all")]
    tok = train_tokenizer(texts, 1000)
    train_sets = {"sft": sft_data(suite["train"], TASK, spec),
                  "fit": build_fit_data(suite["train"], TASK, spec, seed=opts.seed)}
    val_sets = {"sft": sft_data(suite["val"], TASK, spec),
                "fit": build_fit_data(suite["val"], TASK, spec, seed=opts.seed + 1)}
    all_splits = [*SPLITS, *[f"heldout-{s}" for s in SPLITS]]
    evals: dict[str, dict[str, Any]] = {}
    reports: dict[str, Any] = {}
    for method in ("sft", "fit"):
        model = _tiny_model(tok, opts.seed, hidden, layers)  # same initial weights for both
        reports[method] = train_sft(model, tok, train_sets[method], cfg, val_examples=val_sets[method])
        types = ["none"] if method == "sft" else list(FOCUS_TYPES)
        evals[method] = {split: evaluate_examples(model, tok, build_fit_data(suite[split], TASK, spec, types=types,
                                                                             mode="all"), sp.LABELS)
                         for split in all_splits}
    # table[row][split] = focus accuracy; rows: SFT(y) with its plain prompt, FIT per instruction.
    table: dict[str, dict[str, float]] = {"sft": {s: evals["sft"][s]["by_type"]["none"]["focus_accuracy"]
                                                  for s in all_splits}}
    for kind in FOCUS_TYPES:
        table[f"fit:{kind}"] = {s: evals["fit"][s]["by_type"][kind]["focus_accuracy"] for s in all_splits}
    n_params = sum(p.numel() for p in _tiny_model(tok, 0, hidden, layers).parameters())
    return {"table": table, "evals": evals, "reports": reports, "n_params": n_params}


@register_reproduction(
    "fit", title=TITLE,
    summary="tiny Llamas fine-tuned by SFT(y) and by FIT on a sentiment + spurious-keyword suite; focus accuracy on "
            "iid/high/low/flipped splits and an unseen keyword family",
)
def run(opts: ReproduceOptions) -> ClaimResult:
    import torch

    from lmforge.data import spurious as sp
    from lmforge.methods.fit.config import FITConfig
    from lmforge.methods.fit.data import FOCUS_SYMBOLS, FOCUS_TYPES

    start = time.perf_counter()
    torch.set_num_threads(1)
    n_train, n_test, steps = (800, 32, 30) if opts.quick else (8000, 200, 400)
    hidden, layers = 64, 2
    cfg = FITConfig(steps=steps, lr=3e-3, batch_size=32, eval_every=0 if opts.quick else 100, patience=2,
                    seed=opts.seed)
    # The verdict's arm: the notes' design, a core that is an XOR of two tokens.
    main = _arm(opts, sp.NEGATION, n_train, n_test, cfg, hidden, layers)
    # Control, reported beside it: the same with a one-token core (no negation).
    control_steps = 30 if opts.quick else 300
    control = _arm(opts, 0.0, n_train, n_test, FITConfig(**{**cfg.__dict__, "steps": control_steps}), hidden, layers)
    table, evals, reports = main["table"], main["evals"], main["reports"]
    checks = verdict(table)
    held = checks["held"]
    control_checks = verdict(control["table"])

    def label(r: str) -> str:
        return "SFT(y), plain prompt" if r == "sft" else f"FIT {FOCUS_SYMBOLS[r.split(':')[1]]}"

    row_order = ["sft", *[f"fit:{k}" for k in FOCUS_TYPES]]
    main_rows = [[label(r), *[round(table[r][s], 3) for s in SPLITS]] for r in row_order]
    held_rows = [[label(r), *[round(table[r][f"heldout-{s}"], 3) for s in SPLITS]] for r in row_order]
    control_rows = [[label(r), *[round(control["table"][r][s], 3) for s in SPLITS],
                     round(control["table"][r]["heldout-flipped"], 3)] for r in row_order]
    follow_rows = []
    for r, method, kind in [("sft", "sft", "none"), *[(f"fit:{k}", "fit", k) for k in FOCUS_TYPES]]:
        bt = evals[method]["flipped"]["by_type"][kind]
        hb = evals[method]["heldout-flipped"]["by_type"][kind]
        follow_rows.append([label(r), round(bt["agrees_with_label"], 3), round(bt["agrees_with_spurious"], 3),
                            round(hb["agrees_with_label"], 3), round(hb["agrees_with_spurious"], 3)])

    fig_rows = ["sft", "fit:focus_c_ignore_s", "fit:focus_c", "fit:none", "fit:focus_s"]
    f1 = _plot(opts.out_dir / "fit-focus-accuracy.png", {label(r): table[r] for r in fig_rows},
               [label(r) for r in fig_rows], list(SPLITS), "Focus accuracy, XOR core (verdict arm)")
    f2 = _plot(opts.out_dir / "fit-heldout-family.png", {label(r): table[r] for r in fig_rows},
               [label(r) for r in fig_rows], [f"heldout-{s}" for s in SPLITS],
               "Focus accuracy, held-out keyword family (XOR core)")
    f3 = _plot(opts.out_dir / "fit-control-easy-core.png", {label(r): control["table"][r] for r in fig_rows},
               [label(r) for r in fig_rows], list(SPLITS), "Control: one-token core (no negation)")

    def _train_json(reps: dict[str, Any]) -> dict[str, Any]:
        return {m: {"steps_run": r.steps_run, "best_step": r.best_step, "losses": r.losses,
                    "eval_losses": r.eval_losses, "seconds": r.seconds} for m, r in reps.items()}

    (opts.out_dir / "fit-results.json").write_text(json.dumps(
        {"table": table, "checks": checks, "evals": evals, "train": _train_json(reports),
         "control": {"table": control["table"], "checks": control_checks, "train": _train_json(control["reports"])}},
        indent=1, default=str))

    ct = control["table"]

    def steer(t: dict[str, dict[str, float]]) -> float:
        # On flipped (binary, y != y_S everywhere), focus(S) accuracy = 1 - share answering y, so this is
        # share answering y under focus(C)+ignore(S) minus that under focus(S): 1 = fully steered by
        # the instruction, 0 = the instruction changes nothing.
        return t["fit:focus_c_ignore_s"]["flipped"] - (1.0 - t["fit:focus_s"]["flipped"])

    measured: dict[str, Any] = {
        "SFT(y) focus accuracy iid / flipped": f"{table['sft']['iid']:.3f} / {table['sft']['flipped']:.3f}",
        "FIT focus(C)+ignore(S) iid / flipped": f"{table['fit:focus_c_ignore_s']['iid']:.3f} / "
                                                 f"{table['fit:focus_c_ignore_s']['flipped']:.3f}",
        "FIT focus(S) (vs y_S) iid / flipped": f"{table['fit:focus_s']['iid']:.3f} / {table['fit:focus_s']['flipped']:.3f}",
        "held-out family, flipped: FIT focus(C)+ignore(S) / focus(S) / SFT(y)":
            f"{table['fit:focus_c_ignore_s']['heldout-flipped']:.3f} / {table['fit:focus_s']['heldout-flipped']:.3f}"
            f" / {table['sft']['heldout-flipped']:.3f}",
        **{k: v for k, v in checks.items() if k != "held"},
        "control (one-token core), flipped: SFT(y) / FIT focus(C)+ignore(S) / FIT focus(S)":
            f"{ct['sft']['flipped']:.3f} / {ct['fit:focus_c_ignore_s']['flipped']:.3f} / {ct['fit:focus_s']['flipped']:.3f}",
        "FIT steerability on flipped, XOR core / control": f"{steer(table):.3f} / {steer(ct):.3f}",
        "steps run (kept) SFT / FIT": f"{reports['sft'].steps_run} ({reports['sft'].best_step}) / "
                                      f"{reports['fit'].steps_run} ({reports['fit'].best_step})",
    }
    notes = [
        f"Condition, fixed before running: held iff, on the XOR-core suite, SFT(y) loses at least {COLLAPSE_DROP:.2f} "
        f"focus accuracy from iid to flipped, FIT with focus(C)+ignore(S) scores at least {HOLD_MIN:.2f} on flipped "
        f"and at least {HOLD_MARGIN:.2f} above SFT(y) there, and FIT with focus(S) agrees with y_S on at least "
        f"{TRACK_MIN:.2f} of the flipped split. The held-out family and the one-token-core control are reported, "
        "not part of the verdict (the paper's own feature-shift results have focus(S) failing on unseen features).",
        f"Models: Llamas of {main['n_params'] / 1e6:.2f}M parameters (hidden {hidden}, {layers} layers), SFT(y) and FIT "
        "trained from the same random initialisation with a BPE tokenizer fitted here; the paper fine-tunes 7-13B "
        "instruction models with LoRA. A model trained from scratch knows neither feature before fine-tuning, unlike "
        "the paper's LLMs, which already read sentiment and follow instructions.",
        f"Data: {n_train} training records (rho = {sp.TRAIN_RHO}), families {', '.join(sp.TRAIN_FAMILIES)}; "
        f"{n_test} records per test split; held-out family {', '.join(sp.HELDOUT_FAMILIES)} "
        f"(keywords {', '.join(sp.FAMILIES[sp.HELDOUT_FAMILIES[0]])}) never appears in training. Core: one sentiment "
        f"word, negated by 'not' with probability {sp.NEGATION} (the label is then the opposite polarity), so the "
        "core label is an XOR of two tokens as the notes' CPU test asks; the control drops the negation.",
        f"Training: TRL SFTTrainer, completion-only loss, {steps} steps ({control_steps} in the control) of "
        f"{cfg.batch_size}, lr {cfg.lr}, "
        + ("no early stopping (quick mode)." if cfg.eval_every == 0 else
           f"early stopping on validation cross-entropy every {cfg.eval_every} steps (patience {cfg.patience}, "
           "best weights kept), as the paper."),
        "Splits: co-occurrence P(y = y_S) is 0.9 (iid), 1.0 (high), 0.5 (low), 0.0 (flipped), exact per split; "
        "the paper's exact test rates are unverified (see lmforge/data/spurious.py).",
        "On the flipped split (binary labels, y != y_S on every record) agreement with y and with y_S sum to 1, so "
        "a row at 0 for a y-type instruction means the model answered with the keyword's label every time. "
        "'Steerability' is the share of flipped records answered with y under focus(C)+ignore(S) minus the share "
        "under focus(S): 1 when the instruction alone decides which feature is read, 0 when it changes nothing "
        "(the model reads one feature whatever it is told).",
        f"Why steering is hard to learn from scratch: the focus label depends on the instruction only on records "
        f"where y != y_S, a share 1 - rho = {1 - sp.TRAIN_RHO:.0%} of the training set; on the rest every instruction "
        "has the same answer. The paper's instruction-tuned LLMs already map 'focus on X' to their own features; a "
        "model trained from scratch must learn the mapping from that thin signal."
        + (" In this run it did not: FIT's answers barely depend on the instruction in either arm (steerability "
           f"{steer(table):.2f} and {steer(ct):.2f})." if max(abs(steer(table)), abs(steer(ct))) < 0.2 else ""),
    ]
    if opts.quick:
        notes.append("Quick mode: 30 steps on 800 records and 32 records per split; the models have barely "
                     "started to learn, so the verdict is not meaningful.")
    return ClaimResult(
        name="fit", title=TITLE,
        claim=("Fine-tuned with focus instructions, a model told to focus on the core feature and ignore the spurious "
               "one stays accurate on a split where the spurious correlation is reversed, where SFT on the task label "
               "collapses; told to focus on the spurious feature, it follows the spurious feature's label."),
        paper=PAPER, measured=measured, held=held,
        tables=[
            Table("Focus accuracy per split, XOR core (the verdict's arm). SFT(y) answers its plain prompt; FIT rows "
                  "are the six focus instructions (focus label y, or y_S for the focus(S) rows).",
                  ["method", *SPLITS], main_rows),
            Table("Focus accuracy on the held-out family (name and keywords unseen in training), XOR core.",
                  ["method", *[f"heldout-{s}" for s in SPLITS]], held_rows),
            Table("Which label the predictions follow on the flipped splits (share equal to y, share equal to y_S), "
                  "XOR core.",
                  ["method", "flipped: = y", "flipped: = y_S", "heldout-flipped: = y", "heldout-flipped: = y_S"],
                  follow_rows),
            Table("Control: the same with a one-token core (no negation); focus accuracy per split and on the "
                  "held-out family's flipped split.", ["method", *SPLITS, "heldout-flipped"], control_rows),
        ],
        figures=[Figure(str(f1), "Focus accuracy per split on the training families (XOR core); dashed: chance."),
                 Figure(str(f2), "Focus accuracy on the held-out keyword family (XOR core)."),
                 Figure(str(f3), "Control: focus accuracy per split with a one-token core.")],
        notes=notes,
        seconds=time.perf_counter() - start,
    )
