"""Tests for the Minions chat clients: HF (agent-nano), OpenAI-compatible (a local fake server),
scripted, and structured output with bounded retries."""

from __future__ import annotations

import copy
import logging
import socket
from typing import Any

import pytest
import torch

from lmforge.common.errors import UserError
from lmforge.methods.minions.clients import (
    ChatClient,
    ChatResponse,
    HFChatClient,
    OpenAIChatClient,
    ScriptedClient,
    StructuredOutputError,
    Usage,
    chat_json,
    count_tokens,
    extract_json,
    render_plain,
)
from lmforge.methods.minions.ledger import CostLedger, LedgeredClient
from tests.methods.minions.fake_openai import FakeOpenAI, completion

USER = [{"role": "user", "content": "What is the total revenue?"}]


# ------------------------------------------------------------------------------------------ basics


def test_usage_arithmetic_and_dict():
    a, b = Usage(3, 4), Usage(10, 1)
    assert a + b == Usage(13, 5)
    assert sum([a, b]) == Usage(13, 5)  # sum() starts from 0
    assert (a + b).total_tokens == 18
    assert a.to_dict() == {"prompt_tokens": 3, "completion_tokens": 4, "total_tokens": 7}
    assert a == Usage(3, 4)  # unchanged by the additions


def test_count_tokens_words_and_punctuation():
    assert count_tokens("Hello, world!") == 4
    assert count_tokens("") == 0
    assert count_tokens('{"a": 12}') == 7  # { " a " : 12 }
    assert count_tokens("  spaced   out ") == 2


def test_clients_satisfy_protocol():
    assert isinstance(ScriptedClient(["x"]), ChatClient)
    assert not isinstance(object(), ChatClient)


# ------------------------------------------------------------------------------------------ scripted


def test_scripted_list_in_order_records_calls_and_counts_tokens():
    client = ScriptedClient(["first reply.", "second"], name="remote-x")
    conv = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    r1 = client.chat(conv, json_mode=True)
    conv.append({"role": "assistant", "content": r1.text})  # later mutation must not change the record
    r2 = client.chat(conv, max_tokens=50)
    assert (r1.text, r2.text) == ("first reply.", "second")
    assert r1.usage == Usage(count_tokens("Be brief.") + count_tokens("Hi there"), 3) == Usage(5, 3)
    assert r2.usage == Usage(5 + 3, 1)
    assert len(client.calls) == 2 and len(client.calls[0]) == 2 and len(client.calls[1]) == 3
    assert client.options == [{"json_mode": True, "max_tokens": None}, {"json_mode": False, "max_tokens": 50}]
    with pytest.raises(RuntimeError, match="2 scripted replies"):
        client.chat(conv)


def test_scripted_callable_batch_and_done_reasons():
    client = ScriptedClient(lambda msgs: msgs[-1]["content"].upper(), done_reasons=["stop", "length"])
    out = client.chat_batch([[{"role": "user", "content": "a b"}], [{"role": "user", "content": "c"}],
                             [{"role": "user", "content": "d"}]])
    assert [r.text for r in out] == ["A B", "C", "D"]
    assert [r.done_reason for r in out] == ["stop", "length", "stop"]  # past the list: natural
    assert [c[-1]["content"] for c in client.calls] == ["a b", "c", "d"]


def test_scripted_truncates_at_max_tokens():
    client = ScriptedClient(lambda msgs: "one two, three four")
    full = client.chat(USER)
    cut = client.chat(USER, max_tokens=3)
    assert full.done_reason == "stop" and full.usage.completion_tokens == 5
    assert cut.text == "one two," and cut.done_reason == "length" and cut.usage.completion_tokens == 3
    exact = client.chat(USER, max_tokens=5)
    assert exact.text == full.text and exact.done_reason == "stop"


def test_scripted_rejects_bad_input():
    with pytest.raises(TypeError):
        ScriptedClient("not a list")
    client = ScriptedClient(["x"])
    with pytest.raises(ValueError, match="message 0"):
        client.chat([{"role": "user"}])
    with pytest.raises(ValueError):
        client.chat([])


