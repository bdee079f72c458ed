"""Preference pairs with every annotator's label: loaders and a simulator of annotator groups.

Zhang et al. (ICML 2025, arXiv 2410.14632) release the unaggregated labels of two datasets; both are
read here from local files (JSONL, optionally ``.gz``; lmforge never downloads):

**MultiPref** (``allenai/multipref``, ``MultiPref-Train.jsonl`` or its parquet export saved as
JSONL), one comparison per line:

* ``comparison_id`` (id), ``text`` (the prompt), ``completion_a``, ``completion_b``;
* ``normal_worker_annotations`` and ``expert_worker_annotations``: lists of dicts whose
  ``overall_pref`` is one of ``A-is-clearly-better`` (label 2), ``A-is-slightly-better`` (1),
  ``Tie`` (0), ``B-is-slightly-better`` (−1), ``B-is-clearly-better`` (−2). Two normal and two expert
  annotators per pair: the paper's four labels per pair.

**HelpSteer2 preferences / disagreements** (``nvidia/HelpSteer2``, ``preference/preference.jsonl.gz``
and ``disagreements/disagreements.jsonl.gz``), one pair per line:

* ``prompt``, ``response_1`` (A), ``response_2`` (B), optional ``split``;
* ``all_preferences_unprocessed``: each annotator's ``{"strength": s, "justification": ...}``
  (a list, or the same list as a Python-literal string), s in −3..3, negative = response 1 better;
  ``-100`` marks an annotator who judged neither usable and is skipped (counted in
  ``meta["skipped_labels"]``). Labels: |s| ≥ 2 → strong (±2), |s| = 1 → slight (±1), 0 → tie.
  NOTE: how the paper maps HelpSteer2's 7-point strengths onto its 5 labels is unverified; the
  threshold is ``strong_at`` (2 by default: "better" and "much better" are strong).

**lmforge JSONL** (what :func:`save_pairs` writes): ``id``, ``prompt``, ``response_a``,
``response_b``, ``labels`` (ints −2..2, positive = A preferred), optional ``ratings_a`` /
``ratings_b`` (per-annotator Likert ratings 1..K of each response, for the classification head) and
optional ``features_a`` / ``features_b`` (numeric vectors, for MLP heads).

Every malformed record is a one-line :class:`UserError` naming the file and line.
"""

from __future__ import annotations

import ast
import gzip
import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from lmforge.common.errors import UserError

FORMATS = ("auto", "multipref", "helpsteer2", "lmforge")

MULTIPREF_LABELS = {
    "A-is-clearly-better": 2,
    "A-is-slightly-better": 1,
    "Tie": 0,
    "B-is-slightly-better": -1,
    "B-is-clearly-better": -2,
}
HS2_SKIP = -100


@dataclass
class PreferencePair:
    """One prompt with two responses and every annotator's label.

    Attributes:
        id: the record's id.
        prompt: the prompt.
        response_a: response A.
        response_b: response B.
        labels: one label per annotator, in −2..2 (positive: A preferred).
        ratings_a: per-annotator Likert ratings of A (1..K), if the data has them.
        ratings_b: the same for B.
        features_a: a feature vector of A (synthetic data, MLP heads).
        features_b: the same for B.
        meta: anything else (source fields, skipped labels).
    """

    id: str
    prompt: str
    response_a: str
    response_b: str
    labels: list[int]
    ratings_a: list[int] | None = None
    ratings_b: list[int] | None = None
    features_a: list[float] | None = None
    features_b: list[float] | None = None
    meta: dict[str, Any] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"id": self.id, "prompt": self.prompt, "response_a": self.response_a,
                               "response_b": self.response_b, "labels": self.labels}
        for k in ("ratings_a", "ratings_b", "features_a", "features_b"):
            if getattr(self, k) is not None:
                out[k] = getattr(self, k)
        if self.meta:
            out["meta"] = self.meta
        return out


