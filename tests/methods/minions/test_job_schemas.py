"""The MINIONS worker reply schemas (``--job-schema official|bounded``): what they are, and that a worker
decoding under the bounded one writes strings within its bounds where the official one lets them run on.

The model is a seeded random tiny Llama on agent-nano's tokenizer: unlike the barely trained nano (which
writes ``" "`` in every field), it writes long strings under free-string schemas, as SmolLM2-135M does."""

from __future__ import annotations

import json

import pytest
import torch

from lmforge.methods.minions import prompts
from lmforge.methods.minions.clients import HFChatClient
from lmforge.methods.minions.jobs import (
    BOUNDED_JOB_LIMITS,
    BOUNDED_JOB_PARSER_OPTIONS,
    JOB_OUTPUT_SCHEMA,
    JOB_SCHEMAS,
    bounded_job_schema,
    job_schema,
)


def test_schema_names_and_bounds() -> None:
    assert JOB_SCHEMAS == ("official", "bounded")
    official, options = job_schema("official")
    assert official == JOB_OUTPUT_SCHEMA and options is None and official is not JOB_OUTPUT_SCHEMA
    bounded, options = job_schema("bounded")
    assert options == BOUNDED_JOB_PARSER_OPTIONS and options is not BOUNDED_JOB_PARSER_OPTIONS
    assert list(bounded["properties"]) == list(JOB_OUTPUT_SCHEMA["properties"]) == bounded["required"]
    assert bounded["properties"]["explanation"] == {"type": "string", "maxLength": BOUNDED_JOB_LIMITS["explanation"]}
    for key in ("citation", "answer"):  # still nullable
        assert bounded["properties"][key]["anyOf"] == [{"type": "string", "maxLength": BOUNDED_JOB_LIMITS[key]},
                                                      {"type": "null"}]
    assert BOUNDED_JOB_LIMITS == {"explanation": 60, "citation": 120, "answer": 20}
    custom = bounded_job_schema(explanation=5, citation=6, answer=7)
    assert custom["properties"]["citation"]["anyOf"][0]["maxLength"] == 6
    assert "maxLength" not in JOB_OUTPUT_SCHEMA["properties"]["explanation"]  # the official one is untouched
    bounded["properties"]["explanation"]["maxLength"] = 1  # fresh copies: mutating one changes no other
    assert job_schema("bounded")[0]["properties"]["explanation"]["maxLength"] == 60
    with pytest.raises(ValueError, match="unknown job schema"):
        job_schema("strict")
    for bad in (0, -1, 2.5, True):
        with pytest.raises(ValueError, match="explanation bound"):
            bounded_job_schema(explanation=bad)


@pytest.fixture(scope="module")
def random_model():
    from transformers import LlamaConfig, LlamaForCausalLM

    from lmforge.models.load import load

    _, tokenizer = load("zoo:agent-nano")
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                      initializer_range=0.3, bos_token_id=tokenizer.bos_token_id,
                      eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id)
    return LlamaForCausalLM(cfg).eval(), tokenizer


CHUNK = "## Revenue\nThe Cloud division reported revenue of 42 million dollars in 2023.\n"
TASKS = ("What was Cloud revenue in 2023?", "What was Devices revenue?", "Who is the CEO?", "Hi")


def _replies(random_model, name: str) -> list:
    model, tok = random_model
    schema, options = job_schema(name)
    client = HFChatClient(model, tok, max_tokens=256, batch_size=4, json_schema=schema, json_parser_options=options)
    convs = [[{"role": "user", "content": prompts.minions_worker(CHUNK, task, "")}] for task in TASKS]
    return client.chat_batch(convs, json_mode=True)


def _too_long(obj: dict, slack: int = 0) -> list[str]:
    return [k for k, limit in BOUNDED_JOB_LIMITS.items()
            if isinstance(obj.get(k), str) and len(obj[k]) > limit + slack]


def test_bounded_worker_replies_keep_their_strings_within_the_bounds(random_model) -> None:
    # Under the official free strings the same worker writes longer strings (or runs to the token
    # limit): the bounded check below could fail.
    official = _replies(random_model, "official")
    assert any(r.done_reason == "length" or _too_long(json.loads(r.text)) for r in official)
    for r in _replies(random_model, "bounded"):
        assert r.done_reason == "stop", r.text
        obj = json.loads(r.text)
        assert list(obj) == ["explanation", "citation", "answer"]  # the official key order, enforced
        # NOTE: lm-format-enforcer 0.11.3 lets a string run one character past maxLength now and then
        # (measured here: a 61-character explanation under maxLength 60; its token-length cache for free
        # text), so the bound is checked to within one character.
        assert not _too_long(obj, slack=1), obj