# ------------------------------------------------------------------------------------------ extract_json


def test_extract_json_fenced_takes_last_block():
    text = 'first ```json\n{"a": 1}\n``` then ```json\n{"a": 2, "b": [1, {"c": 3}]}\n```  trailing {"z": 9'
    assert extract_json(text) == {"a": 2, "b": [1, {"c": 3}]}


def test_extract_json_unfenced_last_balanced_object_with_nesting():
    text = 'I think {"x": 1} but finally: {"decision": "final", "inner": {"k": "v}"}, "n": [1, 2]} done.'
    assert extract_json(text) == {"decision": "final", "inner": {"k": "v}"}, "n": [1, 2]}


def test_extract_json_bad_fence_falls_back_and_garbage_gives_none():
    assert extract_json('```json\n{not json}\n```\nbut here {"ok": true}') == {"ok": True}
    assert extract_json("```\n{\"plain\": 1}\n```") == {"plain": 1}
    for garbage in ["", "no json here", "{broken", "[1, 2, 3]", '"just a string"', "{'single': 1}"]:
        assert extract_json(garbage) is None, garbage


# ------------------------------------------------------------------------------------------ chat_json


def _validate_answer(obj: dict[str, Any]) -> str:
    if not isinstance(obj.get("answer"), str):
        raise ValueError("'answer' must be a string\nsecond line")
    return obj["answer"]


def test_chat_json_first_try():
    client = ScriptedClient(['Sure.\n```json\n{"answer": "42"}\n```'])
    assert chat_json(client, USER, _validate_answer) == "42"
    assert client.options[0]["json_mode"] is True and len(client.calls) == 1


def test_chat_json_retries_with_correction_and_counts_attempts():
    client = ScriptedClient(["no idea", '{"answer": 7}', '{"answer": "seven"}'])
    ledger = CostLedger()
    assert chat_json(client, USER, _validate_answer, ledger=ledger) == "seven"
    assert len(client.calls) == 3
    # Each retry carries the failed reply and a correction that names the problem.
    second, third = client.calls[1], client.calls[2]
    assert second[-2] == {"role": "assistant", "content": "no idea"}
    assert second[-1]["role"] == "user" and "no JSON object" in second[-1]["content"]
    assert third[-2]["content"] == '{"answer": 7}' and "'answer' must be a string" in third[-1]["content"]
    assert len(USER) == 1  # the caller's list is not modified
    assert ledger.calls("remote") == 3 and ledger.calls("local") == 0


def test_chat_json_gives_up_after_bound_and_ledger_keeps_every_attempt():
    replies = ["nope", '{"answer": 1}', "still nope"]
    client = ScriptedClient(replies, name="gpt-4o")
    ledger = CostLedger()
    with pytest.raises(StructuredOutputError) as info:
        chat_json(client, USER, _validate_answer, retries=3, ledger=ledger)
    err = info.value
    assert isinstance(err, UserError)
    msg = str(err)
    assert "\n" not in msg and "3 attempt" in msg and "gpt-4o" in msg and "no JSON object" in msg
    assert err.attempts == 3 and err.last_reply == "still nope"
    assert ledger.calls("remote") == 3
    expected = sum((client_call_usage(c, r) for c, r in zip(client.calls, replies)), Usage())
    assert ledger.usage("remote") == expected
    assert ledger.dollars("remote") == pytest.approx(
        (expected.prompt_tokens * 2.50 + expected.completion_tokens * 10.00) / 1e6)


def client_call_usage(messages: list[dict[str, str]], reply: str) -> Usage:
    return Usage(sum(count_tokens(m["content"]) for m in messages), count_tokens(reply))


def test_chat_json_does_not_double_count_a_ledgered_client():
    ledger = CostLedger()
    client = LedgeredClient(ScriptedClient(["x", '{"answer": "a"}']), ledger, "local")
    assert chat_json(client, USER, _validate_answer, ledger=ledger, side="local") == "a"
    assert ledger.calls("local") == 2 and ledger.calls("remote") == 0


