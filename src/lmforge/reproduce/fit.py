"""``lmforge reproduce fit``: Focus Instruction Tuning against SFT(y) on a spurious-keyword suite.

By default on SmolLM2-135M-Instruct (``real:smollm2-135m-instruct``): LoRA SFT(y) and LoRA FIT from
the same untuned weights with the same budget, three seeds, on natural-language film reviews with a
keyword sentence (:mod:`lmforge.data.spurious_reviews`); the condition is :data:`REAL_MIN_SEEDS` of
:data:`REAL_SEEDS` seeds meeting :func:`verdict`. ``--quick`` runs the tiny-Llama miniature described
below (what the tests use); ``--full`` adds a run with 4x the steps at one seed and the miniature's
full arms.

The miniature:

Lamb et al., "Focus On This, Not That! Steering LLMs with Adaptive Feature Specification" (ICML
2025, arXiv 2410.22944): fine-tuning on focus instructions (focus on / ignore the core or the
spurious feature, the label following the instruction) makes a model steerable: told to focus on
the core feature and ignore the spurious one it stays accurate where the spurious correlation is
reversed (the flipped split), where SFT on the task label collapses; told to focus on the spurious
feature it answers with the label that feature is tied to.

Here: the synthetic suite of :mod:`lmforge.data.spurious` (sentiment phrase = core, a keyword from
a named family = spurious, co-occurrence 0.9 in training; iid / high / low / flipped test splits,
and the same four on a held-out family never seen in training). The paper fine-tunes pretrained
instruction models that already read both features; so here a tiny Llama is first "pretrained" on
two label-independent auxiliary tasks (what is the sentiment of the text, on data where the keyword
is uncorrelated with it; which keyword of a family appears), and SFT(y) and FIT then start from
that one checkpoint and are fine-tuned with the same schedule through TRL's ``SFTTrainer``: SFT(y)
on the plain prompt, FIT on the six focus instructions drawn per example. Evaluation is label-set
scoring (argmax of the label log-likelihood).

Two arms share the checkpoint and the test splits: a clean core (the text's sentiment always reads the
gold label) and an ambiguous one (10% of the training texts contradict their label, so the core is as
reliable as the keyword's tie). With the clean core SFT(y) does not collapse; with the ambiguous one it
does, but FIT's focus(C)+ignore(S) answers did not hold there at seeds 0-2 (the report's notes give
every seed).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from lmforge.reproduce.base import (ClaimResult, Figure, ReproduceOptions, Table, figure, register_reproduction,
                                   save_figure)

TITLE = "Focus Instruction Tuning (Lamb, Davies, Paren, Torr, Pinto; ICML 2025)"
TASK = "Is the sentiment positive or negative?"
SPLITS = ("iid", "high", "low", "flipped")
# Auxiliary "pretraining" prompts: label-independent tasks that make the tiny model represent both
# features before SFT/FIT (the paper's LLMs already do). Their wording differs from TASK.
SENTIMENT_PROBE = "What is the sentiment of the text?"
KEYWORD_PROBE = "What is the {} in the text?"
PRETRAIN_RHO = 0.5       # keyword independent of the sentiment in the auxiliary data
PRETRAIN_NEGATION = 0.25  # share of negated sentiment words in the auxiliary data (test splits keep sp.NEGATION)
# The two fine-tuning data regimes (arm -> share of ambiguous training texts, see lmforge.data.spurious):
# a core that always reads the gold label, and one that reads it 90% of the time, as often as the
# keyword's tie does (rho 0.9). Test splits are the same gold-consistent records in both arms.
ARMS: dict[str, float] = {"clean core": 0.0, "ambiguous core": 0.10}
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
    fig, ax = figure(figsize=(8, 3.6))
    w = 0.8 / len(rows)
    for i, r in enumerate(rows):
        ax.bar([j + i * w for j in range(len(splits))], [table[r][s] for s in splits], width=w, label=r)
    ax.set_xticks([j + 0.4 - w / 2 for j in range(len(splits))], splits)
    ax.set_ylim(0, 1.3)
    ax.set_ylabel("focus accuracy")
    ax.axhline(0.5, color="grey", lw=0.8, ls="--")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, ncol=3, loc="upper center")
    return save_figure(fig, path)


def sentiment_probe(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Auxiliary task 1: the sentiment of the text (the core label ``y``), a question worded apart
    from :data:`TASK`, with no focus line."""
    from lmforge.methods.fit.data import completion, render_prompt

    return [{"prompt": render_prompt(SENTIMENT_PROBE, "", r["text"]), "completion": completion(r["label"]),
             "focus_type": "sentiment", "focus_label": r["label"], "label": r["label"]} for r in recs]


def keyword_probe(recs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Auxiliary task 2: which keyword of the record's family appears (answer: the keyword itself,
    not its tied label, so the task is label-independent). The family is named as the focus
    instructions name it ("the fruit")."""
    from lmforge.methods.fit.data import completion, render_prompt

    return [{"prompt": render_prompt(KEYWORD_PROBE.format(r["family"]), "", r["text"]),
             "completion": completion(r["keyword"]), "focus_type": "keyword", "focus_label": r["keyword"],
             "label": r["keyword"]} for r in recs]


def probe_accuracy(model: Any, tok: Any, recs: list[dict[str, Any]]) -> dict[str, float]:
    """The checkpoint's accuracy on the two auxiliary tasks (sentiment over the label set, keyword
    over its family's two keywords) and how often it answers the task prompt with ``y``."""
    from lmforge.data import spurious as sp
    from lmforge.methods.fit.data import FieldSpec, sft_data
    from lmforge.methods.fit.evaluate import evaluate_examples, label_logprobs

    sent = evaluate_examples(model, tok, sentiment_probe(recs), sp.LABELS)["focus_accuracy"]
    kw = keyword_probe(recs)
    hits = 0
    for e, r in zip(kw, recs):
        cands = list(sp.FAMILIES[r["family"]])
        lp = label_logprobs(model, tok, [e["prompt"]], cands)[0]
        hits += int(cands[max(range(len(cands)), key=lambda j: lp[j])] == r["keyword"])
    spec = FieldSpec(label="label", spurious_label="keyword_label")
    task = evaluate_examples(model, tok, sft_data(recs, TASK, spec), sp.LABELS)["by_type"]["none"]["agrees_with_label"]
    return {"sentiment": sent, "keyword": hits / max(1, len(recs)), "task=y": task}


