"""``lmforge agent udora``: UDora (Zhang et al., ICML 2025, arXiv 2503.01908), red-teaming an LLM agent
by hijacking its reasoning, with the GCG and random-search baselines.

Each case is a prompt with one ``{optim_str}`` slot (inside a tool observation, InjecAgent style, or
an item title, WebShop style) and a target (the tool the attack wants called, or the product to
click). The attack is checkpointed after every step and resumes where it stopped.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Annotated, Any

import typer

from lmforge.commands.groups import agent_app
from lmforge.common.errors import UserError

METHODS = ("udora", "gcg", "random")
PRESETS = ("injecagent", "webshop", "official")

_CASES_HELP = ("Cases: JSON list or JSON lines of objects with 'prompt' (a string, or a list of "
               "{role, content} messages) holding exactly one {optim_str} slot; optional 'name', 'target' "
               "(string or list; else --target-tool), 'rule' (injecagent: 'Action: <tool>' in the output; "
               "webshop: 'click[<target>]'; contains), 'tools' (the agent's tool names; default: the target "
               "must be named in the prompt) and 'raw' (use a string prompt verbatim, no chat template).")


def _safe(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", name)[:80] or "case"


def load_cases(path: Path, target_tool: str | None) -> list[Any]:
    """Read and validate every case before anything is loaded or written."""
    from lmforge.common.io import read_json_objects
    from lmforge.methods.udora.attack import Case

    cases = []
    names: set[str] = set()
    for i, obj in enumerate(read_json_objects(path, "cases")):
        target = obj.get("target", obj.get("targets", target_tool))
        if target_tool is not None:
            target = target_tool
        if target is None:
            raise UserError(f"{path}: case {i}: no target (give 'target' in the case or --target-tool)")
        rule = obj.get("rule", "injecagent")
        name = str(obj.get("name", f"case{i}"))
        if name in names:
            raise UserError(f"{path}: case name {name!r} appears twice")
        names.add(name)
        try:
            case = Case(prompt=obj.get("prompt"), targets=target, rule=rule, name=name, raw=bool(obj.get("raw", False)))
        except UserError as exc:
            raise UserError(f"{path}: case {name!r}: {exc}") from None
        tools = obj.get("tools")
        prompt_text = case.prompt if isinstance(case.prompt, str) else "\n".join(m["content"] for m in case.prompt)
        if rule == "injecagent":
            for t in case.targets:
                have = (t in tools) if isinstance(tools, list) else (t in prompt_text.replace("{optim_str}", ""))
                if not have:
                    raise UserError(f"{path}: case {name!r}: the agent has no tool {t!r} "
                                    f"({'not in its tools' if isinstance(tools, list) else 'not named in its prompt'})")
        cases.append(case)
    return cases


def make_config(preset: str, overrides: dict[str, Any]) -> Any:
    from lmforge.methods.udora.attack import UDoraConfig, injecagent_defaults, webshop_defaults

    overrides = {k: v for k, v in overrides.items() if v is not None}
    if preset == "injecagent":
        cfg = injecagent_defaults(readme_run=True, **overrides)
    elif preset == "webshop":
        cfg = webshop_defaults(readme_run=True, **overrides)
    else:
        cfg = UDoraConfig(**overrides)
    cfg.validate()
    return cfg


def _landing(tokenizer: Any, record: dict[str, Any]) -> str:
    """The trace with every chosen target placement marked «…» (a readable view of where the target
    landed in the reasoning). NOTE: the trace is re-encoded from its text, so a token boundary may
    differ from the generated ids in rare cases."""
    ivs = record.get("intervals") or []
    ids = tokenizer(record["trace"], add_special_tokens=False)["input_ids"]
    if not ivs:
        return record["trace"]
    out, pos = [], 0
    for iv in sorted(ivs, key=lambda x: x["start"]):
        s = max(pos, min(int(iv["start"]), len(ids)))
        out.append(tokenizer.decode(ids[pos:s]))
        out.append("«" + str(iv.get("target_text") or tokenizer.decode(iv.get("target_ids", []))) + "»")
        pos = min(len(ids), max(s, int(iv["end"])))
    out.append(tokenizer.decode(ids[pos:]))
    return "".join(out)


def write_report(path: Path, results: list[dict[str, Any]], tokenizer: Any, method: str) -> None:
    from lmforge.common.io import atomic_write_text

    n = len(results)
    k = sum(r["success"] for r in results)
    lines = [f"# lmforge agent udora: {method}", "", f"Attack success rate: {k}/{n}", "",
             "| case | success | first success step | steps run | final string |", "|---|---|---|---|---|"]
    for r in results:
        lines.append(f"| {r['case']['name']} | {'yes' if r['success'] else 'no'} | {r['first_success_step']} | "
                     f"{r['steps_run']} | `{r['final_string'][:60]}` |")
    lines.append("")
    for r in results:
        last = next((x for x in reversed(r["records"]) if x.get("intervals")), r["records"][-1])
        lines += [f"## {r['case']['name']}", "",
                  f"Where the target was placed in the agent's reasoning at step {last['step']} («…»):", "",
                  "```", _landing(tokenizer, last), "```", "",
                  "Final trace:", "", "```", r["final_trace"], "```", ""]
    atomic_write_text(path, "\n".join(lines) + "\n")


@agent_app.command("udora")
def udora_cmd(
    model: Annotated[str, typer.Option("--model", "-m", help="The agent: a local HF folder, a .gguf, real:NAME or zoo:NAME.")],
    cases: Annotated[Path, typer.Option(help=_CASES_HELP)],
    out: Annotated[Path, typer.Option(help="Output folder: results.json (per case: success, first success step, best/final string, final trace, every step's record), report.md (where the target landed in the reasoning), and checkpoints/ while running.")],
    target_tool: Annotated[str | None, typer.Option(help="The tool every case should be made to call (overrides the cases' 'target').")] = None,
    method: Annotated[str, typer.Option(help="udora (the paper), gcg (target at the first response position) or random (random search, no gradient).")] = "udora",
    preset: Annotated[str, typer.Option(help="Settings of the official runs: injecagent (300 steps, width 256, top-k 64, 3 locations, space before target, early stop), webshop (500/128/32), or official (UDoraConfig's defaults).")] = "injecagent",
    steps: Annotated[int | None, typer.Option(help="Optimisation steps (overrides the preset).")] = None,
    width: Annotated[int | None, typer.Option(help="Candidates per step (search width).")] = None,
    topk: Annotated[int | None, typer.Option(help="Top-k tokens of the gradient per position.")] = None,
    num_location: Annotated[int | None, typer.Option(help="Target placements in the reasoning.")] = None,
    sequential: Annotated[bool | None, typer.Option("--sequential/--joint", help="Interval selection mode.")] = None,
    max_new_tokens: Annotated[int | None, typer.Option(help="Length of the agent's reasoning trace per step.")] = None,
    early_stop: Annotated[bool | None, typer.Option("--early-stop/--no-early-stop", help="Stop a case at its first success.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the candidate sampling.")] = 0,
    dtype: Annotated[str, typer.Option(help="Model dtype: float32 or bfloat16.")] = "float32",
    overwrite: Annotated[bool, typer.Option(help="Replace a finished output folder.")] = False,
    progress: Annotated[bool, typer.Option(help="Show a progress bar per case.")] = True,
    as_json: Annotated[bool, typer.Option("--json", help="Print the summary as JSON on stdout.")] = False,
) -> None:
    """Optimise an adversarial string in each case's {optim_str} slot until the agent calls the target
    tool (UDora: the target is inserted where it fits best in the agent's own reasoning)."""
    from lmforge.common.io import atomic_write_json, check_output_folder

    if method not in METHODS:
        raise UserError(f"--method must be one of {', '.join(METHODS)}, got {method!r}")
    if preset not in PRESETS:
        raise UserError(f"--preset must be one of {', '.join(PRESETS)}, got {preset!r}")
    for flag, value in (("--steps", steps), ("--width", width), ("--topk", topk), ("--num-location", num_location),
                        ("--max-new-tokens", max_new_tokens)):
        if value is not None and value <= 0:
            raise UserError(f"{flag} must be > 0, got {value}")
    config = make_config(preset, {"num_steps": steps, "search_width": width, "topk": topk,
                                  "num_location": num_location, "sequential": sequential,
                                  "max_new_tokens": max_new_tokens, "early_stop": early_stop, "seed": seed})
    case_list = load_cases(cases, target_tool)
    final = out / "results.json"
    if out.exists() and not out.is_dir():
        raise UserError(f"output '{out}' is a file; give a folder")
    if final.exists() and not overwrite:
        raise UserError(f"output '{final}' already exists; pass --overwrite to replace it")
    check_output_folder(out)

    import torch

    from lmforge.methods.udora.attack import run_attack
    from lmforge.models.load import load

    placement, proposal = {"udora": ("intervals", "gradient"), "gcg": ("start", "gradient"),
                           "random": ("intervals", "random")}[method]
    agent, tok = load(model, dtype=torch.bfloat16 if dtype in ("bfloat16", "bf16") else torch.float32)
    ckpt_dir = out / "checkpoints"
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    if overwrite:
        for f in ckpt_dir.glob("*.json"):
            f.unlink()
    results = []
    for case in case_list:
        done_file = ckpt_dir / f"{_safe(case.name)}.done.json"
        state_file = ckpt_dir / f"{_safe(case.name)}.state.json"
        if done_file.exists():
            results.append(json.loads(done_file.read_text(encoding="utf-8")))
            continue
        resume = json.loads(state_file.read_text(encoding="utf-8")) if state_file.exists() else None

        def save(record: Any, state: Any, _f: Path = state_file) -> None:
            atomic_write_json(_f, state.to_json())

        res = run_attack(agent, tok, case, config, placement=placement, proposal=proposal,
                         progress=progress and not as_json, on_step=save, resume_from=resume)
        payload = res.to_json()
        atomic_write_json(done_file, payload)
        state_file.unlink(missing_ok=True)
        results.append(payload)
    summary = {"method": method, "model": model, "cases": len(results),
               "successes": sum(r["success"] for r in results),
               "asr": sum(r["success"] for r in results) / len(results), "config": config.to_dict()}
    atomic_write_json(final, {"summary": summary, "cases": results})
    write_report(out / "report.md", results, tok, method)
    if as_json:
        typer.echo(json.dumps(summary, indent=2))
    else:
        typer.echo(f"{method}: {summary['successes']}/{summary['cases']} cases succeeded; saved to {final}")
