"""Tests for the Minions cost ledger: arithmetic, pricing rules, serialisation, price files."""

from __future__ import annotations

import json
import logging

import pytest

from lmforge.common.errors import UserError
from lmforge.methods.minions.clients import ScriptedClient, Usage, count_tokens
from lmforge.methods.minions.ledger import PRICES, CostLedger, LedgeredClient, Price, lookup_price


def test_release_prices():
    assert PRICES["gpt-4o"] == Price(2.50, 10.00)
    assert PRICES["gpt-4o-mini"] == Price(0.15, 0.60)


def test_arithmetic_by_hand():
    ledger = CostLedger()
    ledger.record("remote", "gpt-4o", Usage(1_234, 567))
    # 1,234 / 1e6 * 2.50 = 0.003085 and 567 / 1e6 * 10.00 = 0.00567
    assert ledger.dollars("remote") == pytest.approx(0.003085 + 0.00567, abs=1e-12)
    assert ledger.dollars("remote") == pytest.approx(0.008755, abs=1e-12)
    ledger.record("remote", "gpt-4o-mini", Usage(10_000, 2_000))  # 0.0015 + 0.0012
    ledger.record("remote", "gpt-4o", Usage(1_000_000, 0))  # 2.50
    assert ledger.dollars("remote") == pytest.approx(0.008755 + 0.0027 + 2.50, abs=1e-12)
    assert ledger.usage("remote") == Usage(1_011_234, 2_567)
    assert ledger.calls("remote") == 3
    # Local tokens are counted and free.
    ledger.record("local", "zoo:agent-nano", Usage(50_000, 9_000))
    assert ledger.usage("local") == Usage(50_000, 9_000) and ledger.calls("local") == 1
    assert ledger.dollars("local") == 0.0
    assert ledger.dollars() == pytest.approx(ledger.dollars("remote"), abs=1e-15)


def test_local_price_and_default_price():
    ledger = CostLedger(default_price=Price(1.0, 2.0), local_price=Price(0.1, 0.1))
    ledger.record("remote", "my-frontier", Usage(1_000_000, 500_000))  # 1.0 + 1.0
    ledger.record("local", "gpt-4o", Usage(1_000_000, 1_000_000))  # local price, not gpt-4o's: 0.2
    assert ledger.dollars("remote") == pytest.approx(2.0)
    assert ledger.dollars("local") == pytest.approx(0.2)
    assert ledger.unpriced == []


def test_unknown_remote_model_is_free_but_flagged(caplog):
    ledger = CostLedger()
    with caplog.at_level(logging.WARNING):
        ledger.record("remote", "mystery-model", Usage(100, 100))
        ledger.record("remote", "mystery-model", Usage(100, 100))
    assert ledger.dollars() == 0.0 and ledger.calls("remote") == 2
    assert ledger.unpriced == ["mystery-model"]
    assert ledger.to_dict()["unpriced"] == ["mystery-model"]
    assert "note: no price for mystery-model" in ledger.render()
    assert caplog.text.count("mystery-model") == 1  # warned once
    ledger.record("local", "also-unknown", Usage(1, 1))
    assert ledger.unpriced == ["mystery-model"]  # the local side is never flagged


def test_lookup_snapshots_and_provider_prefix():
    assert lookup_price(PRICES, "gpt-4o-2024-08-06") == PRICES["gpt-4o"]
    assert lookup_price(PRICES, "gpt-4o-mini-2024-07-18") == PRICES["gpt-4o-mini"]
    assert lookup_price(PRICES, "openai/gpt-4o") == PRICES["gpt-4o"]
    assert lookup_price(PRICES, "claude-3-5-sonnet-20241022") == PRICES["claude-3-5-sonnet"]
    assert lookup_price(PRICES, "gpt-4o-audio-preview") is None  # an unlisted variant is not its base
    assert lookup_price(PRICES, "gpt-4") is None


def test_price_is_fixed_at_first_call():
    ledger = CostLedger({"m": Price(1.0, 1.0)})
    ledger.record("remote", "m", Usage(1_000_000, 0))
    ledger.prices["m"] = Price(100.0, 100.0)
    ledger.record("remote", "m", Usage(1_000_000, 0))
    assert ledger.dollars() == pytest.approx(2.0)


def test_bad_side_and_bad_price():
    ledger = CostLedger()
    with pytest.raises(ValueError, match="side"):
        ledger.record("cloud", "gpt-4o", Usage(1, 1))
    with pytest.raises(ValueError):
        ledger.dollars("both")
    with pytest.raises(ValueError):
        Price(-1.0, 1.0)
    with pytest.raises(ValueError):
        Price(float("inf"), 1.0)


def test_to_dict_round_trip_and_json():
    ledger = CostLedger(default_price=Price(0.5, 1.5))
    ledger.record("remote", "gpt-4o", Usage(1_234, 567))
    ledger.record("remote", "unlisted", Usage(2_000, 1_000))  # default price: 0.001 + 0.0015
    ledger.record("local", "zoo:agent-small", Usage(9_999, 111))
    d = ledger.to_dict()
    assert d["sides"]["remote"] == {"calls": 2, "prompt_tokens": 3_234, "completion_tokens": 1_567,
                                    "total_tokens": 4_801, "dollars": pytest.approx(0.008755 + 0.0025)}
    assert d["sides"]["local"]["dollars"] == 0.0 and d["sides"]["local"]["prompt_tokens"] == 9_999
    assert d["total_dollars"] == pytest.approx(0.011255)
    assert [(m["side"], m["model"]) for m in d["models"]] == [
        ("remote", "gpt-4o"), ("remote", "unlisted"), ("local", "zoo:agent-small")]
    assert d["models"][1]["price"] == {"input": 0.5, "output": 1.5}
    restored = CostLedger.from_dict(json.loads(json.dumps(d)))
    assert restored.to_dict() == d
    assert restored.dollars("remote") == pytest.approx(ledger.dollars("remote"))
    restored.record("remote", "gpt-4o", Usage(1_000_000, 0))  # keeps counting on the same entry
    assert restored.calls("remote") == 3 and restored.dollars("remote") == pytest.approx(2.511255)
    with pytest.raises(UserError, match="not a cost-ledger dict"):
        CostLedger.from_dict({"models": [{"side": "remote"}]})


