"""``lmforge reproduce moragent``: Mixture-of-Roles against an equal-parameter LoRA on BFCL v4.

Han et al., "MoRAgent: Parameter Efficient Agent Tuning with Mixture-of-Roles" (ICML 2025): splitting
the adapter into role groups (reasoner, executor, summarizer) with per-token role routing beats a
plain LoRA; on BFCL, Llama-3.2-1B goes from 27.5 to 77.6.

Miniature (the settings below are fixed before the verdict run):

* model: SmolLM2-135M-Instruct (``real:smollm2-135m-instruct``), float32 weights, bf16 autocast;
* data: three-role trajectories from the MoRAgent pipeline (template completer, reliability
  verification; drops reported) built from :data:`N_TRAIN_BFCL` BFCL v4 ``simple_python`` /
  ``multiple`` entries *outside* the evaluation sample plus :data:`N_TRAIN_SYNTH` synthetic xLAM
  records (:mod:`lmforge.data.toolcalls`);
* arms: MoR on the top :data:`TOP_LAYERS` decoder layers (all seven projections, rank
  :data:`MOR_RANK` per expert, groups 4+1/4+1/3+1, top-k 3/3/2, Eq. 8 aux terms) against a peft LoRA
  on the same linears whose rank gives the nearest trainable-parameter count, same data, steps,
  batch, learning rate and seed; and the base model;
* evaluation: :data:`N_EVAL` entries each of BFCL v4 ``simple_python`` and ``multiple``, the agent
  loop (:func:`lmforge.methods.moragent.agent.run_agent`, greedy, at most :data:`MAX_STEPS` segments),
  its executor calls scored by lmforge's BFCL AST checker. The base model is also scored in BFCL's own
  prompting format (its system prompt, BFCL's call syntax), and the better of its two scores is
  the base number;
* the condition (:func:`conditions`): at each of :data:`SEEDS` seeds, MoR >= LoRA + 5 points and
  MoR >= base + 20 points; the claim holds when both hold at 2 of the 3 seeds.

NOTE (scale): the paper tunes every layer at rank 16 per expert for 4 epochs of ~80k samples per role
at lr 5e-5; here the top layers at rank 2 for :data:`STEPS` steps of :data:`BATCH` at lr :data:`LR`
fit 15 minutes on 2 CPU cores. The learning rate, steps and layers were chosen by a pilot before the
verdict run (24 BFCL simple_python entries of seed 99, the training pool without them; one of them,
simple_python_308, is also in the verdict's evaluation sample; both arms at
lr 1e-3 and 3e-3, 90 steps of 4: every arm scored 2/24 except MoR at 1e-3, 1/24; 3e-3 is the best or
tied-best lr of both arms, and gives the lower final loss). ``--full`` trains :data:`STEPS_FULL` steps
and evaluates :data:`N_EVAL_FULL` entries per category (about an hour on 2 cores). A size-matched
official configuration (all 30 layers, rank 16: 68M trainable parameters) does not fit a CPU run.

NOTE (budget, changed after a run): the first verdict runs used 50 steps, a 48-token summarizer, an
evaluation batch of 12 and 128 tokens for the base model's BFCL-prompting reply. They took 18-19.5
minutes, over the 15-minute budget, and gave (twice, identically) base 0.000, MoR 0.042 / 0.083 /
0.083, LoRA 0.125 / 0.083 / 0.083: not held. To fit the budget the steps went to 40, the summarizer
to 32 tokens (it is not scored), the evaluation batch to 24 and the base reply to 96 tokens (MoR 0.042
at each seed, LoRA 0.125 / 0 / 0.083: not held). A review then found 2 of the 24 evaluation questions
among the training entries under other ids (BFCL repeats questions); the split now also excludes
training entries whose question equals an evaluation entry's. The condition never changed.
"""

from __future__ import annotations

import json
import random
import time
from collections import Counter
from pathlib import Path
from typing import Any

from lmforge.reproduce.base import ClaimResult, Figure, ReproduceOptions, Table, figure, register_reproduction, save_figure

