"""MINIONS worker jobs on synthetic report chunks: the training data of the zoo's reader.

In MINIONS (Narayan et al., ICML 2025, arXiv 2502.15964) the local model never sees the whole
document: it runs *chunk-local jobs*, one short message per (chunk, task), and answers each with a
``JobOutput`` JSON (``explanation``, ``citation``, ``answer``; the answer is null when the chunk
does not hold what the task asks for). With :class:`~lmforge.methods.minions.oracle.OracleRemote`
as the remote (the stand-in for GPT-4o in ``lmforge reproduce minions``) on the questions of
:func:`lmforge.eval.longdoc.synthetic_docqa`, every job is the same kind of look-up:

* the chunk is a fixed-size character window of a synthetic annual report
  (:func:`~lmforge.methods.minions.jobs.chunk_by_section`, so it starts and ends mid-word);
* the task is ``"What was the <line item> of the <Division> division in fiscal <year>? Answer in
  USD millions."`` and the advice is one fixed sentence (:data:`TASK_TEMPLATE`, :data:`ADVICE`:
  the oracle's own wording, checked against its code by the tests);
* the message is :func:`lmforge.data.worker_prompt.minions_worker` (the worker prompt the method
  sends) as one user turn, which :class:`~lmforge.methods.minions.clients.HFChatClient` renders for a
  zoo tokenizer (no chat template) with :func:`lmforge.common.chat.render_plain`:
  ``"user: ...\\nassistant:"``.

:func:`job` builds exactly that prompt text from a fresh report and :func:`reply` the correct
reply, by the rules of the scripted correct reader
(:func:`lmforge.methods.minions.oracle.perfect_reader`): a fact sentence of the chunk (cut where the
chunk is cut) states the figure when it names its division, line item and fiscal year and a
``$... million`` value; the citation is that sentence, the answer its value as written there
(``"1,024.4"``: digits copied, not reformatted, which is easier for a tiny model and reads the same
to the oracle). About half the jobs ask for a figure the chunk lacks, most of them a look-alike of
a figure it holds (the same line item in another year, of another division, or another line item),
so that answering needs all three to match.

Training (:func:`segments`, the zoo's ``docjob`` task) adds two aids that MINIONS never sends, a
short prompt form and follow-up questions on the same chunk, and a curriculum (:func:`stage`): copy
first, on one-figure chunks, then negatives and longer chunks. :func:`evaluate_reader` scores a
model on the exact prompts only.

Held-out data: training reports are drawn from even seeds and evaluation reports
(:func:`evaluate_reader`) from odd ones, so no report is in both.
"""

from __future__ import annotations

import json
import math
import random
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from lmforge.common.chat import extract_json, render_plain
from lmforge.data.worker_prompt import minions_worker
from lmforge.eval.longdoc import _DIVISIONS, _METRICS, _YEARS, parse_fact_sentence, synthetic_docqa

__all__ = [
    "ADVICE",
    "CHUNK_CHARS",
    "TASK_TEMPLATE",
    "DocJob",
    "Stage",
    "chunk_facts",
    "compact_prompt",
    "evaluate_reader",
    "job",
    "pair",
    "parse_reply",
    "prompt",
    "reply",
    "segments",
    "stage",
    "task_text",
    "tokenizer_texts",
]

# The oracle's task and advice (OracleRemote._code); tests/data/test_docjobs.py checks they match.
TASK_TEMPLATE = "What was the {metric} of the {division} division in fiscal {year}? Answer in USD millions."
ADVICE = ("Only a sentence naming this division, this line item and this fiscal year counts. Answer "
          "with the number, quote that sentence as the citation; answer null if the excerpt lacks it.")
# Chunk lengths (characters) of the jobs. NOTE: the worker prompt is ~165 tokens of template plus
# the chunk (~4.6 characters a token with a reader's tokenizer), and a tiny model's retrieval fades
# past a few hundred tokens (shared/papers/zoo-learnability.md), so a zoo reader works on chunks of
# a few hundred characters; the paper's 5000-character chunks are for 3B-8B local models.
CHUNK_CHARS = (100, 1000)
POSITIVE_RATE = 0.5
LOOKALIKE_RATE = 0.75  # of the negatives: a look-alike of a figure the chunk holds


