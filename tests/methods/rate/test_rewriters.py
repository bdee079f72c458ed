"""Rewriters: the official prompt, a local HF model through lmforge's engine, an OpenAI-compatible
server (key kept secret), and the built-in rule attributes."""

from __future__ import annotations

import pytest

from lmforge.common.errors import UserError
from lmforge.methods.minions.clients import ScriptedClient
from lmforge.methods.rate.config import REWRITE_PROMPT, RateConfig
from lmforge.methods.rate.rewriters import (
    ChatRewriter,
    LengthRule,
    builtin_attribute,
    make_rewriter,
    sentiment_rewrite,
    sentiment_w,
)
from tests.methods.minions.fake_openai import FakeOpenAI

SECRET = "sk-test-0123456789abcdef"


def test_chat_rewriter_sends_the_official_prompt_for_each_target():
    cfg = RateConfig(w1_string="longer", w0_string="shorter")
    client = ScriptedClient(lambda m: "  rewritten  ")
    out = ChatRewriter(client, cfg).rewrite(["text one", "text two"], [1, 0])
    assert out == ["rewritten", "rewritten"]
    assert client.calls[0] == [{"role": "user", "content":
                                "text one\n\n[Adjust this review so it's longer, but change *nothing* else."}]
    assert client.calls[1][0]["content"] == REWRITE_PROMPT.format(original_completion="text two",
                                                                  w_counterfactual_string="shorter")


def test_truncated_replies_are_counted():
    cfg = RateConfig(max_tokens=2)
    rw = ChatRewriter(ScriptedClient(lambda m: "one two three four"), cfg)
    rw.rewrite(["a", "b"], [1, 1])
    assert rw.truncated == 2


def test_hf_rewriter_is_lmforge_generation_on_the_prompt(nano_dir, nano):
    from lmforge.common.generation import generate

    cfg = RateConfig(w1_string="longer", w0_string="shorter", temperature=0.0, max_tokens=6)
    rw = make_rewriter(f"hf:{nano_dir}", cfg)
    out = rw.rewrite(["the plan is simple"], [1])
    model, tok = nano
    prompt = rw.client.render([{"role": "user", "content": rw.prompt("the plan is simple", 1)}])
    want = generate(model, tok, [prompt], max_new_tokens=6, stop=None if rw.client.has_chat_template else
                    ["\nuser:", "\nsystem:", "\nassistant:"])[0].text.strip()
    assert out == [want]


def test_openai_rewriter_reads_the_key_from_the_environment_and_never_shows_it(monkeypatch):
    server = FakeOpenAI(reply=lambda msgs: "REWRITTEN: " + msgs[-1]["content"][:9])
    try:
        monkeypatch.delenv("RATE_TEST_KEY", raising=False)
        with pytest.raises(UserError) as exc:
            make_rewriter("openai:gpt-4o-2024-08-06", RateConfig(), base_url=server.base_url, api_key_env="RATE_TEST_KEY")
        assert "RATE_TEST_KEY" in str(exc.value)
        monkeypatch.setenv("RATE_TEST_KEY", SECRET)
        rw = make_rewriter("openai:gpt-4o-2024-08-06", RateConfig(), base_url=server.base_url, api_key_env="RATE_TEST_KEY")
        assert SECRET not in repr(rw) and SECRET not in repr(rw.client)
        out = rw.rewrite(["some text", "other text"], [1, 0])
        assert out == ["REWRITTEN: some text", "REWRITTEN: other tex"]
        req = server.requests[0]
        assert req["body"]["model"] == "gpt-4o-2024-08-06" and req["body"]["temperature"] == 0.7
        assert req["headers"]["Authorization"] == f"Bearer {SECRET}"
    finally:
        server.close()


def test_builtin_rules_flip_their_classifiers():
    for text in ("I loved it, a great film.", "A bad, boring film.", "No opinion here."):
        for w in (0, 1):
            assert sentiment_w(sentiment_rewrite(text, w)) == w
    assert sentiment_rewrite("Great acting, good plot.", 0) == "Terrible acting, bad plot."
    rule = LengthRule(6)
    for text in ("short", "one two three four five six seven eight"):
        for w in (0, 1):
            assert rule.w(rule.rewrite(text, w)) == w
    w_fn, rw, cfg = builtin_attribute("length", ["a b", "a b c d", "a b c d e f"])
    assert cfg.w1_string == "longer" and w_fn("a b c d") == 1 and w_fn("a b c") == 0
    with pytest.raises(UserError):
        builtin_attribute("humour", [])


def test_make_rewriter_errors():
    with pytest.raises(UserError, match="built-in attribute"):
        make_rewriter("programmatic", RateConfig())
    with pytest.raises(UserError, match="names no model"):
        make_rewriter("hf:", RateConfig())
    with pytest.raises(UserError, match="unknown rewriter"):
        make_rewriter("claude:opus", RateConfig())
    with pytest.raises(UserError):
        RateConfig(rewrite_prompt="no placeholders")