def test_render_table_aligned():
    ledger = CostLedger()
    ledger.record("remote", "gpt-4o", Usage(1_234, 567))
    ledger.record("local", "zoo:agent-nano", Usage(123_456, 7_890))
    ledger.record("local", "zoo:agent-nano", Usage(4, 0))
    lines = ledger.render().splitlines()
    assert lines[0].split() == ["side", "calls", "prompt", "tok", "completion", "tok", "$"]
    assert lines[1].split() == ["local", "2", "123,460", "7,890", "0.000000"]
    assert lines[2].split() == ["remote", "1", "1,234", "567", "0.008755"]
    assert lines[3].split() == ["total", "3", "124,694", "8,457", "0.008755"]
    assert len({len(line) for line in lines}) == 1  # right-aligned columns end together
    assert len(lines) == 4  # no unpriced note


def test_ledgered_client_records_every_call():
    ledger = CostLedger()
    inner = ScriptedClient(lambda msgs: "an answer", name="gpt-4o")
    client = LedgeredClient(inner, ledger, "remote")
    msgs = [{"role": "user", "content": "a question here"}]
    r = client.chat(msgs)
    batch = client.chat_batch([msgs, msgs, msgs], max_tokens=1)
    assert client.name == "gpt-4o" and r.text == "an answer"
    assert ledger.calls("remote") == 4
    assert ledger.usage("remote") == Usage(4 * count_tokens("a question here"), 2 + 3 * 1)
    assert all(b.done_reason == "length" for b in batch)
    assert inner.options[-1]["max_tokens"] == 1  # arguments pass through
    with pytest.raises(ValueError):
        LedgeredClient(inner, ledger, "middle")


# ------------------------------------------------------------------------------------------ price files


def test_from_file_yaml_structured(tmp_path):
    path = tmp_path / "prices.yaml"
    path.write_text(
        "# dollars per million tokens\n"
        "prices:\n"
        "  gpt-4o: {input: 5.0, output: 15.0}\n"
        "  my-remote: {input: 1, output: 2}\n"
        "default: {input: 0.5, output: 0.5}\n"
        "local: {input: 0.01, output: 0.02}\n"
    )
    ledger = CostLedger.from_file(path)
    ledger.record("remote", "gpt-4o", Usage(1_000_000, 1_000_000))  # overridden: 20
    ledger.record("remote", "gpt-4o-mini", Usage(1_000_000, 0))  # built-in kept (merge): 0.15
    ledger.record("remote", "other", Usage(2_000_000, 0))  # default: 1.0
    ledger.record("local", "zoo:agent-small", Usage(1_000_000, 1_000_000))  # 0.03
    assert ledger.dollars("remote") == pytest.approx(21.15)
    assert ledger.dollars("local") == pytest.approx(0.03)


def test_from_file_json_flat_and_no_merge(tmp_path):
    flat = tmp_path / "flat.json"
    flat.write_text(json.dumps({"my-remote": {"input": 3, "output": 4}}))
    ledger = CostLedger.from_file(flat)
    assert ledger.prices["my-remote"] == Price(3.0, 4.0) and "gpt-4o" in ledger.prices
    only = tmp_path / "only.yml"
    only.write_text("merge: false\nprices:\n  my-remote: {input: 3, output: 4}\n")
    ledger = CostLedger.from_file(only)
    assert set(ledger.prices) == {"my-remote"}
    ledger.record("remote", "gpt-4o", Usage(10, 10))
    assert ledger.unpriced == ["gpt-4o"]


@pytest.mark.parametrize(
    ("name", "text", "match"),
    [
        ("missing.yaml", None, "price file not found"),
        ("broken.yaml", "prices: {gpt-4o: [1, 2\n", "not valid YAML"),
        ("broken.json", '{"gpt-4o": {"input": 1,', "not valid JSON"),
        ("list.yaml", "- 1\n- 2\n", "must be a mapping"),
        ("empty.yaml", "", "must be a mapping"),
        ("noout.yaml", "gpt-4o: {input: 1}\n", "price for 'gpt-4o' must be a mapping"),
        ("text.yaml", "gpt-4o: {input: one, output: 2}\n", "numbers 'input' and 'output'"),
        ("bool.yaml", "gpt-4o: {input: true, output: 2}\n", "numbers 'input' and 'output'"),
        ("negative.yaml", "gpt-4o: {input: -1, output: 2}\n", ">= 0"),
        ("unknown.yaml", "prices: {}\nlocal_price: {input: 1, output: 1}\n", "unknown key 'local_price'"),
        ("badmerge.yaml", "prices: {}\nmerge: maybe\n", "'merge' must be true or false"),
        ("baddefault.yaml", "prices: {}\ndefault: 3\n", "price for default"),
    ],
)
def test_from_file_bad_files_are_one_line_user_errors(tmp_path, name, text, match):
    path = tmp_path / name
    if text is not None:
        path.write_text(text)
    with pytest.raises(UserError, match=match) as info:
        CostLedger.from_file(path)
    assert "\n" not in str(info.value)