def _experiment(opts: ReproduceOptions, n_train: int, n_test: int, pre_steps: tuple[int, int], pre_lr: float,
                cfg: Any, hidden: int, layers: int, arms: dict[str, float]) -> dict[str, Any]:
    """Pretrain one tiny Llama on the auxiliary tasks, then, for each arm (share of ambiguous training
    texts), fine-tune SFT(y) and FIT from that same checkpoint with the same schedule and score both;
    returns per-arm tables, raw evaluations, probes and training reports."""
    import copy
    import random

    from lmforge.data import spurious as sp
    from lmforge.methods.fit.config import FITConfig
    from lmforge.methods.fit.data import FOCUS_TYPES, FieldSpec, build_fit_data, sft_data
    from lmforge.methods.fit.evaluate import evaluate_examples
    from lmforge.methods.fit.train import train_sft
    from lmforge.models.tokenizer import train_tokenizer

    n_val = 20 if opts.quick else 200
    suites = {arm: sp.suite(opts.seed, n_train, n_test, n_val=n_val, ambiguity=amb) for arm, amb in arms.items()}
    suite = suites[next(iter(arms))]
    spec = FieldSpec(label="label", spurious_label="keyword_label", core_name=sp.CORE_NAME, spurious_name=None,
                     spurious_name_field="family", spurious_name_format="the {}")
    # NOTE: the paper fine-tunes instruction LLMs that already read sentiment and name the things in a
    # text; a tiny model trained from scratch does neither (the earlier from-scratch run never learned
    # the XOR core and FIT's answers ignored the instruction). So a "pretraining" stage first teaches
    # both features through label-independent tasks on fresh records of the training families: the
    # keyword is independent of the sentiment there (rho 0.5), and the keyword task answers with the
    # keyword itself, so neither the spurious tie (keyword -> label) nor FIT's instructions are seen.
    # NOTE: the auxiliary records negate the sentiment word a quarter of the time, not half: with
    # exactly half, word polarity and negation are each uncorrelated with the label (a parity problem)
    # and gradient descent sat at chance in our runs; natural text negates less often than it does
    # not, and the test splits keep the notes' 0.5. Stage 1 is the sentiment task alone, stage 2 mixes
    # it 1:1 with the keyword task: measured here, mixing from the start left the sentiment at chance.
    pre_recs = [sp.make_split(f"{opts.seed}:pretrain{k}", n_train, PRETRAIN_RHO, sp.TRAIN_FAMILIES, exact=False,
                              negation=PRETRAIN_NEGATION) for k in (1, 2)]
    rng = random.Random(f"lmforge-fit-pretrain:{opts.seed}")
    stage1 = sentiment_probe(pre_recs[0])
    stage2 = [e for r in pre_recs[1] for e in (sentiment_probe([r]) if rng.random() < 0.5 else keyword_probe([r]))]
    # One BPE over every prompt form, held-out family included, so an unseen keyword is one token
    # whose embedding training never touches (an unseen feature, not an unknown token).
    texts = [e["prompt"] + e["completion"] for recs in suite.values()
             for e in build_fit_data(recs[:200], TASK, spec, mode="all")]
    texts += [e["prompt"] + e["completion"] for e in stage2[:400]]
    tok = train_tokenizer(texts, 1000)
    model = _tiny_model(tok, opts.seed, hidden, layers)
    pre_reports = []
    for k, (data, steps) in enumerate(zip((stage1, stage2), pre_steps)):
        pre_reports.append(train_sft(model, tok, data, FITConfig(steps=steps, lr=pre_lr, batch_size=cfg.batch_size,
                                                                  seed=opts.seed + k)))
    pretrained = copy.deepcopy(model.state_dict())
    probes_pre = {s: probe_accuracy(model, tok, suite[s]) for s in SPLITS}
    all_splits = [*SPLITS, *[f"heldout-{s}" for s in SPLITS]]
    out: dict[str, Any] = {}
    for arm, su in suites.items():
        train_sets = {"sft": sft_data(su["train"], TASK, spec),
                      "fit": build_fit_data(su["train"], TASK, spec, seed=opts.seed)}
        val_sets = {"sft": sft_data(su["val"], TASK, spec),
                    "fit": build_fit_data(su["val"], TASK, spec, seed=opts.seed + 1)}
        evals: dict[str, dict[str, Any]] = {}
        reports: dict[str, Any] = {}
        probes: dict[str, Any] = {"pretrained": probes_pre}
        for method in ("sft", "fit"):
            model.load_state_dict(pretrained)  # the same pretrained start for both methods and both arms
            reports[method] = train_sft(model, tok, train_sets[method], cfg, val_examples=val_sets[method])
            types = ["none"] if method == "sft" else list(FOCUS_TYPES)
            evals[method] = {split: evaluate_examples(model, tok, build_fit_data(su[split], TASK, spec, types=types,
                                                                                 mode="all"), sp.LABELS)
                             for split in all_splits}
            probes[method] = {"flipped": probe_accuracy(model, tok, su["flipped"])}
        # table[row][split] = focus accuracy; rows: SFT(y) with its plain prompt, FIT per instruction.
        table: dict[str, dict[str, float]] = {"sft": {s: evals["sft"][s]["by_type"]["none"]["focus_accuracy"]
                                                      for s in all_splits}}
        for kind in FOCUS_TYPES:
            table[f"fit:{kind}"] = {s: evals["fit"][s]["by_type"][kind]["focus_accuracy"] for s in all_splits}
        ambiguous_share = sum(r["ambiguous"] for r in su["train"]) / len(su["train"])
        out[arm] = {"table": table, "evals": evals, "reports": reports, "probes": probes,
                    "ambiguity": arms[arm], "ambiguous_share": ambiguous_share}
    n_params = sum(p.numel() for p in model.parameters())
    return {"arms": out, "pre_reports": pre_reports, "probes_pretrained": probes_pre, "n_params": n_params}