TITLE = "MoRAgent: Parameter Efficient Agent Tuning with Mixture-of-Roles (Han et al., ICML 2025)"
MODEL = "real:smollm2-135m-instruct"
CATEGORIES = ("simple_python", "multiple")
N_EVAL = 12          # per category
N_EVAL_FULL = 50
N_TRAIN_BFCL = 200
N_TRAIN_SYNTH = 100
MAX_LEN = 384
TOP_LAYERS = 4
MOR_RANK = 2
STEPS = 40
STEPS_FULL = 200
BATCH = 4
LR = 3e-3
WARMUP = 5
SEEDS = 3
MAX_STEPS = 4
SEGMENT_TOKENS = {"reasoner": 48, "executor": 80, "summarizer": 32}
EVAL_BATCH = 24
BASE_PROMPT_TOKENS = 96
LORA_MARGIN = 0.05
BASE_MARGIN = 0.20
PAPER = {"BFCL, Llama-3.2-1B (base -> MoRAgent)": "27.5 -> 77.6",
         "BFCL, Phi-3.5-mini (base -> MoRAgent)": "64.2 -> 82.1"}


def conditions(mor: list[float], lora: list[float], base: float) -> dict[str, Any]:
    """The pass condition, fixed before the run: per seed MoR >= LoRA + 0.05 and MoR >= base + 0.20
    (accuracies in [0, 1]); held when both hold at 2 of 3 seeds (a majority of the seeds run)."""
    per_seed = [(m >= l + LORA_MARGIN - 1e-9) and (m >= base + BASE_MARGIN - 1e-9) for m, l in zip(mor, lora)]
    need = len(per_seed) // 2 + 1
    return {"per_seed": per_seed, "needed": need, "held": sum(per_seed) >= need}


def _split(seed: int, n_eval: int) -> tuple[list[Any], list[Any]]:
    """(eval records, training records): the eval sample per category, and the rest of both
    categories shuffled, without any entry whose user query equals an eval entry's (BFCL repeats
    questions under other ids, across and within categories)."""
    from lmforge.data import bfcl

    evals, train = [], []
    for cat in CATEGORIES:
        pick = bfcl.sample(cat, seed, n_eval)
        ids = {r.id for r in pick}
        evals += pick
        train += [r for r in bfcl.load_packaged(cat) if r.id not in ids]
    seen = {_query_key(r) for r in evals}
    train = [r for r in train if _query_key(r) not in seen]
    random.Random(f"moragent-train-pool:{seed}").shuffle(train)
    assert not {r.id for r in evals} & {r.id for r in train}
    return evals, train


def _query_key(record: Any) -> str:
    """A BFCL entry's user text, case and whitespace folded."""
    text = " ".join(m.get("content", "") for m in record.messages if m.get("role") == "user")
    return " ".join(text.lower().split())


def _score(records: list[Any], episodes: list[Any]) -> tuple[float, dict[str, float]]:
    from lmforge.eval import bfcl_ast
    from lmforge.methods.moragent.agent import bfcl_calls

    per: dict[str, list[bool]] = {}
    for rec, ep in zip(records, episodes):
        v = bfcl_ast.check_calls(rec.functions, bfcl_calls(ep), rec.ground_truth, rec.category)
        per.setdefault(rec.category, []).append(v.valid)
    flat = [x for xs in per.values() for x in xs]
    return sum(flat) / len(flat), {c: sum(xs) / len(xs) for c, xs in per.items()}


def _base_bfcl_prompting(model: Any, tok: Any, records: list[Any]) -> float:
    """The base model in BFCL's own prompting mode (ACBench's ``bfcl`` task format)."""
    from lmforge.bench.task_bfcl import _system_role_kept, fold_system
    from lmforge.common.generation import generate
    from lmforge.eval import bfcl_ast

    msgs = [bfcl_ast.chat_messages(r.messages, r.functions) for r in records]
    if not _system_role_kept(tok):
        msgs = [fold_system(m) for m in msgs]
    outs = generate(model, tok, messages=msgs, max_new_tokens=BASE_PROMPT_TOKENS, batch_size=8)
    ok = [bfcl_ast.evaluate(o.text, r.functions, r.ground_truth, r.category).valid for o, r in zip(outs, records)]
    return sum(ok) / len(ok)


