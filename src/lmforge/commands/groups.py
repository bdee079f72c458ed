"""The shared typer groups. Command modules import these and decorate their functions with
``@align_app.command("NAME")``; keep heavy imports (torch, transformers) inside the functions so
``lmforge --help`` stays fast."""

from __future__ import annotations

import typer

align_app = typer.Typer(help="Alignment and distillation: DistiLLM-2, Selective DPO, Focus Instruction Tuning.",
                        no_args_is_help=True)
reward_app = typer.Typer(help="Reward models and what they reward: diverging preferences, RATE.",
                         no_args_is_help=True)
