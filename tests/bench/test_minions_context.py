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
    # 92 + 8 = 100 fits exactly; chunked protocols never give the whole document, so they are not checked.
    check_unchunked_fit([_item(0, 92)], local, [protocol])
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
