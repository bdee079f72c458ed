"""``lmforge reproduce dsla``: DSLA-Serve on SmolLM2-135M-Instruct (chained conversion, decode speed, policy).

Setup, fixed before the run:

* **Model.** SmolLM2-135M-Instruct (``real:smollm2-135m-instruct``, 30 layers, GQA 9/3 heads); the
  teacher is the unconverted model, training in float32.
* **Order.** Ascending last-token attention entropy on one calibration window (the official
  ``calculate_attention_entropy_order`` reads one sample prompt); the first ``K_LAYERS`` layers are
  chain-converted.
* **Training per stage.** ``LOCAL`` steps of local MSE on cached teacher attention inputs/outputs,
  then ``JOINT`` steps of the official loss (CE + 0.001·KL + 0.01·MSE), AdamW lr 1e-3, batches of 4
  calibration-essay windows of 128 tokens. Evaluation: 16 held-out essay windows of 256 tokens.
* **Arms.** Zeroing the attention of the same layers; DSLA and single-state GLA with the official
  initialisation (the default, the verdict's arms); and both again with the output-energy rescale
  folded into ``o_proj`` (a NOTE deviation, reported beside, not counted).
* **Speed.** Decode ms/token at 1k/4k/8k context with 0/25/50/75% of the layers converted (in entropy
  order), bf16, caches filled to the context (:mod:`lmforge.methods.dsla.speed`), in one process.
* **Policy.** The official swap policy over a load ramp on the bf16 model, time scaled by 1/100
  (cooldown 0.6 s, poll 0.05 s), converting only the trained layers.

Conditions (the issue's; ``held`` needs all three):

* **A.** KL(DSLA) < KL(zeroing) and KL(DSLA) ≤ KL(single-state), default initialisation.
* **B.** ≥ 1.3× decode speed at 75% converted and 8k context.
* **C.** Converting then restoring gives bit-identical logits.
"""

from __future__ import annotations

import copy
import time


from lmforge.reproduce.base import (ClaimResult, Figure, ReproduceOptions, Table, figure, register_reproduction,
                                   save_figure)

TITLE = ("On-the-Fly Adaptive Distillation of Transformer to Dual-State Linear Attention "
         "(DSLA-Serve; Ro et al., ICML 2025)")
REAL_MODEL = "real:smollm2-135m-instruct"
# NOTE: JOINT was 10 in the first full run, which took 17 min (over the 15-min budget); it was cut to 5
# for time, with the conditions unchanged. The README reports both runs.
K_LAYERS, LOCAL, JOINT, SEQ, BATCH, N_TRAIN, N_EVAL, EVAL_SEQ = 4, 60, 5, 128, 4, 64, 16, 256
CONTEXTS = (1024, 4096, 8192)
FRACTIONS = (0.0, 0.25, 0.5, 0.75)
SPEEDUP = 1.3
PAPER = {"speed-up vs Llama2-7B": 2.3, "speed-up vs Zamba-7B": 3.0, "accuracy": "comparable (commonsense, "
         "long-context QA, summarisation)"}