def _eval(model: Any, tok: Any, records: list[Any]) -> tuple[float, dict[str, float], dict[str, int], list[Any]]:
    """The agent loop on a bfloat16 copy of the model (real-model inference runs in bf16 here)."""
    import copy

    import torch

    from lmforge.methods.moragent.agent import run_agent
    from lmforge.methods.moragent.data import from_bfcl

    m = copy.deepcopy(model).to(torch.bfloat16)
    eps = run_agent(m, tok, [from_bfcl(r) for r in records], max_steps=MAX_STEPS, max_new_tokens=SEGMENT_TOKENS,
                    batch_size=EVAL_BATCH)
    acc, per = _score(records, eps)
    return acc, per, dict(Counter(e.ended for e in eps)), eps


@register_reproduction("moragent", TITLE, "MoR vs an equal-parameter LoRA and the base, SmolLM2-135M-Instruct on "
                       "BFCL v4 simple/multiple through the three-role agent loop")
def run(cfg: ReproduceOptions) -> ClaimResult:
    import torch

    from lmforge.data import toolcalls
    from lmforge.methods.moragent import data as D
    from lmforge.methods.moragent.layer import MoRConfig
    from lmforge.methods.moragent.train import TrainSettings, add_adapter, encode_examples, train_adapter
    from lmforge.models.load import load

    t0 = time.time()
    out = Path(cfg.out_dir)
    n_eval = 2 if cfg.quick else (N_EVAL_FULL if cfg.full else N_EVAL)
    steps = 2 if cfg.quick else (STEPS_FULL if cfg.full else STEPS)
    seeds = [cfg.seed + s for s in range(1 if cfg.quick else SEEDS)]
    n_bfcl, n_synth = (8, 4) if cfg.quick else (N_TRAIN_BFCL, N_TRAIN_SYNTH)

    evals, pool = _split(cfg.seed, n_eval)
    records = [D.from_bfcl(r) for r in pool[:n_bfcl]] + toolcalls.generate(random.Random(f"moragent:{cfg.seed}"), n_synth)
    trajs, report = D.build_trajectories(records, D.TemplateCompleter())
    base, tok = load(MODEL)
    examples, too_long = encode_examples(tok, trajs, MAX_LEN)
    report = {k: v for k, v in report.items() if k != "drops"} | {"too_long": too_long, "examples": len(examples)}
    (out / "data_report.json").write_text(json.dumps(report, indent=1))
    base_loop, base_per, base_ended, _ = _eval(base, tok, evals)
    import copy

    base_prompting = _base_bfcl_prompting(copy.deepcopy(base).to(torch.bfloat16), tok, evals)
    base_acc = max(base_loop, base_prompting)
    if cfg.progress:
        print(f"[moragent] base: loop {base_loop:.3f}, BFCL prompting {base_prompting:.3f}", flush=True)

    runs: list[dict[str, Any]] = []
    samples: dict[str, str] = {}
    for seed in seeds:
        for kind in ("mor", "lora"):
            model, info = add_adapter(copy.deepcopy(base), kind, list(range(-TOP_LAYERS, 0)),
                                      config=MoRConfig(rank=MOR_RANK), seed=seed)
            log = train_adapter(model, tok, examples, TrainSettings(steps=steps, lr=LR, batch_size=BATCH,
                                                                    warmup=min(WARMUP, steps - 1), seed=seed))
            acc, per, ended, eps = _eval(model, tok, evals)
            runs.append({"arm": kind, "seed": seed, "accuracy": acc, "per_category": per, "ended": ended,
                         "trainable": info["trainable"], "rank": info["rank"], "train_seconds": round(log["seconds"], 1),
                         "loss_first": log["losses"][0], "loss_last_5": sum(log["losses"][-5:]) / len(log["losses"][-5:])})
            samples.setdefault(kind, "".join(D.render_segment(s) for s in eps[0].segments))
            if cfg.progress:
                print(f"[moragent] seed {seed} {kind}: {acc:.3f} {per} ({log['seconds']:.0f} s train)", flush=True)
            del model
    (out / "runs.json").write_text(json.dumps(runs, indent=1))
    (out / "sample_episodes.txt").write_text("\n\n".join(f"== {k} ==\n{v}" for k, v in samples.items()))

    mor = [r["accuracy"] for r in runs if r["arm"] == "mor"]
    lora = [r["accuracy"] for r in runs if r["arm"] == "lora"]
    cond = conditions(mor, lora, base_acc)
    fig, ax = figure(1, 1, figsize=(5, 3.2))
    xs = range(len(seeds))
    ax.bar([x - 0.2 for x in xs], mor, width=0.4, label="MoR")
    ax.bar([x + 0.2 for x in xs], lora, width=0.4, label="LoRA (equal params)")
    ax.axhline(base_acc, color="k", ls="--", lw=1, label="base")
    ax.set_xticks(list(xs), [f"seed {s}" for s in seeds])
    ax.set_ylabel("BFCL simple+multiple AST accuracy")
    ax.legend(fontsize=8)
    fig_path = save_figure(fig, out / "moragent.png")
    rows = [[r["arm"], r["seed"], r["trainable"], r["rank"], round(r["accuracy"], 3),
             round(r["per_category"].get("simple_python", 0.0), 3), round(r["per_category"].get("multiple", 0.0), 3),
             round(r["loss_last_5"], 3), r["train_seconds"], json.dumps(r["ended"])] for r in runs]
    rows.insert(0, ["base (agent loop)", "-", 0, "-", round(base_loop, 3), round(base_per.get("simple_python", 0.0), 3),
                    round(base_per.get("multiple", 0.0), 3), "-", 0, json.dumps(base_ended)])
    rows.insert(1, ["base (BFCL prompting)", "-", 0, "-", round(base_prompting, 3), "-", "-", "-", 0, "-"])
    measured = {
        "BFCL accuracy, base (better of loop / BFCL prompting)": f"{base_acc:.3f} ({base_loop:.3f} / {base_prompting:.3f})",
        "BFCL accuracy per seed, MoR": [round(x, 3) for x in mor],
        "BFCL accuracy per seed, LoRA": [round(x, 3) for x in lora],
        "trainable parameters MoR / LoRA": f"{runs[0]['trainable']} / {runs[1]['trainable']}",
        "condition per seed (MoR >= LoRA+5 and >= base+20)": cond["per_seed"],
        "training data (kept / built, dropped by reason)": f"{report['kept']} / {report['total']}, "
                                                          f"{report['dropped_by_reason']}",
    }
    notes = [
        f"SmolLM2-135M-Instruct, MoR on the top {TOP_LAYERS} of 30 layers at rank {MOR_RANK} per expert, "
        f"{steps} steps of batch {BATCH} at lr {LR} (bf16 autocast); the paper tunes all layers at rank 16 for "
        "4 epochs at lr 5e-5. The LoRA baseline has alpha = rank (scaling 1, as MoR's experts).",
        f"Evaluation: {n_eval} BFCL v4 entries each of simple_python and multiple (seeded sample; training uses "
        "only other entries of the two categories plus synthetic xLAM records), agent loop with at most "
        f"{MAX_STEPS} segments, calls scored by lmforge's BFCL AST checker.",
        "The condition (MoR >= LoRA + 5 points and >= base + 20 points at 2 of 3 seeds) was written in the code "
        "before the verdict run; a pilot on a separate BFCL sample (seed 99) chose the learning rate, steps and layers "
        "(module docstring).",
        "Budget change after a run (module NOTE): the first verdict runs used 50 steps and took 18-19.5 minutes "
        "(MoR 0.042 / 0.083 / 0.083, LoRA 0.125 / 0.083 / 0.083, base 0: not held); steps 40 and cheaper "
        "evaluation settings fit 15 minutes (MoR 0.042 x3, LoRA 0.125 / 0 / 0.083); then the split was made "
        "disjoint by question as well as by id (2 of 24 evaluation questions had been trained on under "
        "other ids). All not held; the condition is unchanged.",
    ]
    if cfg.quick:
        notes.append("--quick: 2 training steps, 2 eval entries per category, one seed; the verdict is not meaningful.")
    return ClaimResult(
        name="moragent", title=TITLE,
        claim="Role-grouped LoRA experts with per-token role routing (MoR) tune an agent better than a plain LoRA "
              "of the same size, far above the base model.",
        paper=PAPER, measured=measured, held=bool(cond["held"]) and not cfg.quick,
        tables=[Table("BFCL v4 AST accuracy per arm and seed",
                      ["arm", "seed", "trainable", "rank", "accuracy", "simple_python", "multiple",
                       "final loss", "train s", "episodes ended"], rows)],
        figures=[Figure(str(fig_path), "BFCL accuracy per seed: MoR, equal-parameter LoRA, base (dashed)")],
        notes=notes, seconds=time.time() - t0)