def _lines(path: Path) -> Iterator[tuple[int, str]]:
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt", encoding="utf-8") as fh:  # type: ignore[operator]
            for i, line in enumerate(fh, 1):
                if line.strip():
                    yield i, line
    except (OSError, UnicodeDecodeError, EOFError) as exc:
        raise UserError(f"cannot read '{path}': {exc}") from None


def json_records(path: Path) -> Iterator[tuple[int, str, dict[str, Any]]]:
    """(line number, "FILE:LINE", record) for every non-blank line of a JSONL(.gz) file; a line that
    is not a JSON object is a one-line UserError naming it."""
    for lineno, line in _lines(path):
        where = f"{path}:{lineno}"
        try:
            rec = json.loads(line)
        except json.JSONDecodeError as exc:
            raise UserError(f"{where}: not valid JSON ({exc.msg})") from None
        if not isinstance(rec, dict):
            raise UserError(f"{where}: a record must be a JSON object")
        yield lineno, where, rec


def _need_str(rec: dict[str, Any], key: str, where: str) -> str:
    v = rec.get(key)
    if not isinstance(v, str):
        raise UserError(f"{where}: field '{key}' must be a string, got {type(v).__name__}")
    return v


def _detect(rec: dict[str, Any]) -> str:
    if "completion_a" in rec or "normal_worker_annotations" in rec:
        return "multipref"
    if "response_1" in rec or "all_preferences_unprocessed" in rec:
        return "helpsteer2"
    if "response_a" in rec and "labels" in rec:
        return "lmforge"
    raise UserError("cannot tell the format (no completion_a / response_1 / response_a field); pass the format")


def _multipref(rec: dict[str, Any], where: str, annotators: str) -> PreferencePair:
    groups = {"all": ("normal_worker_annotations", "expert_worker_annotations"),
              "normal": ("normal_worker_annotations",), "expert": ("expert_worker_annotations",)}[annotators]
    labels: list[int] = []
    for key in groups:
        anns = rec.get(key) or []
        if not isinstance(anns, list):
            raise UserError(f"{where}: field '{key}' must be a list of annotations")
        for ann in anns:
            pref = ann.get("overall_pref") if isinstance(ann, dict) else None
            if pref not in MULTIPREF_LABELS:
                raise UserError(f"{where}: unknown overall_pref {pref!r} in '{key}' (expected one of "
                                f"{', '.join(MULTIPREF_LABELS)})")
            labels.append(MULTIPREF_LABELS[pref])
    if not labels:
        raise UserError(f"{where}: no annotator labels ({' / '.join(groups)} empty)")
    return PreferencePair(id=str(rec.get("comparison_id", "")), prompt=_need_str(rec, "text", where),
                          response_a=_need_str(rec, "completion_a", where),
                          response_b=_need_str(rec, "completion_b", where), labels=labels,
                          meta={k: rec[k] for k in ("source", "category", "prompt_id") if k in rec})


def _hs2_strengths(raw: Any, where: str) -> list[int]:
    if isinstance(raw, str):
        try:
            raw = ast.literal_eval(raw)  # literals only: never evaluates code
        except (ValueError, SyntaxError):
            raise UserError(f"{where}: all_preferences_unprocessed is not a list literal") from None
    if not isinstance(raw, list):
        raise UserError(f"{where}: all_preferences_unprocessed must be a list")
    out = []
    for item in raw:
        s = item.get("strength") if isinstance(item, dict) else item
        if isinstance(s, str) and s.lstrip("-").isdigit():
            s = int(s)
        if isinstance(s, bool) or not isinstance(s, int) or not (-3 <= s <= 3 or s == HS2_SKIP):
            raise UserError(f"{where}: preference strength must be an integer in -3..3 (or -100), got {s!r}")
        out.append(s)
    return out


