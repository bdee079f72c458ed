"""The DSLA-Serve runtime on a virtual clock, with fake serve/convert/revert functions."""

from __future__ import annotations

import copy
import json
import math

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from lmforge.common.errors import UserError
from lmforge.methods.dsla.policy import SwapPolicy
from lmforge.methods.dsla.serve import (
    Request,
    ServeRuntime,
    Trace,
    engine_serve_fn,
    load_ramp,
    read_load_file,
    write_load_file,
)


class FakeModel:
    """Records swaps; a request's service time is ``a * prompt + b * new`` times a slow-down that
    grows with the number of softmax (unconverted) layers: ``1 + (n - converted) / n``."""

    def __init__(self, n_layers: int, a: float = 1e-3, b: float = 1e-2) -> None:
        self.n, self.a, self.b = n_layers, a, b
        self.converted: list[int] = []
        self.calls: list[tuple[str, int]] = []
        self.served: list[tuple[Request, int]] = []

    def convert(self, layer: int) -> None:
        assert layer not in self.converted
        self.converted.append(layer)
        self.calls.append(("convert", layer))

    def revert(self, layer: int) -> None:
        assert self.converted and self.converted[-1] == layer  # LIFO
        self.converted.pop()
        self.calls.append(("revert", layer))

    def service(self, req: Request, n_converted: int) -> float:
        return (self.a * req.prompt_tokens + self.b * req.max_new_tokens) * (1 + (self.n - n_converted) / self.n)

    def serve(self, req: Request) -> float:
        self.served.append((req, len(self.converted)))
        return self.service(req, len(self.converted))


def replay_and_check(trace: Trace, policy: SwapPolicy) -> None:
    """Replay ``policy`` (fresh) on the recorded polls; rebuild each poll's queue from the events."""
    policy.reset(0.0)
    replayed = []
    for p in trace.polls:
        queue: list[int] = []
        for e in trace.events[: p.event_index]:
            if e.kind == "arrive":
                queue.append(e.ref)
            elif e.kind == "start":
                queue.remove(e.ref)
        assert tuple(trace.requests[j].prompt_tokens for j in queue) == p.queue_prompts
        assert all(e.time_s <= p.time_s for e in trace.events[: p.event_index])
        d = policy.step(p.time_s, list(p.queue_prompts))
        assert d == p.decision
        if d.action:
            replayed.append((d.action, d.layer))
            e = trace.events[p.event_index]  # the swap is the event right after its poll
            assert (e.kind, e.ref, e.time_s) == (d.action, d.layer, p.time_s)
            assert (e.queue_len, e.max_prompt) == (len(p.queue_prompts), max(p.queue_prompts, default=0))
    assert replayed == trace.swaps()


def check_swaps_between_requests(trace: Trace) -> None:
    serving = None
    for e in trace.events:
        if e.kind == "start":
            assert serving is None
            serving = e.ref
        elif e.kind == "finish":
            assert serving == e.ref
            serving = None
        elif e.kind in ("convert", "revert"):
            assert serving is None, f"{e.kind} of layer {e.ref} at {e.time_s} while request {serving} runs"
    times = [e.time_s for e in trace.events]
    assert times == sorted(times)


# --- a run traced by hand ---------------------------------------------------------------------

HAND_POLICY = dict(n_layers=4, order=[2, 0, 3, 1], max_prompt_tokens=100, max_pending=3,
                   cooldown_s=1.0, poll_s=0.5)
HAND_REQUESTS = [Request(0.0, 50, 1), Request(0.25, 125, 1), Request(0.5, 100, 1), Request(4.0, 25, 1)]
#  (time, kind, ref, queue_len, max_prompt, converted); service = prompt / 100 s.
HAND_EVENTS = [
    (0.0, "arrive", 0, 1, 50, ()),
    (0.0, "start", 0, 0, 0, ()),  # poll at 0: cooldown from start-up
    (0.25, "arrive", 1, 1, 125, ()),  # arrives while r0 runs
    (0.5, "finish", 0, 1, 125, ()),
    (0.5, "arrive", 2, 2, 125, ()),
    (0.5, "start", 1, 1, 100, ()),  # poll at 0.5 (queue 125, 100): still cooldown
    (1.75, "finish", 1, 1, 100, ()),
    (1.75, "convert", 2, 1, 100, (2,)),  # polls due at 1.0 and 1.5 wait for r1: one poll at 1.75
    (1.75, "start", 2, 0, 0, (2,)),
    (2.75, "finish", 2, 0, 0, (2,)),
    (2.75, "revert", 2, 0, 0, ()),  # exactly 1.0 s after the convert: cooldown over
    (4.0, "arrive", 3, 1, 25, ()),
    (4.0, "start", 3, 0, 0, ()),
    (4.25, "finish", 3, 0, 0, ()),
]
HAND_POLLS = [0.0, 0.5, 1.75, 2.75, 3.25, 3.75, 4.25]