def test_chat_json_truncated_reply_is_named_and_retries_must_be_positive():
    client = ScriptedClient(['{"answer": "x"'], done_reasons=["length"])
    with pytest.raises(StructuredOutputError, match="cut off"):
        chat_json(client, USER, _validate_answer, retries=1)
    with pytest.raises(UserError, match="retries"):
        chat_json(client, USER, _validate_answer, retries=0)


# ------------------------------------------------------------------------------------------ HF client


@pytest.fixture(scope="module")
def nano_client(nano):
    model, tokenizer = nano
    return HFChatClient(model, tokenizer, max_tokens=8, batch_size=4, name="zoo:agent-nano")


@pytest.fixture(scope="module")
def random_client(nano):
    """A seeded random tiny Llama on agent-nano's tokenizer: unlike the barely trained nano (which
    repeats one token), its greedy continuations differ between prompts."""
    from transformers import LlamaConfig, LlamaForCausalLM

    _, tokenizer = nano
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                      initializer_range=0.3, bos_token_id=tokenizer.bos_token_id,
                      eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    model = LlamaForCausalLM(cfg).eval()
    return HFChatClient(model, tokenizer, max_tokens=6, batch_size=3, name="random")


CONVERSATIONS = [
    [{"role": "user", "content": "Hi"}],
    [{"role": "system", "content": "You read financial reports."},
     {"role": "user", "content": "What was the operating margin in 2023, in percent?"}],
    [{"role": "user", "content": "Count: 1, 2, 3"}],
    [{"role": "user", "content": "The needle is 7731. What is the needle?"},
     {"role": "assistant", "content": "7731"}, {"role": "user", "content": "Again?"}],
]


def naive_greedy(model, tokenizer, prompt: str, n: int) -> list[int]:
    """Reference: full forward pass per token, no cache, no batching."""
    ids = tokenizer(prompt).input_ids
    out: list[int] = []
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([ids + out])).logits[0, -1]
            out.append(int(logits.argmax()))
    return out


def test_hf_plain_rendering(nano_client):
    assert not nano_client.has_chat_template  # the zoo tokenizer has none
    conv = CONVERSATIONS[1]
    expected = ("system: You read financial reports.\n"
                "user: What was the operating margin in 2023, in percent?\nassistant:")
    assert render_plain(conv) == expected
    assert nano_client.render(conv) == expected


def test_hf_uses_chat_template_when_present(nano):
    model, tokenizer = nano
    tok = copy.deepcopy(tokenizer)
    tok.chat_template = ("{% for m in messages %}<{{ m.role }}>{{ m.content }}\n{% endfor %}"
                         "{% if add_generation_prompt %}<assistant>{% endif %}")
    client = HFChatClient(model, tok, max_tokens=3)
    prompt = client.render(CONVERSATIONS[1])
    assert prompt == ("<system>You read financial reports.\n"
                      "<user>What was the operating margin in 2023, in percent?\n<assistant>")
    r = client.chat(CONVERSATIONS[1])
    assert r.usage.prompt_tokens == len(tok(prompt).input_ids)


def test_hf_usage_equals_tokenizer_counts_and_truncation(nano_client, nano):
    model, tokenizer = nano
    for conv in CONVERSATIONS:
        r = nano_client.chat(conv)
        prompt = render_plain(conv)
        assert r.usage.prompt_tokens == len(tokenizer(prompt).input_ids)
        ref = naive_greedy(model, tokenizer, prompt, 8)
        if tokenizer.eos_token_id in ref:  # an EOS ends the reply naturally, and counts
            n = ref.index(tokenizer.eos_token_id) + 1
            assert (r.usage.completion_tokens, r.done_reason) == (n, "stop")
            ref = ref[: n - 1]
        else:  # (what the barely trained nano does) cut at max_tokens
            assert (r.usage.completion_tokens, r.done_reason) == (8, "length")
        assert r.text == tokenizer.decode(ref, skip_special_tokens=True)
    assert any(nano_client.chat(c).done_reason == "length" for c in CONVERSATIONS)
    short = nano_client.chat(CONVERSATIONS[0], max_tokens=2)
    assert short.usage.completion_tokens <= 2 and short.text == tokenizer.decode(
        naive_greedy(model, tokenizer, render_plain(CONVERSATIONS[0]), 2), skip_special_tokens=True)


