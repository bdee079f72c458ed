"""The docjob generator (MINIONS worker jobs for the zoo's reader): it reproduces exactly what the
local worker receives from the oracle remote, answers it as the correct reader does, and adding it
changed nothing about the agentic zoo models."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import random
import re

import pytest

from lmforge.data import corpus, docjobs
from lmforge.eval.longdoc import parse_fact_sentence, synthetic_docqa
from lmforge.methods.minions import prompts
from lmforge.methods.minions.apply import MinionsConfig, run_protocol
from lmforge.methods.minions.clients import HFChatClient, ScriptedClient
from lmforge.methods.minions.oracle import Figure, OracleRemote, oracle_client, perfect_reader
from lmforge.models import zoo


def test_agentic_zoo_specs_and_data_unchanged():
    """Recorded before the docjob task existed: the agent-* digests, the tokenizer sample, the
    tokenizer and a stretch of training batches are bit-identical (agent-small's committed weights
    stay valid)."""
    from lmforge.models.tokenizer import train_tokenizer

    assert zoo.ZOO["agent-nano"].digest() == "4dc244c0161f1b17"
    assert zoo.ZOO["agent-small"].digest() == "f44063aadaa5bff6"
    assert zoo.packaged_dir(zoo.ZOO["agent-small"]) is not None
    texts = corpus.tokenizer_training_texts(0)
    assert texts == corpus.tokenizer_training_texts(0, tasks=[t for t, _ in zoo.ZOO["agent-small"].train.mixture])
    assert hashlib.sha256("\x00".join(texts).encode()).hexdigest()[:16] == "1ef255ed85bd6502"
    tok = train_tokenizer(texts, 2048)
    assert hashlib.sha256(json.dumps(tok.get_vocab(), sort_keys=True).encode()).hexdigest()[:16] == "e732c887921bb45b"
    h = hashlib.sha256()
    for step in range(6):
        for task in ("toolcall", "workflow", "needle", "textworld", "text"):
            b = zoo.make_batch(tok, task, zoo._step_rng(0, step, "train"), 2048, 12)
            h.update(b["input_ids"].numpy().tobytes())
            h.update(b["labels"].numpy().tobytes())
    assert h.hexdigest()[:16] == "1247061cff48a879"


def test_task_and_advice_are_the_oracles():
    code = OracleRemote()._code([Figure("operating costs", "Ember", 2021)], 800)
    assert json.dumps([docjobs.task_text("Ember", "operating costs", 2021)], indent=4) in code
    assert repr(docjobs.ADVICE) in code


_JOB_RX = re.compile(r"^Here is an excerpt from a document:\n\n(?P<chunk>.*)\n\n-{32}\nYour task:\n\n"
                     r"What was the (?P<metric>[a-z ]+) of the (?P<div>\w+) division in fiscal (?P<year>\d{4})\?",
                     re.S)


def test_prompts_and_replies_match_a_real_minions_run():
    """Every worker message of MINIONS (oracle remote, 800-character chunks) is a docjob prompt, and
    the docjob reply agrees with the scripted correct reader's."""
    seen: list[list[dict[str, str]]] = []

    def reader(messages):
        seen.append(messages)
        return perfect_reader(messages)

    item = synthetic_docqa(1, seed=3, doc_chars=12000, hops=2)[0]
    rec = run_protocol(ScriptedClient(reader, name="r"), oracle_client(), item.document, item.question,
                       MinionsConfig(protocol="minions", chunk_size=800))
    assert rec["answer"] == item.answer
    assert len(seen) > 20
    positives = 0

    class NoTemplate:  # a zoo tokenizer has no chat template: the client renders plainly
        chat_template = None

    client = HFChatClient(model=None, tokenizer=NoTemplate(), name="x")
    for messages in seen:
        assert len(messages) == 1 and messages[0]["role"] == "user"
        m = _JOB_RX.match(messages[0]["content"])
        assert m is not None
        key = (m["div"], m["metric"], int(m["year"]))
        assert client.render(messages) == docjobs.prompt(m["chunk"], key)
        ours = json.loads(docjobs.reply(m["chunk"], key))
        theirs = json.loads(perfect_reader(messages))
        assert (ours["answer"] is None) == (theirs["answer"] is None)
        if ours["answer"] is not None:
            positives += 1
            assert float(ours["answer"].replace(",", "")) == float(theirs["answer"])
            assert ours["citation"] == theirs["citation"]
    assert positives >= 2


def test_jobs_are_half_positive_with_lookalike_negatives():
    rng = random.Random(0)
    jobs = [docjobs.job(rng) for _ in range(400)]
    pos = [j for j in jobs if j.positive]
    assert 0.4 < len(pos) / len(jobs) < 0.6
    for j in jobs:
        assert j.prompt.startswith("user: Here is an excerpt from a document:\n\n" + j.chunk)
        assert j.prompt.endswith("Your reply:\nassistant:")
        reply = json.loads(j.answer)
        facts = {(p["division"], p["metric"], p["year"]): s for s, p in docjobs.chunk_facts(j.chunk)}
        if j.positive:
            assert reply["citation"] == facts[j.key] and parse_fact_sentence(reply["citation"]) is not None
            assert f"${reply['answer']} million" in reply["citation"]
        else:
            assert j.key not in facts and reply == {"answer": None, "citation": None,
                                                    "explanation": "The excerpt does not state it."}
    # Most negatives whose chunk holds figures ask for a look-alike (two of three attributes shared).
    hard = [j for j in jobs if not j.positive and docjobs.chunk_facts(j.chunk)]
    near = [j for j in hard if any(sum(a == b for a, b in zip(j.key, (p["division"], p["metric"], p["year"]))) == 2
                                   for _, p in docjobs.chunk_facts(j.chunk))]
    assert len(near) / len(hard) > 0.6


