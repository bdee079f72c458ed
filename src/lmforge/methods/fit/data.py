"""FIT data: the six focus instructions, the prompt template and the focus label.

Focus Instruction Tuning (Lamb et al., ICML 2025, arXiv 2410.22944) is supervised fine-tuning on
``(task, I_focus, x) -> y_focus`` where ``I_focus`` names the features the answer should rest on:

=====================  ==========================================  ===========
type                   instruction (our wording)                   ``y_focus``
=====================  ==========================================  ===========
``none`` (∅)            (no focus line)                             ``y``
``focus_c``             "Focus on {C}."                             ``y``
``ignore_s``            "Ignore {S}."                               ``y``
``focus_c_ignore_s``    "Focus on {C}, ignore {S}."                 ``y``
``focus_s``             "Focus on {S}."                             ``y_S``
``focus_s_ignore_c``    "Focus on {S}, don't focus on {C}."         ``y_S``
=====================  ==========================================  ===========

``C`` is the core feature, ``S`` the spurious one and ``y_S`` the label ``S``'s value is tied to.

Checked: the official code (github.com/tomalamb/fit) had no snapshot to read; the six types, the
label rule and the instruction wording were checked against the project page's Figure 2 ("Example
of Focus Labels", tomalamb/focus-instruction-tuning, ``static/images/focus_labels.png``): focus(C),
ignore(S) and focus(C)∧ignore(S) answer ``y``; focus(S), ignore(C) and focus(S)∧ignore(C) answer
``y_S``; the instructions read "Focus on age.", "Ignore age.", "Focus on ..., ignore age." and
"Focus on age, don't answer the question based on the context alone." The six evaluated types are
those of its Figure 3 radar plots (∅, fcs(C), fcs(C)∧ign(S), ign(S), fcs(S), fcs(S)∧ign(C)).

# NOTE: the line layout of the prompt (task line, focus line, text, "Answer:") is the notes'
# suggested form; the paper's exact template text is unverified. ``I_focus`` is drawn uniformly
# per example (the notes: "sampled per example"); the paper's mixture weights are unverified.

TRL has no FIT (the notes' "TRL overlap": "FIT, which is only a data format over SFT"), so the
builder is written here and its output is TRL's prompt/completion format for ``SFTTrainer``.
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from lmforge.common.errors import UserError

FOCUS_TYPES: tuple[str, ...] = ("none", "focus_c", "ignore_s", "focus_c_ignore_s", "focus_s", "focus_s_ignore_c")
#: Types whose focus label is the spurious label ``y_S``; the others answer the task label ``y``.
SPURIOUS_TYPES: frozenset[str] = frozenset({"focus_s", "focus_s_ignore_c"})
#: Paper notation, for tables.
FOCUS_SYMBOLS: dict[str, str] = {
    "none": "∅", "focus_c": "focus(C)", "ignore_s": "ignore(S)", "focus_c_ignore_s": "focus(C)+ignore(S)",
    "focus_s": "focus(S)", "focus_s_ignore_c": "focus(S)+ignore(C)",
}


def focus_instruction(kind: str, core: str, spurious: str) -> str:
    """The focus sentence of type ``kind`` for core feature name ``core`` and spurious ``spurious``
    (empty for ``none``)."""
    templates = {
        "none": "",
        "focus_c": f"Focus on {core}.",
        "ignore_s": f"Ignore {spurious}.",
        "focus_c_ignore_s": f"Focus on {core}, ignore {spurious}.",
        "focus_s": f"Focus on {spurious}.",
        "focus_s_ignore_c": f"Focus on {spurious}, don't focus on {core}.",
    }
    if kind not in templates:
        raise UserError(f"unknown focus type '{kind}'; choose one of {', '.join(FOCUS_TYPES)}")
    return templates[kind]


def focus_label(kind: str, label: str, spurious_label: str) -> str:
    """``y_focus``: ``y_S`` when the instruction focuses on the spurious feature, else ``y``."""
    if kind not in FOCUS_TYPES:
        raise UserError(f"unknown focus type '{kind}'; choose one of {', '.join(FOCUS_TYPES)}")
    return spurious_label if kind in SPURIOUS_TYPES else label


def render_prompt(task: str, instruction: str, text: str) -> str:
    """``task``, the focus line (omitted when empty), the input and ``Answer:``. The completion is
    ``" " + label``, so prompt and completion meet on a word boundary and tokenize apart."""
    lines = [task]
    if instruction:
        lines.append(instruction)
    lines.append(f"Text: {text}")
    lines.append("Answer:")
    return "\n".join(lines)


def completion(label: str) -> str:
    """The answer text for ``label`` (a leading space, as the prompt ends with ``Answer:``)."""
    return f" {label}"


@dataclass(frozen=True)
class FieldSpec:
    """Where a labelled record keeps its fields, and how the features are named.

    Attributes:
        text: field with the input text ``x``.
        label: field with the task label ``y``.
        spurious_label: field with ``y_S`` (the label the spurious value is tied to); or None and
            ``spurious_field`` + ``spurious_map`` give it.
        spurious_field: field with the spurious feature's value (e.g. the keyword).
        spurious_map: spurious value -> tied label.
        core_name: how instructions name the core feature, e.g. ``"the sentiment"``.
        spurious_name: how instructions name the spurious feature, a constant, e.g. ``"the keyword"``.
        spurious_name_field: or a field that holds the name per record (e.g. the family).
        spurious_name_format: format applied to that field's value (``"the {}"``).
    """

    text: str = "text"
    label: str = "label"
    spurious_label: str | None = "spurious_label"
    spurious_field: str | None = None
    spurious_map: Mapping[str, str] | None = None
    core_name: str = "the core feature"
    spurious_name: str | None = "the spurious feature"
    spurious_name_field: str | None = None
    spurious_name_format: str = "{}"

    def y_s(self, rec: Mapping[str, Any], where: str) -> str:
        if self.spurious_label is not None and self.spurious_label in rec:
            return str(rec[self.spurious_label])
        if self.spurious_field is not None and self.spurious_map is not None:
            value = rec.get(self.spurious_field)
            if value is None:
                raise UserError(f"{where}: no field '{self.spurious_field}'")
            if str(value) not in self.spurious_map:
                raise UserError(f"{where}: spurious value {value!r} has no tied label in the spurious map")
            return str(self.spurious_map[str(value)])
        field = self.spurious_label or self.spurious_field
        raise UserError(f"{where}: no spurious label (field '{field}' missing and no spurious map)")

    def s_name(self, rec: Mapping[str, Any], where: str) -> str:
        if self.spurious_name_field is not None:
            if self.spurious_name_field not in rec:
                raise UserError(f"{where}: no field '{self.spurious_name_field}'")
            return self.spurious_name_format.format(rec[self.spurious_name_field])
        if self.spurious_name is None:
            raise UserError("name the spurious feature (a name, or a field that holds it)")
        return self.spurious_name


def fit_example(rec: Mapping[str, Any], kind: str, task: str, spec: FieldSpec, where: str = "record") -> dict[str, Any]:
    """One FIT example: ``prompt``/``completion`` (TRL's format) plus the bookkeeping fields."""
    for f in (spec.text, spec.label):
        if f not in rec:
            raise UserError(f"{where}: no field '{f}'")
    y = str(rec[spec.label])
    y_s = spec.y_s(rec, where)
    s_name = spec.s_name(rec, where)
    y_focus = focus_label(kind, y, y_s)
    return {
        "prompt": render_prompt(task, focus_instruction(kind, spec.core_name, s_name), str(rec[spec.text])),
        "completion": completion(y_focus),
        "focus_type": kind,
        "focus_label": y_focus,
        "label": y,
        "spurious_label": y_s,
        "spurious_name": s_name,
    }


def build_fit_data(records: Iterable[Mapping[str, Any]], task: str, spec: FieldSpec, seed: int = 0,
                   types: Sequence[str] = FOCUS_TYPES, mode: str = "sample") -> list[dict[str, Any]]:
    """FIT training/evaluation examples from labelled records.

    Args:
        records: labelled records (see :class:`FieldSpec` for the fields).
        task: the task line, e.g. ``"Is the sentiment of the text positive or negative?"``.
        spec: field names and feature names.
        seed: seeds the per-example draw of the focus type.
        types: the focus types to use.
        mode: ``"sample"`` draws one type per record uniformly (FIT training); ``"all"`` emits every
            type for every record (evaluation).
    """
    bad = [t for t in types if t not in FOCUS_TYPES]
    if bad or not types:
        raise UserError(f"unknown focus type(s) {bad}; choose from {', '.join(FOCUS_TYPES)}")
    if mode not in ("sample", "all"):
        raise UserError(f"mode must be 'sample' or 'all', got '{mode}'")
    rng = random.Random(f"lmforge-fit:{seed}")
    out: list[dict[str, Any]] = []
    for i, rec in enumerate(records):
        kinds = list(types) if mode == "all" else [rng.choice(list(types))]
        for kind in kinds:
            out.append(fit_example(rec, kind, task, spec, where=f"record {i + 1}"))
    return out


def sft_data(records: Iterable[Mapping[str, Any]], task: str, spec: FieldSpec) -> list[dict[str, Any]]:
    """The SFT(y) baseline's examples: the same prompt without a focus line, answer ``y``."""
    out = []
    for i, rec in enumerate(records):
        for f in (spec.text, spec.label):
            if f not in rec:
                raise UserError(f"record {i + 1}: no field '{f}'")
        out.append({"prompt": render_prompt(task, "", str(rec[spec.text])), "completion": completion(str(rec[spec.label])),
                    "focus_type": "none", "focus_label": str(rec[spec.label]), "label": str(rec[spec.label])})
    return out
