"""``lmforge bench minions`` refuses, before anything runs or is written, a document that MINION or
local-only would hand whole to a local model whose context it does not fit (issue 19's bad input:
"a Minions document longer than the reader's context with chunking off")."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmforge.bench.minions import BenchSetup, check_unchunked_fit, run_bench
from lmforge.common.errors import UserError
from lmforge.eval.longdoc import DocQA
from lmforge.methods.minions.clients import ScriptedClient, count_tokens
from lmforge.methods.minions.oracle import oracle_client
from tests.cli.helpers import call, one_error_line
from tests.methods.minions.fake_openai import FakeOpenAI


class _Local(ScriptedClient):
    """A scripted local model that knows its context (as HFChatClient does)."""

    def __init__(self, limit: int, max_tokens: int = 8) -> None:
        super().__init__(lambda messages: '{"explanation": "x", "citation": null, "answer": null}', name="local")
        self.limit, self.max_tokens = limit, max_tokens

    def context_limit(self) -> int:
        return self.limit

    def count_tokens(self, text: str) -> int:
        return count_tokens(text)


def _item(i: int, words: int) -> DocQA:
    return DocQA(id=f"q{i}", document=" ".join(["revenue"] * words), question="What was it?", answer="1",
                 kind="numeric")


@pytest.mark.parametrize("protocol", ["minion", "local-only"])
def test_a_document_past_the_context_is_refused_with_nothing_written(tmp_path: Path, protocol: str) -> None:
    local = _Local(limit=100, max_tokens=8)
    items = [_item(0, 50), _item(1, 93)]  # 93 + 8 > 100: the second does not fit with room to answer
    out = tmp_path / "run"
    with pytest.raises(UserError) as err:
        run_bench(items, local, oracle_client(), out, BenchSetup(local="l", remote="r", data="d", protocols=[protocol]))
    msg = str(err.value)
    assert "\n" not in msg and "q1" in msg and "93 tokens" in msg and "100 positions" in msg and protocol in msg
    assert not out.exists() and local.calls == []
    # A short one fits (the exact boundary, prompt included: below); chunked protocols never give the
    # whole document, so they are not checked.
    check_unchunked_fit([_item(0, 50)], local, [protocol])
    check_unchunked_fit(items, local, ["minions", "remote-only"])
    # A served model (no known context) is not checked.
    check_unchunked_fit(items, ScriptedClient(["x"]), [protocol])


def test_bench_cli_refuses_an_unchunked_run_on_documents_past_the_context(monkeypatch, capsys, tmp_path) -> None:
    monkeypatch.setenv("LMFORGE_TEST_REMOTE_KEY", "sk-test")
    remote = FakeOpenAI(reply=lambda messages: "42")
    try:
        out = tmp_path / "bench"
        code, stdout, err = call(monkeypatch, capsys, "bench", "minions", "--local", "zoo:agent-nano", "--remote",
                                 "gpt-4o", "--remote-base-url", remote.base_url, "--key-env",
                                 "LMFORGE_TEST_REMOTE_KEY", "--out", str(out), "--synthetic", "1",
                                 "--synthetic-chars", "20000", "-p", "local-only,remote-only")
        assert code == 2 and stdout == ""
        # NOTE: transformers' "Writing model shards" bar (loading a zoo model) is not the command's output.
        line = one_error_line("\n".join(ln for ln in err.splitlines() if "it/s]" not in ln))
        assert "positions" in line and "local-only" in line
        assert not out.exists() and remote.requests == []
    finally:
        remote.close()


# ------------------------------------------------------------------- the whole first prompt counts


def _first_local_prompt(protocol: str, item: DocQA) -> list[dict[str, str]]:
    """What the protocol first sends the local model, as the protocol itself builds it: run it with a
    local model of unlimited context and read the recorded call."""
    from lmforge.methods.minions.apply import MinionsConfig, run_protocol

    local = _Local(limit=10**9, max_tokens=8)
    run_protocol(local, oracle_client(), item.document, item.question, MinionsConfig(protocol=protocol))
    return local.calls[0]


@pytest.mark.parametrize("protocol", ["minion", "local-only"])
def test_the_check_counts_the_prompt_around_the_document(protocol: str) -> None:
    # The document alone fits with room for the answer (92 + 8 = 100), but the protocol's prompt wraps
    # it in instructions and the question: the model would be fed more than its 100 positions.
    item = _item(0, 92)
    with pytest.raises(UserError, match="100 positions"):
        check_unchunked_fit([item], _Local(limit=100, max_tokens=8), [protocol])
    # The boundary is the prompt the protocol really sends first (for MINION: its worker system
    # message, which holds the document; the remote's first message comes after and is not known yet).
    first = _first_local_prompt(protocol, item)
    sent = first if protocol == "local-only" else [m for m in first if m["role"] == "system"]
    n = sum(count_tokens(m["content"]) for m in sent)
    assert n > 92 + 5
    check_unchunked_fit([item], _Local(limit=n + 8, max_tokens=8), [protocol])
    with pytest.raises(UserError, match=f"{n} tokens"):
        check_unchunked_fit([item], _Local(limit=n + 7, max_tokens=8), [protocol])


def test_the_check_counts_tokens_as_the_in_process_model_reads_them(nano) -> None:
    # HFChatClient: the rendered prompt (chat template or plain rendering, BOS) as generate() encodes
    # it, i.e. the prompt_tokens its own usage reports for that call.
    from lmforge.methods.minions.clients import HFChatClient

    model, tokenizer = nano

    class _Sized(HFChatClient):
        limit = 10**9

        def context_limit(self) -> int:
            return self.limit

    client = _Sized(model, tokenizer, max_tokens=1, name="nano")
    item = DocQA(id="q0", document="Revenue of the Pumps division was 41.5 million dollars in 2023. " * 5,
                 question="What was the revenue of Pumps in 2023?", answer="41.5", kind="numeric")
    reply = client.chat(_first_local_prompt("local-only", item))
    n = reply.usage.prompt_tokens
    assert n > client.count_tokens(item.document)
    client.max_tokens = 8
    client.limit = n + 8
    check_unchunked_fit([item], client, ["local-only"])
    client.limit = n + 7
    with pytest.raises(UserError, match=f"{n} tokens"):
        check_unchunked_fit([item], client, ["local-only"])


def test_run_bench_with_its_progress_bar_runs_and_scores(tmp_path: Path, monkeypatch) -> None:
    """progress=True (what `lmforge bench minions` and `reproduce minions` use outside tests) draws lmforge's
    bar, whose columns read an ``info`` field: the bench's task must carry one (it crashed with KeyError
    'info' before any question ran)."""
    from lmforge.eval.longdoc import synthetic_docqa
    from lmforge.methods.minions.oracle import ORACLE_NAME, reader_client

    monkeypatch.setenv("LMFORGE_NO_PROGRESS", "0")  # the suite switches bars off; this test needs one drawn
    items = synthetic_docqa(1, seed=0, doc_chars=4000, hops=2)
    setup = BenchSetup(local="scripted-reader", remote=ORACLE_NAME, data="synthetic", protocols=["remote-only"])
    data = run_bench(items, reader_client(), oracle_client(), tmp_path / "run", setup, progress=True)
    assert data["summary"]["remote-only"]["n"] == 1 and data["summary"]["remote-only"]["accuracy"] == 1.0