def test_same_seed_same_jobs():
    assert docjobs.pair(random.Random(5)) == docjobs.pair(random.Random(5))
    assert docjobs.pair(random.Random(5)) != docjobs.pair(random.Random(6))
    assert docjobs.segments(random.Random(5), 4) == docjobs.segments(random.Random(5), 4)


_ASK = re.compile(r"What was the ([a-z ]+) of the (\w+) division in fiscal (\d{4})\?")


def _check_sequence(segs: list[tuple[str, bool]]) -> list[tuple[str, str, int]]:
    """Every reply in a training sequence is the correct one for its question; returns the keys."""
    assert [flag for _, flag in segs] == [False, True] * (len(segs) // 2)
    chunk = segs[0][0].split("Here is an excerpt from a document:\n\n", 1)[1].split("\n\n" + "-" * 32)[0]
    keys = []
    for (question, _), (answer, _) in zip(segs[::2], segs[1::2]):
        metric, div, year = _ASK.findall(question)[-1]
        keys.append((div, metric, int(year)))
        assert answer == " " + docjobs.reply(chunk, keys[-1])
    return keys


def test_curriculum_stages():
    # Levels 1-2: copy only (every job's chunk states the figure), no follow-ups, short chunks.
    for i in range(60):
        segs = docjobs.segments(random.Random(i), 2)
        keys = _check_sequence(segs)
        assert len(keys) == 1 and '"answer": null' not in segs[1][0]
    # Later levels: the full prompt mostly, negatives and follow-ups, never the same figure twice.
    seqs = [docjobs.segments(random.Random(i), 10) for i in range(60)]
    replies = [a for s in seqs for a, flag in s if flag]
    assert 0.3 < sum('"answer": null' in a for a in replies) / len(replies) < 0.8
    assert sum(len(s) > 2 for s in seqs) > 30
    assert sum(s[0][0].endswith("Your reply:\nassistant:") for s in seqs) > 35
    for s in seqs:
        keys = _check_sequence(s)
        assert len(set(keys)) == len(keys)
    assert docjobs.stage(10).chunk_chars == docjobs.CHUNK_CHARS and docjobs.stage(1).positive_rate == 1.0


def test_heldout_reports_never_meet_training_reports():
    rng = random.Random(1)
    assert all(docjobs.job(rng).seed % 2 == 0 for _ in range(20))
    assert all(docjobs.job(rng, heldout=True).seed % 2 == 1 for _ in range(20))


def test_reader_spec_trains_on_docjobs_only(tmp_path):
    spec = zoo.ZOO["reader-small"]
    assert [t for t, _ in spec.train.mixture] == ["docjob"]
    texts = corpus.tokenizer_training_texts(spec.seed, tasks=["docjob"])
    assert texts == docjobs.tokenizer_texts(spec.seed) and all("Your reply:" in t for t in texts)
    short = dataclasses.replace(spec, train=dataclasses.replace(spec.train, steps=2, tokens_per_step=512,
                                                                eval_every=2, warmup=1))
    model, tok, state = zoo.train(short, tmp_path, progress=False)
    assert "docjob" in state.probes[-1] and {t for _, t, _ in state.losses} == {"docjob"}
    # The reader's tokenizer knows the report vocabulary: a division name is one token.
    assert len(tok(" Ember", add_special_tokens=False).input_ids) == 1
    assert model.config.max_position_embeddings >= max(
        len(tok(docjobs.job(random.Random(i), (1000, 1000)).prompt).input_ids) + 96 for i in range(8))


@pytest.mark.parametrize("chunk", ["", "no figures here at all."])
def test_reply_is_null_without_a_fact(chunk):
    assert json.loads(docjobs.reply(chunk, ("Ember", "revenue", 2021)))["answer"] is None


def test_worker_prompt_is_the_protocols():
    chunk = "In fiscal 2021, the Ember division reported revenue of $1,024.4 million."
    key = ("Ember", "revenue", 2021)
    assert docjobs.prompt(chunk, key) == "user: " + prompts.minions_worker(
        chunk, docjobs.task_text(*key), docjobs.ADVICE) + "\nassistant:"
    assert json.loads(docjobs.reply(chunk, key)) == {"answer": "1,024.4", "citation": chunk,
                                                     "explanation": "The excerpt states it."}


def test_evaluate_reader_gives_none_not_nan_for_a_rate_over_no_job(monkeypatch):
    """One held-out job is either positive or negative: the rates over the other kind are None
    (undefined), never NaN, so the report's results.json stays strict JSON."""
    import lmforge.common.generation as generation

    class Out:
        text, prompt_tokens = '{"answer": null, "citation": null, "explanation": "no"}', 10

    monkeypatch.setattr(generation, "generate", lambda model, tok, prompts, **kw: [Out() for _ in prompts])
    res = docjobs.evaluate_reader(None, None, n=1, seed=0)
    undefined = {k for k, v in res.items() if v is None}
    assert undefined  # one kind of job is missing
    assert undefined <= {"answer_exact_match", "citation_exact_match", "oracle_reads_right", "null_accuracy",
                         "lookalike_null_accuracy", "misleading_rate"}
    assert res["valid_json"] == 1.0 and res["n"] == 1.0
    json.dumps(res, allow_nan=False)
