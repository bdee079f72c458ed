"""DSLA-Serve at serve time: a request stream on a virtual clock, swapping layers under load.

Follows the serving loop of the official ``src/server.py`` (utnslab/DSLA-Serve): requests wait in
a FIFO queue (``request_queue``), one is generated at a time (``BATCH_MAX_SIZE = 1``,
``batch_scheduler``), and a monitor (``model_swap_monitor``, here
:class:`~lmforge.methods.dsla.policy.SwapPolicy`) polls the queue every 5 s and converts the next
layer to DSLA or reverts the last one. The official server is an HTTP service on wall-clock time;
this runtime replays a recorded or synthetic request stream instead:

* **Virtual clock.** Requests arrive at their ``arrival_s``; a request starts when the model is
  free and it is first in the queue, and the clock advances by the **measured** wall seconds that
  ``serve(request)`` took (the real prefill + decode on the model). Arrivals during a request join
  the queue at their own times.
* **Polls.** The policy is polled at ``t = 0`` (start-up: the official ``LAST_SWAP_TIME`` is set
  when the server starts), then ``poll_s`` after each poll (the official loop sleeps 5 s after
  every check). Swaps are applied only **between** requests: a poll that falls due while a
  request runs is taken when that request finishes, before the next one starts, so the decision
  and the swap happen at the same virtual time and see the same queue.
* **Time scale.** ``time_scale`` multiplies the policy's ``cooldown_s`` and ``poll_s``.

NOTE: the reproduction scales time: with ``time_scale=0.01`` the official 60 s cooldown and 5 s
poll become 0.6 s and 0.05 s so that a short CPU run sees several swaps; the defaults
(``time_scale=1`` and the :class:`SwapPolicy` defaults) are the official ones.

NOTE: the official monitor runs on the event loop while ``MODEL.generate`` runs in a worker thread,
so a swap can land in the middle of a generation; here a swap never does (a due poll waits for
the running request). The official server also answers 503 once more than 100 requests
(``2 * MAX_QUEUE_SIZE_FOR_SWAP``) are queued; this runtime serves every request (no admission
control), and swaps take no virtual time (their wall seconds are recorded in the trace).

Load files (:func:`read_load_file`) are JSON lines, one request per line::

    {"arrival_s": 0.0, "prompt_tokens": 1200, "max_new_tokens": 64}

with ``arrival_s`` a number >= 0, non-decreasing down the file, and ``prompt_tokens`` and
``max_new_tokens`` integers >= 1; blank lines are skipped and nothing else is accepted.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from lmforge.common.batching import inference
from lmforge.common.errors import UserError
from lmforge.methods.dsla.policy import Decision, SwapPolicy

EventKind = Literal["arrive", "start", "finish", "convert", "revert"]

_FIELDS = ("arrival_s", "prompt_tokens", "max_new_tokens")


@dataclass(frozen=True)
class Request:
    """One request of the stream.

    Attributes:
        arrival_s: arrival time in seconds from the start of the run.
        prompt_tokens: prompt length in tokens.
        max_new_tokens: tokens to generate (the runtime's serve functions generate exactly this many).
    """

    arrival_s: float
    prompt_tokens: int
    max_new_tokens: int


def _clip(value: Any) -> str:
    text = json.dumps(value) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def read_load_file(path: str | Path) -> list[Request]:
    """Read a JSON-lines load file (the format is in the module docstring).

    Args:
        path: the file.

    Returns:
        The requests in file order.

    Raises:
        UserError: a missing file, an empty one, or any line that is not exactly one object with the
            three fields as documented; the one-line message names the line number and the field.
    """
    p = Path(path)
    if not p.is_file():
        raise UserError(f"load file {p} does not exist")
    out: list[Request] = []
    prev = 0.0
    with p.open(encoding="utf-8") as f:
        for lineno, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"load file {p} line {lineno}"
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as e:
                raise UserError(f"{where}: not valid JSON ({e.msg})") from None
            if not isinstance(obj, dict):
                raise UserError(f"{where}: expected a JSON object with {', '.join(_FIELDS)}")
            extra = sorted(set(obj) - set(_FIELDS))
            if extra:
                raise UserError(f"{where}: unknown field '{extra[0]}' (allowed: {', '.join(_FIELDS)})")
            for name in _FIELDS:
                if name not in obj:
                    raise UserError(f"{where}: missing field '{name}'")
            a = obj["arrival_s"]
            if isinstance(a, bool) or not isinstance(a, (int, float)) or not math.isfinite(a) or a < 0:
                raise UserError(f"{where}: field 'arrival_s' must be a number >= 0, got {_clip(a)}")
            if a < prev:
                raise UserError(f"{where}: field 'arrival_s' is {a}, before the previous line's {prev} "
                                "(arrivals must not decrease)")
            for name in ("prompt_tokens", "max_new_tokens"):
                v = obj[name]
                if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                    raise UserError(f"{where}: field '{name}' must be an integer >= 1, got {_clip(v)}")
            prev = float(a)
            out.append(Request(float(a), int(obj["prompt_tokens"]), int(obj["max_new_tokens"])))
    if not out:
        raise UserError(f"load file {p} has no requests")
    return out


def write_load_file(path: str | Path, requests: Sequence[Request]) -> None:
    """Write requests as a JSON-lines load file that :func:`read_load_file` reads back.

    Args:
        path: the file to write (overwritten).
        requests: the requests, arrivals non-decreasing.
    """
    with Path(path).open("w", encoding="utf-8") as f:
        for r in requests:
            f.write(json.dumps({"arrival_s": r.arrival_s, "prompt_tokens": r.prompt_tokens,
                                "max_new_tokens": r.max_new_tokens}) + "\n")


def load_ramp(
    n: int,
    peak_prompt: int,
    *,
    base_prompt: int = 32,
    max_new_tokens: int = 16,
    min_gap_s: float = 0.05,
    max_gap_s: float = 1.0,
) -> list[Request]:
    """A deterministic load ramp: prompts grow and arrivals crowd towards the middle, then both ease off.

    Request ``k`` of ``n`` sits at ``u = k / (n - 1)`` with intensity ``w = 1 - |2u - 1|`` (a
    triangle: 0 at both ends, 1 in the middle). Its prompt has ``round(base_prompt + (peak_prompt -
    base_prompt) * w)`` tokens and it arrives ``max_gap_s - (max_gap_s - min_gap_s) * w`` seconds
    after request ``k - 1`` (request 0 at t = 0): the load rises to a peak of long, dense requests
    and falls back to short, sparse ones.

    Args:
        n: number of requests (>= 1).
        peak_prompt: prompt tokens at the peak.
        base_prompt: prompt tokens at both ends (1 <= base_prompt <= peak_prompt).
        max_new_tokens: tokens to generate for every request.
        min_gap_s: inter-arrival gap at the peak.
        max_gap_s: inter-arrival gap at the ends (>= min_gap_s).

    Returns:
        ``n`` requests with non-decreasing arrivals.
    """
    if n < 1 or not 1 <= base_prompt <= peak_prompt or max_new_tokens < 1 or not 0 <= min_gap_s <= max_gap_s:
        raise UserError("load_ramp: need n >= 1, 1 <= base_prompt <= peak_prompt, max_new_tokens >= 1, "
                        "0 <= min_gap_s <= max_gap_s")
    out: list[Request] = []
    t = 0.0
    for k in range(n):
        w = 1.0 - abs(2.0 * (k / (n - 1)) - 1.0) if n > 1 else 1.0
        if k > 0:
            t += max_gap_s - (max_gap_s - min_gap_s) * w
        out.append(Request(t, int(round(base_prompt + (peak_prompt - base_prompt) * w)), max_new_tokens))
    return out


@dataclass(frozen=True)
class TraceEvent:
    """One event of a run.

    Attributes:
        time_s: virtual time in seconds.
        kind: ``"arrive"``, ``"start"``, ``"finish"``, ``"convert"`` or ``"revert"``.
        ref: the request's index in the input list (arrive/start/finish) or the layer (convert/revert).
        queue_len: requests waiting after the event (the one being served is not waiting).
        max_prompt: the longest waiting prompt after the event (0 when none waits).
        converted: the DSLA layers after the event, in conversion order (oldest first).
        duration_s: for ``finish`` the measured service seconds; for ``convert``/``revert`` the wall
            seconds the swap call took (not added to the clock); else None.
    """

    time_s: float
    kind: EventKind
    ref: int
    queue_len: int
    max_prompt: int
    converted: tuple[int, ...]
    duration_s: float | None = None


@dataclass(frozen=True)
class PollRecord:
    """One poll of the policy: what it saw and what it decided.

    Attributes:
        time_s: virtual time of the poll.
        queue_prompts: prompt lengths of the waiting requests, in queue order.
        decision: the policy's decision (a swap is carried out at the same time).
        event_index: number of trace events recorded before this poll.
    """

    time_s: float
    queue_prompts: tuple[int, ...]
    decision: Decision
    event_index: int


@dataclass
class Trace:
    """The record of one :meth:`ServeRuntime.run`.

    Attributes:
        requests: the requests served, by index.
        events: every arrive/start/finish/convert/revert event, in time order.
        polls: every poll of the policy, in time order.
    """

    requests: list[Request]
    events: list[TraceEvent] = field(default_factory=list)
    polls: list[PollRecord] = field(default_factory=list)

    def swaps(self) -> list[tuple[str, int]]:
        """The ``(kind, layer)`` of every convert/revert, in order."""
        return [(e.kind, e.ref) for e in self.events if e.kind in ("convert", "revert")]

    def latencies_s(self) -> list[float]:
        """Per request (input order): finish time minus arrival time."""
        finish = {e.ref: e.time_s for e in self.events if e.kind == "finish"}
        return [finish[i] - r.arrival_s for i, r in enumerate(self.requests)]

    def summary(self) -> dict[str, Any]:
        """Headline numbers: makespan, latency (mean/p50/p95), queue wait, swap counts."""
        lat = sorted(self.latencies_s())
        start = {e.ref: e.time_s for e in self.events if e.kind == "start"}
        waits = [start[i] - r.arrival_s for i, r in enumerate(self.requests)]
        finishes = [e.time_s for e in self.events if e.kind == "finish"]

        def pct(q: float) -> float:
            return lat[min(len(lat) - 1, int(round(q * (len(lat) - 1))))] if lat else 0.0

        sw = self.swaps()
        return {
            "n_requests": len(self.requests),
            "makespan_s": max(finishes, default=0.0),
            "latency_mean_s": statistics.fmean(lat) if lat else 0.0,
            "latency_p50_s": pct(0.5),
            "latency_p95_s": pct(0.95),
            "wait_mean_s": statistics.fmean(waits) if waits else 0.0,
            "n_converts": sum(k == "convert" for k, _ in sw),
            "n_reverts": sum(k == "revert" for k, _ in sw),
            "max_converted": max((len(e.converted) for e in self.events), default=0),
            "converted_at_end": list(self.events[-1].converted) if self.events else [],
        }

    def write_jsonl(self, path: str | Path) -> None:
        """Write the events, one JSON object per line."""
        with Path(path).open("w", encoding="utf-8") as f:
            for e in self.events:
                row = asdict(e)
                row["converted"] = list(e.converted)
                f.write(json.dumps(row) + "\n")


class ServeRuntime:
    """Serve a request stream one request at a time, polling a swap policy on a virtual clock.

    Args:
        policy: the swap policy; the runtime works on a fresh copy (``policy.scaled(time_scale)``),
            available as :attr:`policy`, reset at the start of every :meth:`run`.
        convert: ``convert(layer)`` turns that layer into DSLA on the served model.
        revert: ``revert(layer)`` turns it back into softmax attention.
        serve: ``serve(request)`` runs the request on the model (prefill + decode, batch size 1)
            and returns its wall seconds (:func:`engine_serve_fn`).
        time_scale: multiplies the policy's ``cooldown_s`` and ``poll_s`` (1 = the official times).
    """

    def __init__(
        self,
        policy: SwapPolicy,
        convert: Callable[[int], None],
        revert: Callable[[int], None],
        serve: Callable[[Request], float],
        *,
        time_scale: float = 1.0,
    ) -> None:
        self.policy = policy.scaled(time_scale)
        self.time_scale = float(time_scale)
        self._convert = convert
        self._revert = revert
        self._serve = serve

    def run(self, requests: Sequence[Request], *, tail_s: float = 0.0) -> Trace:
        """Serve every request and return the trace.

        Args:
            requests: arrivals non-decreasing; a request's id in the trace is its index here.
            tail_s: keep polling up to this many virtual seconds after the last request finishes
                (the load has drained, so layers are reverted one per cooldown); the run stops
                earlier once nothing is converted. ``math.inf`` polls until everything is reverted.

        Returns:
            The :class:`Trace`.
        """
        reqs = list(requests)
        for k in range(1, len(reqs)):
            if reqs[k].arrival_s < reqs[k - 1].arrival_s:
                raise UserError(f"request {k} arrives before request {k - 1}; sort the stream by arrival")
        if tail_s < 0:
            raise UserError(f"tail_s must be >= 0, got {tail_s}")
        pol = self.policy
        pol.reset(0.0)
        trace = Trace(requests=reqs)
        queue: deque[int] = deque()
        state = {"clock": 0.0, "next_poll": 0.0, "i": 0}

        def emit(t: float, kind: EventKind, ref: int, duration: float | None = None) -> None:
            trace.events.append(TraceEvent(
                time_s=t, kind=kind, ref=ref, queue_len=len(queue),
                max_prompt=max((reqs[j].prompt_tokens for j in queue), default=0),
                converted=tuple(pol.converted), duration_s=duration))

        def admit(upto: float, *, before: bool = False) -> None:
            i = state["i"]
            while i < len(reqs) and (reqs[i].arrival_s < upto or (not before and reqs[i].arrival_s == upto)):
                queue.append(i)
                emit(reqs[i].arrival_s, "arrive", i)
                i += 1
            state["i"] = i

        def poll(t: float) -> None:
            prompts = tuple(reqs[j].prompt_tokens for j in queue)
            index = len(trace.events)
            decision = pol.step(t, prompts)
            trace.polls.append(PollRecord(t, prompts, decision, index))
            if decision.action is not None:
                assert decision.layer is not None
                w0 = time.perf_counter()
                (self._convert if decision.action == "convert" else self._revert)(decision.layer)
                emit(t, decision.action, decision.layer, time.perf_counter() - w0)
            state["next_poll"] = t + pol.poll_s

        last_finish = 0.0
        while True:
            clock = state["clock"]
            admit(clock)
            if state["next_poll"] <= clock:
                poll(clock)  # due now, or fell due while the last request ran
            if queue:
                j = queue.popleft()
                emit(clock, "start", j)
                took = float(self._serve(reqs[j]))
                if not (math.isfinite(took) and took >= 0):
                    raise ValueError(f"serve() returned {took!r} seconds for request {j}; need a finite number >= 0")
                admit(clock + took, before=True)
                clock = last_finish = clock + took
                state["clock"] = clock
                emit(clock, "finish", j, took)
                continue
            if state["i"] < len(reqs):
                state["clock"] = max(clock, min(reqs[state["i"]].arrival_s, state["next_poll"]))
                continue
            # Drained: polls go on for tail_s, while something is still converted.
            if not pol.dsla or state["next_poll"] > last_finish + tail_s:
                break
            state["clock"] = max(clock, state["next_poll"])
        return trace


class EngineServe:
    """Runs a request on a Hugging Face causal LM: random prompt ids, greedy decode with a KV cache.

    Each call draws ``prompt_tokens`` random token ids (from a generator seeded once, so a run is
    reproducible), then times ``model.generate`` (prefill + decode, batch size 1 as the official
    ``BATCH_MAX_SIZE = 1``) producing exactly ``max_new_tokens`` tokens: ``min_new_tokens`` equals
    ``max_new_tokens``, so an EOS token is never chosen and never ends a request early. CUDA is
    synchronised before and after, so the time covers the whole request.

    NOTE: the official server samples (``do_sample=True, temperature=0.7``) and stops at EOS; here
    decoding is greedy and every request generates its stated ``max_new_tokens``, so a request's cost
    depends only on its lengths (lmforge's ``generate`` engine takes text prompts and stops at EOS,
    so ``model.generate`` is used instead).

    Attributes:
        last_prompt: the prompt ids of the last request.
        last_output: the generated ids of the last request.
    """

    def __init__(self, model: nn.Module, tokenizer: Any | None = None, seed: int = 0) -> None:
        self.model = model
        vocab = int(model.config.vocab_size)
        banned: set[int] = set()
        if tokenizer is not None:
            vocab = min(vocab, len(tokenizer))
            banned = {int(i) for i in getattr(tokenizer, "all_special_ids", [])}
        allowed = [i for i in range(vocab) if i not in banned]
        if not allowed:
            raise UserError("engine_serve_fn: no non-special token ids to draw prompts from")
        self._allowed = torch.tensor(allowed, dtype=torch.long)
        self._gen = torch.Generator().manual_seed(int(seed))
        eos = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
        if eos is None:
            eos = getattr(model.config, "eos_token_id", None)
        self._eos = eos
        pad = getattr(tokenizer, "pad_token_id", None) if tokenizer is not None else None
        if pad is None:
            pad = (eos[0] if isinstance(eos, list) and eos else eos) if eos is not None else 0
        self._pad = int(pad)
        self.last_prompt: list[int] = []
        self.last_output: list[int] = []

    def __call__(self, req: Request) -> float:
        """Run ``req`` and return its wall seconds (prefill + decode)."""
        from transformers import GenerationConfig

        idx = torch.randint(len(self._allowed), (req.prompt_tokens,), generator=self._gen)
        ids = self._allowed[idx][None, :]
        device = next(self.model.parameters()).device
        ids = ids.to(device)
        cfg = GenerationConfig(max_new_tokens=req.max_new_tokens, min_new_tokens=req.max_new_tokens,
                               do_sample=False, eos_token_id=self._eos, pad_token_id=self._pad)
        sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
        with inference(self.model):
            sync()
            t0 = time.perf_counter()
            out = self.model.generate(input_ids=ids, attention_mask=torch.ones_like(ids), generation_config=cfg)
            sync()
            took = time.perf_counter() - t0
        self.last_prompt = ids[0].tolist()
        self.last_output = out[0, ids.shape[1]:].tolist()
        return took


def engine_serve_fn(model: nn.Module, tokenizer_or_none: Any | None = None, seed: int = 0) -> EngineServe:
    """A ``serve`` function for :class:`ServeRuntime` that runs requests on ``model``.

    Args:
        model: a Hugging Face causal LM (possibly with DSLA layers swapped in).
        tokenizer_or_none: its tokenizer, used only to keep special and out-of-tokenizer ids out of
            the random prompts; None draws from ``0..vocab_size - 1``.
        seed: seeds the random prompt ids.

    Returns:
        An :class:`EngineServe`: call it with a :class:`Request`, it returns the measured seconds.
    """
    return EngineServe(model, tokenizer_or_none, seed)