# ---------------------------------------------------------------------------------------------
# The real model: LoRA FIT on SmolLM2-135M-Instruct (issue 19, item 1)

REAL_MODEL = "real:smollm2-135m-instruct"
REAL_TASK = "Is the sentiment of this review positive or negative?"
REAL_SEEDS = 3
# Settings chosen on a pilot at seed 100, which is not one of the verdict seeds (opts.seed .. +2).
REAL_STEPS = 50
REAL_BATCH = 16
REAL_LR = 1e-3
REAL_LORA = (16, 32, 0.05)  # r, alpha, dropout: on every linear layer (the paper trains LoRA)
REAL_AMBIGUITY = 0.10       # share of training reviews whose text contradicts the gold label (SST-like noise)
REAL_N_TEST = 48
REAL_EVAL_SPLITS = (*SPLITS, "heldout-iid", "heldout-flipped")
# NOTE: the paper scores all six instruction types; the real run scores the four the verdict and the
# steerability read (plus ∅ and focus(C) for context) to stay within the 15-minute budget. Training
# still draws all six types uniformly.
REAL_FIT_TYPES = ("none", "focus_c", "focus_c_ignore_s", "focus_s")
# The condition for the real model, written before any run at the verdict seeds: per seed, the three
# checks of :func:`verdict` with the same thresholds as the toy; held iff all three hold at >= 2 of the
# 3 seeds.
REAL_MIN_SEEDS = 2
# --full adds one longer run at opts.seed: the same settings with this many times the steps (and data),
# to see whether the 15-minute budget is what limits the instruction-following; reported, not counted.
REAL_FULL_FACTOR = 4
# What the pilot at seed 100 gave (flipped split; SFT(y) / FIT focus(C)+ignore(S) / FIT focus(S)), quoted
# in the notes: it is why lr 1e-3 was chosen (between a run where nothing collapses and one where FIT
# follows the keyword under every instruction).
PILOT = {"lr 5e-4, 50 steps": (0.96, 0.92, 0.10), "lr 2e-3, 50 steps": (0.52, 0.21, 0.81),
         "lr 1e-3, 60 steps": (0.88, 0.58, 0.48)}


def real_verdict(per_seed: list[dict[str, bool]]) -> dict[str, Any]:
    """The real-model verdict from the per-seed :func:`verdict` results (fixed before the runs)."""
    n = sum(bool(c["held"]) for c in per_seed)
    return {"seeds held": n, "seeds": len(per_seed), "held": n >= REAL_MIN_SEEDS}


def real_spec() -> Any:
    from lmforge.methods.fit.data import FieldSpec

    return FieldSpec(label="label", spurious_label="keyword_label", core_name="the sentiment", spurious_name=None,
                     spurious_name_field="family", spurious_name_format="the {}")


def _evaluate_real(model: Any, tok: Any, su: dict[str, list[dict[str, Any]]], types: list[str]) -> dict[str, Any]:
    """Focus accuracy per split and type, evaluated in bfloat16 (the model is restored afterwards by
    the caller)."""
    import torch

    from lmforge.data import spurious as sp
    from lmforge.methods.fit.data import build_fit_data, sft_data
    from lmforge.methods.fit.evaluate import evaluate_examples

    model.to(torch.bfloat16)
    try:
        out = {}
        for split in REAL_EVAL_SPLITS:
            ex = (sft_data(su[split], REAL_TASK, real_spec()) if types == ["none"]
                  else build_fit_data(su[split], REAL_TASK, real_spec(), types=types, mode="all"))
            out[split] = evaluate_examples(model, tok, ex, sp.LABELS, batch_size=48)
        return out
    finally:
        model.float()


def real_experiment(seeds: list[int], steps: int = REAL_STEPS, batch: int = REAL_BATCH, lr: float = REAL_LR,
                    ambiguity: float = REAL_AMBIGUITY, n_test: int = REAL_N_TEST, model_spec: str = REAL_MODEL,
                    log: Any = None) -> dict[str, Any]:
    """For each seed: SFT(y) and FIT with LoRA from the same pretrained start, with the same budget
    (``steps`` x ``batch`` examples, one pass over fresh reviews), then focus accuracy per split; the
    untouched model is scored once (zero-shot) on the first seed's splits."""
    import time as _time

    import torch

    from lmforge.data import spurious_reviews as rv
    from lmforge.methods.fit.config import FITConfig
    from lmforge.methods.fit.data import build_fit_data, sft_data
    from lmforge.methods.fit.train import train_sft
    from lmforge.models.load import load

    model, tok = load(model_spec)
    pristine = {k: v.detach().clone() for k, v in model.state_dict().items()}
    spec = real_spec()
    out: dict[str, Any] = {"seeds": {}, "n_params": sum(p.numel() for p in model.parameters())}
    for n, seed in enumerate(seeds):
        su = rv.suite(seed, steps * batch, n_test, ambiguity=ambiguity)
        if n == 0:
            t0 = _time.perf_counter()
            out["zero-shot"] = {"sft": _evaluate_real(model, tok, su, ["none"]),
                                "fit": _evaluate_real(model, tok, su, list(REAL_FIT_TYPES))}
            out["zero-shot seconds"] = _time.perf_counter() - t0
        res: dict[str, Any] = {"ambiguous_share": sum(r["ambiguous"] for r in su["train"]) / len(su["train"])}
        for method in ("sft", "fit"):
            model.load_state_dict(pristine)
            data = (sft_data(su["train"], REAL_TASK, spec) if method == "sft"
                    else build_fit_data(su["train"], REAL_TASK, spec, seed=seed))
            cfg = FITConfig(steps=steps, lr=lr, batch_size=batch, lora_r=REAL_LORA[0], lora_alpha=REAL_LORA[1],
                            lora_dropout=REAL_LORA[2], bf16=True, trainer="loop", seed=seed)
            torch.manual_seed(seed)
            rep = train_sft(model, tok, data, cfg)
            t0 = _time.perf_counter()
            ev = _evaluate_real(model, tok, su, ["none"] if method == "sft" else list(REAL_FIT_TYPES))
            res[method] = {"eval": ev, "train_seconds": rep.seconds, "eval_seconds": _time.perf_counter() - t0,
                           "losses": rep.losses, "steps_run": rep.steps_run}
            if log:
                log(f"seed {seed} {method}: train {rep.seconds:.0f} s, eval {res[method]['eval_seconds']:.0f} s, "
                    f"last loss {rep.losses[-1][1]:.3f}")
        table = {"sft": {s: res["sft"]["eval"][s]["by_type"]["none"]["focus_accuracy"] for s in REAL_EVAL_SPLITS}}
        for kind in REAL_FIT_TYPES:
            table[f"fit:{kind}"] = {s: res["fit"]["eval"][s]["by_type"][kind]["focus_accuracy"]
                                    for s in REAL_EVAL_SPLITS}
        res["table"] = table
        res["checks"] = verdict(table)
        out["seeds"][seed] = res
    model.load_state_dict(pristine)
    return out


