"""The shared typer groups. Command modules import these and decorate their functions with
``@align_app.command("NAME")``; keep heavy imports (torch, transformers) inside the functions so
``lmforge --help`` stays fast."""

from __future__ import annotations

import typer

align_app = typer.Typer(help="Alignment and distillation: DistiLLM-2, Selective DPO, Focus Instruction Tuning, SelfCite.",
                        no_args_is_help=True)
# `lmforge bench`: ACBench and the data commands live in lmforge.cli; methods add their own
# benchmarks here (`lmforge bench citations`).
bench_app = typer.Typer(help="Benchmarks: ACBench over models x compressions, MINIONS, citation F1 (SelfCite), simple-to-hard visual reasoning (S2H).",
                        no_args_is_help=True)
# `lmforge agent`: Minions lives in lmforge.cli; methods add their own (`lmforge agent udora`).
agent_app = typer.Typer(help="Agents: local-remote collaboration (Minions), red-teaming by reasoning hijack (UDora), Mixture-of-Roles agent tuning (MoRAgent).",
                        no_args_is_help=True)
reward_app = typer.Typer(help="Reward models and what they reward: diverging preferences, RATE.",
                         no_args_is_help=True)
# `lmforge train -m MODEL --out DIR` is the group's own callback (in lmforge.cli); its help is the
# callback's docstring. Subcommands (`lmforge train omnibal`) are methods with their own loop.
train_app = typer.Typer(invoke_without_command=True)
# Top-level commands that live in a method's command module (``lmforge serve-sim``): lmforge.cli
# copies them onto the app.
top_app = typer.Typer()