def test_hf_eos_is_a_natural_stop(nano):
    model, tokenizer = nano
    prompt = render_plain(CONVERSATIONS[0])
    first = tokenizer.convert_ids_to_tokens(naive_greedy(model, tokenizer, prompt, 1))[0]
    tok = copy.deepcopy(tokenizer)
    tok.eos_token = first  # the model's first token now ends the reply
    r = HFChatClient(model, tok, max_tokens=8).chat(CONVERSATIONS[0])
    assert r.done_reason == "stop" and r.text == "" and r.usage.completion_tokens == 1


def test_hf_batch_equals_one_by_one_greedy(random_client):
    model, tokenizer = random_client.model, random_client.tokenizer
    batch = random_client.chat_batch(CONVERSATIONS)
    single = [random_client.chat(c) for c in CONVERSATIONS]
    assert batch == single
    refs = [tokenizer.decode(naive_greedy(model, tokenizer, render_plain(c), 6), skip_special_tokens=True)
            for c in CONVERSATIONS]
    assert len(set(refs)) > 1  # the check below can tell the conversations apart
    for r, ref, conv in zip(batch, refs, CONVERSATIONS):
        if r.done_reason == "length":
            assert r.text == ref
        else:  # cut at a plain-rendering stop line
            assert ref.startswith(r.text)
        assert r.usage.prompt_tokens == len(tokenizer(render_plain(conv)).input_ids)
    assert random_client.chat_batch([]) == []


def test_hf_from_spec(nano_dir):
    client = HFChatClient.from_spec("zoo:agent-nano", max_tokens=2)
    assert client.name == "zoo:agent-nano" and client.max_tokens == 2
    assert client.chat(CONVERSATIONS[0]).usage.completion_tokens == 2
    with pytest.raises(UserError, match="does not exist"):
        HFChatClient.from_spec(str(nano_dir / "missing"))


# ------------------------------------------------------------------------------------------ OpenAI client

KEY_ENV = "LMFORGE_TEST_OPENAI_KEY"
SECRET = "sk-test-5ecret-do-not-print"


@pytest.fixture()
def server():
    fake = FakeOpenAI()
    yield fake
    fake.close()


@pytest.fixture()
def key_env(monkeypatch):
    monkeypatch.setenv(KEY_ENV, SECRET)
    return KEY_ENV


def make_client(server: FakeOpenAI, **kw: Any) -> tuple[OpenAIChatClient, list[float]]:
    sleeps: list[float] = []
    kw.setdefault("api_key_env", KEY_ENV)
    client = OpenAIChatClient(server.base_url, "gpt-4o", timeout=kw.pop("timeout", 5), backoff=0.5,
                              sleep=sleeps.append, **kw)
    return client, sleeps


def test_openai_request_usage_and_finish_reason(server, key_env):
    server.script.append((200, completion("The answer is 4.", prompt_tokens=123, completion_tokens=45), {}, 0))
    server.script.append((200, completion("cut mid", finish_reason="length"), {}, 0))
    client, sleeps = make_client(server, max_tokens=64)
    r = client.chat(USER)
    assert r == ChatResponse("The answer is 4.", Usage(123, 45), "stop")
    req = server.requests[0]
    assert req["path"] == "/v1/chat/completions"
    assert req["headers"]["Authorization"] == f"Bearer {SECRET}"
    assert req["body"] == {"model": "gpt-4o", "messages": USER, "temperature": 0.0, "max_tokens": 64}
    r2 = client.chat(USER, json_mode=True, max_tokens=5)
    assert r2.done_reason == "length"
    assert server.requests[1]["body"]["response_format"] == {"type": "json_object"}
    assert server.requests[1]["body"]["max_tokens"] == 5
    assert sleeps == [] and client.name == "gpt-4o"