@dataclass(frozen=True)
class Stage:
    """What a training batch looks like at one curriculum level (training only; see :func:`segments`).

    Attributes:
        chunk_chars: chunk lengths (log-uniform between the two).
        positive_rate: the share of jobs whose chunk states the asked figure.
        followups: extra questions on the same chunk, at most.
        compact_rate: the share of first prompts in the short form (:func:`compact_prompt`).
        hops: the reports' hops (figure density: 1-2 sparse, up to 6 dense); None: 1-6.
    """

    chunk_chars: tuple[int, int]
    positive_rate: float
    followups: int
    compact_rate: float
    hops: int | None


# The zoo's curriculum level counts sentences of LEVEL_CHARS characters (a fact sentence is 70-95).
LEVEL_CHARS = 100
# NOTE: measured here (2-layer h128 reader, 1 CPU thread, ~5k tokens/s): on one-figure chunks with
# only positive jobs, copying the figure formed in ~250 steps of 4096 tokens with the short prompt
# and ~500 with the full one; with half the jobs negative from the start it had not formed after
# 900 steps (the reply's decision and its copy have to be learnt together, and neither gets a clean
# gradient). So levels 1-2 are copy-only, on sparse reports, with half the prompts short; negatives,
# follow-ups and dense reports come in from level 3.
# What reader-small (2 layers, h128, 1,800 steps, ~20 min) then learns, on held-out 400-character
# jobs: the figure's value in ~26% of positives, null in ~39% of negatives. Its citations take the
# line item and the year from the task and the value from the chunk, but the division is one fixed
# name whatever the task says (it never learnt to copy the division token; division look-alikes were
# doubled for that, without effect at this budget). It has not learnt the conjunctive look-up.


def stage(level: int) -> Stage:
    """The batch recipe of curriculum level ``level`` (1, 2, ...; chunks up to ``level`` sentences)."""
    hi = max(CHUNK_CHARS[0] + 50, min(CHUNK_CHARS[1], level * LEVEL_CHARS))
    if level <= 2:
        return Stage((CHUNK_CHARS[0], hi), 1.0, 0, 0.5, 1)
    return Stage((CHUNK_CHARS[0], hi), max(POSITIVE_RATE, 1.0 - 0.25 * (level - 2)), 4, 0.2, None)


# The sentence split of the scripted correct reader (oracle._SENTENCE_SPLIT).
_SENTENCE_SPLIT = re.compile(r"(?<=[.;!?])\s+|\n+")

Key = tuple[str, str, int]  # (division, metric, year)


def task_text(division: str, metric: str, year: int) -> str:
    """The oracle's task for one figure."""
    return TASK_TEMPLATE.format(metric=metric, division=division, year=year)


def chunk_facts(chunk: str) -> list[tuple[str, dict[str, Any]]]:
    """(sentence, parsed) for every fact sentence in ``chunk`` that states a whole figure."""
    out = []
    for s in _SENTENCE_SPLIT.split(chunk):
        parsed = parse_fact_sentence(s)
        if parsed is not None:
            out.append((s.strip(), parsed))
    return out


_VALUE = re.compile(r"\$(-?[\d,]+(?:\.\d+)?) million")


def reply(chunk: str, key: Key) -> str:
    """The correct ``JobOutput`` JSON for the job asking ``key`` of ``chunk``."""
    division, metric, year = key
    for sentence, p in chunk_facts(chunk):
        if (p["division"], p["metric"], p["year"]) == (division, metric.lower(), year):
            value = _VALUE.search(sentence)
            return json.dumps({"answer": value.group(1) if value else None, "citation": sentence,
                               "explanation": "The excerpt states it."})
    return json.dumps({"answer": None, "citation": None, "explanation": "The excerpt does not state it."})


def prompt(chunk: str, key: Key) -> str:
    """The worker prompt exactly as HFChatClient renders it for a tokenizer without a chat template."""
    message = minions_worker(chunk, task_text(*key), ADVICE)
    return render_plain([{"role": "user", "content": message}])