def _run_toy(opts: ReproduceOptions) -> ClaimResult:
    import torch

    from lmforge.data import spurious as sp
    from lmforge.methods.fit.config import FITConfig
    from lmforge.methods.fit.data import FOCUS_SYMBOLS, FOCUS_TYPES

    start = time.perf_counter()
    torch.set_num_threads(1)
    # NOTE: 1,000 fine-tuning steps (was 400) and early-stopping patience 3 (was 2), checks every 100 steps:
    # at 400 FIT had only begun to route by instruction (focus(S) 0.30 on flipped); at 1,000, with the clean
    # core, it answered all six instructions right at seeds 0 and 1.
    n_train, n_test, steps = (800, 32, 30) if opts.quick else (8000, 200, 1000)
    pre_steps = (40, 40) if opts.quick else (300, 300)
    hidden, layers = 64, 2
    # NOTE: lr 1e-3, not the earlier 3e-3: at 3e-3 the tiny model sat at chance on the sentiment
    # task in our runs. The paper fine-tunes with LoRA at small rates (its exact rate unverified).
    lr = 1e-3
    cfg = FITConfig(steps=steps, lr=lr, batch_size=32, eval_every=0 if opts.quick else 100, patience=3,
                    seed=opts.seed)
    main = _experiment(opts, n_train, n_test, pre_steps, lr, cfg, hidden, layers, ARMS)
    arms = main["arms"]
    checks = {arm: verdict(a["table"]) for arm, a in arms.items()}
    held = any(c["held"] for c in checks.values())

    def label(r: str) -> str:
        return "SFT(y), plain prompt" if r == "sft" else f"FIT {FOCUS_SYMBOLS[r.split(':')[1]]}"

    def steer(t: dict[str, dict[str, float]]) -> float:
        # On flipped (binary, y != y_S everywhere), focus(S) accuracy = 1 - share answering y, so this is
        # share answering y under focus(C)+ignore(S) minus that under focus(S): 1 = fully steered by
        # the instruction, 0 = the instruction changes nothing.
        return t["fit:focus_c_ignore_s"]["flipped"] - (1.0 - t["fit:focus_s"]["flipped"])

    row_order = ["sft", *[f"fit:{k}" for k in FOCUS_TYPES]]
    main_tables, held_rows, follow_rows, forget_rows, figures = [], [], [], [], []
    probe_names = {"sentiment": f"sentiment task ('{SENTIMENT_PROBE}') = y",
                   "keyword": "keyword task ('What is the <family> in the text?') correct",
                   "task=y": f"task prompt ('{TASK}') answered y"}
    pre = main["probes_pretrained"]
    forget_rows.append(["pretrained (before fine-tuning)", *[round(pre["flipped"][k], 3) for k in probe_names]])
    fig_rows = ["sft", "fit:focus_c_ignore_s", "fit:focus_c", "fit:none", "fit:focus_s"]
    for n, (arm, a) in enumerate(arms.items()):
        table, evals, probes = a["table"], a["evals"], a["probes"]
        main_tables.append(Table(
            f"Focus accuracy per split, {arm} (ambiguous training texts: {a['ambiguity']:.0%}). SFT(y) answers its "
            "plain prompt; FIT rows are the six focus instructions (focus label y, or y_S for the focus(S) rows). "
            "Both start from the same pretrained checkpoint.",
            ["method", *SPLITS], [[label(r), *[round(table[r][s], 3) for s in SPLITS]] for r in row_order]))
        held_rows += [[f"{arm}: {label(r)}", *[round(table[r][f"heldout-{s}"], 3) for s in SPLITS]] for r in row_order]
        for r, method, kind in [("sft", "sft", "none"), *[(f"fit:{k}", "fit", k) for k in FOCUS_TYPES]]:
            bt = evals[method]["flipped"]["by_type"][kind]
            hb = evals[method]["heldout-flipped"]["by_type"][kind]
            follow_rows.append([f"{arm}: {label(r)}", round(bt["agrees_with_label"], 3),
                                round(bt["agrees_with_spurious"], 3), round(hb["agrees_with_label"], 3),
                                round(hb["agrees_with_spurious"], 3)])
        forget_rows += [[f"{arm}: after {name}", *[round(probes[ck]["flipped"][k], 3) for k in probe_names]]
                        for name, ck in (("SFT(y)", "sft"), ("FIT", "fit"))]
        figures.append(Figure(
            str(_plot(opts.out_dir / f"fit-focus-accuracy-{n + 1}.png", {label(r): table[r] for r in fig_rows},
                      [label(r) for r in fig_rows], list(SPLITS),
                      f"Focus accuracy, {arm} ({a['ambiguity']:.0%} ambiguous training texts)")),
            f"Focus accuracy per split, {arm}; dashed: chance."))
    pre_rows = [[f"pretrained: {probe_names[k]}", *[round(pre[s][k], 3) for s in SPLITS]] for k in probe_names]

    def _train_json(reps: dict[str, Any]) -> dict[str, Any]:
        return {m: {"steps_run": r.steps_run, "best_step": r.best_step, "losses": r.losses,
                    "eval_losses": r.eval_losses, "seconds": r.seconds} for m, r in reps.items()}

    (opts.out_dir / "fit-results.json").write_text(json.dumps(
        {"arms": {arm: {"ambiguity": a["ambiguity"], "ambiguous_share": a["ambiguous_share"], "table": a["table"],
                        "checks": checks[arm], "evals": a["evals"], "probes": a["probes"],
                        "train": _train_json(a["reports"])} for arm, a in arms.items()},
         "held": held, "probes_pretrained": pre,
         "pretrain": _train_json({f"stage{k + 1}": r for k, r in enumerate(main["pre_reports"])})},
        indent=1, default=str))

    pf = pre["flipped"]
    measured: dict[str, Any] = {
        "pretrained checkpoint on flipped: sentiment task / keyword task / task prompt = y":
            f"{pf['sentiment']:.3f} / {pf['keyword']:.3f} / {pf['task=y']:.3f}"}
    for arm, a in arms.items():
        t, rep = a["table"], a["reports"]
        measured.update({
            f"[{arm}] SFT(y) focus accuracy iid / flipped": f"{t['sft']['iid']:.3f} / {t['sft']['flipped']:.3f}",
            f"[{arm}] FIT focus(C)+ignore(S) iid / flipped":
                f"{t['fit:focus_c_ignore_s']['iid']:.3f} / {t['fit:focus_c_ignore_s']['flipped']:.3f}",
            f"[{arm}] FIT focus(S) (vs y_S) iid / flipped": f"{t['fit:focus_s']['iid']:.3f} / {t['fit:focus_s']['flipped']:.3f}",
            f"[{arm}] held-out family, flipped: FIT focus(C)+ignore(S) / focus(S) / SFT(y)":
                f"{t['fit:focus_c_ignore_s']['heldout-flipped']:.3f} / {t['fit:focus_s']['heldout-flipped']:.3f}"
                f" / {t['sft']['heldout-flipped']:.3f}",
            **{f"[{arm}] {k}": v for k, v in checks[arm].items() if k != "held"},
            f"[{arm}] FIT steerability on flipped": f"{steer(t):.3f}",
            f"[{arm}] FIT focus(C)+ignore(S) minus FIT ∅ on flipped (what the instruction adds)":
                f"{t['fit:focus_c_ignore_s']['flipped'] - t['fit:none']['flipped']:+.3f}",
            f"[{arm}] steps run (kept) SFT / FIT": f"{rep['sft'].steps_run} ({rep['sft'].best_step}) / "
                                                  f"{rep['fit'].steps_run} ({rep['fit'].best_step})",
        })
    measured["all three checks in one arm"] = held
    measured["scope of this verdict"] = "this seed only; the notes give seeds 0-2"
    clean, amb = (arms[k]["table"] for k in ARMS)
    y_types = [f"fit:{k}" for k in FOCUS_TYPES if k not in ("focus_s", "focus_s_ignore_c")]
    notes = [
        f"Condition: per arm, SFT(y) loses at least {COLLAPSE_DROP:.2f} focus accuracy "
        f"from iid to flipped, FIT with focus(C)+ignore(S) scores at least {HOLD_MIN:.2f} on flipped and at least "
        f"{HOLD_MARGIN:.2f} above SFT(y) there, and FIT with focus(S) agrees with y_S on at least {TRACK_MIN:.2f} "
        "of the flipped split; held iff all three hold in one arm. Only these thresholds were fixed before any run "
        "(they are the first version's); the two arms, the 10% level and the one-arm rule were designed after "
        "runs at seed 0, so seed 0 is in-sample and the other seeds are the check. The held-out family is "
        "reported, not part of the verdict (the paper's own feature-shift results have focus(S) failing on "
        "unseen features).",
        f"Models: a Llama of {main['n_params'] / 1e6:.2f}M parameters (hidden {hidden}, {layers} layers) with a BPE "
        "tokenizer fitted here; the paper fine-tunes 7-13B instruction models with LoRA. To match the paper's premise "
        "(the model already reads both features), it is first pretrained on two label-independent auxiliary tasks: "
        f"'{SENTIMENT_PROBE}' ({pre_steps[0]} steps alone, then {pre_steps[1]} steps mixed 1:1 with the keyword "
        f"task 'What is the <family> in the text?', answered with the keyword), on fresh records of the training "
        f"families with the keyword independent of the sentiment (rho {PRETRAIN_RHO}) and a negation rate of "
        f"{PRETRAIN_NEGATION} (with 0.5 the core is a pure parity and training sat at chance). Neither the "
        "keyword->label tie nor any focus instruction is seen in pretraining. Both methods in both arms start "
        "from that one checkpoint with the same schedule.",
        f"Data: {n_train} training records (rho = {sp.TRAIN_RHO}), families {', '.join(sp.TRAIN_FAMILIES)}; "
        f"{n_test} records per test split; held-out family {', '.join(sp.HELDOUT_FAMILIES)} "
        f"(keywords {', '.join(sp.FAMILIES[sp.HELDOUT_FAMILIES[0]])}) never appears in pretraining or training. Core: "
        f"one sentiment word, negated by 'not' with probability {sp.NEGATION} (the label is then the opposite "
        "polarity), so the core label is an XOR of two tokens as the notes' CPU test asks. Arms: "
        + "; ".join(f"{arm}, {a['ambiguity']:.0%} of the training and validation texts ambiguous (their phrase "
                    f"contradicts the gold label; {a['ambiguous_share']:.1%} of this training set)"
                    for arm, a in arms.items())
        + ". The test splits are the same gold-consistent records in both arms.",
        f"Training: TRL SFTTrainer, completion-only loss, lr {lr}, batch {cfg.batch_size}; fine-tuning {steps} steps, "
        + ("no early stopping (quick mode)." if cfg.eval_every == 0 else
           f"early stopping on validation cross-entropy every {cfg.eval_every} steps (patience {cfg.patience}, "
           "best weights kept), as the paper.")
        + " FIT draws its six focus types uniformly per example (the paper's mixture weights are unverified).",
        "Splits: co-occurrence P(y = y_S) is 0.9 (iid), 1.0 (high), 0.5 (low), 0.0 (flipped), exact per split; "
        "the paper's exact test rates are unverified (see lmforge/data/spurious.py).",
        "On the flipped split (binary labels, y != y_S on every record) agreement with y and with y_S sum to 1, so "
        "a row at 0 for a y-type instruction means the model answered with the keyword's label every time. "
        "'Steerability' is the share of flipped records answered with y under focus(C)+ignore(S) minus the share "
        "under focus(S): 1 when the instruction alone decides which feature is read, 0 when it changes nothing.",
        "Reading the two arms: FIT's four y-type instructions (∅, focus(C), ignore(S), focus(C)+ignore(S)) are "
        "trained on exactly SFT(y)'s labels for the same texts; only the two focus(S) types differ, so any gap "
        "between FIT's y-type answers and SFT(y)'s comes from what the focus(S) examples do to the shared weights, "
        "not from the labels. With a clean core, the core alone fits every training label and SFT(y) reads it "
        f"(flipped {clean['sft']['flipped']:.2f}): no collapse in this arm, whatever FIT does (focus(C)+ignore(S) "
        f"{clean['fit:focus_c_ignore_s']['flipped']:.2f}, focus(S) {clean['fit:focus_s']['flipped']:.2f}, "
        f"steerability {steer(clean):.2f}). With {ARMS['ambiguous core']:.0%} ambiguous texts the core reads the "
        f"label {1 - ARMS['ambiguous core']:.0%} of the time and the keyword's tie {sp.TRAIN_RHO:.0%}, with "
        "independent errors: on a flipped record the training data give SFT(y) no reason to prefer either, so "
        "its collapse in this arm is close to built in (near chance, or below if the easier keyword wins), "
        f"not a finding (flipped {amb['sft']['flipped']:.2f}). The test is FIT: its y-type answers score "
        f"{min(amb[r]['flipped'] for r in y_types):.2f} to {max(amb[r]['flipped'] for r in y_types):.2f} on "
        f"flipped (∅, no instruction, {amb['fit:none']['flipped']:.2f}; focus(C)+ignore(S) minus ∅ "
        f"{amb['fit:focus_c_ignore_s']['flipped'] - amb['fit:none']['flipped']:+.2f}, which is what the "
        f"instruction itself adds over FIT's training mixture), focus(S) {amb['fit:focus_s']['flipped']:.2f}.",
        "Across seeds (full runs with --seed 0 / 1 / 2, each redrawing the data and the model; written after those "
        "runs): clean core, SFT(y) on flipped 1.00 / 1.00 / 1.00, FIT focus(C)+ignore(S) 1.00 / 1.00 / 0.00, "
        "focus(S) 1.00 / 1.00 / 1.00; ambiguous core, SFT(y) 0.61 / 0.575 / 0.00, FIT focus(C)+ignore(S) "
        "0.375 / 0.215 / 0.005 (FIT ∅ 0.25 / 0.31 / 0.235), focus(S) 1.00 at all three. The three checks hold "
        "together at none: where SFT(y) collapses, FIT focus(C)+ignore(S) does no better (0.375 vs 0.61, 0.215 "
        "vs 0.575, 0.005 vs 0.00), and at seed 2 FIT answered every instruction with the keyword's tie even with a clean core. "
        "(An earlier version of the ambiguous arm drew its ambiguous texts from the split's own random stream, "
        "so the two arms saw different texts; there seed 0 held, 0.895 against SFT(y)'s 0.60, and seeds 1 and 2 "
        "did not. With the texts shared across arms, as now, seed 0 does not hold either.)",
        "What the paper has that this miniature lacks: instruction-tuned LLMs for which 'ignore the fruit' already "
        "means something, a prior from pretraining that LoRA fine-tuning with early stopping does not wash out. "
        "No such model can be loaded here (nothing from a hub), and a model trained here knows of 'ignore' only "
        "what the labels say, which for the y-type instructions is the same as SFT(y)'s.",
        "Earlier settings, kept for the record: from scratch (no pretraining) everything followed the keyword "
        "(FIT focus(C)+ignore(S) 0.00 on flipped); pretrained with 400 fine-tuning steps, SFT(y) 1.00 on flipped, "
        "FIT focus(C)+ignore(S) 0.895, focus(S) 0.30. Exploratory runs outside this command, which made texts "
        "ambiguous by rewriting the sentiment word afterwards (seed 0): 15% gave SFT(y) 0.10 and FIT y-types 0.00 "
        "on flipped; 10% with 1,000 steps gave 0.14 and at most 0.01; a task prompt without the word "
        "'sentiment', or the keyword always first in the text, left SFT(y) at 1.00 with a clean core. In the "
        "ambiguous arm at seeds 1 and 2 (its earlier version), a longer keyword pretraining (900 steps) gave FIT "
        "focus(C)+ignore(S) 0.26 / 0.26 on flipped; an added instruction-tuning stage (400 steps of the six "
        "instructions at rho 0.5) 0.55 / 0.53 against SFT(y)'s 0.51 / 0.66; pretraining sentiment, then "
        "keyword, then both (300 steps each) 0.00 / 0.39.",
    ]
    if opts.quick:
        notes.append(f"Quick mode: {pre_steps} pretraining steps, {steps} fine-tuning steps on {n_train} records and "
                     f"{n_test} records per split; the models have barely started to learn, so the verdict is not "
                     "meaningful.")
    return ClaimResult(
        name="fit", title=TITLE,
        claim=("Fine-tuned with focus instructions, a model told to focus on the core feature and ignore the spurious "
               "one stays accurate on a split where the spurious correlation is reversed, where SFT on the task label "
               "collapses; told to focus on the spurious feature, it follows the spurious feature's label."),
        paper=PAPER, measured=measured, held=held,
        tables=[
            *main_tables,
            Table("Focus accuracy on the held-out family (name and keywords unseen in pretraining and training).",
                  ["method", *[f"heldout-{s}" for s in SPLITS]], held_rows),
            Table("Which label the predictions follow on the flipped splits (share equal to y, share equal to y_S).",
                  ["method", "flipped: = y", "flipped: = y_S", "heldout-flipped: = y", "heldout-flipped: = y_S"],
                  follow_rows),
            Table("The pretrained checkpoint before SFT/FIT: accuracy on the auxiliary tasks and share of the task "
                  "prompt answered with y, per split.", ["probe", *SPLITS], pre_rows),
            Table("The auxiliary tasks on the flipped split before and after fine-tuning (what each fine-tuning "
                  "kept of the pretrained features).", ["checkpoint", *probe_names.values()], forget_rows),
        ],
        figures=figures,
        notes=notes,
        seconds=time.perf_counter() - start,
    )


