"""The CLI: --help everywhere, --json shapes, and bad input as one line with exit status 2."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lmforge.cli import app

runner = CliRunner()


def run_cli(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess:
    """Run the real entry point in a subprocess (exit codes and stderr as a user sees them)."""
    return subprocess.run([sys.executable, "-m", "lmforge.cli", *args], capture_output=True, text=True,
                          cwd=cwd, timeout=300)


@pytest.mark.parametrize("cmd", [[], ["list"], ["zoo"], ["zoo", "list"], ["zoo", "build"], ["reproduce"]])
def test_help_on_every_command(cmd):
    res = runner.invoke(app, [*cmd, "--help"])
    assert res.exit_code == 0, res.output
    assert "Usage" in res.output


def test_list_json_has_name_family_paper():
    res = runner.invoke(app, ["list", "--json"])
    rows = json.loads(res.stdout)
    assert rows and all({"name", "family", "paper"} <= set(r) for r in rows)
    names = {r["name"] for r in rows}
    assert {"gptq", "awq", "wanda", "sparsegpt", "ganq", "zigzag", "acbench", "minions"} <= names


def test_zoo_list_json():
    rows = json.loads(runner.invoke(app, ["zoo", "list", "--json"]).stdout)
    assert {r["name"] for r in rows} >= {"agent-nano", "agent-small"}


def _one_error_line(res: subprocess.CompletedProcess) -> str:
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr)
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    assert "Traceback" not in res.stderr
    return lines[0]


def test_unknown_zoo_name(tmp_path):
    line = _one_error_line(run_cli("zoo", "build", "agent-huge", "--out", str(tmp_path / "o")))
    assert "unknown zoo model 'agent-huge'" in line
    assert not (tmp_path / "o").exists()


def test_existing_output_without_overwrite(tmp_path):
    out = tmp_path / "exists"
    out.mkdir()
    (out / "keep.txt").write_text("user data")
    line = _one_error_line(run_cli("zoo", "build", "agent-nano", "--out", str(out)))
    assert "--overwrite" in line
    assert (out / "keep.txt").read_text() == "user data"
    report = tmp_path / "reports"
    (report / "zoo").mkdir(parents=True)
    line = _one_error_line(run_cli("reproduce", "zoo", "--out", str(report)))
    assert "already exists" in line


def test_unknown_reproduction(tmp_path):
    line = _one_error_line(run_cli("reproduce", "nope", "--out", str(tmp_path)))
    assert "unknown reproduction 'nope'" in line


def test_bad_kernel_and_quick_with_full_are_one_line_before_any_work(tmp_path):
    line = _one_error_line(run_cli("generate", "zoo:agent-nano", "--kernel", "fast", "-p", "hi"))
    assert "--kernel must be one of auto, int4, dequant" in line
    line = _one_error_line(run_cli("reproduce", "ganq", "--quick", "--full", "--out", str(tmp_path / "r")))
    assert "exclude each other" in line and not (tmp_path / "r").exists()


def test_model_folder_without_config(tmp_path):
    from lmforge.common.errors import UserError
    from lmforge.models import load

    with pytest.raises(UserError, match="config.json"):
        load(str(tmp_path))


def test_reproduce_list_json():
    rows = json.loads(runner.invoke(app, ["reproduce", "--list", "--json"]).stdout)
    assert "zoo" in {r["name"] for r in rows}


def test_generate_refuses_pickle_until_allowed(tmp_path):
    from tests.models.conftest import save_tiny

    folder = tmp_path / "pickled"
    folder.mkdir()
    save_tiny(folder, "llama", safe_serialization=False)
    line = _one_error_line(run_cli("generate", str(folder), "-p", "ab", "--max-new-tokens", "3"))
    assert "refusing to load pickle weights" in line and "--allow-pickle" in line
    res = run_cli("generate", str(folder), "-p", "ab", "--max-new-tokens", "3", "--allow-pickle", "--json")
    assert res.returncode == 0, res.stderr
    out = json.loads(res.stdout)
    assert out["outputs"][0]["completion_tokens"] == 3 and out["outputs"][0]["prompt"] == "ab"
    assert out["runtime"]["threads"] >= 1 and out["runtime"]["dtype"] in ("float32", "bfloat16")


def test_perplexity_cli_matches_library(tmp_path, nano):
    from lmforge.common.scoring import perplexity

    text = tmp_path / "t.txt"
    text.write_text("Anna visited the garden on Monday.\n\nThe weather in Oslo was cold.\n")
    res = runner.invoke(app, ["perplexity", "zoo:agent-nano", str(text), "--json"])
    assert res.exit_code == 0, res.output
    got = json.loads(res.stdout)
    model, tok = nano
    ref = perplexity(model, tok, ["Anna visited the garden on Monday.", "The weather in Oslo was cold."])
    assert abs(got["ppl"] - ref.ppl) < 1e-6 * ref.ppl and got["n_tokens"] == ref.n_tokens


def test_zoo_build_unknown_recipe_key_writes_nothing(tmp_path):
    out = tmp_path / "o"
    line = _one_error_line(run_cli("zoo", "build", "agent-nano", "train.nope=3", "--out", str(out)))
    assert "unknown recipe key 'train.nope'" in line
    line = _one_error_line(run_cli("zoo", "build", "agent-nano", "train.steps=zero", "--out", str(out)))
    assert "train.steps" in line
    recipe = tmp_path / "r.yaml"
    recipe.write_text("shape:\n  widht: 3\n")
    line = _one_error_line(run_cli("zoo", "build", "agent-nano", "--recipe", str(recipe), "--out", str(out)))
    assert "unknown recipe key 'shape.widht'" in line
    assert not out.exists()


def test_zoo_build_with_overrides_writes_a_loadable_model(tmp_path):
    from lmforge.models import load

    out = tmp_path / "tiny"
    res = runner.invoke(app, ["zoo", "build", "agent-nano", "train.steps=3", "seed=5", "--no-eval",
                              "--out", str(out), "--json"])
    assert res.exit_code == 0, res.output
    meta = json.loads(res.stdout)
    assert meta["spec"]["train"]["steps"] == 3 and meta["spec"]["seed"] == 5
    assert json.loads((out / "zoo.json").read_text())["digest"] == meta["digest"]
    model, tok = load(str(out))
    assert model.config.num_hidden_layers == meta["spec"]["shape"]["layers"]


def test_model_folder_without_config_via_cli(tmp_path):
    line = _one_error_line(run_cli("generate", str(tmp_path), "-p", "hi"))
    assert "config.json" in line
