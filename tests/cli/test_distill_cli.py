"""``lmforge align distill``: a run that saves a loadable student, and one-line errors for bad input."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from tests.cli.helpers import call
from tests.methods.distillm2.conftest import make_llama, make_tokenizer, prompts


@pytest.fixture(scope="module")
def dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    torch.set_num_threads(1)
    tok = make_tokenizer()
    root = tmp_path_factory.mktemp("distill-cli")
    out = {}
    for name, (hidden, layers, seed) in {"teacher": (32, 2, 0), "student": (16, 1, 1), "big": (64, 2, 3)}.items():
        make_llama(tok, hidden, layers, seed).save_pretrained(root / name)
        tok.save_pretrained(root / name)
        out[name] = root / name
    other = make_tokenizer("xyz")
    make_llama(other, 16, 1, 2).save_pretrained(root / "other")
    other.save_pretrained(root / "other")
    out["other"] = root / "other"
    (root / "prompts.txt").write_text("\n".join(prompts(6)) + "\n")
    out["prompts"] = root / "prompts.txt"
    return out


def _args(d: dict[str, Path], out: Path, *extra: str, student: str = "student") -> list[str]:
    return ["align", "distill", "--teacher", str(d["teacher"]), "--student", str(d[student]), "--prompts",
            str(d["prompts"]), "--out", str(out), "--epochs", "1", "--batch-size", "3", "--max-new-tokens", "4",
            "--lr", "1e-3", *extra]


def test_distill_cli_saves_a_loadable_student(dirs, tmp_path: Path, monkeypatch, capsys) -> None:
    from lmforge.models.load import load

    out = tmp_path / "run"
    code, stdout, err = call(monkeypatch, capsys, *_args(dirs, out, "--json"))
    assert code == 0, err
    summary = json.loads(stdout)
    assert summary["loss"] == "distillm2" and summary["steps"] == 2 and summary["prompts"] == 6
    record = json.loads((out / "distill.json").read_text())
    assert record["config"]["alpha"] == 0.1 and len(record["history"]) == 2
    lines = (out / "pairs.jsonl").read_text().splitlines()
    assert len(lines) == 6 and {"prompt", "chosen", "rejected"} <= set(json.loads(lines[0]))
    model, _ = load(str(out))
    base, _ = load(str(dirs["student"]))
    assert model.config.num_hidden_layers == 1
    assert any(not torch.equal(a, b) for a, b in zip(model.state_dict().values(), base.state_dict().values()))
    # an existing output is not replaced without --overwrite
    code, _, err = call(monkeypatch, capsys, *_args(dirs, out))
    assert code == 2 and "--overwrite" in err


def test_distill_cli_lora_and_pairs_input(dirs, tmp_path: Path, monkeypatch, capsys) -> None:
    first = tmp_path / "first"
    assert call(monkeypatch, capsys, *_args(dirs, first, "--loss", "gjsd"))[0] == 0
    out = tmp_path / "lora"
    args = ["align", "distill", "--teacher", str(dirs["teacher"]), "--student", str(dirs["student"]), "--pairs",
            str(first / "pairs.jsonl"), "--out", str(out), "--epochs", "1", "--batch-size", "6",
            "--max-new-tokens", "4", "--lora", "--lora-r", "2", "--lora-alpha", "4", "--json"]
    code, stdout, err = call(monkeypatch, capsys, *args)
    assert code == 0, err
    # the teacher responses come from the given pairs file
    given = [json.loads(x)["chosen"] for x in (first / "pairs.jsonl").read_text().splitlines()]
    kept = [json.loads(x)["chosen"] for x in (out / "pairs.jsonl").read_text().splitlines()]
    assert given == kept
    # LoRA is merged: a plain transformers folder without adapter files
    assert (out / "config.json").is_file() and not (out / "adapter_config.json").exists()


@pytest.mark.parametrize("alpha", ["0", "1.5", "-0.2"])
def test_alpha_outside_unit_interval_is_one_line(dirs, tmp_path: Path, monkeypatch, capsys, alpha: str) -> None:
    code, _, err = call(monkeypatch, capsys, *_args(dirs, tmp_path / "x", "--alpha", alpha))
    assert code == 2
    assert err.strip() == f"error: alpha must be in (0, 1], got {float(alpha)}"
    assert not (tmp_path / "x").exists()


def test_different_tokenizers_are_one_line(dirs, tmp_path: Path, monkeypatch, capsys) -> None:
    code, _, err = call(monkeypatch, capsys, *_args(dirs, tmp_path / "x", student="other"))
    assert code == 2
    assert err.startswith("error: teacher and student tokenizers differ") and err.count("\n") == 1
    assert not (tmp_path / "x").exists()


def test_unknown_loss_and_missing_inputs(dirs, tmp_path: Path, monkeypatch, capsys) -> None:
    code, _, err = call(monkeypatch, capsys, *_args(dirs, tmp_path / "x", "--loss", "dpo"))
    assert code == 2 and err.startswith("error: unknown loss 'dpo'") and err.count("\n") == 1
    code, _, err = call(monkeypatch, capsys, "align", "distill", "--teacher", str(dirs["teacher"]), "--student",
                        str(dirs["student"]), "--out", str(tmp_path / "y"))
    assert code == 2 and err.strip() == "error: give exactly one of --prompts and --pairs"
    bad = tmp_path / "pairs.jsonl"
    bad.write_text('{"prompt": "a", "chosen": " b"}\n')
    code, _, err = call(monkeypatch, capsys, "align", "distill", "--teacher", str(dirs["teacher"]), "--student",
                        str(dirs["student"]), "--pairs", str(bad), "--out", str(tmp_path / "z"))
    assert code == 2 and err.strip() == f"error: {bad}:1: missing field 'rejected'"


def test_student_larger_than_teacher_warns(dirs, tmp_path: Path, monkeypatch, capsys) -> None:
    code, stdout, err = call(monkeypatch, capsys, *_args(dirs, tmp_path / "big", "--loss", "kl", student="big"))
    assert code == 0, err
    assert "warning: the student" in err and "is larger than the teacher" in err
    assert "warning" not in stdout and (tmp_path / "big" / "config.json").is_file()
