"""UDora's candidate target placements in a reasoning trace, and the surrogate response built from them.

Given the agent's greedy reasoning trace ``y`` (token ids) with the next-token distribution at every
generated position (``probs[k]`` is the distribution the model emitted ``y[k]`` from), UDora scores, for
every position ``i`` and every target string ``t``, how close the model already is to writing ``t``
instead of ``y[i:]``:

1. splice ``t`` in front of ``y[i]``: decode ``y[:i]``, merge it with ``t`` on their longest overlap
   (the longest suffix of the decoded prefix that is a prefix of ``t``; see :func:`merge_overlap`),
   with a space before ``t`` when ``add_space_before_target`` is on and ``y[i]``'s token string starts
   with ``Ġ`` (or a space), and re-encode the merged text;
2. the spliced target's tokens start ``d`` tokens before ``i``: ``d = 1`` when the merge overlapped,
   otherwise the number of positions where the re-encoded prefix differs from ``y[:i]``;
3. with ``start = i - d`` and target tokens ``t_0 .. t_{L-1}``, walk ``j = 0, 1, ...`` while
   ``start + j`` is still inside the trace, collecting ``probs[start + j][t_j]`` and counting a match
   while ``argmax probs[start + j] == t_j``; the first mismatch is collected, then the walk stops;
4. ``score = (m + p̄) / (L + 1)`` with ``m`` the matches and ``p̄`` the mean collected probability.

``before_negative`` stops the scan (all later positions too) at the first position whose next two
tokens decode to a first word ``cannot`` or ``can't``.

The chosen intervals (``scheduling.py``) give the surrogate response ``y[:s1] t1 y[e1:s2] t2 ...``,
cut after the last target, which the attack then optimises for.

Follows the official ``udora/text_processing.py`` (``build_target_intervals``,
``_compute_interval_score``), ``udora/utils.py`` (``combine_with_overlap``) and ``udora/scheduling.py``
(``build_final_token_sequence``) of AI-secure/UDora (MIT), written anew; kept quirks and deviations
are marked ``NOTE:``. The official defaults are ``add_space_before_target=False`` and
``before_negative=False`` (``UDoraConfig``); the README's runs all pass ``--add_space_before_target``.

Libraries checked: nanoGCG (UDora's base) optimises a fixed target at a fixed place and has none of
this.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from lmforge.methods.udora.scheduling import Interval

NEGATIVE_WORDS = ("cannot", "can't")
SPACE_MARKERS = ("Ġ", " ")  # token-string prefixes that mean "this token starts with a space"


def merge_overlap(preceding: str, target: str) -> tuple[str, bool]:
    """``preceding`` followed by ``target``, merged on the longest suffix of ``preceding`` that is a
    prefix of ``target``; the flag says whether any (non-empty) overlap was found."""
    for cut in range(len(preceding)):
        tail = preceding[cut:]
        if target.startswith(tail):
            return preceding + target[len(tail):], True
    return preceding + target, False


def _as_table(probs: Any) -> torch.Tensor:
    """A (positions, vocab) tensor from a 2-D tensor or a list of 1-D per-position tensors."""
    if isinstance(probs, torch.Tensor):
        table = probs
    else:
        table = torch.stack([torch.as_tensor(p).reshape(-1) for p in probs]) if len(probs) else torch.zeros(0, 0)
    if table.dim() == 3 and table.shape[1] == 1:  # generate()'s scores: (steps, 1, vocab)
        table = table[:, 0]
    if table.dim() != 2:
        raise ValueError(f"probs must be (positions, vocab), got shape {tuple(table.shape)}")
    return table.detach()


def match_score(
    target_ids: Sequence[int],
    probs: Any,
    start: int,
    n_positions: int | None = None,
    argmax: Sequence[int] | None = None,
) -> tuple[float, int] | None:
    """``(score, num_matched)`` of the target tokens laid over the trace from position ``start``.

    ``probs`` is the (positions, vocab) table of next-token probabilities (``probs[k]`` predicts trace
    token ``k``); ``n_positions`` is the trace length (default ``len(probs)``: the official table may
    carry one more row than the trace when a final EOS was stripped, and only trace positions count).
    ``argmax`` may pass the per-row argmax precomputed. ``None`` when no position could be scored.
    """
    table = _as_table(probs)
    if n_positions is None:
        n_positions = table.shape[0]
    if argmax is None:
        argmax = table.argmax(dim=-1).tolist() if table.numel() else []
    length = len(target_ids)
    collected: list[float] = []
    matched = 0
    for j in range(min(length, n_positions - start)):
        k = start + j
        if k < 0 or k >= table.shape[0]:
            break
        tid = int(target_ids[j])
        collected.append(float(table[k, tid]))
        if argmax[k] != tid:
            break
        matched += 1
    if not collected:
        return None
    mean_prob = sum(collected) / len(collected)
    return (matched + mean_prob) / (length + 1), matched


def _starts_with_space(tokenizer: Any, token_id: int) -> bool:
    token = tokenizer.convert_ids_to_tokens(int(token_id))
    # NOTE: as the official, only a byte-level BPE's "Ġ" (or a literal space) counts; SentencePiece's
    # "▁" does not, so with such tokenizers the space rule never fires.
    return isinstance(token, str) and token.startswith(SPACE_MARKERS)


def splice_target(
    tokenizer: Any,
    trace_ids: Sequence[int],
    position: int,
    target_text: str,
    add_space_before_target: bool = False,
) -> tuple[int, tuple[int, ...]]:
    """``(start, target_ids)``: where, and as which tokens, ``target_text`` lands when spliced in front
    of trace token ``position`` (steps 1-2 of the module docstring)."""
    trace_ids = [int(t) for t in trace_ids]
    prefix_ids = trace_ids[:position]
    prefix_text = tokenizer.decode(prefix_ids, skip_special_tokens=False)
    text = target_text
    if add_space_before_target and position < len(trace_ids) and _starts_with_space(tokenizer, trace_ids[position]):
        text = " " + target_text
    merged, overlapped = merge_overlap(prefix_text, text)
    merged_ids = tokenizer.encode(merged, add_special_tokens=False)
    if overlapped:
        # NOTE: as the official, an overlap is assumed to change exactly the prefix's last token.
        shift = 1
    else:
        shift = sum(1 for a, b in zip(merged_ids[:position], prefix_ids) if a != b)
    start = position - shift
    return start, tuple(int(t) for t in merged_ids[start:])


def stops_at_negative(tokenizer: Any, trace_ids: Sequence[int], position: int) -> bool:
    """``before_negative``'s test: the first word of ``decode(trace[position:position+2])`` is a refusal."""
    words = tokenizer.decode([int(t) for t in trace_ids[position:position + 2]]).strip().split()
    return bool(words) and words[0] in NEGATIVE_WORDS


