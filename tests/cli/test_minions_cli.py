"""``lmforge agent minions`` and ``lmforge bench minions`` end to end, against an OpenAI-compatible
server on 127.0.0.1 (the remote) and the zoo's agent-nano (the local model)."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest

from tests.cli.helpers import call
from tests.methods.minions.fake_openai import FakeOpenAI

KEY_ENV = "LMFORGE_TEST_REMOTE_KEY"
SECRET = "sk-cli-test-never-printed"


@pytest.fixture()
def remote(monkeypatch):
    monkeypatch.setenv(KEY_ENV, SECRET)
    # A remote that answers "42" to the direct question and never writes valid JSON.
    fake = FakeOpenAI(reply=lambda messages: "The answer is 42.")
    yield fake
    fake.close()


@pytest.fixture()
def doc(tmp_path: Path) -> Path:
    p = tmp_path / "report.txt"
    p.write_text("## Revenue\nThe Cloud division reported revenue of 42 million dollars in 2023.\n")
    return p


def _args(remote: FakeOpenAI, *extra: str) -> list[str]:
    return ["--local", "zoo:agent-nano", "--remote", "gpt-4o", "--remote-base-url", remote.base_url,
            "--key-env", KEY_ENV, *extra]


def test_agent_remote_only_answers_prints_and_saves_the_ledger(monkeypatch, capsys, remote, doc, tmp_path):
    out = tmp_path / "run.json"
    code, stdout, err = call(monkeypatch, capsys, "agent", "minions", *_args(remote), "--protocol", "remote-only",
                             "--doc", str(doc), "--question", "What was Cloud revenue in 2023?", "--out", str(out))
    assert code == 0, err
    assert "answer: The answer is 42." in stdout
    rec = json.loads(out.read_text())
    sent = remote.requests[0]["body"]["messages"][0]["content"]
    assert "42 million dollars" in sent  # remote-only reads the document
    remote_side = rec["ledger"]["sides"]["remote"]
    from lmforge.methods.minions.clients import count_tokens

    assert remote_side["calls"] == 1 and remote_side["prompt_tokens"] == count_tokens(sent)
    assert remote_side["completion_tokens"] == count_tokens("The answer is 42.")
    expected = remote_side["prompt_tokens"] * 2.5e-6 + remote_side["completion_tokens"] * 10e-6
    assert abs(remote_side["dollars"] - expected) < 1e-12
    assert "remote" in stdout and "total" in stdout  # the ledger table
    assert SECRET not in stdout + err + out.read_text()
    # An existing result is never replaced without --overwrite.
    code, _, err = call(monkeypatch, capsys, "agent", "minions", *_args(remote), "--protocol", "remote-only",
                        "--doc", str(doc), "--question", "q", "--out", str(out))
    assert code == 2 and "--overwrite" in err


def test_minion_remote_json_that_never_validates_stops_with_the_partial_ledger(monkeypatch, capsys, remote, doc):
    code, stdout, err = call(monkeypatch, capsys, "agent", "minions", *_args(remote), "--protocol", "minion",
                             "--doc", str(doc), "--question", "What was Cloud revenue in 2023?")
    assert code == 2
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert len(lines) == 1 and "JSON" in lines[0]
    assert len(remote.requests) == 5  # the official bound on retries
    assert "remote" in err and "total" in err  # the ledger of what was spent is still shown
    for r in remote.requests:  # MINION: the document never reaches the remote
        assert all("42 million" not in m["content"] for m in r["body"]["messages"])


def _closed_port() -> int:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.mark.parametrize("case", ["refused", "no_key", "pdf", "binary", "protocol"])
def test_bad_input_is_one_line(monkeypatch, capsys, remote, doc, tmp_path, case):
    args = _args(remote)
    document = doc
    if case == "refused":
        args = ["--local", "zoo:agent-nano", "--remote", "gpt-4o", "--key-env", KEY_ENV,
                "--remote-base-url", f"http://127.0.0.1:{_closed_port()}/v1"]
    elif case == "no_key":
        monkeypatch.delenv(KEY_ENV)
    elif case == "pdf":
        document = tmp_path / "filing.pdf"
        document.write_bytes(b"%PDF-1.7\n%\xe2\xe3\xcf\xd3\n1 0 obj\n")
    elif case == "binary":
        document = tmp_path / "blob.txt"
        document.write_bytes(b"\x00\x01\x02\xff" * 10)
    extra = ["--protocol", "oracle"] if case == "protocol" else ["--protocol", "remote-only"]
    code, _, err = call(monkeypatch, capsys, "agent", "minions", *args, *extra, "--doc", str(document),
                        "--question", "q")
    lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
    assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert {"refused": "connection refused", "no_key": KEY_ENV, "pdf": "not a text document",
            "binary": "not a text document", "protocol": "unknown protocol"}[case] in lines[0]


def test_bench_runs_side_by_side_and_resumes(monkeypatch, capsys, remote, tmp_path):
    out = tmp_path / "bench"
    args = ["bench", "minions", *_args(remote), "--synthetic", "2", "--synthetic-chars", "1500",
            "--protocol", "remote-only,local-only", "--local-max-tokens", "8", "--out", str(out)]
    code, stdout, err = call(monkeypatch, capsys, *args)
    assert code == 0, err
    data = json.loads((out / "results.json").read_text())
    assert sorted(data["cells"]) == sorted(f"{p}|{i}" for p in ("remote-only", "local-only")
                                           for i in {c["id"] for c in data["cells"].values()})
    summ = data["summary"]
    assert summ["remote-only"]["remote_calls"] == 1 and summ["local-only"]["remote_calls"] == 0
    assert summ["local-only"]["local_calls"] == 1 and summ["local-only"]["remote_dollars"] == 0
    # local-only spends no remote tokens: "infinitely" cheaper, reported as no ratio rather than a crash.
    assert summ["local-only"]["cost_reduction"] is None
    assert "remote-only" in stdout and "local-only" in stdout
    n_requests = len(remote.requests)
    code, _, err = call(monkeypatch, capsys, *args)  # resume: nothing left to do
    assert code == 0 and len(remote.requests) == n_requests
    code, _, err = call(monkeypatch, capsys, *[a if a != "2" else "3" for a in args])
    assert code == 2 and "different run" in err


def test_local_model_on_an_openai_compatible_server_needs_no_key(monkeypatch, capsys, remote, doc):
    local = FakeOpenAI(reply=lambda messages: "Cloud revenue was 42 million.")
    try:
        code, stdout, err = call(monkeypatch, capsys, "agent", "minions", "--local", "qwen2.5:3b",
                                 "--local-base-url", local.base_url, "--remote", "gpt-4o",
                                 "--remote-base-url", remote.base_url, "--key-env", KEY_ENV,
                                 "--protocol", "local-only", "--doc", str(doc), "--question", "Cloud revenue?",
                                 "--json")
    finally:
        local.close()
    assert code == 0, err
    rec = json.loads(stdout)
    assert rec["answer"] == "Cloud revenue was 42 million."
    req = local.requests[0]
    assert req["body"]["model"] == "qwen2.5:3b" and "Authorization" not in req["headers"]
    assert "42 million dollars" in req["body"]["messages"][0]["content"]
    assert remote.requests == []  # local-only never calls the remote
    assert rec["ledger"]["sides"]["local"]["calls"] == 1 and rec["ledger"]["sides"]["remote"]["calls"] == 0


def test_output_paths_fail_before_any_call(monkeypatch, capsys, remote, doc, tmp_path):
    folder = tmp_path / "adir"
    folder.mkdir()
    a_file = tmp_path / "afile"
    a_file.write_text("x")
    cases = [
        ("agent", "minions", *_args(remote), "--protocol", "remote-only", "--doc", str(doc), "--question", "q",
         "--out", str(folder), "--overwrite"),
        ("agent", "minions", *_args(remote), "--protocol", "remote-only", "--doc", str(doc), "--question", "q",
         "--out", str(a_file / "run.json")),
        ("bench", "minions", *_args(remote), "--synthetic", "1", "--protocol", "remote-only", "--out", str(a_file)),
    ]
    for args in cases:
        code, _, err = call(monkeypatch, capsys, *args)
        lines = [ln for ln in err.splitlines() if ln.startswith("error:")]
        assert code == 2 and len(lines) == 1 and "Traceback" not in err, err
    assert remote.requests == []  # nothing was paid for
    bad = tmp_path / "bench"
    bad.mkdir()
    (bad / "results.json").write_text("[1, 2]")
    code, _, err = call(monkeypatch, capsys, "bench", "minions", *_args(remote), "--synthetic", "1",
                        "--protocol", "remote-only", "--out", str(bad))
    assert code == 2 and "not a minions results file" in err


def test_bench_resume_refuses_other_token_budgets_and_keeps_an_aborted_ledger(monkeypatch, capsys, remote, tmp_path):
    out = tmp_path / "bench"
    base = ["bench", "minions", *_args(remote), "--synthetic", "2", "--synthetic-chars", "1500",
            "--protocol", "remote-only", "--out", str(out)]
    assert call(monkeypatch, capsys, *base)[0] == 0
    code, _, err = call(monkeypatch, capsys, *base, "--remote-max-tokens", "64")
    assert code == 2 and "different run" in err
    # The server goes away in the middle of a fresh run: one line, and the spent ledger is kept.
    out2 = tmp_path / "bench2"
    remote.script.append((200, {"id": "x", "choices": [{"index": 0, "message": {"role": "assistant", "content": "7"},
                                                        "finish_reason": "stop"}],
                                "usage": {"prompt_tokens": 5, "completion_tokens": 1}}, {}, 0.0))
    remote.script.extend([(401, {"error": {"message": "key revoked"}}, {}, 0.0)] * 3)
    code, _, err = call(monkeypatch, capsys, *[a if a != str(out) else str(out2) for a in base])
    assert code == 2 and "key revoked" in err
    data = json.loads((out2 / "results.json").read_text())
    assert len(data["cells"]) == 1 and data["aborted"]["error"]
    assert "remote" in err  # the ledger table of the aborted question


@pytest.mark.parametrize("protocol", ["minion", "local-only"])
def test_unchunked_document_longer_than_the_local_context_is_refused_before_any_call(monkeypatch, capsys, remote,
                                                                                     tmp_path, protocol):
    from lmforge.models.load import load

    model, tok = load("zoo:agent-nano")
    limit = int(model.config.max_position_embeddings)
    long_doc = tmp_path / "long.txt"
    long_doc.write_text("The Cloud division reported revenue of 42 million dollars. " * (limit // 4))
    assert len(tok(long_doc.read_text(), add_special_tokens=False)["input_ids"]) > limit
    out = tmp_path / "run.json"
    before = sorted(p.name for p in tmp_path.iterdir())
    code, stdout, err = call(monkeypatch, capsys, "agent", "minions", *_args(remote), "--protocol", protocol,
                             "--doc", str(long_doc), "--question", "q", "--out", str(out))
    assert code == 2
    lines = [ln for ln in (stdout + err).splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:") and f"{limit} positions" in lines[0]
    assert "--protocol minions" in lines[0]
    assert remote.requests == [] and sorted(p.name for p in tmp_path.iterdir()) == before
    # A document that fits runs (MINION's first remote call happens).
    short = tmp_path / "short.txt"
    short.write_text("The Cloud division reported revenue of 42 million dollars in 2023.")
    code, _, err = call(monkeypatch, capsys, "agent", "minions", *_args(remote), "--protocol", protocol, "--doc",
                        str(short), "--question", "q", "--local-max-tokens", "8")
    if protocol == "local-only":
        assert code == 0, err
    else:
        assert remote.requests  # MINION went on to its first remote call


@pytest.mark.parametrize("protocol", ["minion", "local-only"])
def test_unchunked_check_counts_the_prompt_not_the_document_alone(monkeypatch, capsys, remote, tmp_path, protocol):
    """A document that fits on its own count but not inside the protocol's first prompt (instructions,
    question, chat template) is refused: the count is the prompt's."""
    from lmforge.bench.minions import first_local_prompt, prompt_tokens
    from lmforge.methods.minions.clients import HFChatClient
    from lmforge.models.load import load

    model, tok = load("zoo:agent-nano")
    limit = int(model.config.max_position_embeddings)
    reserve = 8
    words = "The Cloud division reported revenue of 42 million dollars."
    text = ""
    while len(tok(text + " " + words, add_special_tokens=False)["input_ids"]) + reserve <= limit - 5:
        text = (text + " " + words).strip()
    n_doc = len(tok(text, add_special_tokens=False)["input_ids"])
    assert n_doc + reserve <= limit  # the document alone fits
    client = HFChatClient(model, tok, max_tokens=reserve)
    assert prompt_tokens(client, first_local_prompt(protocol, text, "q")) + reserve > limit  # the prompt does not
    doc = tmp_path / "doc.txt"
    doc.write_text(text)
    before = sorted(p.name for p in tmp_path.iterdir())
    code, stdout, err = call(monkeypatch, capsys, "agent", "minions", *_args(remote), "--protocol", protocol,
                             "--doc", str(doc), "--question", "q", "--local-max-tokens", str(reserve))
    assert code == 2
    lines = [ln for ln in (stdout + err).splitlines() if ln.strip()]
    assert len(lines) == 1 and "the prompt is" in lines[0] and f"{limit} positions" in lines[0]
    assert remote.requests == [] and sorted(p.name for p in tmp_path.iterdir()) == before