@dataclass
class DocJob:
    """One job: the rendered prompt, the correct reply (``" " + JSON``) and what it asks."""

    prompt: str
    answer: str
    key: Key
    chunk: str
    positive: bool
    divisions: tuple[str, ...] = ()
    seed: int = 0  # the report's synthetic_docqa seed (even: training, odd: held out)


def _lookalike(rng: random.Random, key: Key, divisions: Sequence[str]) -> Key:
    """``key`` with one of its three parts changed; the division half the time.

    NOTE: a first reader (1,800 steps) matched figures on line item and year and ignored the
    division (its citations named one fixed division); look-alikes that differ only in the division
    are what teach it to read that part, so they are drawn more often.
    """
    div, metric, year = key
    kind = rng.choice(("year", "division", "division", "metric"))
    if kind == "year":
        return div, metric, rng.choice([y for y in _YEARS if y != year])
    if kind == "division":
        return rng.choice([d for d in divisions if d != div]), metric, year
    return div, rng.choice([m for m in _METRICS if m != metric]), year


def job(rng: random.Random, chunk_chars: tuple[int, int] = CHUNK_CHARS, *, positive_rate: float = POSITIVE_RATE,
        heldout: bool = False, hops: int | None = None) -> DocJob:
    """A fresh job: a window of a new synthetic report and a figure to find in it.

    Args:
        rng: all randomness.
        chunk_chars: the window length is log-uniform in this range (short windows are the easy end).
        positive_rate: the share of jobs whose chunk states the asked figure.
        heldout: draw the report from the evaluation seeds (odd) instead of the training ones (even).
        hops: the report's question hops, which set how dense its figures are (1-2: about one per
            400 characters, as in a long report; 6: one per 120). None: drawn from 1-6, so that
            training chunks often hold several figures, look-alikes of one another among them.
    """
    lo, hi = chunk_chars
    size = round(math.exp(rng.uniform(math.log(lo), math.log(hi))))
    seed = 2 * rng.randrange(2**30) + int(heldout)
    item = synthetic_docqa(1, seed=seed, doc_chars=max(1000, size + rng.randint(1000, 2500)),
                           hops=hops if hops is not None else rng.randint(1, 6))[0]
    doc = item.document
    facts = item.metadata["facts"] + item.metadata["distractors"]
    divisions = sorted({f["division"] for f in facts})
    if len(divisions) < 2:
        divisions = list(_DIVISIONS)
    positive = rng.random() < positive_rate
    if positive:
        # A window that holds one fact sentence whole, at a uniform position within it.
        fact = rng.choice([f for f in facts if len(f["sentence"]) <= size] or facts)
        lo = max(0, fact["start"] + len(fact["sentence"]) - size)
        hi = max(lo, min(fact["start"], len(doc) - size))
        start = rng.randint(lo, hi)
    else:
        start = rng.randint(0, max(0, len(doc) - size))
    chunk = doc[start:start + size]
    key = _ask(rng, chunk, divisions, positive)
    text = reply(chunk, key)
    return DocJob(prompt=prompt(chunk, key), answer=" " + text, key=key, chunk=chunk,
                  positive=json.loads(text)["answer"] is not None, divisions=tuple(divisions), seed=seed)


def _ask(rng: random.Random, chunk: str, divisions: Sequence[str], positive: bool,
         asked: Sequence[Key] = ()) -> Key:
    """A figure the chunk states (``positive`` and there is one), else one it lacks (mostly a
    look-alike of one it states); never one of ``asked``."""
    held = [(p["division"], p["metric"], p["year"]) for _, p in chunk_facts(chunk)]
    fresh = [k for k in held if k not in asked]
    if positive and fresh:
        return rng.choice(fresh)
    for _ in range(50):
        if held and rng.random() < LOOKALIKE_RATE:
            cand = _lookalike(rng, rng.choice(held), divisions)
        else:
            cand = (rng.choice(divisions), rng.choice(_METRICS), rng.choice(_YEARS))
        if cand not in held and cand not in asked:
            return cand
    raise AssertionError("no absent figure found")  # 7 years x 5 line items x 2+ divisions: unreachable