def _plot_real(path: Path, seeds: dict[Any, Any], zero_shot: dict[str, Any]) -> Path:
    rows = ["sft", "fit:focus_c_ignore_s", "fit:focus_s"]
    names = ["SFT(y)", "FIT focus(C)+ignore(S)", "FIT focus(S) (vs y_S)"]
    fig, ax = figure(figsize=(7.5, 3.6))
    keys = list(seeds)
    w = 0.8 / len(rows)
    for i, (r, name) in enumerate(zip(rows, names)):
        ax.bar([j + i * w for j in range(len(keys))], [seeds[k]["table"][r]["flipped"] for k in keys], width=w,
               label=name)
    zs = zero_shot["sft"]["flipped"]["by_type"]["none"]["focus_accuracy"]
    ax.axhline(zs, color="black", lw=0.8, ls=":", label="untuned model, plain prompt")
    ax.axhline(0.5, color="grey", lw=0.8, ls="--")
    ax.axhline(HOLD_MIN, color="lightgrey", lw=0.8)
    ax.set_xticks([j + 0.4 - w / 2 for j in range(len(keys))], [f"seed {k}" for k in keys])
    ax.set_ylim(0, 1.3)
    ax.set_ylabel("focus accuracy on flipped")
    ax.set_title("FIT with LoRA on SmolLM2-135M-Instruct: the flipped split per seed", fontsize=9)
    ax.legend(fontsize=7, ncol=2, loc="upper center")
    return save_figure(fig, path)