def _helpsteer2(rec: dict[str, Any], where: str, strong_at: int) -> PreferencePair:
    if "all_preferences_unprocessed" not in rec:
        raise UserError(f"{where}: missing 'all_preferences_unprocessed' (the per-annotator strengths)")
    strengths = _hs2_strengths(rec["all_preferences_unprocessed"], where)
    labels, skipped = [], 0
    for s in strengths:
        if s == HS2_SKIP:
            skipped += 1
            continue
        mag = 0 if s == 0 else (2 if abs(s) >= strong_at else 1)
        labels.append(-mag if s > 0 else mag)  # s < 0: response 1 (A) better
    if not labels:
        raise UserError(f"{where}: no usable annotator strengths (all were -100 or none given)")
    meta: dict[str, Any] = {"skipped_labels": skipped}
    if "split" in rec:
        meta["split"] = rec["split"]
    return PreferencePair(id=str(rec.get("id", "")), prompt=_need_str(rec, "prompt", where),
                          response_a=_need_str(rec, "response_1", where),
                          response_b=_need_str(rec, "response_2", where), labels=labels, meta=meta)


def _int_list(v: Any, key: str, where: str, lo: int, hi: int | None) -> list[int] | None:
    if v is None:
        return None
    if not isinstance(v, list) or not v:
        raise UserError(f"{where}: '{key}' must be a non-empty list of integers")
    for x in v:
        if isinstance(x, bool) or not isinstance(x, int) or x < lo or (hi is not None and x > hi):
            rng = f"{lo}..{hi}" if hi is not None else f">= {lo}"
            raise UserError(f"{where}: '{key}' must hold integers in {rng}, got {x!r}")
    return list(v)