def collect_intervals(
    trace_ids: Sequence[int],
    targets: Sequence[str],
    tokenizer: Any,
    probs: Any,
    add_space_before_target: bool = False,
    before_negative: bool = False,
) -> list[Interval]:
    """Every scored placement of every target at every trace position, in the official order
    (position-major, then target order), which the scheduler's stable sort relies on for ties."""
    trace_ids = [int(t) for t in trace_ids]
    table = _as_table(probs)
    argmax = table.argmax(dim=-1).tolist() if table.numel() else []
    n = len(trace_ids)
    found: list[Interval] = []
    for i in range(n):
        if before_negative and stops_at_negative(tokenizer, trace_ids, i):
            break
        for t_index, target_text in enumerate(targets):
            start, target_ids = splice_target(tokenizer, trace_ids, i, target_text, add_space_before_target)
            scored = match_score(target_ids, table, start, n_positions=n, argmax=argmax)
            if scored is None:
                continue
            score, matched = scored
            found.append(Interval(start=start, end=start + len(target_ids), score=score,
                                  target_ids=target_ids, num_matched=matched,
                                  target_index=t_index, target_text=target_text))
    return found


def surrogate_segments(trace_ids: Sequence[int], chosen: Sequence[Interval]) -> list[list[int]]:
    """The official alternating list ``[y[:s1], t1, y[e1:s2], t2, ...]`` (contexts may be empty);
    ``chosen`` must be non-overlapping and in trace order, as :func:`select_intervals` returns them."""
    trace_ids = [int(t) for t in trace_ids]
    segments: list[list[int]] = []
    prev_end = 0
    for iv in chosen:
        if iv.start < prev_end:
            raise ValueError(f"intervals overlap or are out of order: start {iv.start} < previous end {prev_end}")
        segments.append(trace_ids[prev_end:iv.start])
        segments.append(list(iv.target_ids))
        prev_end = iv.end
    return segments


def build_surrogate(trace_ids: Sequence[int], chosen: Sequence[Interval]) -> tuple[list[int], list[tuple[int, int]]]:
    """``(surrogate_ids, spans)``: the surrogate response (cut after the last target) and each target's
    ``[start, end)`` inside it, in order (target ``k`` of the spans gets weight ``w**k`` in the losses)."""
    ids: list[int] = []
    spans: list[tuple[int, int]] = []
    for k, segment in enumerate(surrogate_segments(trace_ids, chosen)):
        if k % 2 == 1:
            spans.append((len(ids), len(ids) + len(segment)))
        ids.extend(segment)
    return ids, spans
