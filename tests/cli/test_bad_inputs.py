"""Every bad invocation of every command: one line ``error: ...``, exit status 2, nothing written.

A table of bad inputs, each run through the real entry point (``lmforge.cli.main``, in-process) in
a folder of cheap input files. For each: exit status 2, exactly one non-empty line of output
(stdout and stderr together) that starts with ``error:`` and names the culprit, no traceback, and
the folder's files unchanged (hashed before and after). Range and type checks must come before any
model is touched: loading a model (``from_pretrained``) or building a zoo model fails the test
loudly, so a check that only fires after the load shows up here, not as a slow run.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.cli.helpers import call

NANO = "zoo:agent-nano"
MINIONS = ["--local", NANO, "--remote", "gpt-4o"]
DISTILL = ["align", "distill", "--teacher", NANO, "--student", NANO, "--out", "o", "--prompts", "p.txt"]
FIT_DATA = ["align", "fit-data", "-i", "recs.jsonl", "--out", "fit.jsonl", "--task", "Sentiment?",
            "--core-name", "the sentiment"]
SDPO = ["align", "selective-dpo", "-m", NANO, "--data", "prefs.jsonl", "--out", "o"]
MOR_TRAIN = ["agent", "mor-train", "-m", NANO, "--out", "o", "--data"]
RATE = ["reward", "rate", "--reward-model", "rm", "--data", "r.jsonl", "--attribute", "length"]
SETUP = ["bench", "setup", "fixrepo", "--out", "o", "--index", "idx"]

# (id, arguments, a word the error line must contain, case-insensitively)
CASES: list[tuple[str, list[str], str]] = [
    # generate
    ("generate-max-new-tokens", ["generate", NANO, "-p", "x", "--max-new-tokens", "-1"], "max_new_tokens"),
    ("generate-top-p", ["generate", NANO, "-p", "x", "--top-p", "1.5"], "top_p"),
    ("generate-top-p-sampling", ["generate", NANO, "-p", "x", "--sample", "--top-p", "0"], "top_p"),
    ("generate-temperature", ["generate", NANO, "-p", "x", "--temperature", "-1"], "temperature"),
    ("generate-temperature-zero-sampling", ["generate", NANO, "-p", "x", "--sample", "--temperature", "0"],
     "temperature"),
    ("generate-max-new-tokens-type", ["generate", NANO, "-p", "x", "--max-new-tokens", "abc"], "--max-new-tokens"),
    ("generate-seed-type", ["generate", NANO, "-p", "x", "--seed", "1.5"], "--seed"),
    ("generate-missing-prompt", ["generate", NANO], "--prompt"),
    ("generate-missing-model", ["generate"], "model"),
    ("generate-unknown-option", ["generate", NANO, "-p", "x", "--bogus"], "--bogus"),
    ("generate-threads", ["generate", NANO, "-p", "x", "--threads", "0"], "threads"),
    ("generate-dtype", ["generate", NANO, "-p", "x", "--dtype", "float7"], "dtype"),
    ("generate-no-such-folder", ["generate", "no-such-model-folder", "-p", "x"], "no-such-model-folder"),
    ("generate-empty-zoo-name", ["generate", "zoo:", "-p", "x"], "zoo"),
    # perplexity
    ("perplexity-stride-zero", ["perplexity", NANO, "t.txt", "--stride", "0"], "stride"),
    ("perplexity-max-length-negative", ["perplexity", NANO, "t.txt", "--max-length", "-5"], "max-length"),
    ("perplexity-max-length-one", ["perplexity", NANO, "t.txt", "--max-length", "1"], "max-length"),
    ("perplexity-stride-over-window", ["perplexity", NANO, "t.txt", "--max-length", "8", "--stride", "9"], "stride"),
    ("perplexity-directory", ["perplexity", NANO, "d"], "directory"),
    ("perplexity-missing-file", ["perplexity", NANO, "missing.txt"], "missing.txt"),
    ("perplexity-empty-file", ["perplexity", NANO, "empty.txt"], "empty.txt"),
    ("perplexity-stride-type", ["perplexity", NANO, "t.txt", "--stride", "x"], "--stride"),
    ("perplexity-missing-file-argument", ["perplexity", NANO], "text_file"),
    # compress
    ("compress-bits-high", ["compress", "gptq", "-m", NANO, "--bits", "9"], "bits"),
    ("compress-bits-low", ["compress", "rtn", "-m", NANO, "--bits", "1"], "bits"),
    ("compress-sparsity-high", ["compress", "wanda", "-m", NANO, "--sparsity", "1.5"], "sparsity"),
    ("compress-sparsity-negative", ["compress", "magnitude", "-m", NANO, "--sparsity", "-0.1"], "sparsity"),
    ("compress-unknown-method", ["compress", "nosuch", "-m", NANO], "nosuch"),
    ("compress-calib-samples", ["compress", "gptq", "-m", NANO, "--calib-samples", "0"], "calib"),
    ("compress-seq-len", ["compress", "gptq", "-m", NANO, "--seq-len", "0"], "seq"),
    ("compress-group-size", ["compress", "gptq", "-m", NANO, "--group-size", "-2"], "group"),
    ("compress-pattern", ["compress", "wanda", "-m", NANO, "--pattern", "5:4"], "5:4"),
    ("compress-set-without-value", ["compress", "gptq", "-m", NANO, "--set", "act_order"], "act_order"),
    ("compress-missing-model", ["compress", "gptq"], "--model"),
    ("compress-eval-dtype", ["compress", "gptq", "-m", NANO, "--eval-dtype", "fp16"], "--eval-dtype"),
    ("compress-calib-dtype", ["compress", "gptq", "-m", NANO, "--calib-dtype", "fp16"], "--calib-dtype"),
    ("compress-bits-type", ["compress", "gptq", "-m", NANO, "--bits", "four"], "--bits"),
    ("compress-calib-file-missing", ["compress", "gptq", "-m", NANO, "--calib-file", "missing.jsonl"], "missing.jsonl"),
    ("compress-out-is-a-file", ["compress", "gptq", "-m", NANO, "--out", "f.txt"], "f.txt"),
    # prune layers
    ("prune-remove-zero", ["prune", "layers", "-c", "zigzag", "-m", NANO, "--out", "o", "--remove", "0"], "remove"),
    ("prune-threshold", ["prune", "layers", "-c", "zigzag", "-m", NANO, "--out", "o", "--threshold", "1.5"],
     "threshold"),
    ("prune-unknown-criterion", ["prune", "layers", "-c", "nosuch", "-m", NANO, "--out", "o", "--remove", "1"],
     "nosuch"),
    ("prune-k-zero", ["prune", "layers", "-c", "zigzag", "-m", NANO, "--out", "o", "--remove", "1", "--k", "0"],
     "k"),
    ("prune-n-texts", ["prune", "layers", "-c", "angular", "-m", NANO, "--out", "o", "--remove", "1",
                       "--n-texts", "0"], "n-texts"),
    ("prune-batch-size", ["prune", "layers", "-c", "angular", "-m", NANO, "--out", "o", "--remove", "1",
                          "--batch-size", "0"], "batch-size"),
    ("prune-neither-remove-nor-threshold", ["prune", "layers", "-c", "angular", "-m", NANO, "--out", "o"],
     "remove"),
    ("prune-zigzag-cloud", ["prune", "layers", "-c", "zigzag", "-m", NANO, "--out", "o", "--remove", "1",
                            "--zigzag-cloud", "nowhere"], "cloud"),
    ("prune-missing-out", ["prune", "layers", "-c", "zigzag", "-m", NANO], "--out"),
    ("prune-max-length", ["prune", "layers", "-c", "angular", "-m", NANO, "--out", "o", "--remove", "1",
                          "--max-length", "0"], "max-length"),
    # zigzag
    ("zigzag-k-zero", ["zigzag", "-m", NANO, "--out", "o", "--k", "0"], "k"),
    ("zigzag-cloud", ["zigzag", "-m", NANO, "--out", "o", "--cloud", "x"], "cloud"),
    ("zigzag-n-texts", ["zigzag", "-m", NANO, "--out", "o", "--n-texts", "1"], "n-texts"),
    ("zigzag-p", ["zigzag", "-m", NANO, "--out", "o", "--p", "-1"], "p"),
    ("zigzag-batch-size", ["zigzag", "-m", NANO, "--out", "o", "--batch-size", "0"], "batch-size"),
    ("zigzag-alpha-type", ["zigzag", "-m", NANO, "--out", "o", "--alpha", "abc"], "--alpha"),
    ("zigzag-out-is-a-file", ["zigzag", "-m", NANO, "--out", "f.txt"], "f.txt"),
    # train
    ("train-steps", ["train", "-m", NANO, "--out", "o", "--steps", "0"], "steps"),
    ("train-lr", ["train", "-m", NANO, "--out", "o", "--lr", "-1"], "lr"),
    ("train-batch-size", ["train", "-m", NANO, "--out", "o", "--batch-size", "0"], "batch"),
    ("train-seq-len", ["train", "-m", NANO, "--out", "o", "--seq-len", "0"], "seq"),
    ("train-optimizer", ["train", "-m", NANO, "--out", "o", "--optimizer", "sgd"], "sgd"),
    ("train-parametrization", ["train", "-m", NANO, "--out", "o", "--parametrization", "xx"], "parametrization"),
    ("train-tau", ["train", "-m", NANO, "--out", "o", "--parametrization", "mus", "--tau", "1.5"], "tau"),
    ("train-min-lr-ratio", ["train", "-m", NANO, "--out", "o", "--min-lr-ratio", "2"], "min"),
    ("train-warmup", ["train", "-m", NANO, "--out", "o", "--warmup", "-1"], "warmup"),
    ("train-data-missing", ["train", "-m", NANO, "--out", "o", "--data", "missing.txt"], "missing.txt"),
    ("train-dsla-layers", ["train", "dsla", "-m", NANO, "--out", "o", "--layers", "0"], "layers"),
    ("train-dsla-hidden-index", ["train", "dsla", "-m", NANO, "--out", "o", "--hidden-index", "x"], "hidden-index"),
    ("serve-sim-not-a-run", ["serve-sim", "-m", "d", "--load", "f.txt"], "not a `lmforge train dsla` output"),
    ("train-omnibal-lengths-missing", ["train", "omnibal", "--lengths", "missing.json", "--out", "o"], "missing.json"),
    ("train-omnibal-stages", ["train", "omnibal", "--lengths", "internvl", "--out", "o", "--stages", "99"], "stages"),
    ("train-omnibal-one-cap", ["train", "omnibal", "--lengths", "internvl", "--out", "o", "--token-cap", "4096"],
     "both --vit-cap"),
    ("train-omnibal-micro", ["train", "omnibal", "--lengths", "internvl", "--out", "o", "--stages", "4",
                             "--micro-batches", "2"], "micro-batches"),
    # (nccl/cuda: "needs CUDA" without a GPU; with one, the pairing rule gloo/cpu, nccl/cuda names them too)
    ("train-omnibal-nccl", ["train", "omnibal", "--lengths", "internvl", "--out", "o", "--backend", "nccl"], "nccl"),
    ("train-omnibal-cuda", ["train", "omnibal", "--lengths", "internvl", "--out", "o", "--device", "cuda"], "cuda"),
    ("train-omnibal-backend", ["train", "omnibal", "--lengths", "internvl", "--out", "o", "--backend", "mpi"],
     "backend"),
    ("train-omnibal-capacity-source", ["train", "omnibal", "--lengths", "internvl", "--out", "o",
                                       "--capacity-source", "guess"], "capacity-source"),
    ("train-omnibal-capacity-both", ["train", "omnibal", "--lengths", "internvl", "--out", "o", "--capacity-mb", "64",
                                     "--capacity-source", "measured"], "not both"),
    ("train-omnibal-capacity-inf", ["train", "omnibal", "--lengths", "internvl", "--out", "o", "--capacity-mb", "inf"],
     "capacity-mb must be positive and finite"),
    ("train-omnibal-capacity-nan", ["train", "omnibal", "--lengths", "internvl", "--out", "o", "--capacity-mb", "nan"],
     "capacity-mb must be positive and finite"),
    # SelfCite and UDora
    ("selfcite-bon-n", ["align", "selfcite-bon", "-m", NANO, "--data", "docs.jsonl", "--out", "o", "--n", "0"],
     "N must be >= 1"),
    ("selfcite-bon-no-context", ["align", "selfcite-bon", "-m", NANO, "--data", "prefs.jsonl", "--out", "o"],
     "'context'"),
    ("selfcite-simpo-identical", ["align", "selfcite-simpo", "-m", NANO, "--pairs", "same.jsonl", "--out", "o"],
     "no usable pair"),
    ("bench-citations-outside", ["bench", "citations", "--pred", "cite_pred.jsonl", "--gold", "cite_gold.jsonl"],
     "outside the document"),
    ("agent-udora-no-slot", ["agent", "udora", "-m", NANO, "--cases", "noslot.jsonl", "--out", "o"],
     "exactly one {optim_str}"),
    ("agent-udora-steps", ["agent", "udora", "-m", NANO, "--cases", "cases.jsonl", "--out", "o", "--steps", "0"],
     "--steps must be > 0"),
    ("agent-udora-tool", ["agent", "udora", "-m", NANO, "--cases", "cases.jsonl", "--out", "o", "--target-tool",
                          "OrderPizza"], "has no tool"),
    # MoRAgent
    ("agent-mor-data-missing-input", ["agent", "mor-data", "--input", "missing.jsonl", "--out", "tr.jsonl"],
     "missing.jsonl"),
    ("agent-mor-data-two-sources", ["agent", "mor-data", "--input", "recs.jsonl", "--bfcl", "multiple",
                                    "--out", "tr.jsonl"], "exactly one of --input"),
    ("agent-mor-data-irrelevance", ["agent", "mor-data", "--bfcl", "irrelevance", "--out", "tr.jsonl"],
     "no gold calls"),
    ("agent-mor-train-unknown-role", [*MOR_TRAIN, "traj_planner.jsonl"], "'planner'"),
    ("agent-mor-train-no-role-tag", [*MOR_TRAIN, "traj_norole.jsonl"], "no role tag"),
    ("agent-mor-train-top-k", [*MOR_TRAIN, "traj.jsonl", "--top-k", "5,3,2"], "top-k 5"),
    ("agent-mor-train-steps", [*MOR_TRAIN, "traj.jsonl", "--steps", "0"], "--steps"),
    ("agent-mor-train-adapter", [*MOR_TRAIN, "traj.jsonl", "--adapter", "dora"], "dora"),
    ("agent-mor-train-out-exists", ["agent", "mor-train", "-m", NANO, "--out", "d", "--data", "traj.jsonl"],
     "--overwrite"),
    ("agent-mor-run-bfcl-category", ["agent", "mor-run", "-m", NANO, "--bfcl", "simple_java", "--out", "o"],
     "simple_java"),
    ("agent-mor-run-max-steps", ["agent", "mor-run", "-m", NANO, "--bfcl", "multiple", "--out", "o",
                                 "--max-steps", "0"], "--max-steps"),
    ("agent-mor-run-not-an-adapter", ["agent", "mor-run", "-m", NANO, "--bfcl", "multiple", "--out", "o",
                                      "--adapter", "d"], "not an adapter folder"),
    ("agent-mor-run-lora-without-safetensors", ["agent", "mor-run", "-m", NANO, "--bfcl", "multiple", "--out", "o",
                                                "--adapter", "lora_pickle"], "adapter_model.safetensors"),
    ("s2h-data-task", ["bench", "s2h-data", "--task", "maze", "--out", "o"], "unknown S2H task"),
    ("s2h-data-size", ["bench", "s2h-data", "--task", "table-readout", "--size", "rows=3..4", "--out", "o"],
     "outside the generator's range"),
    ("s2h-bench-image", ["bench", "s2h", "--image", "cite_pred.jsonl", "--start", "a1", "--end", "b2"],
     "cannot read"),
    ("s2h-train-strategy", ["train", "s2h", "--strategy", "mix++", "--out", "o"], "unknown strategy"),
    ("s2h-base-steps", ["train", "s2h-base", "--out", "o", "--steps", "0"], "--steps must be at least 1"),
    # bench
    ("bench-data-onto-a-file", ["bench", "data", "f.txt"], "f.txt"),
    ("bench-data-unknown-task", ["bench", "data", "o", "--tasks", "nosuch"], "nosuch"),
    ("bench-acbench-max-steps", ["bench", "acbench", "-m", NANO, "--out", "o", "--max-steps", "0"], "max-steps"),
    ("bench-acbench-unknown-task", ["bench", "acbench", "-m", NANO, "--out", "o", "--tasks", "nosuch"], "nosuch"),
    ("bench-acbench-limit", ["bench", "acbench", "-m", NANO, "--out", "o", "--limit", "0"], "limit"),
    ("bench-acbench-length-buckets", ["bench", "acbench", "-m", NANO, "--out", "o", "--length-buckets", "8,4"],
     "length-buckets"),
    ("bench-acbench-prompt-format", ["bench", "acbench", "-m", NANO, "--out", "o", "--prompt-format", "xx"],
     "prompt"),
    ("bench-acbench-compress", ["bench", "acbench", "-m", NANO, "--out", "o", "--compress", "nosuch:bits=4"],
     "nosuch"),
    ("bench-acbench-embedder", ["bench", "acbench", "-m", NANO, "--out", "o", "--embedder", "xx"], "embedder"),
    ("bench-acbench-data-missing", ["bench", "acbench", "-m", NANO, "--out", "o", "--data", "missing"], "missing"),
    ("bench-acbench-out-is-a-file", ["bench", "acbench", "-m", NANO, "--out", "f.txt"], "f.txt"),
    ("bench-export-data-missing", ["bench", "export-lmeval", "o", "-m", NANO, "--data", "missing"], "missing"),
    ("bench-export-unknown-task", ["bench", "export-lmeval", "o", "-m", NANO, "--tasks", "nosuch"], "nosuch"),
    ("bench-export-limit", ["bench", "export-lmeval", "o", "-m", NANO, "--limit", "0"], "limit"),
    ("bench-minions-no-data", ["bench", "minions", *MINIONS, "--out", "o"], "--synthetic"),
    ("bench-minions-synthetic", ["bench", "minions", *MINIONS, "--out", "o", "--synthetic", "0"], "synthetic"),
    ("bench-minions-limit", ["bench", "minions", *MINIONS, "--out", "o", "--synthetic", "2", "--limit", "0"],
     "limit"),
    ("bench-minions-protocol", ["bench", "minions", *MINIONS, "--out", "o", "--synthetic", "2", "-p", "nosuch"],
     "nosuch"),
    ("bench-minions-chunk-size", ["bench", "minions", *MINIONS, "--out", "o", "--synthetic", "2",
                                  "--chunk-size", "0"], "chunk"),
    ("bench-minions-max-rounds", ["bench", "minions", *MINIONS, "--out", "o", "--synthetic", "2",
                                  "--max-rounds", "0"], "rounds"),
    # agent minions
    ("agent-minions-missing-doc", ["agent", "minions", *MINIONS, "--doc", "missing.txt", "--question", "q"],
     "missing.txt"),
    ("agent-minions-empty-question", ["agent", "minions", *MINIONS, "--doc", "t.txt", "--question", " "],
     "question"),
    ("agent-minions-protocol", ["agent", "minions", *MINIONS, "--doc", "t.txt", "--question", "q",
                                "--protocol", "nosuch"], "nosuch"),
    ("agent-minions-max-rounds", ["agent", "minions", *MINIONS, "--doc", "t.txt", "--question", "q",
                                  "--max-rounds", "0"], "rounds"),
    ("agent-minions-local-max-tokens", ["agent", "minions", *MINIONS, "--doc", "t.txt", "--question", "q",
                                        "--local-max-tokens", "0"], "local-max-tokens"),
    ("agent-minions-missing-question", ["agent", "minions", *MINIONS, "--doc", "t.txt"], "--question"),
    # align distill / fit-data / fit / selective-dpo / teacher-hacking
    ("distill-alpha", [*DISTILL, "--alpha", "2"], "alpha"),
    ("distill-loss", [*DISTILL, "--loss", "nosuch"], "nosuch"),
    ("distill-epochs", [*DISTILL, "--epochs", "0"], "epochs"),
    ("distill-top-p", [*DISTILL, "--top-p", "0"], "top_p"),
    ("distill-no-prompts", DISTILL[:-2], "--prompts"),
    ("distill-prompts-missing", [*DISTILL[:-1], "missing.txt"], "missing.txt"),
    ("fit-data-no-spurious-name", [*FIT_DATA, "--spurious-label-field", "s"], "--spurious-name"),
    ("fit-data-mode", [*FIT_DATA, "--spurious-name", "the word", "--spurious-label-field", "s", "--mode", "xx"],
     "mode"),
    ("fit-data-bad-map", [*FIT_DATA, "--spurious-name", "the word", "--spurious-field", "w",
                          "--spurious-map", "{not json"], "--spurious-map"),
    # FIT data without the named feature fields (the record has text, label, s and w only)
    ("fit-data-no-spurious-label-field", [*FIT_DATA, "--spurious-name", "the word", "--spurious-label-field",
                                          "keyword_label"], "keyword_label"),
    ("fit-data-no-spurious-name-field", [*FIT_DATA, "--spurious-name-field", "family", "--spurious-label-field",
                                         "s"], "family"),
    ("fit-data-no-text-field", [*FIT_DATA, "--spurious-name", "the word", "--spurious-label-field", "s",
                                "--text-field", "review"], "review"),
    ("fit-trainer", ["align", "fit", "-m", NANO, "--data", "fitd.jsonl", "--out", "o", "--trainer", "nosuch"],
     "trainer"),
    ("fit-lora-r", ["align", "fit", "-m", NANO, "--data", "fitd.jsonl", "--out", "o", "--lora-r", "-1"], "LoRA"),
    ("fit-steps", ["align", "fit", "-m", NANO, "--data", "fitd.jsonl", "--out", "o", "--steps", "0"], "steps"),
    ("fit-val-fraction", ["align", "fit", "-m", NANO, "--data", "fitd.jsonl", "--out", "o",
                          "--val-fraction", "1.5"], "val"),
    ("fit-data-missing", ["align", "fit", "-m", NANO, "--data", "missing.jsonl", "--out", "o"], "missing.jsonl"),
    ("selective-dpo-tau", [*SDPO, "--tau", "0"], "tau"),
    ("selective-dpo-engine", [*SDPO, "--engine", "xx"], "engine"),
    ("selective-dpo-seeds", [*SDPO, "--seeds", "a,b"], "seeds"),
    ("selective-dpo-batch-size", [*SDPO, "--batch-size", "0"], "batch"),
    ("selective-dpo-data-missing", [*SDPO[:5], "missing.jsonl", "--out", "o"], "missing.jsonl"),
    ("teacher-hacking-regimes", ["align", "teacher-hacking", "--out", "o", "--regimes", "nosuch"], "nosuch"),
    ("teacher-hacking-steps", ["align", "teacher-hacking", "--out", "o", "--steps", "0"], "steps"),
    ("teacher-hacking-loss", ["align", "teacher-hacking", "--out", "o", "--loss", "xx"], "loss"),
    ("teacher-hacking-student-sft", ["align", "teacher-hacking", "--out", "o", "--student-sft-steps", "-1"],
     "student_sft"),
    # reward
    ("reward-train-head", ["reward", "train", "--head", "nosuch", "--data", "prefs.jsonl", "--out", "o"], "head"),
    ("reward-train-data-missing", ["reward", "train", "--head", "bt", "--data", "missing.jsonl", "--out", "o"],
     "missing.jsonl"),
    ("reward-train-epochs", ["reward", "train", "--head", "bt", "--data", "prefs.jsonl", "--out", "o",
                             "--epochs", "0"], "epochs"),
    ("reward-train-test-fraction", ["reward", "train", "--head", "bt", "--data", "prefs.jsonl", "--out", "o",
                                    "--test-fraction", "1.5"], "fraction"),
    ("reward-eval-lambda", ["reward", "eval", "--reward-model", "rm", "--data", "prefs.jsonl", "--lambda", "-1"],
     "lambda"),
    ("reward-judge-drop-fraction", ["reward", "judge", "--data", "prefs.jsonl", "--judge", "hf:x",
                                    "--drop-fraction", "1"], "drop-fraction"),
    ("reward-rate-temperature", [*RATE, "--temperature", "-1"], "temperature"),
    ("reward-rate-limit", [*RATE, "--limit", "0"], "limit"),
    ("reward-rate-data-missing", [*RATE[:5], "missing.jsonl", *RATE[6:]], "missing.jsonl"),
    # SetUpAgent: bench setup / bench swe-export (inputs built by _setupagent_inputs)
    ("bench-setup-not-a-git-repo", ["bench", "setup", "d", "--out", "o", "--index", "idx"], "not a git repository"),
    ("bench-setup-no-candidate", ["bench", "setup", "plainrepo", "--out", "o", "--index", "idx"], "no candidate"),
    ("bench-setup-index-no-upload-time", ["bench", "setup", "fixrepo", "--out", "o", "--index", "idx_notimes"],
     "upload time"),
    ("bench-setup-index-missing", ["bench", "setup", "fixrepo", "--out", "o", "--index", "missing"], "missing"),
    ("bench-setup-max-rounds", [*SETUP, "--max-rounds", "0"], "--max-rounds"),
    ("bench-setup-threshold", [*SETUP, "--threshold", "1.5"], "--threshold"),
    ("bench-setup-timeout", [*SETUP, "--timeout", "0"], "--timeout"),
    ("bench-setup-memory-mb", [*SETUP, "--memory-mb", "0"], "--memory-mb"),
    ("bench-setup-max-commits", [*SETUP, "--max-commits", "0"], "--max-commits"),
    ("bench-setup-base-url-with-rules", [*SETUP, "--base-url", "http://127.0.0.1:9/v1"], "--base-url"),
    ("bench-setup-served-model-without-url", [*SETUP, "--extractor", "gpt-4o"], "--base-url"),
    ("bench-setup-out-not-a-setup-folder", ["bench", "setup", "fixrepo", "--out", "lora_pickle", "--index", "idx"],
     "not a `lmforge bench setup` output folder"),
    ("bench-swe-export-no-runs", ["bench", "swe-export", "d", "--out", "x.jsonl"], "no runs/"),
    ("bench-swe-export-out-exists", ["bench", "swe-export", "setup_out", "--out", "f.txt"], "--overwrite"),
    ("bench-swe-export-duplicate-id", ["bench", "swe-export", "setup_out", "setup_out_copy", "--out", "x.jsonl"],
     "in both"),
    ("bench-swe-export-no-instance", ["bench", "swe-export", "setup_invalid", "--out", "x.jsonl"],
     "no valid instance"),
    # reproduce, zoo, list, unknown commands
    ("reproduce-unknown", ["reproduce", "nosuch"], "nosuch"),
    ("reproduce-out-is-a-file", ["reproduce", "zoo", "--out", "f.txt"], "f.txt"),
    ("zoo-build-unknown", ["zoo", "build", "agent-huge"], "agent-huge"),
    ("zoo-build-bad-override", ["zoo", "build", "agent-nano", "no_such_field=1"], "no_such_field"),
    ("list-unknown-option", ["list", "--bogus"], "--bogus"),
    ("unknown-command", ["nosuch"], "nosuch"),
    ("unknown-subcommand", ["bench", "nosuch"], "nosuch"),
]


def _traj(role: str | None = "reasoner") -> str:
    """One MoRAgent trajectory line; its first reasoner segment gets ``role`` (None: no role tag)."""
    segs = [{"role": "user", "text": "Tools:\n- f(x)\nQuery: f of 1"},
            {"role": role, "text": "Thought: call f.\nNext role: executor"},
            {"role": "executor", "text": '{"name": "f", "arguments": {"x": 1}}'},
            {"role": "observation", "text": '{"status": "ok", "function": "f", "result": {"x": 1}}'},
            {"role": "reasoner", "text": "Thought: done.\nNext role: summarizer"},
            {"role": "summarizer", "text": "f returned x 1."}]
    if role is None:
        del segs[1]["role"]
    return json.dumps({"segments": segs, "meta": {}}) + "\n"


# Cheap inputs in the working folder: every case sees the same files, and none may change.
FILES = {
    "f.txt": "x\n",
    "t.txt": "The quick brown fox jumps over the lazy dog.\n\nA second short document.\n",
    "empty.txt": "",
    "p.txt": "What is two plus two?\n",
    "recs.jsonl": json.dumps({"text": "good film", "label": "positive", "s": "positive", "w": "pineapple"}) + "\n",
    "fitd.jsonl": json.dumps({"prompt": "Q: ", "completion": "A"}) + "\n",
    "prefs.jsonl": json.dumps({"prompt": "1+1=", "chosen": "2", "rejected": "3"}) + "\n",
    "r.jsonl": json.dumps({"response": "a short answer", "w": 1}) + "\n",
    "docs.jsonl": json.dumps({"context": "One fact. Another fact.", "query": "What?"}) + "\n",
    "same.jsonl": json.dumps({"prompt": "q", "chosen": "<statement>a<cite>[0-0]</cite></statement>",
                              "rejected": "<statement>a<cite>[0-0]</cite></statement>"}) + "\n",
    "cite_pred.jsonl": json.dumps({"idx": 0, "prediction": "<statement>a<cite>[0-0]</cite></statement>"}) + "\n",
    "cite_gold.jsonl": json.dumps({"idx": 0, "context": "One fact. Another fact.",
                                   "statements": [{"statement": "a", "support": [5]}]}) + "\n",
    "noslot.jsonl": json.dumps({"prompt": "Tools: SendPostcard. Observation: hi", "target": "SendPostcard"}) + "\n",
    "cases.jsonl": json.dumps({"prompt": "Tools: SendPostcard. Observation: {optim_str}", "raw": True,
                               "target": "SendPostcard"}) + "\n",
    "traj.jsonl": _traj(),
    "traj_planner.jsonl": _traj(role="planner"),
    "traj_norole.jsonl": _traj(role=None),
}


def _git(root: Path, *args: str, when: str = "2023-01-01T12:00:00+00:00") -> None:
    env = {"PATH": os.environ.get("PATH", os.defpath), "HOME": str(root), "GIT_CONFIG_NOSYSTEM": "1",
           "GIT_AUTHOR_NAME": "dev", "GIT_AUTHOR_EMAIL": "dev@example.org", "GIT_COMMITTER_NAME": "dev",
           "GIT_COMMITTER_EMAIL": "dev@example.org", "GIT_AUTHOR_DATE": when, "GIT_COMMITTER_DATE": when}
    subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, env=env)


def _run_record(instance_id: str, status: str) -> str:
    """A `bench setup` run record (runs/<id>.json) with a graded instance."""
    inst = {"repo": "proj", "instance_id": instance_id, "base_commit": "0" * 40, "patch": "", "test_patch": "",
            "problem_statement": "clamp ignores its upper bound", "created_at": "2023-06-01T12:00:00Z",
            "FAIL_TO_PASS": ["tests/test_core.py::test_clamp_upper"], "PASS_TO_PASS": []}
    return json.dumps({"instance_id": instance_id, "status": status, "reason": "", "instance": inst})


def _setupagent_inputs(folder: Path) -> None:
    """Inputs of the `bench setup` / `bench swe-export` cases: a repository with an issue-linked fix
    (fixrepo), one whose history changes no test (plainrepo), a local index with upload times (idx)
    and one without (idx_notimes), and setup output folders (setup_out, its copy, setup_invalid)."""
    from lmforge.methods.setupagent.index import UPLOAD_TIMES_FILE, build_wheel
    from lmforge.reproduce.setupagent import make_repo

    make_repo(folder / "fixrepo", 0)
    plain = folder / "plainrepo"
    plain.mkdir()
    (plain / "calc.py").write_text("def add(a, b):\n    return a - b\n")
    _git(plain, "init", "-q", "-b", "main")
    _git(plain, "add", "-A")
    _git(plain, "commit", "-q", "-m", "Initial")
    (plain / "calc.py").write_text("def add(a, b):\n    return a + b\n")
    _git(plain, "commit", "-q", "-am", "Fix #1: add subtracts", when="2023-02-01T12:00:00+00:00")
    for name, times in (("idx", True), ("idx_notimes", False)):
        wheel = build_wheel("toydep", "1.0", {"toydep/__init__.py": "X = 1\n"}, folder / name)
        if times:
            (folder / name / UPLOAD_TIMES_FILE).write_text(json.dumps({wheel.name: "2022-03-01T00:00:00Z"}))
    for name, status in (("setup_out", "valid"), ("setup_out_copy", "valid"), ("setup_invalid", "invalid")):
        (folder / name / "runs").mkdir(parents=True)
        (folder / name / "runs" / "proj-0123456789ab.json").write_text(_run_record("proj-0123456789ab", status))


@pytest.fixture(scope="module")
def setupagent_template(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("setupagent_inputs")
    _setupagent_inputs(folder)
    return folder


def _snapshot(folder: Path) -> dict[str, str]:
    """Every path under ``folder`` with the sha256 of its content ("dir" for folders)."""
    out = {}
    for path in sorted(folder.rglob("*")):
        rel = str(path.relative_to(folder))
        out[rel] = "dir" if path.is_dir() else hashlib.sha256(path.read_bytes()).hexdigest()
    return out


@pytest.fixture
def workdir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, setupagent_template: Path) -> Path:
    for name, text in FILES.items():
        (tmp_path / name).write_text(text)
    for entry in setupagent_template.iterdir():
        shutil.copytree(entry, tmp_path / entry.name, symlinks=True)
    (tmp_path / "d").mkdir()
    (tmp_path / "lora_pickle").mkdir()  # a peft folder with pickle weights only
    (tmp_path / "lora_pickle" / "adapter_config.json").write_text("{}")
    (tmp_path / "lora_pickle" / "adapter_model.bin").write_bytes(b"\x80")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.fixture
def no_model_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any model load or zoo build fails the test: the checks must come first."""
    import transformers

    import lmforge.models.zoo as zoo

    def loaded(*args, **kwargs):
        raise AssertionError("a model was loaded (or built) before the bad input was noticed")

    monkeypatch.setattr(transformers.PreTrainedModel, "from_pretrained", classmethod(loaded))
    monkeypatch.setattr(zoo, "ensure_built", loaded)
    monkeypatch.setattr(zoo, "build", loaded)