def _real_rows(res: dict[str, Any]) -> list[list[Any]]:
    from lmforge.methods.fit.data import FOCUS_SYMBOLS

    rows = []
    for r, vals in res["table"].items():
        name = "SFT(y), plain prompt" if r == "sft" else f"FIT {FOCUS_SYMBOLS[r.split(':')[1]]}"
        rows.append([name, *[round(vals[s], 3) for s in REAL_EVAL_SPLITS]])
    return rows


def _steer(t: dict[str, dict[str, float]], split: str = "flipped") -> float:
    return t["fit:focus_c_ignore_s"][split] - (1.0 - t["fit:focus_s"][split])


def _run_real(opts: ReproduceOptions) -> ClaimResult:
    import torch

    from lmforge.data import spurious as sp

    start = time.perf_counter()
    seeds = [opts.seed + k for k in range(REAL_SEEDS)]
    exp = real_experiment(seeds)
    per_seed = exp["seeds"]
    checks = [per_seed[k]["checks"] for k in seeds]
    final = real_verdict(checks)
    long_run = None
    if opts.full:
        long_run = real_experiment([opts.seed], steps=REAL_STEPS * REAL_FULL_FACTOR)
    zs = exp["zero-shot"]
    zs_table = {"sft": {s: zs["sft"][s]["by_type"]["none"]["focus_accuracy"] for s in REAL_EVAL_SPLITS}}
    for kind in REAL_FIT_TYPES:
        zs_table[f"fit:{kind}"] = {s: zs["fit"][s]["by_type"][kind]["focus_accuracy"] for s in REAL_EVAL_SPLITS}
    measured: dict[str, Any] = {
        "untuned SmolLM2, plain prompt, iid / flipped": f"{zs_table['sft']['iid']:.3f} / {zs_table['sft']['flipped']:.3f}",
    }
    for k in seeds:
        t = per_seed[k]["table"]
        measured[f"[seed {k}] flipped: SFT(y) / FIT focus(C)+ignore(S) / FIT focus(S) vs y_S"] = (
            f"{t['sft']['flipped']:.3f} / {t['fit:focus_c_ignore_s']['flipped']:.3f} / {t['fit:focus_s']['flipped']:.3f}")
        measured[f"[seed {k}] SFT(y) iid - flipped"] = round(t["sft"]["iid"] - t["sft"]["flipped"], 3)
        measured[f"[seed {k}] FIT steerability on flipped"] = round(_steer(t), 3)
        measured[f"[seed {k}] checks"] = {c: v for c, v in per_seed[k]["checks"].items() if c != "held"}
        measured[f"[seed {k}] all three checks"] = per_seed[k]["checks"]["held"]
    measured[f"seeds where all three checks hold (held iff >= {REAL_MIN_SEEDS} of {REAL_SEEDS})"] = (
        f"{final['seeds held']} of {final['seeds']}")
    if long_run is not None:
        t = long_run["seeds"][opts.seed]["table"]
        measured[f"[--full: {REAL_FULL_FACTOR}x steps, seed {opts.seed}] flipped: SFT(y) / FIT focus(C)+ignore(S) / "
                 "FIT focus(S)"] = (f"{t['sft']['flipped']:.3f} / {t['fit:focus_c_ignore_s']['flipped']:.3f} / "
                                    f"{t['fit:focus_s']['flipped']:.3f}")
        measured[f"[--full] steerability on flipped; all three checks"] = (
            f"{_steer(t):.3f}; {long_run['seeds'][opts.seed]['checks']['held']}")
    tables = [Table(f"Seed {k}: focus accuracy per split (SFT(y) answers the plain prompt; FIT rows are focus "
                    "instructions, focus(S) scored against y_S). Both start from the untuned model with the same "
                    "budget.", ["method", *REAL_EVAL_SPLITS], _real_rows(per_seed[k])) for k in seeds]
    tables.append(Table("The untuned SmolLM2-135M-Instruct on the first seed's splits (zero-shot, same prompts).",
                        ["prompt", *REAL_EVAL_SPLITS], _real_rows({"table": zs_table})))
    timing = [[f"seed {k}", m, round(per_seed[k][m]["train_seconds"]), round(per_seed[k][m]["eval_seconds"]),
               per_seed[k][m]["steps_run"], per_seed[k][m]["losses"][-1][1] if per_seed[k][m]["losses"] else None]
              for k in seeds for m in ("sft", "fit")]
    tables.append(Table("Training: seconds, evaluation seconds, steps and the last logged loss.",
                        ["seed", "method", "train s", "eval s", "steps", "last loss"], timing))
    if long_run is not None:
        tables.append(Table(f"--full: seed {opts.seed} with {REAL_FULL_FACTOR}x the steps and data "
                            f"({REAL_STEPS * REAL_FULL_FACTOR} steps): not part of the verdict.",
                            ["method", *REAL_EVAL_SPLITS], _real_rows(long_run["seeds"][opts.seed])))
    fig = _plot_real(opts.out_dir / "fit-real-flipped.png", per_seed, zs)
    (opts.out_dir / "fit-real-results.json").write_text(json.dumps(
        {"seeds": {str(k): {"table": v["table"], "checks": v["checks"], "ambiguous_share": v["ambiguous_share"],
                            "train": {m: {x: v[m][x] for x in ("train_seconds", "eval_seconds", "losses", "steps_run")}
                                      for m in ("sft", "fit")}} for k, v in per_seed.items()},
         "zero_shot": zs_table, "verdict": final,
         "full": None if long_run is None else {"table": long_run["seeds"][opts.seed]["table"],
                                                "checks": long_run["seeds"][opts.seed]["checks"]}},
        indent=1, default=str))
    pilot = "; ".join(f"{k}: {a:.2f} / {b:.2f} / {c:.2f}" for k, (a, b, c) in PILOT.items())
    notes = [
        f"Condition, written before any run at the verdict seeds ({', '.join(map(str, seeds))}): per seed, SFT(y) "
        f"loses at least {COLLAPSE_DROP:.2f} focus accuracy from iid to flipped, FIT with focus(C)+ignore(S) scores "
        f"at least {HOLD_MIN:.2f} on flipped and at least {HOLD_MARGIN:.2f} above SFT(y) there, and FIT with "
        f"focus(S) agrees with y_S on at least {TRACK_MIN:.2f} of flipped (the toy's thresholds); held iff all three "
        f"hold at >= {REAL_MIN_SEEDS} of the {REAL_SEEDS} seeds.",
        f"Model: {REAL_MODEL} ({exp['n_params'] / 1e6:.0f}M parameters), LoRA r {REAL_LORA[0]}, alpha {REAL_LORA[1]}, "
        f"dropout {REAL_LORA[2]} on every linear layer, merged after training; AdamW lr {REAL_LR:g}, linear warm-up "
        f"(5%) and decay, {REAL_STEPS} steps of {REAL_BATCH} examples (one pass over {REAL_STEPS * REAL_BATCH} fresh "
        "reviews per seed), bf16 autocast, no early stopping; evaluation in bf16 with the label set scored at the "
        "answer position. SFT(y) and FIT start from the same untuned weights with the same budget.",
        "Data (lmforge.data.spurious_reviews): short film reviews in plain English (one or two sentiment clauses, "
        "sometimes a neutral clause) with one sentence naming a keyword of a family (fruit, animal, colour; the "
        f"tool family held out), keyword tied to a label at rho {sp.TRAIN_RHO} in training; "
        f"{REAL_AMBIGUITY:.0%} of the training reviews are written with the other polarity (SST's labels are not "
        "always readable from the text either). Test reviews use sentiment clauses never seen in training; "
        f"{REAL_N_TEST} records per split.",
        f"Settings chosen on a pilot at seed 100 (flipped: SFT(y) / FIT focus(C)+ignore(S) / FIT focus(S)): {pilot}. "
        "No setting of the pilot met the condition: at a low rate nothing reads the keyword, at a high rate FIT "
        "reads it under every instruction; lr 1e-3 lies between. The step count is what the 15-minute budget "
        "allows for 3 seeds x 2 methods at ~2.2 s per step on 2 cores.",
        "The toy arm (a 0.2M-parameter Llama pretrained here, `lmforge reproduce fit --quick` and --full) is "
        "reported in the README beside this one.",
        "Paper: Llama-3.1-8B, Mistral-7B and Vicuna-13B with LoRA on SS/SMNLI/BBQ, focus accuracy about 80-95% for "
        "every instruction on every split (read off its Figure 3); exact numbers unverified.",
    ]
    return ClaimResult(
        name="fit", title=TITLE,
        claim=("Fine-tuned with focus instructions, a model told to focus on the core feature and ignore the spurious "
               "one stays accurate on a split where the spurious correlation is reversed, where SFT on the task label "
               "collapses; told to focus on the spurious feature, it follows the spurious feature's label. Tested "
               "on SmolLM2-135M-Instruct with LoRA over three seeds."),
        paper=PAPER, measured=measured, held=final["held"], tables=tables,
        figures=[Figure(str(fig), "Flipped-split focus accuracy per seed: SFT(y), FIT focus(C)+ignore(S) and FIT "
                                  "focus(S) (against y_S); dotted: the untuned model; grey line: the 0.80 bar.")],
        notes=notes, seconds=time.perf_counter() - start,
    )


@register_reproduction(
    "fit", title=TITLE,
    summary="LoRA SFT(y) and FIT on SmolLM2-135M-Instruct over natural-language reviews with a spurious keyword "
            "sentence, three seeds; --quick runs the tiny-Llama miniature, --full adds a 4x longer real run and "
            "the miniature's full arms",
)
def run(opts: ReproduceOptions) -> ClaimResult:
    """The real model by default; ``--quick``: the toy miniature (tests); ``--full``: both, plus a
    longer real run."""
    if opts.quick:
        return _run_toy(opts)
    real = _run_real(opts)
    if not opts.full:
        return real
    toy = _run_toy(opts)
    real.measured.update({f"[toy] {k}": v for k, v in toy.measured.items()})
    real.tables += [Table(f"[toy] {t.title}", t.columns, t.rows) for t in toy.tables]
    real.figures += toy.figures
    real.notes += [f"[toy] {n}" for n in toy.notes]
    real.seconds += toy.seconds
    return real
