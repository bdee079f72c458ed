"""``lmforge bench s2h-data``, ``train s2h`` and ``bench s2h``: the official layout on disk, a trained
checkpoint that loads as a transformers LLaVA, and bad inputs as one line with exit 2 and nothing
written."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from tests.cli.helpers import call, one_error_line


@pytest.mark.parametrize("task", ["table-readout", "grid-navigation", "visual-analogy"])
def test_s2h_data_writes_the_official_layout(tmp_path, monkeypatch, capsys, task):
    from lmforge.methods.simple_to_hard.tasks import DATA_TYPES, get_task

    code, out, err = call(monkeypatch, capsys, "bench", "s2h-data", "--task", task, "--level", "HARD", "--n", "2",
                          "--seed", "3", "--out", str(tmp_path))
    assert code == 0, err
    mod = get_task(task)
    folder = tmp_path / mod.NAME / "HARD"
    raws = json.loads((folder / "raw.json").read_text())
    assert raws == mod.generate("HARD", 2, 3)  # the files hold what the generator makes for the seed
    for dt in DATA_TYPES:
        recs = json.loads((folder / f"{dt}+cot.json").read_text())
        assert [r["id"] for r in recs] == [r["id"] for r in raws]
        for rec, raw in zip(recs, raws):
            assert [t["from"] for t in rec["conversations"]] == ["human", "gpt"]
            assert rec["conversations"] == mod.conversation(raw, dt)["conversations"]
            if dt == "text2answer":
                assert "image" not in rec and "<image>" not in rec["conversations"][0]["value"]
            else:
                assert rec["conversations"][0]["value"].startswith("<image>")
                png = np.asarray(Image.open(folder / rec["image"]).convert("RGB"))
                assert np.array_equal(png, np.asarray(mod.render(raw).convert("RGB")))
    for raw, rec in zip(raws, json.loads((folder / "text2answer+cot.json").read_text())):
        assert mod.score(raw, rec["conversations"][1]["value"])  # the gold response passes the task's checker
    # an existing folder is kept without --overwrite
    code, _, err = call(monkeypatch, capsys, "bench", "s2h-data", "--task", task, "--level", "HARD", "--n", "1",
                        "--out", str(tmp_path))
    assert code == 2 and "exists" in one_error_line(err)
    assert json.loads((folder / "raw.json").read_text()) == raws


def _noise_png(path, size=(48, 48)):
    rng = np.random.default_rng(0)
    Image.fromarray(rng.integers(0, 256, (*size[::-1], 3), dtype=np.uint8)).save(path)
    return path


@pytest.mark.parametrize("case", ["task", "level", "size-range", "size-name", "size-syntax", "strategy", "budget",
                                  "image-size", "image-content", "image-missing", "image-cells"])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, monkeypatch, capsys, case):
    out = tmp_path / "out"
    img = tmp_path / "x.png"
    args = {
        "task": ["bench", "s2h-data", "--task", "maze", "--out", str(out)],
        "level": ["bench", "s2h-data", "--task", "table-readout", "--level", "MEDIUM", "--out", str(out)],
        "size-range": ["bench", "s2h-data", "--task", "table-readout", "--size", "rows=3..4", "--out", str(out)],
        "size-name": ["bench", "s2h-data", "--task", "grid-navigation", "--size", "colour=1", "--out", str(out)],
        "size-syntax": ["bench", "s2h-data", "--task", "table-readout", "--size", "rows:7", "--out", str(out)],
        "strategy": ["train", "s2h", "--strategy", "mix++", "--out", str(out)],
        "budget": ["train", "s2h", "--strategy", "mix+", "--budget", "4", "--out", str(out)],
        "image-size": ["bench", "s2h", "--image", str(_noise_png(tmp_path / "wide.png", (64, 48))), "--start", "a1", "--end", "b2",
                       "--out", str(out)],
        "image-content": ["bench", "s2h", "--image", str(_noise_png(img)), "--start", "a1", "--end", "b2",
                          "--out", str(out)],
        "image-missing": ["bench", "s2h", "--image", str(tmp_path / "none.png"), "--start", "a1", "--end", "b2"],
        "image-cells": ["bench", "s2h", "--image", str(_noise_png(img)), "--start", "z9", "--end", "b2"],
    }[case]
    code, stdout, err = call(monkeypatch, capsys, *args)
    assert code == 2, err
    line = one_error_line(err)
    assert stdout == ""
    assert not out.exists()
    expect = {"task": "unknown S2H task", "level": "unknown level", "size-range": "outside", "size-name": "unknown size",
              "size-syntax": "expected NAME", "strategy": "unknown strategy", "budget": "too small",
              "image-size": "48x48", "image-content": "not a miniature Table Readout image",
              "image-missing": "cannot read", "image-cells": "--start and --end"}[case]
    assert expect in line


def test_train_s2h_saves_a_llava_checkpoint_and_bench_answers_one_image(tmp_path, monkeypatch, capsys):
    from transformers import LlavaForConditionalGeneration

    from lmforge.methods.simple_to_hard import mini, supervision, vlm
    from lmforge.methods.simple_to_hard.base import load_base

    out = tmp_path / "mixplus"
    code, stdout, err = call(monkeypatch, capsys, "train", "s2h", "--strategy", "mix+", "--budget", "48", "--out",
                             str(out))
    assert code == 0, err
    meta = json.loads((out / "train.json").read_text())
    # the step count is the plan's: per phase, modality-pure batches of 32 over the composed examples
    (phase,) = supervision.plan("mix+", 48)
    n_img = sum(k for (lv, dt), k in phase.counts.items() if dt != "text2answer")
    n_txt = sum(k for (lv, dt), k in phase.counts.items() if dt == "text2answer")
    assert meta["steps"] == -(-n_img // 32) + -(-n_txt // 32)
    assert meta["phases"] == [{"option": 7, "epochs": 1, "repeat_simple": 1,
                               "examples": {f"{lv} {dt}": k for (lv, dt), k in phase.counts.items()}}]
    assert len(meta["losses"]) == meta["steps"] and len(meta["alignment"]) >= 1
    assert all(-1.0 <= a["cos"] <= 1.0 for a in meta["alignment"])
    LlavaForConditionalGeneration.from_pretrained(out)  # loads in the ecosystem's class
    base, _ = load_base()
    trained, tok = vlm.load(out)
    # training changed the weights (the checkpoint is not the base)
    assert any(not np.allclose(a.detach().numpy(), b.detach().numpy()) for a, b in
               zip(base.parameters(), trained.parameters()))

    p = mini.generate("HARD", 1, 7)[0]
    png = tmp_path / "puzzle.png"
    mini.render(p).save(png)
    s, e = mini.cell_name(*p.path[0]), mini.cell_name(*p.path[-1])
    code, stdout, err = call(monkeypatch, capsys, "bench", "s2h", "--model", str(out), "--image", str(png),
                             "--start", s, "--end", e)
    assert code == 0, err
    want = vlm.generate(trained, tok, [mini.prompt(p, image=True)], [mini.render_array(p)], max_new_tokens=200)[0]
    assert stdout.strip() == want.strip()