def compact_prompt(chunk: str, key: Key) -> str:
    """A training-only short form of :func:`prompt`: the excerpt and the task, without the advice and
    the reply format, so the task sits ~30 tokens after the excerpt instead of ~165 (see segments)."""
    return (f"user: Here is an excerpt from a document:\n\n{chunk}\n\n--------------------------------\n"
            f"Your task:\n\n{task_text(*key)}\nassistant:")


def segments(rng: random.Random, level: int = 10) -> list[tuple[str, bool]]:
    """A job and follow-up questions on the same chunk, as (text, is_answer) segments: the zoo's
    training data at curriculum level ``level`` (:func:`stage`).

    The first job is :func:`job`'s prompt and reply (or, in a share of sequences, the reply after
    the short prompt form of :func:`compact_prompt`).
    NOTE: the short form and the follow-ups (``"\\nuser: <task>\\nassistant: <reply>"``) never occur
    in MINIONS, where each job is one full message; they are training aids. The short form puts the
    task ~30 tokens after the excerpt instead of ~165, where copying forms in half the steps; the
    follow-ups are dense supervision, as the dense queries that made key-value retrieval learnable in
    ``shared/papers/zoo-learnability.md`` (a worker prompt costs ~340 tokens for one decision, a
    follow-up ~50). At inference a reply ends at EOS or at the client's ``"\\nuser:"`` stop string,
    either way after the JSON.
    """
    st = stage(level)
    j = job(rng, st.chunk_chars, positive_rate=st.positive_rate, hops=st.hops)
    first = compact_prompt(j.chunk, j.key) if rng.random() < st.compact_rate else j.prompt
    segs: list[tuple[str, bool]] = [(first, False), (j.answer, True)]
    asked = [j.key]
    for _ in range(rng.randint(0, st.followups)):
        # A figure is asked once per sequence, so no reply can be copied from an earlier one.
        key = _ask(rng, j.chunk, j.divisions, rng.random() < st.positive_rate, asked)
        asked.append(key)
        segs.append((f"\nuser: {task_text(*key)}\nassistant:", False))
        segs.append((" " + reply(j.chunk, key), True))
    return segs


def pair(rng: random.Random, *, heldout: bool = False) -> tuple[str, str]:
    """``(prompt, answer)`` for the zoo's corpus (the ``docjob`` task)."""
    j = job(rng, heldout=heldout)
    return j.prompt, j.answer


def tokenizer_texts(seed: int = 0, n: int = 600) -> list[str]:
    """A fixed sample of docjob texts (prompt + reply) for training a reader's BPE tokenizer."""
    rng = random.Random(f"docjob-tokenizer:{seed}")
    return [p + a for p, a in (pair(rng) for _ in range(n))]


# ------------------------------------------------------------------------------------ evaluation


def parse_reply(text: str) -> dict[str, Any] | None:
    """The JobOutput object of a reply (the last JSON object in it), else None."""
    return extract_json(text)


def _norm(value: Any) -> str | None:
    if value is None:
        return None
    s = " ".join(str(value).split())
    return None if s.lower() in ("", "none", "null", "n/a") else s


def _as_kept_by_oracle(got: dict[str, Any], key: Key) -> float | None:
    """The value the oracle would take from this output for ``key``, or None when it drops it.

    The oracle (``OracleRemote._decide``) drops a null answer and an answer whose citation is a fact
    sentence about another figure, takes the citation's value when the citation states ``key``, and
    otherwise reads the answer's number.
    """
    if _norm(got.get("answer")) is None:
        return None
    parsed = parse_fact_sentence(_norm(got.get("citation")) or "")
    if parsed is not None:
        same = (parsed["division"], parsed["metric"], parsed["year"]) == (key[0], key[1].lower(), key[2])
        return parsed["value"] if same else None
    try:
        return float(str(got["answer"]).replace(",", "").replace("$", "").split()[0])
    except (ValueError, IndexError):
        return None


