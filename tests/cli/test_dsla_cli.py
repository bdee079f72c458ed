"""``lmforge train dsla`` and ``lmforge serve-sim`` end to end on the zoo's agent-nano: the run writes
only DSLA parameters, resumes instead of retraining, refuses more layers than the 75% cap, and the
serve simulation converts and restores the trained layer under a load file."""

from __future__ import annotations

import json

from safetensors.torch import load_file

from tests.cli.helpers import call, one_error_line

NANO = "zoo:agent-nano"


def _texts(tmp_path):
    f = tmp_path / "texts.txt"
    f.write_text("\n\n".join(f"The tool {i} returns the value {i * 7} when asked twice about it." for i in range(60)))
    return f


def test_train_resume_cap_and_serve_sim(tmp_path, monkeypatch, capsys):
    data = _texts(tmp_path)
    out = tmp_path / "run"
    args = ["train", "dsla", "-m", NANO, "--out", str(out), "--layers", "1", "--local-steps", "3",
            "--joint-steps", "2", "--windows", "8", "--seq-len", "24", "--batch-size", "2", "--data", str(data),
            "--json"]
    code, stdout, err = call(monkeypatch, capsys, *args)
    assert code == 0, err
    rec = json.loads(stdout)
    state = load_file(str(out / "dsla.safetensors"))
    layer = rec["layers"][0]
    assert rec["layers"] == rec["order"][:1] and all(f".layers.{layer}.self_attn." in k for k in state)
    assert {k.rsplit(".", 2)[-2] for k in state} >= {"gk_proj", "gk_proj2", "o_proj"}
    before = (out / "stages.json").read_text()
    # rerunning resumes: the stage is not trained again, the saved parameters stay the same
    code, _, err = call(monkeypatch, capsys, *args)
    assert code == 0, err
    assert (out / "stages.json").read_text() == before
    again = load_file(str(out / "dsla.safetensors"))
    assert all((again[k] == v).all() for k, v in state.items())
    # the 75% cap (agent-nano's layer count) is one line, and nothing is written
    n_layers = rec["n_layers"]
    over = tmp_path / "over"
    code, _, err = call(monkeypatch, capsys, "train", "dsla", "-m", NANO, "--out", str(over), "--layers",
                        str(int(0.75 * n_layers) + 1), "--data", str(data))
    assert code == 2 and "cap" in one_error_line(err) and not over.exists()

    # serve-sim: long prompts queue up -> the trained layer is converted, then restored when it drains
    load = tmp_path / "load.jsonl"
    load.write_text("".join(json.dumps({"arrival_s": 0.001 * i, "prompt_tokens": 1100, "max_new_tokens": 1}) + "\n"
                            for i in range(4)))
    trace = tmp_path / "trace.jsonl"
    code, stdout, err = call(monkeypatch, capsys, "serve-sim", "-m", str(out), "--load", str(load), "--time-scale",
                             "0.0001", "--dtype", "float32", "--out", str(trace), "--json")
    assert code == 0, err
    events = [json.loads(line) for line in trace.read_text().splitlines()]
    swaps = [(e["kind"], e["ref"]) for e in events if e["kind"] in ("convert", "revert")]
    assert swaps[0] == ("convert", layer) and swaps[-1] == ("revert", layer)
    assert json.loads(stdout)["n_requests"] == 4

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"arrival_s": 0, "prompt_tokens": -5, "max_new_tokens": 1}\n')
    code, _, err = call(monkeypatch, capsys, "serve-sim", "-m", str(out), "--load", str(bad))
    assert code == 2 and "prompt_tokens" in one_error_line(err)