@register_reproduction(
    "dsla",
    title=TITLE,
    summary="SmolLM2-135M: chain-convert 4 low-entropy layers, KL vs zeroing/single-state, decode speed, policy trace",
)
def run(opts: ReproduceOptions) -> ClaimResult:
    import torch

    from lmforge.data import essays
    from lmforge.data.calibration import token_windows
    from lmforge.methods.dsla.convert import convert_layers, dsla_state_dict, load_dsla_state, restore_layers
    from lmforge.methods.dsla.distill import DistillConfig, chain_distill, evaluate, put_back, zero_layers
    from lmforge.methods.dsla.layer import DSLAConfig
    from lmforge.methods.dsla.order import entropy_order
    from lmforge.methods.dsla.policy import SwapPolicy
    from lmforge.methods.dsla.serve import ServeRuntime, engine_serve_fn, load_ramp
    from lmforge.methods.dsla.speed import decode_ms_per_token
    from lmforge.models import load

    t0 = time.time()
    quick = opts.quick
    log = print if opts.progress else (lambda *a, **k: None)
    if quick:
        spec, k_layers, local, joint, seq, n_train, n_eval, eval_seq = "zoo:agent-nano", 2, 4, 2, 32, 8, 4, 48
        contexts, texts_cal, texts_eval = (64, 256), None, None
    else:
        spec, k_layers, local, joint, seq, n_train, n_eval, eval_seq = (REAL_MODEL, K_LAYERS, LOCAL, JOINT, SEQ,
                                                                      N_TRAIN, N_EVAL, EVAL_SEQ)
        contexts = CONTEXTS
    teacher, tok = load(spec)
    if quick:
        from lmforge.data.calibration import builtin_texts

        texts_cal = texts_eval = builtin_texts(opts.seed)
    else:
        texts_cal, texts_eval = essays.split("calibration"), essays.split("evaluation")
    train = torch.cat(token_windows(tok, texts_cal, n_train, seq, opts.seed))
    held_out = torch.cat(token_windows(tok, texts_eval, n_eval, eval_seq, opts.seed + 1))
    n_layers = teacher.config.num_hidden_layers
    order, entropies = entropy_order(teacher, train[:1])
    layers = order[:k_layers]
    log(f"entropy order {order[:8]}...; converting {layers}")
    student = copy.deepcopy(teacher)

    # --- A: quality ------------------------------------------------------------------------------
    base = evaluate(student, teacher, held_out)
    originals = zero_layers(student, layers)
    zero = evaluate(student, teacher, held_out)
    put_back(student, originals)
    arms = {}
    states = {}
    for name, n_states, energy in (("DSLA", 2, False), ("single-state GLA", 1, False),
                                   ("DSLA + energy init (NOTE)", 2, True),
                                   ("single-state GLA + energy init (NOTE)", 1, True)):
        cfg = DistillConfig(local_steps=local, joint_steps=joint, energy_init=energy, batch_size=BATCH, seed=opts.seed)
        t = time.time()
        logs = chain_distill(student, teacher, layers, train, cfg, DSLAConfig(n_states=n_states, seed=opts.seed),
                             progress=log if opts.progress else None)
        arms[name] = evaluate(student, teacher, held_out) | {
            "seconds": round(time.time() - t, 1),
            "local_mse_first_last": [round(logs[0].local_mse[0], 4), round(logs[-1].local_mse[-1], 4)]
            if local else None}
        states[name] = {k: v.detach().clone() for k, v in dsla_state_dict(student).items()}
        restore_layers(student, layers)
        log(f"{name}: KL {arms[name]['kl']:.4f}, NLL {arms[name]['nll']:.4f} ({arms[name]['seconds']} s)")
    kl_d, kl_s = arms["DSLA"]["kl"], arms["single-state GLA"]["kl"]
    held_a = kl_d < zero["kl"] and kl_d <= kl_s
    kl_de, kl_se = arms["DSLA + energy init (NOTE)"]["kl"], arms["single-state GLA + energy init (NOTE)"]["kl"]
    variant_a = kl_de < zero["kl"] and kl_de <= kl_se

    # --- C: swap then unswap is exact --------------------------------------------------------------
    with torch.no_grad():
        ref = student(held_out[:2]).logits
        load_dsla_state(student, states["DSLA"], DSLAConfig(n_states=2))
        swapped = student(held_out[:2]).logits
        restore_layers(student, layers)
        back = student(held_out[:2]).logits
    held_c = bool(torch.equal(ref, back)) and not torch.equal(ref, swapped)

    # --- B: decode speed -----------------------------------------------------------------------------
    fast = copy.deepcopy(teacher).to(torch.bfloat16).eval()
    del student
    speed: dict[tuple[int, float], float] = {}
    for frac in FRACTIONS:
        k = int(frac * n_layers)
        if k:
            convert_layers(fast, order[:k], DSLAConfig())
        for ctx in contexts:
            speed[(ctx, frac)] = decode_ms_per_token(fast, ctx, n_tokens=4 if quick else 12)
            log(f"decode at {ctx} tokens, {k}/{n_layers} layers converted: {speed[(ctx, frac)]:.1f} ms/token")
        if k:
            restore_layers(fast, order[:k])
    top = contexts[-1]
    speedup = speed[(top, 0.0)] / speed[(top, 0.75)]
    held_b = speedup >= SPEEDUP

    # --- the policy under a load ramp ----------------------------------------------------------------
    policy = SwapPolicy(n_layers=n_layers, order=list(layers))
    fast_state = {k: v.to(torch.bfloat16) for k, v in states["DSLA"].items()}

    def convert_one(layer: int) -> None:
        load_dsla_state(fast, {k: v for k, v in fast_state.items() if f".layers.{layer}." in k},
                        DSLAConfig(n_states=2))

    runtime = ServeRuntime(policy, convert_one, lambda layer: restore_layers(fast, [layer]),
                           engine_serve_fn(fast, tok, opts.seed), time_scale=0.01)
    ramp = load_ramp(8 if quick else 24, 96 if quick else 1536, max_new_tokens=2 if quick else 4)
    trace = runtime.run(ramp, tail_s=float("inf"))
    swaps = trace.swaps()
    held = held_a and held_b and held_c

    # --- report ----------------------------------------------------------------------------------------
    t_q = Table(f"Held-out essays ({n_eval} windows of {eval_seq} tokens): {k_layers} layers {layers} converted",
                ["model", "KL(teacher ‖ model) per token", "NLL per token", "training s", "local MSE first -> last"],
                [["teacher (no layer converted)", round(base["kl"], 5), round(base["nll"], 4), "-", "-"],
                 ["zeroing the attention", round(zero["kl"], 5), round(zero["nll"], 4), "-", "-"]]
                + [[name, round(a["kl"], 5), round(a["nll"], 4), a["seconds"], str(a["local_mse_first_last"])]
                   for name, a in arms.items()])
    t_s = Table("Decode ms/token (bf16, caches filled to the context)",
                ["context", *[f"{int(100 * f)}% converted" for f in FRACTIONS], "speed-up at 75%"],
                [[ctx, *[round(speed[(ctx, f)], 1) for f in FRACTIONS], round(speed[(ctx, 0.0)] / speed[(ctx, 0.75)], 2)]
                 for ctx in contexts])
    t_p = Table("Policy trace under a load ramp (time scaled by 1/100)",
                ["virtual s", "event", "layer", "queue", "max queued prompt", "converted"],
                [[round(e.time_s, 3), e.kind, e.ref, e.queue_len, e.max_prompt, str(e.converted)]
                 for e in trace.events if e.kind in ("convert", "revert")])
    t_o = Table("Last-token attention entropy per layer (conversion order: ascending)",
                ["layer", "entropy"], [[i, round(float(e), 4)] for i, e in enumerate(entropies)])

    fig, ax = figure(1, 2, figsize=(10, 3.6))
    for f in FRACTIONS:
        ax[0].plot(contexts, [speed[(c, f)] for c in contexts], marker="o", label=f"{int(100 * f)}% DSLA")
    ax[0].set(xlabel="context tokens", ylabel="decode ms/token", title="decode speed")
    ax[0].legend()
    ts = [e.time_s for e in trace.events]
    ax[1].step(ts, [len(e.converted) for e in trace.events], where="post", label="converted layers")
    ax[1].step(ts, [e.queue_len for e in trace.events], where="post", label="queue")
    ax[1].set(xlabel="virtual seconds", title="policy under a load ramp")
    ax[1].legend()
    fig_path = save_figure(fig, opts.out_dir / "dsla.png")

    measured = {
        "layers converted": str(layers),
        "KL zeroing / DSLA / single-state (default init)": f"{zero['kl']:.4f} / {kl_d:.4f} / {kl_s:.4f}",
        "KL DSLA / single-state with energy init (NOTE)": f"{kl_de:.4f} / {kl_se:.4f}",
        f"decode speed-up at 75% converted, {top} tokens": round(speedup, 2),
        "swaps in the policy trace": len(swaps),
        "condition A (KL DSLA < zeroing, <= single-state)": held_a,
        "condition A with the energy init (NOTE, not counted)": variant_a,
        "condition B (>= 1.3x decode)": held_b,
        "condition C (swap/unswap bit-identical)": held_c,
    }
    notes = [
        "Conditions A-C are the issue's, fixed in the code before the run. Settings (4 layers, 60 local + 5 "
        "joint steps per stage, 128-token windows) were sized for time: a first full run with 10 joint steps "
        "took 17 min (over the 15-min budget) and was not held either (README).",
        "The official code converts up to 75% of a 7B model's layers after long distillation runs on GPUs; "
        "here 4 of 30 layers get ~1 minute of CPU training each, so A is a small-budget test.",
        "Decode speed is measured with caches filled to the context (shapes, not values, set the cost); "
        "the DSLA state is O(1) per layer while a KV cache grows with the context.",
        "The policy trace shrinks time by 100 (NOTE in serve.py); only the trained layers are converted.",
        "Energy init: the teacher-initialised layer's unnormalised sums are ~50-110x too large in norm; the "
        "NOTE variant folds ||teacher||/||DSLA|| into o_proj before training.",
    ]
    if quick:
        notes.insert(0, "QUICK run: the zoo's agent-nano, 2 layers, a few steps; the verdict is not meaningful.")
    return ClaimResult(
        name="dsla",
        title=TITLE,
        claim=("Converting low-entropy attention layers to dual-state linear attention keeps quality close to the "
               "teacher while decoding faster at long context (2.3x faster than Llama2-7B)."),
        paper=PAPER,
        measured=measured,
        held=held,
        tables=[t_q, t_s, t_p, t_o],
        figures=[Figure(str(fig_path), "Left: decode ms/token by context and share of DSLA layers. Right: "
                                       "converted layers and queue length under the load ramp.")],
        notes=notes,
        seconds=round(time.time() - t0, 1),
    )