def test_the_table_is_large_and_covers_every_command():
    assert len(CASES) >= 70
    assert len({c[0] for c in CASES}) == len(CASES)
    from lmforge.cli import app

    import typer.main

    group = typer.main.get_command(app)
    covered = {tuple(a for a in args[:2] if not a.startswith("-")) for _, args, _ in CASES}
    for name, cmd in group.commands.items():  # type: ignore[attr-defined]
        subs = getattr(cmd, "commands", None)
        for full in ([(name, s) for s in subs] if subs else [(name,)]):
            if full in {("list",), ("zoo", "list"), ("models", "list"), ("bench", "tasks")}:
                continue  # no argument that can be wrong but an unknown option (see list-unknown-option)
            assert any(c[: len(full)] == full for c in covered), f"no bad input for `lmforge {' '.join(full)}`"


@pytest.mark.parametrize("args, needle", [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(args, needle, workdir, no_model_loads, monkeypatch,
                                                         capsys):
    before = _snapshot(workdir)
    code, out, err = call(monkeypatch, capsys, *args)
    lines = [ln for ln in (out + err).splitlines() if ln.strip()]
    assert code == 2, (code, out, err)
    assert len(lines) == 1, out + err
    assert lines[0].startswith("error: "), lines[0]
    assert "Traceback" not in out + err
    assert needle.lower() in lines[0].lower(), lines[0]
    assert _snapshot(workdir) == before, "the folder changed"


@pytest.mark.parametrize("args", [["--help"], ["generate", "--help"], ["bench", "acbench", "--help"],
                                  ["align", "distill", "--help"], ["reward", "rate", "--help"]])
def test_help_still_prints_and_exits_0_through_main(args, monkeypatch, capsys):
    code, out, err = call(monkeypatch, capsys, *args)
    assert code == 0, (out, err)
    assert "Usage" in out and "error:" not in out + err


@pytest.mark.parametrize("args", [[], ["zoo"], ["bench"]])
def test_a_group_without_a_command_prints_its_help(args, monkeypatch, capsys):
    code, out, err = call(monkeypatch, capsys, *args)
    assert code == 2 and "Usage" in out + err and "Traceback" not in out + err  # click's convention
