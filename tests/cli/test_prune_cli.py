"""``lmforge prune layers``: bad input is one line and exit status 2 with nothing written; a real run
writes a loadable model with fewer layers and a layer_prune.json with the documented fields."""

from __future__ import annotations

import importlib
import json

import pytest

from tests.cli.helpers import call, one_error_line

MODEL = "zoo:agent-small"  # 4 layers, shipped with lmforge


@pytest.mark.parametrize(
    "args,needle",
    [
        (["-c", "block-influence", "--remove", "1", "--threshold", "0.9"], "exactly one of"),
        (["-c", "angular"], "exactly one of"),
        (["-c", "block-influence", "--remove", "4"], "cannot remove every layer"),
        (["-c", "angular", "--remove", "7"], "cannot remove every layer"),
        (["-c", "block-influence", "--remove", "0"], "at least 1"),
        (["-c", "zigzag", "--threshold", "1.2"], "(0, 1]"),
        (["-c", "zigzag", "--threshold", "0.9", "--k", "10", "--n-texts", "5"], "--k 10 is too large for 5 prompts"),
        (["-c", "zigzag", "--threshold", "0.9", "--k", "0"], "--k must be a positive integer"),
        (["-c", "magnitude", "--remove", "1"], "unknown criterion"),
        (["-c", "zigzag", "--remove", "1", "--zigzag-cloud", "middle"], "unknown zigzag cloud"),
        (["-c", "block-influence", "--remove", "1", "--n-texts", "0"], "--n-texts"),
    ],
)
def test_bad_input_is_one_line_exit_2_nothing_written(monkeypatch, capsys, tmp_path, args, needle):
    out = tmp_path / "out"
    code, _, stderr = call(monkeypatch, capsys, "prune", "layers", *args, "--model", MODEL, "--out", str(out),
                           "--no-ppl")
    assert code == 2
    assert needle in one_error_line(stderr)
    assert not out.exists() and list(tmp_path.iterdir()) == []