def test_openai_missing_usage_is_estimated(server, key_env):
    body = completion("two words")
    del body["usage"]
    server.script.append((200, body, {}, 0))
    client, _ = make_client(server)
    assert client.chat(USER).usage == Usage(count_tokens(USER[0]["content"]), 2)


def test_openai_retries_500_then_succeeds_with_backoff(server, key_env):
    server.script += [(500, {"error": {"message": "overloaded"}}, {}, 0),
                      (503, {"error": {"message": "again"}}, {}, 0)]
    client, sleeps = make_client(server, max_retries=3)
    r = client.chat(USER)
    assert r.text == f"echo: {USER[0]['content']}"
    assert len(server.requests) == 3 and sleeps == [0.5, 1.0]  # backoff * 2**i


def test_openai_429_honours_retry_after(server, key_env):
    server.script.append((429, {"error": {"message": "slow down"}}, {"Retry-After": "3"}, 0))
    client, sleeps = make_client(server)
    assert client.chat(USER).text.startswith("echo:")
    assert sleeps == [3.0]


def test_openai_gives_up_after_max_retries(server, key_env):
    server.script += [(500, {"error": {"message": "boom\nstack trace"}}, {}, 0)] * 3
    client, sleeps = make_client(server, max_retries=2)
    with pytest.raises(UserError) as info:
        client.chat(USER)
    msg = str(info.value)
    assert "\n" not in msg and "HTTP 500" in msg and "3 attempt" in msg and "boom stack trace" in msg
    assert len(server.requests) == 3 and len(sleeps) == 2


def test_openai_4xx_is_not_retried_and_message_is_one_line(server, key_env):
    server.script.append((400, {"error": {"message": "model 'gpt-4o' does not exist\nsee docs"}}, {}, 0))
    client, sleeps = make_client(server)
    with pytest.raises(UserError) as info:
        client.chat(USER)
    msg = str(info.value)
    assert "\n" not in msg and "HTTP 400" in msg and "does not exist see docs" in msg
    assert len(server.requests) == 1 and sleeps == []


def test_openai_key_never_leaks(server, key_env, caplog):
    # A 401 whose message echoes the bearer token, after a 500 that is logged as a retry.
    def echo_auth(body, headers):
        return 401, {"error": {"message": f"invalid key {headers.get('Authorization')}"}}, {}, 0.0

    server.script.append((500, {"error": {"message": "hiccup"}}, {}, 0))
    server.respond = echo_auth
    caplog.set_level(logging.DEBUG)
    client, _ = make_client(server)
    with pytest.raises(UserError) as info:
        client.chat(USER)
    assert server.requests[-1]["headers"]["Authorization"] == f"Bearer {SECRET}"  # it was sent
    msg = str(info.value)
    assert "HTTP 401" in msg and KEY_ENV in msg and "***" in msg
    assert SECRET not in msg
    assert SECRET not in repr(client) and SECRET not in str(vars(client))
    assert "retrying" in caplog.text and SECRET not in caplog.text


def test_openai_missing_key_is_one_line(monkeypatch, server):
    monkeypatch.delenv(KEY_ENV, raising=False)
    with pytest.raises(UserError) as info:
        OpenAIChatClient(server.base_url, "gpt-4o", api_key_env=KEY_ENV)
    assert KEY_ENV in str(info.value) and "\n" not in str(info.value)
    # A local server needs none: no Authorization header is sent.
    client = OpenAIChatClient(server.base_url, "llama3", api_key_env=KEY_ENV, require_key=False)
    assert client.chat(USER).text.startswith("echo:")
    assert "Authorization" not in server.requests[-1]["headers"]