@pytest.mark.parametrize("scale", [1.0, 0.01])
def test_hand_traced_run(scale):
    factor = 1 / scale  # the same run with the times written 100x larger and scaled back
    policy = SwapPolicy(**{**HAND_POLICY, "cooldown_s": 1.0 * factor, "poll_s": 0.5 * factor})
    calls = []
    rt = ServeRuntime(policy, lambda l: calls.append(("convert", l)), lambda l: calls.append(("revert", l)),
                      lambda r: r.prompt_tokens / 100, time_scale=scale)
    assert (rt.policy.cooldown_s, rt.policy.poll_s) == pytest.approx((1.0, 0.5))
    trace = rt.run(HAND_REQUESTS)
    got = [(e.time_s, e.kind, e.ref, e.queue_len, e.max_prompt, e.converted) for e in trace.events]
    assert got == HAND_EVENTS  # dyadic times: exact
    assert [p.time_s for p in trace.polls] == HAND_POLLS
    assert calls == [("convert", 2), ("revert", 2)]
    assert policy.converted == [] and policy.last_swap_s == 0.0  # the caller's policy is not touched
    assert trace.latencies_s() == pytest.approx([0.5, 1.5, 2.25, 0.25])
    s = trace.summary()
    assert (s["n_converts"], s["n_reverts"], s["max_converted"], s["makespan_s"]) == (1, 1, 1, 4.25)


# --- fake model under load ----------------------------------------------------------------------

def ramp_run(tail_s: float = math.inf):
    fake = FakeModel(n_layers=8)
    policy = SwapPolicy(n_layers=8, order=[5, 2, 7, 0, 6, 1, 3, 4])  # official thresholds
    rt = ServeRuntime(policy, fake.convert, fake.revert, fake.serve, time_scale=0.02)  # cooldown 1.2 s
    reqs = load_ramp(60, 1800, base_prompt=64, max_new_tokens=16, min_gap_s=0.3, max_gap_s=2.0)
    return fake, rt, reqs, rt.run(reqs, tail_s=tail_s)


def test_ramp_converts_as_queue_grows_and_reverts_lifo_as_it_drains():
    fake, rt, reqs, trace = ramp_run()
    swaps = trace.swaps()
    assert swaps == fake.calls
    kinds = [k for k, _ in swaps]
    n_conv = kinds.count("convert")
    assert n_conv >= 3
    assert kinds == ["convert"] * n_conv + ["revert"] * n_conv  # up, then down
    assert [l for _, l in swaps[:n_conv]] == [5, 2, 7, 0, 6, 1][:n_conv]  # the order, capped at 6/8
    assert [l for _, l in swaps[n_conv:]] == [l for _, l in swaps[:n_conv]][::-1]  # LIFO
    assert fake.converted == []
    convs = [e for e in trace.events if e.kind == "convert"]
    revs = [e for e in trace.events if e.kind == "revert"]
    assert all(e.max_prompt >= 1024 or e.queue_len >= 50 for e in convs)
    assert all(e.max_prompt < 819.2 and e.queue_len < 25 for e in revs)
    peak = max(range(len(reqs)), key=lambda i: reqs[i].prompt_tokens)
    assert convs[0].time_s < reqs[peak].arrival_s < revs[0].time_s
    check_swaps_between_requests(trace)
    replay_and_check(trace, SwapPolicy(n_layers=8, order=[5, 2, 7, 0, 6, 1, 3, 4]).scaled(0.02))
    # each request ran with the layers converted when it started, at the fake's speed
    starts = {e.ref: len(e.converted) for e in trace.events if e.kind == "start"}
    fin = {e.ref: e.duration_s for e in trace.events if e.kind == "finish"}
    for i, (req, n_conv_seen) in enumerate(fake.served):
        assert req == reqs[i] and starts[i] == n_conv_seen
        assert fin[i] == pytest.approx(fake.service(req, n_conv_seen))
    assert any(n > 0 for _, n in fake.served)  # some requests ran faster, on converted layers