def test_existing_output_and_missing_calib_file(monkeypatch, capsys, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    code, _, stderr = call(monkeypatch, capsys, "prune", "layers", "-c", "angular", "--remove", "1", "-m", MODEL,
                           "--out", str(out))
    assert code == 2 and "already exists" in one_error_line(stderr)
    assert [p.name for p in out.iterdir()] == ["keep.txt"]
    code, _, stderr = call(monkeypatch, capsys, "prune", "layers", "-c", "angular", "--remove", "1", "-m", MODEL,
                           "--out", str(tmp_path / "o2"), "--calib-file", str(tmp_path / "nope.jsonl"))
    assert code == 2 and "not found" in one_error_line(stderr)
    assert not (tmp_path / "o2").exists()


def test_model_without_hidden_states(monkeypatch, capsys, tmp_path):
    """A model whose forward returns logits only: one line, nothing written."""
    from torch import nn
    from transformers.modeling_outputs import CausalLMOutputWithPast

    load_mod = importlib.import_module("lmforge.models.load")  # the package re-exports the function as `load`
    real_load = load_mod.load

    class NoHidden(nn.Module):
        def __init__(self, inner):
            super().__init__()
            self.model = inner.model  # looks like a Llama stack, so only the hidden states are missing
            self.inner = inner
            self.config = inner.config

        def forward(self, input_ids=None, attention_mask=None, **kw):
            return CausalLMOutputWithPast(logits=self.inner(input_ids=input_ids, attention_mask=attention_mask).logits)

    def fake_load(spec, **kw):
        model, tok = real_load(spec, **kw)
        return NoHidden(model), tok

    monkeypatch.setattr(load_mod, "load", fake_load)
    out = tmp_path / "out"
    code, _, stderr = call(monkeypatch, capsys, "prune", "layers", "-c", "block-influence", "--remove", "1",
                           "-m", MODEL, "--out", str(out), "--n-texts", "4", "--no-ppl")
    assert code == 2 and "exposes no hidden states" in one_error_line(stderr)
    assert not out.exists()


def test_block_influence_run_writes_a_smaller_loadable_model(monkeypatch, capsys, tmp_path):
    from lmforge.models import load

    out = tmp_path / "pruned"
    code, stdout, stderr = call(monkeypatch, capsys, "prune", "layers", "-c", "block-influence", "--remove", "1",
                                "-m", MODEL, "--out", str(out), "--n-texts", "24", "--json")
    assert code == 0, stderr
    record = json.loads(stdout)
    saved = json.loads((out / "layer_prune.json").read_text())
    assert saved == record
    assert record["criterion"] == "block-influence" and record["layers_before"] == 4 and record["layers_after"] == 3
    assert len(record["removed"]) == 1 and len(record["scores"]) == 4
    assert record["removed"] == [max(range(4), key=lambda i: record["scores"][i])]
    assert record["calibration"]["texts"] == 24 and record["calibration"]["tokens"] == "all"
    assert record["ppl_before"] > 1 and record["ppl_after"] > 1 and "ppl_metric" in record
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 3
    model, _ = load(str(out))
    assert len(model.model.layers) == 3


def test_angular_threshold_and_calib_file_text_output(monkeypatch, capsys, tmp_path):
    from lmforge.data.calibration import builtin_texts

    calib = tmp_path / "calib.jsonl"
    calib.write_text("\n".join(json.dumps({"text": t}) for t in builtin_texts(3, 12)) + "\n")
    out = tmp_path / "pruned"
    code, stdout, stderr = call(monkeypatch, capsys, "prune", "layers", "-c", "angular", "--threshold", "0.99",
                                "-m", MODEL, "--out", str(out), "--calib-file", str(calib), "--no-ppl")
    assert code == 0, stderr
    assert "removed layers" in stdout and "saved to" in stdout
    record = json.loads((out / "layer_prune.json").read_text())
    assert record["calibration"]["source"] == str(calib) and record["calibration"]["texts"] == 12
    top = max(record["scores"])
    assert record["removed"] == [i for i, s in enumerate(record["scores"]) if s >= 0.99 * top]
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == 4 - len(record["removed"])


@pytest.mark.parametrize("cloud", ["output", "mid"])
def test_zigzag_run(monkeypatch, capsys, tmp_path, cloud):
    pytest.importorskip("lmforge.methods.zigzag.descriptors")
    out = tmp_path / "pruned"
    code, stdout, stderr = call(monkeypatch, capsys, "prune", "layers", "-c", "zigzag", "--remove", "1",
                                "--zigzag-cloud", cloud, "-m", MODEL, "--out", str(out), "--n-texts", "40",
                                "--no-ppl", "--json")
    assert code == 0, stderr
    record = json.loads(stdout)
    assert record["zigzag"] == {"k": 4, "p": 1, "alpha": 0.0, "cloud": cloud}
    assert len(record["raw_metric"]["values"]) == 5 and len(record["scores"]) == 4
    assert record["removed"] == [max(range(4), key=lambda i: record["scores"][i])]
    assert json.loads((out / "config.json").read_text())["num_hidden_layers"] == record["layers_after"]


@pytest.mark.parametrize("cmd", [["prune"], ["prune", "layers"]])
def test_help(cmd):
    from typer.testing import CliRunner

    from lmforge.cli import app

    res = CliRunner().invoke(app, [*cmd, "--help"])
    assert res.exit_code == 0, res.output
    assert "Usage" in res.output
    if cmd == ["prune", "layers"]:
        for word in ("block-influence", "angular", "zigzag", "ShortGPT", "Gromov", "--threshold", "--remove", "--k"):
            assert word in res.output, word


def test_zigzag_descriptors_command(monkeypatch, capsys, tmp_path):
    """`lmforge zigzag` writes the descriptors and plots; its r equals the library's on the same clouds."""
    import json

    import numpy as np

    from lmforge.data.calibration import builtin_texts
    from lmforge.methods.zigzag import descriptors as zd
    from lmforge.methods.zigzag.layer_prune import official_point_clouds
    from lmforge.models import load

    out = tmp_path / "zz"
    code, _, err = call(monkeypatch, capsys, "zigzag", "-m", MODEL, "--out", str(out), "--n-texts", "3", "--k", "3")
    assert code == 2 and err.count("\n") == 1 and "larger than the number of prompts" in err
    assert not out.exists()
    code, stdout, err = call(monkeypatch, capsys, "zigzag", "-m", MODEL, "--out", str(out), "--n-texts", "40")
    assert code == 0, err
    rec = json.loads((out / "zigzag.json").read_text())
    assert rec["layers"] == 5 and len(rec["average_inter_layer_persistence"]) == 5
    assert sorted(p.name for p in out.glob("*.png")) == sorted(
        ["zigzag_pi_h1.png", "zigzag_births_h1.png", "zigzag_z_h1.png", "zigzag_zbar_h1.png"])
    model, tok = load(MODEL)
    clouds = official_point_clouds(model, tok, builtin_texts(0)[:40])
    np.testing.assert_allclose(rec["average_inter_layer_persistence"], zd.zigzag_layer_scores(clouds, k=4))
    code, _, err = call(monkeypatch, capsys, "zigzag", "-m", MODEL, "--out", str(out), "--n-texts", "40")
    assert code == 2 and "--overwrite" in err