def test_openai_connection_refused(key_env):
    with socket.socket() as s:  # a port that was free a moment ago and has no listener now
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    sleeps: list[float] = []
    client = OpenAIChatClient(f"http://127.0.0.1:{port}/v1", "gpt-4o", api_key_env=KEY_ENV, max_retries=2,
                              timeout=2, sleep=sleeps.append)
    with pytest.raises(UserError) as info:
        client.chat(USER)
    msg = str(info.value)
    assert msg.startswith(f"cannot reach http://127.0.0.1:{port}/v1 (connection refused)") and "\n" not in msg
    assert len(sleeps) == 2


def test_openai_timeout_is_retried(server, key_env):
    server.script.append((200, completion("late"), {}, 1.0))
    client, sleeps = make_client(server, timeout=0.3)
    r = client.chat(USER)
    assert r.text.startswith("echo:") and len(sleeps) == 1
    server.script.append((200, completion("late"), {}, 1.0))
    client, _ = make_client(server, timeout=0.3, max_retries=0)
    with pytest.raises(UserError, match="within 0.3 s"):
        client.chat(USER)


def test_openai_batch_preserves_order(server, key_env):
    delays = [0.15, 0.0, 0.1, 0.0, 0.05]
    convs = [[{"role": "user", "content": f"sleep {d} item {i}"}] for i, d in enumerate(delays)]
    client, _ = make_client(server, workers=5)
    out = client.chat_batch(convs, json_mode=True)
    assert [r.text for r in out] == [f"echo: sleep {d} item {i}" for i, d in enumerate(delays)]
    assert len(server.requests) == 5
    assert all(r["body"]["response_format"] == {"type": "json_object"} for r in server.requests)


def test_openai_bad_arguments_and_bad_body(server, key_env):
    with pytest.raises(UserError, match="http"):
        OpenAIChatClient("localhost:8000", "m", api_key_env=KEY_ENV)
    server.script.append((200, b"<html>not json</html>", {}, 0))
    server.script.append((200, {"object": "list"}, {}, 0))
    client, _ = make_client(server)
    with pytest.raises(UserError, match="not JSON"):
        client.chat(USER)
    with pytest.raises(UserError, match="OpenAI-compatible"):
        client.chat(USER)


def _naive_constrained_greedy(model, tokenizer, prompt: str, allowed, n: int) -> list[int]:
    """Reference: a full forward per token, the argmax over the allowed ids only."""
    ids = tokenizer(prompt).input_ids
    out: list[int] = []
    with torch.no_grad():
        for _ in range(n):
            ok = list(allowed(ids + out))
            logits = model(torch.tensor([ids + out])).logits[0, -1]
            out.append(max(ok, key=lambda t: float(logits[t])))
            if out[-1] == tokenizer.eos_token_id:
                break
    return out


def test_json_mode_replies_are_valid_job_outputs_and_equal_naive_constrained_greedy(random_client):
    # The random model writes noise unconstrained; with json_mode every reply must be a complete
    # JobOutput (three keys, string or null values), and the batched engine must pick the same
    # tokens as a naive loop that takes the argmax over the constraint's allowed ids.
    import json

    from lmforge.common.generation import json_schema_constraint
    from lmforge.methods.minions.jobs import JOB_OUTPUT_SCHEMA

    # JobOutput's shape with short strings, so that a random model's strings end within the budget.
    short = {"type": "string", "maxLength": 6}
    schema = {**JOB_OUTPUT_SCHEMA, "properties": {"explanation": short, "citation": {"anyOf": [short, {"type": "null"}]},
                                                  "answer": {"anyOf": [short, {"type": "null"}]}}}
    client = HFChatClient(random_client.model, random_client.tokenizer, max_tokens=120, batch_size=3,
                          json_schema=schema)
    free = HFChatClient(random_client.model, random_client.tokenizer, max_tokens=20, constrain_json=False)
    assert all(not r.text.lstrip().startswith("{") for r in free.chat_batch(CONVERSATIONS[:2], json_mode=True))
    replies = client.chat_batch(CONVERSATIONS, json_mode=True)
    assert len(replies) == len(CONVERSATIONS)
    assert all(r.done_reason == "stop" for r in replies), [r.text for r in replies]
    for r in replies:
        obj = json.loads(r.text)
        assert set(obj) == {"explanation", "citation", "answer"}
        assert isinstance(obj["explanation"], str)
        assert all(obj[k] is None or isinstance(obj[k], str) for k in ("citation", "answer"))
    tok = random_client.tokenizer
    for conv, r in zip(CONVERSATIONS[:2], replies):
        prompt = client.render(conv)
        allowed = json_schema_constraint(tok, schema)
        ref = _naive_constrained_greedy(random_client.model, tok, prompt, allowed, 120)
        got = tok(r.text, add_special_tokens=False).input_ids
        assert tok.decode(ref, skip_special_tokens=True) == r.text, (ref, got)