# ------------------------------------------------------------------ --job-schema and --local-dtype


@pytest.fixture()
def built(monkeypatch):
    """The clients the CLI builds (make_client wrapped: same arguments, same client)."""
    from lmforge.methods.minions import apply

    made: list = []
    real = apply.make_client

    def spy(spec, **kw):
        client = real(spec, **kw)
        made.append((spec, kw, client))
        return client

    monkeypatch.setattr(apply, "make_client", spy)
    return made


def _local_client(made):
    return next(client for spec, _, client in made if spec == "zoo:agent-nano")


def test_bounded_job_schema_and_dtype_reach_the_in_process_local_model(monkeypatch, capsys, remote, doc, tmp_path,
                                                                       built):
    import torch

    from lmforge.common.runtime import resolve_dtype
    from lmforge.methods.minions import prompts
    from lmforge.methods.minions.jobs import BOUNDED_JOB_PARSER_OPTIONS, JOB_OUTPUT_SCHEMA, bounded_job_schema

    out = tmp_path / "run.json"
    base = ["agent", "minions", *_args(remote), "--protocol", "local-only", "--doc", str(doc), "--question", "q",
            "--local-max-tokens", "4"]
    code, _, err = call(monkeypatch, capsys, *base, "--job-schema", "bounded", "--local-dtype", "bfloat16",
                        "--out", str(out))
    assert code == 0, err
    bounded = _local_client(built)
    assert bounded.json_schema == bounded_job_schema() and bounded.json_parser_options == BOUNDED_JOB_PARSER_OPTIONS
    assert next(bounded.model.parameters()).dtype == torch.bfloat16
    rec = json.loads(out.read_text())
    assert rec["local_options"] == {"job_schema": "bounded", "dtype": "bfloat16", "max_tokens": 4}
    # The defaults: the official free-string schema, the library's parser defaults, --local-dtype auto.
    built.clear()
    code, _, err = call(monkeypatch, capsys, *base)
    assert code == 0, err
    official = _local_client(built)
    assert official.json_schema == JOB_OUTPUT_SCHEMA and official.json_parser_options is None
    assert next(official.model.parameters()).dtype == resolve_dtype("auto")

    # A MINIONS job through each client: agent-nano writes " " in every field, so the bound shows in the
    # structure: the official key order and at most 2 whitespace characters in a row (the official schema
    # lets nano write its keys in another order and end on a dozen newlines).
    conv = [[{"role": "user", "content": prompts.minions_worker(doc.read_text(), "What was Cloud revenue?", "")}]]
    for client in (bounded, official):
        client.model.float()
    replies = {}
    for name, client in (("bounded", bounded), ("official", official)):
        r = client.chat_batch(conv, json_mode=True, max_tokens=64)[0]
        assert r.done_reason == "stop", r.text
        replies[name] = r.text
    import re

    longest_ws = {k: max(len(m) for m in re.findall(r"\s+", v)) for k, v in replies.items()}
    keys = {k: list(json.loads(v)) for k, v in replies.items()}
    assert keys["bounded"] == ["explanation", "citation", "answer"] and longest_ws["bounded"] <= 2
    assert keys["official"] != keys["bounded"] or longest_ws["official"] > 2  # the contrast: the test can fail


