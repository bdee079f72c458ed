"""The controlled oracle → teacher → student harness of Tiapkin et al. (ICML 2025, arXiv 2502.02671).

:func:`build_setup` makes the oracle, trains the teacher on a deliberately small oracle sample (so it
is imperfect), initialises the student (random, or SFT on oracle data as in the paper) and draws the
held-out evaluation samples; :func:`run_regime` distils a copy of the student from one data source
and returns its proxy / golden curves with the detector's verdict.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import torch
from transformers import LlamaForCausalLM

from lmforge.methods.teacher_hacking.config import TeacherHackingConfig
from lmforge.methods.teacher_hacking.detector import Detection, SlopeCollapse, detect_deviation, detect_slope_collapse
from lmforge.methods.teacher_hacking.models import build_lm, sequence_log_prob, train_mle
from lmforge.methods.teacher_hacking.oracle import MarkovOracle
from lmforge.methods.teacher_hacking.train import Curve, EvalSet, clone, distill, make_eval_set


@dataclass
class Setup:
    """Oracle, trained teacher, initial student, held-out evaluation set and the training prompt pool."""

    cfg: TeacherHackingConfig
    oracle: MarkovOracle
    teacher: LlamaForCausalLM
    student0: LlamaForCausalLM
    eval_set: EvalSet
    info: dict[str, Any]


def build_setup(cfg: TeacherHackingConfig) -> Setup:
    """Oracle, teacher (MLE on ``cfg.teacher_data`` oracle sequences) and initial student."""
    start = time.perf_counter()
    gen = torch.Generator().manual_seed(cfg.seed)
    oracle = MarkovOracle(n_symbols=cfg.n_symbols, n_topics=cfg.n_topics, branching=cfg.branching,
                          prompt_len=cfg.prompt_len, max_response_len=cfg.max_response_len, seed=cfg.oracle_seed)
    max_len = cfg.prompt_len + cfg.max_response_len + 1
    teacher = build_lm(cfg.teacher_shape, oracle.vocab_size, max_len, seed=cfg.seed + 1)
    sft_data = oracle.sample(cfg.teacher_data, gen)
    teacher_losses = train_mle(teacher, sft_data, cfg.teacher_steps, cfg.batch_size, cfg.teacher_lr, gen)
    student0 = build_lm(cfg.student_shape, oracle.vocab_size, max_len, seed=cfg.seed + 2)
    student_sft_losses: list[float] = []
    if cfg.student_sft_steps:
        # The paper: the oracle dataset gives "initial SFT checkpoints for both teacher and student".
        student_data = oracle.sample(cfg.student_sft_data, gen) if cfg.student_sft_data else sft_data
        student_sft_losses = train_mle(student0, student_data, cfg.student_sft_steps, cfg.batch_size,
                                       cfg.teacher_lr, gen)
    eval_set = make_eval_set(oracle, teacher, cfg.eval_prompts, cfg.eval_samples_per_prompt, gen)
    teacher_golden = float((eval_set.oracle_logp - sequence_log_prob(teacher, eval_set.oracle_samples)).mean())
    info = {
        "oracle_entropy": float(-eval_set.oracle_logp.mean()),
        "teacher_golden": teacher_golden,
        "teacher_final_train_nll": teacher_losses[-1],
        "teacher_params": sum(p.numel() for p in teacher.parameters()),
        "student_params": sum(p.numel() for p in student0.parameters()),
        "student_sft_steps": cfg.student_sft_steps,
        "student_sft_final_train_nll": student_sft_losses[-1] if student_sft_losses else None,
        "student0_golden": eval_set.golden(student0),
        "student0_proxy": eval_set.proxy(student0),
        "setup_seconds": time.perf_counter() - start,
    }
    return Setup(cfg, oracle, teacher, student0, eval_set, info)


@dataclass
class RunResult:
    """One distillation run: its curves and the detectors' verdicts on the proxy curve."""

    curve: Curve
    detection: Detection
    slope: SlopeCollapse
    seconds: float

    def summary(self) -> dict[str, Any]:
        """Headline numbers of the run."""
        c = self.curve
        g_min = min(c.golden)
        i_min = c.golden.index(g_min)
        return {
            "regime": c.regime, "n_prompts": c.info["n_prompts"], "gens_per_prompt": c.info["gens_per_prompt"],
            "proxy_start": c.proxy[0], "proxy_end": c.proxy[-1], "proxy_min": min(c.proxy),
            "golden_start": c.golden[0], "golden_end": c.golden[-1], "golden_min": g_min,
            "golden_min_step": c.steps[i_min], "proxy_at_golden_min": c.proxy[i_min],
            "golden_rise": c.golden[-1] - g_min, "detector_fired": self.detection.fired,
            "detector_excess": self.detection.max_excess, "detector_tol": self.detection.tol,
            "power_law_b": self.detection.fit.b, "slope_fired": self.slope.fired, "b_early": self.slope.b_early,
            "b_late": self.slope.b_late, "seconds": self.seconds,
        }


def run_regime(setup: Setup, regime: str, n_prompts: int | None = None, gens_per_prompt: int | None = None,
               steps: int | None = None, seed: int | None = None) -> RunResult:
    """Distil a fresh copy of the initial student from ``regime``'s data and apply the detector."""
    cfg = setup.cfg
    n_prompts = n_prompts or cfg.n_prompts
    gens = gens_per_prompt or cfg.gens_per_prompt
    seed = cfg.seed if seed is None else seed
    # The pool depends only on (seed, n_prompts), so the regimes of one setup share their prompts.
    pool = setup.oracle.sample_prompts(n_prompts, torch.Generator().manual_seed(10_000 + seed))
    start = time.perf_counter()
    curve = distill(clone(setup.student0), setup.teacher, setup.oracle, regime, pool, steps or cfg.steps,
                    cfg.batch_size, cfg.lr, setup.eval_set, torch.Generator().manual_seed(20_000 + seed),
                    gens_per_prompt=gens, loss=cfg.loss, n_eval_points=cfg.eval_points,
                    n_linear_points=cfg.eval_linear_points)
    return RunResult(curve, detect_deviation(curve.steps, curve.proxy), detect_slope_collapse(curve.steps, curve.proxy),
                     time.perf_counter() - start)


def run_harness(cfg: TeacherHackingConfig, regimes: tuple[str, ...] = ("offline", "online_teacher", "online_student")
                ) -> dict[str, Any]:
    """Build the setup and distil one student per regime: setup info, run summaries and curves."""
    setup = build_setup(cfg)
    runs = [run_regime(setup, r) for r in regimes]
    return {"setup": setup.info, "runs": [{**r.summary(), "curve": r.curve.to_dict()} for r in runs]}
