"""Fit the per-sample length generator of :mod:`lmforge.data.vlm_lengths` (provenance script).

Reads the four per-sample length files that ModelTC/OmniBal ships (commit fc12bce,
``data/vision/{ai2d_train_12k,chartqa_train_18k,docvqa_train_10k,synthdog_en}_wh_token_lengths.json``,
70,706 samples of InternVL-1.2M) and writes, per (subset, vit_num), the sample count and 101
quantiles of ``token_num``. Only these statistics are committed, not the data.

Usage: ``python benchmarks/fit/fit_internvl_lengths.py DIR_WITH_THE_FOUR_JSON_FILES``
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

SUBSETS = ["ai2d_train_12k", "chartqa_train_18k", "docvqa_train_10k", "synthdog_en"]
OUT = Path(__file__).resolve().parents[2] / "src" / "lmforge" / "data" / "internvl_lengths.json"


def main(src: str) -> None:
    fitted: dict[str, dict[str, dict]] = {}
    for name in SUBSETS:
        records = json.loads((Path(src) / f"{name}_wh_token_lengths.json").read_text())
        vit = np.array([r["vit_num"] for r in records])
        tok = np.array([r["token_num"] for r in records])
        fitted[name] = {}
        for v in np.unique(vit):
            t = tok[vit == v]
            q = np.quantile(t, np.linspace(0, 1, 101), method="linear")
            fitted[name][str(int(v))] = {"count": int(t.size), "quantiles": [round(float(x), 1) for x in q]}
    doc = {"source": "ModelTC/OmniBal@fc12bce data/vision/*_wh_token_lengths.json (4 InternVL-1.2M subsets)",
           "fit": "per (subset, vit_num): count and 101 quantiles of token_num (linear interpolation)",
           "subsets": fitted}
    OUT.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {OUT} ({OUT.stat().st_size} bytes)")


if __name__ == "__main__":
    main(sys.argv[1])