# ------------------------------------------------------------------------ parser options, cache


def test_json_parser_options_force_the_key_order(random_client):
    # With force_json_field_order every reply writes its keys in the schema's required order, whichever
    # it is (the random model cannot prefer all three orders); max_consecutive_whitespaces bounds the
    # whitespace between tokens of the JSON's structure.
    import json

    from lmforge.methods.minions.jobs import JOB_OUTPUT_SCHEMA

    short = {"type": "string", "maxLength": 6}
    props = {"explanation": short, "citation": {"anyOf": [short, {"type": "null"}]},
             "answer": {"anyOf": [short, {"type": "null"}]}}
    for first in ("answer", "citation", "explanation"):
        required = [first, *[k for k in JOB_OUTPUT_SCHEMA["required"] if k != first]]
        client = HFChatClient(random_client.model, random_client.tokenizer, max_tokens=120, batch_size=3,
                              json_schema={**JOB_OUTPUT_SCHEMA, "required": required, "properties": props},
                              json_parser_options={"force_json_field_order": True, "max_consecutive_whitespaces": 1})
        for r in client.chat_batch(CONVERSATIONS, json_mode=True):
            obj = json.loads(r.text)
            assert r.done_reason == "stop" and list(obj) == required
    with pytest.raises(UserError, match="json_parser_options"):
        HFChatClient(random_client.model, random_client.tokenizer, json_parser_options={"nope": 1}).json_constraint()


class _Counting:
    """A greedy stand-in local client that counts the conversations it computes."""

    name = "counting"
    temperature = 0.0
    max_tokens = 9

    def __init__(self) -> None:
        self.computed: list[str] = []

    def chat_batch(self, conversations, *, json_mode=False, max_tokens=None):
        from lmforge.methods.minions.clients import ChatResponse, Usage

        self.computed += [c[-1]["content"] for c in conversations]
        return [ChatResponse(f"{c[-1]['content']}|{json_mode}|{max_tokens}", Usage(len(c[-1]["content"]), 3))
                for c in conversations]

    def context_limit(self) -> int:
        return 77


def test_reply_cache_computes_each_distinct_call_once_and_keeps_its_usage():
    from lmforge.methods.minions.clients import ReplyCache
    from lmforge.methods.minions.ledger import CostLedger, LedgeredClient

    inner = _Counting()
    cache = ReplyCache(inner)
    conv = lambda t: [{"role": "user", "content": t}]  # noqa: E731
    first = cache.chat_batch([conv("a"), conv("bb"), conv("a")], json_mode=True)
    assert [r.text for r in first] == ["a|True|None", "bb|True|None", "a|True|None"]
    assert inner.computed == ["a", "bb"] and (cache.hits, cache.misses) == (1, 2)
    ledger = CostLedger()
    again = LedgeredClient(cache, ledger, "local").chat_batch([conv("bb"), conv("c")], json_mode=True)
    assert [r.text for r in again] == ["bb|True|None", "c|True|None"] and inner.computed == ["a", "bb", "c"]
    # A cached reply's tokens are still counted as spent.
    assert ledger.to_dict()["sides"]["local"]["prompt_tokens"] == len("bb") + len("c")
    # json_mode and max_tokens are part of the call: a different one is computed.
    assert cache.chat(conv("a"), max_tokens=4).text == "a|False|4" and inner.computed[-1] == "a"
    assert cache.context_limit() == 77 and cache.max_tokens == 9 and cache.name == "counting"
    sampling = _Counting()
    sampling.temperature = 0.7
    with pytest.raises(UserError, match="greedy"):
        ReplyCache(sampling)