def test_cooldown_respected_in_virtual_time():
    _, rt, _, trace = ramp_run()
    cd = rt.policy.cooldown_s
    times = [e.time_s for e in trace.events if e.kind in ("convert", "revert")]
    assert times[0] >= cd  # measured from start-up
    gaps = [b - a for a, b in zip(times, times[1:])]
    assert min(gaps) >= cd - 1e-12
    # polls are poll_s apart, or later when a request was running
    pt = [p.time_s for p in trace.polls]
    assert pt[0] == 0.0
    assert all(b - a >= rt.policy.poll_s - 1e-12 for a, b in zip(pt, pt[1:]))
    # a no-op inside the cooldown: every poll closer than cd to the previous swap decided nothing
    last = 0.0
    for p in trace.polls:
        if p.time_s - last < cd:
            assert p.decision.action is None and p.decision.reason == "cooldown"
        if p.decision.action:
            last = p.time_s


def test_tail_zero_stops_with_layers_still_converted():
    fake, _, reqs, trace = ramp_run(tail_s=0.0)
    last_finish = max(e.time_s for e in trace.events if e.kind == "finish")
    assert all(p.time_s <= last_finish for p in trace.polls)
    assert len(trace.events) == 3 * len(reqs) + len(trace.swaps())


def test_long_request_defers_poll_and_swap_to_its_finish():
    policy = SwapPolicy(n_layers=4, cooldown_s=0.0, poll_s=1.0)
    fake = FakeModel(4)
    rt = ServeRuntime(policy, fake.convert, fake.revert, lambda r: 10.0)
    reqs = [Request(0.0, 10, 1), Request(0.5, 2000, 1), Request(0.6, 10, 1)]
    trace = rt.run(reqs, tail_s=0.0)
    # poll at 0 (queue [10]: nothing converted, steady), then the polls due at 1..9 wait: one at 10.
    assert [p.time_s for p in trace.polls][:3] == [0.0, 10.0, 20.0]
    assert trace.polls[1].queue_prompts == (2000, 10)
    kinds = [(e.time_s, e.kind, e.ref) for e in trace.events]
    assert kinds[kinds.index((10.0, "finish", 0)) + 1] == (10.0, "convert", 3)
    assert (10.0, "start", 1) in kinds
    # at 20 the queue holds only the short prompt: the layer goes back before request 2 starts
    i = kinds.index((20.0, "finish", 1))
    assert kinds[i + 1: i + 3] == [(20.0, "revert", 3), (20.0, "start", 2)]
    check_swaps_between_requests(trace)
    replay_and_check(trace, SwapPolicy(n_layers=4, cooldown_s=0.0, poll_s=1.0))


def test_serve_time_must_be_finite():
    rt = ServeRuntime(SwapPolicy(n_layers=2), lambda l: None, lambda l: None, lambda r: float("nan"))
    with pytest.raises(ValueError, match="finite"):
        rt.run([Request(0.0, 5, 1)])
    with pytest.raises(UserError, match="arrives before"):
        rt.run([Request(1.0, 5, 1), Request(0.5, 5, 1)])


# --- load files and the ramp ------------------------------------------------------------------

def test_load_ramp_shape():
    reqs = load_ramp(21, 1000, base_prompt=100, max_new_tokens=4, min_gap_s=0.1, max_gap_s=1.1)
    prompts = [r.prompt_tokens for r in reqs]
    assert prompts[0] == prompts[-1] == 100 and prompts[10] == 1000
    assert prompts[:11] == sorted(prompts[:11]) and prompts[10:] == sorted(prompts[10:], reverse=True)
    gaps = [b.arrival_s - a.arrival_s for a, b in zip(reqs, reqs[1:])]
    assert reqs[0].arrival_s == 0.0
    assert gaps[0] == pytest.approx(1.1 - 1.0 * 0.1) and min(gaps) == pytest.approx(0.1)
    assert gaps[:10] == sorted(gaps[:10], reverse=True) and gaps[10:] == sorted(gaps[10:])
    assert all(r.max_new_tokens == 4 for r in reqs)
    assert load_ramp(1, 50, base_prompt=10) == [Request(0.0, 50, 16)]
    with pytest.raises(UserError):
        load_ramp(5, 10, base_prompt=20)


def test_load_file_round_trip(tmp_path):
    reqs = load_ramp(7, 300)
    path = tmp_path / "load.jsonl"
    write_load_file(path, reqs)
    assert read_load_file(path) == reqs
    path.write_text('{"arrival_s": 0, "prompt_tokens": 3, "max_new_tokens": 1}\n\n'
                    '{"max_new_tokens": 2, "arrival_s": 0, "prompt_tokens": 4}\n')
    assert read_load_file(path) == [Request(0.0, 3, 1), Request(0.0, 4, 2)]