def evaluate_reader(model: Any, tokenizer: Any, n: int = 200, *, seed: int = 0, chunk_chars: int = 800,
                    batch_size: int = 16, max_new_tokens: int = 96,
                    render: Any = None, json_schema: dict[str, Any] | None = None,
                    constrain: bool = False, allowed_tokens: Any = None) -> dict[str, float | None]:
    """Greedy decoding on ``n`` held-out jobs with ``chunk_chars``-character chunks (half positive).

    ``render`` turns the worker's chat messages into the prompt text (an ``HFChatClient.render``, which
    uses the tokenizer's chat template); None renders them plainly, as for a model without a template
    (the jobs' own ``prompt``). ``constrain`` decodes under ``json_schema`` (None: any JSON object)
    as :class:`~lmforge.methods.minions.clients.HFChatClient` does for ``json_mode`` calls;
    ``allowed_tokens`` (a client's own constraint, e.g. with its parser options) replaces that one.

    Returns:
        ``valid_json`` (a JSON object came back); on the jobs whose chunk states the figure:
        ``answer_exact_match`` (the figure's string), ``citation_exact_match`` (the sentence),
        ``oracle_reads_right`` (what the oracle takes from the output is the right value); on the
        others: ``null_accuracy`` (answer null), ``lookalike_null_accuracy`` (the same, when the chunk
        holds a look-alike of the asked figure), ``misleading_rate`` (an output the oracle would keep:
        a number not disowned by a citation of another figure); ``accuracy`` (exact answer or null),
        ``mean_prompt_tokens``. A rate over jobs the sample happens not to hold (no look-alike chunk,
        say) is None, not NaN: it is undefined, and results files hold strict JSON.
    """
    from lmforge.common.generation import generate

    rng = random.Random(f"docjob-eval:{seed}")
    jobs = [job(rng, (chunk_chars, chunk_chars), heldout=True, hops=2) for _ in range(n)]
    if render is None:
        prompts, stop = [j.prompt for j in jobs], ["\nuser:", "\nsystem:", "\nassistant:"]
    else:
        prompts = [render([{"role": "user", "content": minions_worker(j.chunk, task_text(*j.key), ADVICE)}])
                   for j in jobs]
        stop = None
    allowed = allowed_tokens
    if constrain and allowed is None:
        from lmforge.common.generation import json_schema_constraint

        allowed = json_schema_constraint(tokenizer, json_schema)
    outs = generate(model, tokenizer, prompts, max_new_tokens=max_new_tokens, stop=stop, batch_size=batch_size,
                    allowed_tokens=allowed)
    res: dict[str, list[bool]] = {k: [] for k in ("valid", "answer", "citation", "read", "null", "hard",
                                                  "misleading", "correct")}
    for j, o in zip(jobs, outs):
        got = parse_reply(o.text) or {}
        res["valid"].append(bool(got))
        gold = json.loads(j.answer)
        answer = _norm(got.get("answer"))
        kept = _as_kept_by_oracle(got, j.key)
        if j.positive:
            ok = answer == gold["answer"]
            res["answer"].append(ok)
            res["citation"].append(_norm(got.get("citation")) == _norm(gold["citation"]))
            res["read"].append(kept is not None and abs(kept - float(gold["answer"].replace(",", ""))) < 1e-6)
        else:
            ok = bool(got) and answer is None  # a reply that is no JSON is no answer either
            res["null"].append(ok)
            res["misleading"].append(kept is not None)
            d, m, y = j.key
            if any(sum((p["division"] == d, p["metric"] == m, p["year"] == y)) == 2 for _, p in chunk_facts(j.chunk)):
                res["hard"].append(ok)
        res["correct"].append(ok)

    def mean(xs: list[bool]) -> float | None:
        return sum(xs) / len(xs) if xs else None

    return {
        "n": float(n),
        "positives": float(len(res["answer"])),
        "valid_json": mean(res["valid"]),
        "answer_exact_match": mean(res["answer"]),
        "citation_exact_match": mean(res["citation"]),
        "oracle_reads_right": mean(res["read"]),
        "null_accuracy": mean(res["null"]),
        "lookalike_null_accuracy": mean(res["hard"]),
        "misleading_rate": mean(res["misleading"]),
        "accuracy": mean(res["correct"]),
        "mean_prompt_tokens": sum(o.prompt_tokens for o in outs) / max(1, len(outs)),
    }
