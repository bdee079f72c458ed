"""DSLA-Serve's load-driven swap policy: convert one layer under high load, revert one under low load.

Follows ``model_swap_monitor`` in the official ``src/server.py`` (utnslab/DSLA-Serve), whose
constants are the defaults here: ``MAX_PROMPT_TOKENS_IN_QUEUE_FOR_SWAP = 1024``,
``MAX_QUEUE_SIZE_FOR_SWAP = 50``, ``SWAP_COOLDOWN = 60``, ``MAX_CONV_RATE = 0.75``, a 5 s poll
(``asyncio.sleep(5)``) and the revert fractions 0.8 and 0.5 written inline there. Each poll:

1. **Cooldown.** If ``now - last_swap < cooldown_s``: nothing. ``last_swap`` starts at start-up
   (the official ``LAST_SWAP_TIME = time.time()`` runs when the server module loads), so the first
   swap can come ``cooldown_s`` after start, and it is reset by every swap (not by a poll that
   did nothing). At exactly ``cooldown_s`` the poll may act (the check is ``<``).
2. **Convert** when the longest queued prompt is ``>= max_prompt_tokens`` or at least
   ``max_pending`` requests are queued: the next layer of the conversion order is converted,
   provided one is left and ``converted / n_layers < max_conv_rate`` (else nothing; the cooldown
   is not reset).
3. **Revert** (``elif``) when the longest queued prompt is ``< revert_prompt_frac *
   max_prompt_tokens`` (819.2 tokens) **and** fewer than ``revert_pending_frac * max_pending`` (25)
   are queued **and** some layer is converted: the most recently converted layer goes back
   (LIFO): the official lists are ``layers_in_dsla.insert(0, l)`` / ``layers_in_dsla.pop(0)`` and the
   reverted layer is put back at the front of ``layers_in_transformer``, so it is the next one
   converted again.
4. Otherwise nothing.

The queue is the requests waiting for the model (the official ``request_queue``; the request being
generated has already been taken off it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from lmforge.common.errors import UserError

Action = Literal["convert", "revert"]


@dataclass(frozen=True)
class Decision:
    """What one poll of the policy decided.

    Attributes:
        action: ``"convert"``, ``"revert"`` or None (nothing to do).
        layer: the layer converted or reverted; None when ``action`` is None.
        reason: a short human-readable reason, e.g. ``"cooldown"`` or ``"high load: max prompt 1024 >= 1024"``.
    """

    action: Action | None
    layer: int | None
    reason: str


@dataclass
class SwapPolicy:
    """The official DSLA-Serve swap monitor as a pure, clock-driven state machine.

    Attributes:
        n_layers: number of decoder layers (the denominator of the conversion rate).
        order: the conversion order (first converted first), e.g. from
            :func:`lmforge.methods.dsla.order.entropy_order`; None means the official fallback
            ``n_layers - 1, ..., 0``. May list a subset of the layers.
        max_prompt_tokens: convert when the longest queued prompt has at least this many tokens.
        max_pending: convert when at least this many requests are queued.
        revert_prompt_frac: revert only when the longest queued prompt is below this fraction of
            ``max_prompt_tokens``...
        revert_pending_frac: ...and fewer than this fraction of ``max_pending`` are queued.
        cooldown_s: no swap within this many seconds of the last swap (or of start-up).
        max_conv_rate: convert only while ``converted / n_layers`` is below this.
        poll_s: seconds between polls (used by the runtime that drives :meth:`step`).

    State (reset by :meth:`reset`): ``remaining`` (the official ``layers_in_transformer``: layers
    still to convert, next first), ``dsla`` (the official ``layers_in_dsla``: converted layers,
    most recent first) and ``last_swap_s``.
    """

    n_layers: int
    order: list[int] | None = None
    max_prompt_tokens: int = 1024
    max_pending: int = 50
    revert_prompt_frac: float = 0.8
    revert_pending_frac: float = 0.5
    cooldown_s: float = 60.0
    max_conv_rate: float = 0.75
    poll_s: float = 5.0
    remaining: list[int] = field(init=False, repr=False)
    dsla: list[int] = field(init=False, repr=False)
    last_swap_s: float = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.n_layers, bool) or not isinstance(self.n_layers, int) or self.n_layers < 1:
            raise UserError(f"SwapPolicy: n_layers must be an integer >= 1, got {self.n_layers!r}")
        if self.order is None:
            self.order = list(range(self.n_layers - 1, -1, -1))
        self.order = [int(i) for i in self.order]
        bad = [i for i in self.order if not 0 <= i < self.n_layers]
        if bad:
            raise UserError(f"SwapPolicy: order has layer(s) {bad} outside 0..{self.n_layers - 1}")
        if len(set(self.order)) != len(self.order):
            raise UserError("SwapPolicy: order lists a layer more than once")
        if self.max_prompt_tokens < 1 or self.max_pending < 1:
            raise UserError("SwapPolicy: max_prompt_tokens and max_pending must be >= 1")
        if not (0 < self.revert_prompt_frac <= 1 and 0 < self.revert_pending_frac <= 1):
            raise UserError("SwapPolicy: revert_prompt_frac and revert_pending_frac must be in (0, 1]")
        if not 0 < self.max_conv_rate <= 1:
            raise UserError(f"SwapPolicy: max_conv_rate must be in (0, 1], got {self.max_conv_rate}")
        if self.cooldown_s < 0 or self.poll_s <= 0:
            raise UserError("SwapPolicy: cooldown_s must be >= 0 and poll_s > 0")
        self.reset(0.0)

    def reset(self, now: float = 0.0) -> None:
        """Start afresh at time ``now`` (start-up): nothing converted, the cooldown running from ``now``."""
        assert self.order is not None
        self.remaining = list(self.order)
        self.dsla = []
        self.last_swap_s = float(now)

    @property
    def converted(self) -> list[int]:
        """The converted layers in the order they were converted (oldest first)."""
        return self.dsla[::-1]

    @property
    def max_converted(self) -> int:
        """How many layers the cap lets convert: the least ``k`` with ``k / n_layers >= max_conv_rate``
        (all of ``order`` if fewer)."""
        k = 0
        while k < len(self.order or []) and k / self.n_layers < self.max_conv_rate:
            k += 1
        return k

    def scaled(self, factor: float) -> SwapPolicy:
        """A fresh copy (state reset) with ``cooldown_s`` and ``poll_s`` multiplied by ``factor``.

        Args:
            factor: > 0; e.g. 0.01 turns the official 60 s cooldown and 5 s poll into 0.6 s and 0.05 s.
        """
        if not factor > 0:
            raise UserError(f"time scale must be > 0, got {factor}")
        return dataclasses.replace(self, order=list(self.order or []), cooldown_s=self.cooldown_s * factor,
                                   poll_s=self.poll_s * factor)

    def step(self, now: float, queue_prompt_lengths: Sequence[int]) -> Decision:
        """Poll once at time ``now`` with the queued requests' prompt lengths; apply the decision to the state.

        The caller must carry out a ``"convert"``/``"revert"`` decision on the model before the next
        request runs (the state already counts it, and ``last_swap_s`` is set to ``now``).

        Args:
            now: the current time in seconds (any clock, as long as it matches :meth:`reset`'s).
            queue_prompt_lengths: prompt tokens of each request waiting in the queue (not the one
                being served).

        Returns:
            The :class:`Decision`.
        """
        max_prompt = max(queue_prompt_lengths, default=0)
        pending = len(queue_prompt_lengths)
        if now - self.last_swap_s < self.cooldown_s:
            return Decision(None, None, "cooldown")
        if max_prompt >= self.max_prompt_tokens or pending >= self.max_pending:
            why = (f"max prompt {max_prompt} >= {self.max_prompt_tokens}" if max_prompt >= self.max_prompt_tokens
                   else f"pending {pending} >= {self.max_pending}")
            # NOTE: the official test is on the count *before* converting (len(layers_in_dsla)/32 <
            # MAX_CONV_RATE), so the last conversion may take the rate past max_conv_rate: it stops at
            # 24 of 32 layers (exactly 75%) but at 23 of 30 (76.7%). We keep that rule; we divide by
            # n_layers where the official code hard-codes 32 (Llama-3.1-8B), the same for 32 layers.
            if self.remaining and len(self.dsla) / self.n_layers < self.max_conv_rate:
                layer = self.remaining.pop(0)
                self.dsla.insert(0, layer)
                self.last_swap_s = float(now)
                return Decision("convert", layer, f"high load: {why}")
            return Decision(None, None, f"high load ({why}) but conversion cap reached "
                                        f"({len(self.dsla)}/{self.n_layers} converted)")
        if (max_prompt < self.max_prompt_tokens * self.revert_prompt_frac
                and pending < self.max_pending * self.revert_pending_frac and self.dsla):
            layer = self.dsla.pop(0)
            self.remaining.insert(0, layer)
            self.last_swap_s = float(now)
            return Decision("revert", layer, f"low load: max prompt {max_prompt} < "
                                             f"{self.max_prompt_tokens * self.revert_prompt_frac:g} and pending "
                                             f"{pending} < {self.max_pending * self.revert_pending_frac:g}")
        return Decision(None, None, "steady" if self.dsla else "steady (nothing converted)")