GOOD = {"arrival_s": 1.0, "prompt_tokens": 3, "max_new_tokens": 2}


@pytest.mark.parametrize("line,msg", [
    ("not json", "line 2: not valid JSON"),
    ("[1, 2]", "line 2: expected a JSON object"),
    (json.dumps({**GOOD, "extra": 1}), "line 2: unknown field 'extra'"),
    (json.dumps({"arrival_s": 1.0, "prompt_tokens": 3}), "line 2: missing field 'max_new_tokens'"),
    (json.dumps({**GOOD, "arrival_s": -1}), "line 2: field 'arrival_s' must be a number >= 0"),
    (json.dumps({**GOOD, "arrival_s": "1"}), "line 2: field 'arrival_s' must be a number"),
    (json.dumps({**GOOD, "arrival_s": True}), "line 2: field 'arrival_s' must be a number"),
    (json.dumps({**GOOD, "arrival_s": 0.5}), "line 2: field 'arrival_s' is 0.5, before"),
    (json.dumps({**GOOD, "prompt_tokens": 0}), "line 2: field 'prompt_tokens' must be an integer >= 1"),
    (json.dumps({**GOOD, "prompt_tokens": 2.0}), "line 2: field 'prompt_tokens' must be an integer"),
    (json.dumps({**GOOD, "max_new_tokens": None}), "line 2: field 'max_new_tokens' must be an integer"),
    ('{"arrival_s": NaN, "prompt_tokens": 3, "max_new_tokens": 2}', "line 2: field 'arrival_s'"),
])
def test_load_file_errors(tmp_path, line, msg):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({**GOOD, "arrival_s": 0.75}) + "\n" + line + "\n")
    with pytest.raises(UserError, match=msg) as info:
        read_load_file(path)
    assert "\n" not in str(info.value)


def test_load_file_missing_or_empty(tmp_path):
    with pytest.raises(UserError, match="does not exist"):
        read_load_file(tmp_path / "nope.jsonl")
    (tmp_path / "empty.jsonl").write_text("\n")
    with pytest.raises(UserError, match="no requests"):
        read_load_file(tmp_path / "empty.jsonl")


# --- the engine serve function ----------------------------------------------------------------

@pytest.fixture(scope="module")
def tiny_llama():
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=50, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=128,
                      eos_token_id=7, bos_token_id=1)
    return LlamaForCausalLM(cfg).eval()


def greedy_no_cache(model, prompt: list[int], n: int, eos: int | None) -> list[int]:
    """Greedy decoding by full forwards (no cache), ``eos`` never chosen (min_new_tokens = n)."""
    ids = torch.tensor([prompt])
    out = []
    with torch.no_grad():
        for _ in range(n):
            logits = model(input_ids=ids, use_cache=False).logits[0, -1].clone()
            if eos is not None:
                logits[eos] = -math.inf
            tok = int(logits.argmax())
            out.append(tok)
            ids = torch.cat([ids, torch.tensor([[tok]])], dim=1)
    return out


def test_engine_serve_fn_runs_exactly_max_new_tokens(tiny_llama):
    model = copy.deepcopy(tiny_llama)
    probe = engine_serve_fn(model, None, seed=3)
    assert probe(Request(0.0, 9, 1)) > 0
    prompt = probe.last_prompt
    assert len(prompt) == 9 and len(probe.last_output) == 1
    # Make the EOS id the token free greedy decoding picks second: generation that stopped at EOS
    # would end after 2 tokens.
    eos = greedy_no_cache(model, prompt, 6, eos=None)[1]
    model.generation_config.eos_token_id = eos
    model.config.eos_token_id = eos
    serve = engine_serve_fn(model, None, seed=3)  # same seed: same prompt
    took = serve(Request(0.0, 9, 6))
    assert took > 0
    assert serve.last_prompt == prompt
    assert len(serve.last_output) == 6 and eos not in serve.last_output
    assert serve.last_output == greedy_no_cache(model, prompt, 6, eos=eos)
    assert model.config._attn_implementation == "sdpa" and not model.training


def test_engine_serve_fn_keeps_special_ids_out(tiny_llama):
    class Tok:
        all_special_ids = [0, 1, 7]
        pad_token_id = 0

        def __len__(self):
            return 12

    serve = engine_serve_fn(tiny_llama, Tok(), seed=0)
    serve(Request(0.0, 100, 2))
    assert set(serve.last_prompt) == set(range(2, 12)) - {7}  # 100 draws from 9 ids: all seen
    assert len(serve.last_output) == 2