def test_bench_records_the_local_options_and_resumes_only_the_same(monkeypatch, capsys, remote, tmp_path, built):
    out = tmp_path / "bench"
    base = ["bench", "minions", *_args(remote), "--synthetic", "1", "--synthetic-chars", "1500",
            "--protocol", "local-only", "--local-max-tokens", "4", "--out", str(out)]
    code, _, err = call(monkeypatch, capsys, *base, "--job-schema", "bounded", "--local-dtype", "float32")
    assert code == 0, err
    clients = json.loads((out / "results.json").read_text())["setup"]["clients"]
    assert clients["job_schema"] == "bounded" and clients["local_dtype"] == "float32"
    assert _local_client(built).json_parser_options is not None
    code, _, err = call(monkeypatch, capsys, *base, "--local-dtype", "float32")  # official: another run
    assert code == 2 and "different run" in err


@pytest.mark.parametrize("case", ["schema", "dtype", "served"])
@pytest.mark.parametrize("command", ["agent", "bench"])
def test_bad_local_options_are_one_line_and_write_nothing(monkeypatch, capsys, remote, doc, tmp_path, built,
                                                          case, command):
    extra = {"schema": ["--job-schema", "strict"], "dtype": ["--local-dtype", "float16"],
             "served": ["--job-schema", "bounded", "--local-base-url", "http://127.0.0.1:9/v1"]}[case]
    out = tmp_path / "out"
    if command == "agent":
        args = ["agent", "minions", *_args(remote), "--doc", str(doc), "--question", "q", "--out", str(out / "r.json")]
    else:
        args = ["bench", "minions", *_args(remote), "--synthetic", "1", "--out", str(out)]
    before = sorted(p.name for p in tmp_path.iterdir())
    code, stdout, err = call(monkeypatch, capsys, *args, *extra)
    lines = [ln for ln in (stdout + err).splitlines() if ln.strip()]
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error:"), stdout + err
    assert {"schema": "--job-schema must be one of official, bounded",
            "dtype": "--local-dtype must be one of auto, float32, bfloat16",
            "served": "--job-schema bounded needs an in-process --local model"}[case] in lines[0]
    assert sorted(p.name for p in tmp_path.iterdir()) == before and not out.exists()
    assert built == [] and remote.requests == []  # no client was made, nothing was paid for