def test_in_process_specs_include_real_checkpoints():
    from lmforge.methods.minions.apply import is_local_model

    assert is_local_model("real:smollm2-135m-instruct") and is_local_model("zoo:agent-nano")
    assert not is_local_model("gpt-4o")


def test_a_served_model_without_url_is_told_every_in_process_spec(tmp_path):
    from lmforge.methods.minions.apply import is_local_model, make_client

    with pytest.raises(UserError) as err:
        make_client("gpt-4o", require_key=False)
    assert "real:NAME" in str(err.value) and "zoo:NAME" in str(err.value)
    # The loader reads a .gguf file too (lmforge.models.load): it runs in-process, not as a served name.
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    assert is_local_model(str(gguf)) and not is_local_model(str(tmp_path / "missing.gguf"))


def test_from_spec_loads_in_the_dtype_asked():
    from lmforge.common.runtime import resolve_dtype

    assert HFChatClient.from_spec("zoo:agent-nano").model.dtype == torch.float32  # the loader's default, kept
    assert HFChatClient.from_spec("zoo:agent-nano", dtype="bfloat16").model.dtype == torch.bfloat16
    assert HFChatClient.from_spec("zoo:agent-nano", dtype="auto").model.dtype == resolve_dtype("auto")


def test_reply_cache_recomputes_when_the_clients_generation_settings_change():
    # The wrapped client's own settings shape every reply as much as the messages do: a new default
    # max_tokens, JSON schema, parser options or constraint switch must not get the old reply back.
    from lmforge.methods.minions.clients import ReplyCache

    inner = _Counting()
    inner.json_schema, inner.json_parser_options, inner.constrain_json = None, None, True
    cache = ReplyCache(inner)
    conv = [{"role": "user", "content": "a"}]
    cache.chat(conv, json_mode=True)
    assert inner.computed == ["a"]
    for attr, value in (("max_tokens", 4), ("json_schema", {"type": "object"}),
                        ("json_parser_options", {"force_json_field_order": True}), ("constrain_json", False)):
        setattr(inner, attr, value)
        cache.chat(conv, json_mode=True)
        cache.chat(conv, json_mode=True)  # the same settings again: from memory
    assert inner.computed == ["a"] * 5 and (cache.hits, cache.misses) == (4, 5)


def test_reply_cache_never_answers_from_memory_for_a_client_that_now_samples():
    from lmforge.methods.minions.clients import ReplyCache

    inner = _Counting()
    cache = ReplyCache(inner)
    conv = [{"role": "user", "content": "a"}]
    cache.chat(conv)
    inner.temperature = 0.8  # switched to sampling after the cache was made
    with pytest.raises(UserError, match="greedy"):
        cache.chat(conv)
    assert inner.computed == ["a"]


def test_reply_cache_hands_out_its_own_usage_objects():
    # A caller that adjusts a reply's usage in place must not change what the cache returns later.
    from lmforge.methods.minions.clients import ReplyCache

    cache = ReplyCache(_Counting())
    conv = [{"role": "user", "content": "abc"}]
    first = cache.chat(conv)
    first.usage.prompt_tokens += 100
    assert cache.chat(conv).usage.prompt_tokens == 3


def test_reply_cache_without_a_client_has_no_attributes_rather_than_a_key_error():
    import copy as _copy

    from lmforge.methods.minions.clients import ReplyCache

    bare = ReplyCache.__new__(ReplyCache)
    assert not hasattr(bare, "context_limit")
    cache = ReplyCache(_Counting())
    assert _copy.copy(cache).client is cache.client