def _float_list(v: Any, key: str, where: str) -> list[float] | None:
    if v is None:
        return None
    if not isinstance(v, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
        raise UserError(f"{where}: '{key}' must be a list of numbers")
    return [float(x) for x in v]


def _lmforge(rec: dict[str, Any], where: str) -> PreferencePair:
    labels = _int_list(rec.get("labels"), "labels", where, -2, 2)
    if labels is None:
        raise UserError(f"{where}: missing 'labels'")
    return PreferencePair(
        id=str(rec.get("id", "")), prompt=_need_str(rec, "prompt", where),
        response_a=_need_str(rec, "response_a", where), response_b=_need_str(rec, "response_b", where),
        labels=labels, ratings_a=_int_list(rec.get("ratings_a"), "ratings_a", where, 1, None),
        ratings_b=_int_list(rec.get("ratings_b"), "ratings_b", where, 1, None),
        features_a=_float_list(rec.get("features_a"), "features_a", where),
        features_b=_float_list(rec.get("features_b"), "features_b", where),
        meta=rec.get("meta") if isinstance(rec.get("meta"), dict) else {},
    )


def load_pairs(path: str | os.PathLike[str], fmt: str = "auto", *, annotators: str = "all", strong_at: int = 2,
               limit: int | None = None) -> list[PreferencePair]:
    """Read per-annotator preference pairs from a local JSONL(.gz) file.

    Args:
        path: the file.
        fmt: ``"multipref"``, ``"helpsteer2"``, ``"lmforge"`` or ``"auto"`` (from the first record's fields).
        annotators: MultiPref: ``"all"`` (normal + expert), ``"normal"`` or ``"expert"``.
        strong_at: HelpSteer2: the |strength| from which a label is strong (±2).
        limit: read at most this many pairs.

    Raises:
        UserError: a missing file, an unknown format, or a malformed record (naming its line).
    """
    p = Path(path)
    if limit is not None and limit < 1:
        raise UserError(f"--limit must be at least 1, got {limit}")
    if fmt not in FORMATS:
        raise UserError(f"unknown data format '{fmt}'; use one of {', '.join(FORMATS)}")
    if annotators not in ("all", "normal", "expert"):
        raise UserError(f"annotators must be all, normal or expert, got '{annotators}'")
    if not p.is_file():
        raise UserError(f"data file '{p}' does not exist")
    pairs: list[PreferencePair] = []
    kind = None if fmt == "auto" else fmt
    width: int | None = None
    for lineno, where, rec in json_records(p):
        if kind is None:
            try:
                kind = _detect(rec)
            except UserError as exc:
                raise UserError(f"{where}: {exc}") from None
        if kind == "multipref":
            pair = _multipref(rec, where, annotators)
        elif kind == "helpsteer2":
            pair = _helpsteer2(rec, where, strong_at)
        else:
            pair = _lmforge(rec, where)
        if not pair.id:
            pair.id = f"line-{lineno}"
        # An MLP head needs one feature width across the file: a ragged vector is this line's fault.
        for vec in (pair.features_a, pair.features_b):
            if vec is not None:
                if width is None:
                    width = len(vec)
                elif len(vec) != width:
                    raise UserError(f"{where}: a feature vector of length {len(vec)}; earlier lines have {width}")
        pairs.append(pair)
        if limit is not None and len(pairs) >= limit:
            break
    if not pairs:
        raise UserError(f"'{p}' holds no records")
    return pairs


def save_pairs(pairs: list[PreferencePair], path: str | os.PathLike[str]) -> Path:
    """Write ``pairs`` as lmforge JSONL (atomically)."""
    from lmforge.common.io import atomic_write_text

    return atomic_write_text(path, "".join(json.dumps(p.to_json()) + "\n" for p in pairs))


# --------------------------------------------------------------------------------------- simulator


@dataclass
class SimulatedGroups:
    """Annotator groups that agree on quality and disagree on style.

    Each response has a quality q ~ N(0, 1) and, with probability ``p_style``, a style vector of
    length ``style_scale`` in a random direction of R^k (else none). Group g's utility is
    u = q + ``style_weight``·⟨w_g, s⟩ + N(0, noise²), with w_g = ±e_j (k = n_groups / 2), so that
    the groups' style weights cancel on average: the majority follows quality while a pair with
    distinct styles splits the groups. An annotator's pair label is u_A − u_B cut at ±0.5 and ±1.5
    (the same bins the mean-variance model uses); a rating is u thresholded into 1..5.
    """

    n_groups: int = 4
    style_weight: float = 1.5
    style_scale: float = 1.5
    p_style: float = 0.5
    noise: float = 0.3
    n_distractors: int = 2

    @property
    def n_features(self) -> int:
        return 1 + self.n_groups // 2 + self.n_distractors


def simulate_pairs(n_pairs: int, seed: int = 0, sim: SimulatedGroups | None = None) -> list[PreferencePair]:
    """``n_pairs`` synthetic pairs, one annotator from each group per pair, with features and ratings."""
    sim = sim or SimulatedGroups()
    if sim.n_groups < 2 or sim.n_groups % 2:
        raise ValueError("n_groups must be an even number >= 2")
    rng = np.random.default_rng(seed)
    k = sim.n_groups // 2
    weights = np.concatenate([np.eye(k), -np.eye(k)])  # (n_groups, k): each axis loved by one group, hated by one

    def response() -> np.ndarray:
        q = rng.normal()
        s = np.zeros(k)
        if rng.random() < sim.p_style:
            d = rng.normal(size=k)
            s = sim.style_scale * d / np.linalg.norm(d)
        return np.concatenate([[q], s, rng.normal(size=sim.n_distractors)])

    def bins(d: float) -> int:
        return int(np.sign(d)) * (0 if abs(d) < 0.5 else 1 if abs(d) < 1.5 else 2)

    pairs = []
    for i in range(n_pairs):
        xa, xb = response(), response()
        ua = xa[0] + sim.style_weight * weights @ xa[1 : 1 + k] + rng.normal(scale=sim.noise, size=sim.n_groups)
        ub = xb[0] + sim.style_weight * weights @ xb[1 : 1 + k] + rng.normal(scale=sim.noise, size=sim.n_groups)
        labels = [bins(d) for d in ua - ub]
        rate = lambda u: [int(np.clip(np.round(v + 3), 1, 5)) for v in u]  # noqa: E731
        pairs.append(PreferencePair(
            id=f"sim-{seed}-{i}", prompt=f"prompt {i}", response_a=f"response {i}a", response_b=f"response {i}b",
            labels=labels, ratings_a=rate(ua), ratings_b=rate(ub),
            features_a=[float(v) for v in xa], features_b=[float(v) for v in xb],
        ))
    return pairs
