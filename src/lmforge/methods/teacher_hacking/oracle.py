"""The oracle of the teacher-hacking setup: a known sequence distribution with exact log-probs.

Tiapkin et al., "On Teacher Hacking in Language Model Distillation" (ICML 2025, arXiv 2502.02671)
use a large LM as the oracle, so that the "golden" distance KL(oracle‖student) can be measured. Here
the oracle is a topic-conditioned sparse Markov chain over a tiny vocabulary (no library offers such a
toy; it is written by hand in numpy/torch): the prompt's first token picks one of ``n_topics``
transition matrices, the response is a first-order chain started from the prompt's last token, and
it ends with EOS (id 0), forced after ``max_response_len`` symbols. Because every sequence
probability is a product of table entries, ``log_prob`` is exact, and a tiny instance can be
enumerated to check that the probabilities sum to one.

Token ids are the oracle's own (no BPE): 0 is EOS, 1..n_symbols are symbols, so the teacher and
student log-probs of the same token sequence compare directly with the oracle's.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np
import torch

EOS = 0


@dataclass
class SequenceBatch:
    """Prompts and responses of equal shapes across a batch.

    Attributes:
        prompts: ``[n, prompt_len]`` long tensor of symbol ids (no EOS).
        responses: ``[n, max_response_len + 1]`` long tensor; the first EOS ends the response and
            every slot after it is EOS too (padding, masked out by :attr:`mask`).
        mask: ``[n, max_response_len + 1]`` bool tensor, True on response tokens up to and including
            the first EOS.
    """

    prompts: torch.Tensor
    responses: torch.Tensor
    mask: torch.Tensor

    def __len__(self) -> int:
        return int(self.prompts.shape[0])

    def index(self, idx: torch.Tensor | slice) -> "SequenceBatch":
        """The rows ``idx``."""
        return SequenceBatch(self.prompts[idx], self.responses[idx], self.mask[idx])

    def lengths(self) -> torch.Tensor:
        """Number of response tokens, EOS included."""
        return self.mask.sum(-1)

    @staticmethod
    def cat(batches: list["SequenceBatch"]) -> "SequenceBatch":
        """Rows of several batches stacked."""
        return SequenceBatch(torch.cat([b.prompts for b in batches]), torch.cat([b.responses for b in batches]),
                             torch.cat([b.mask for b in batches]))


def response_mask(responses: torch.Tensor) -> torch.Tensor:
    """True on every token up to and including the first EOS of each row."""
    is_eos = responses == EOS
    before = torch.cumsum(is_eos.long(), dim=-1) - is_eos.long()  # EOS seen strictly before this slot
    return before == 0


class MarkovOracle:
    """A topic-conditioned sparse first-order Markov chain with an EOS: exact sequence log-probs.

    Args:
        n_symbols: number of non-EOS tokens; the vocabulary is ``n_symbols + 1`` with EOS = 0.
        n_topics: number of transition matrices; the prompt's first token selects
            ``topic = (prompt[0] - 1) % n_topics``.
        branching: symbols with non-zero probability after each symbol (sparsity of a row).
        eos_prob: (low, high) range of the per-row EOS probability.
        prompt_len: prompt length in symbols.
        max_response_len: longest response in symbols; EOS is forced after it.
        alpha: Dirichlet concentration of a row's weights over its support (small = peaked rows).
        seed: seed of the random tables.
    """

    def __init__(self, n_symbols: int = 20, n_topics: int = 4, branching: int = 4,
                 eos_prob: tuple[float, float] = (0.05, 0.2), prompt_len: int = 3, max_response_len: int = 16,
                 alpha: float = 0.7, seed: int = 0) -> None:
        if n_symbols < 2 or n_topics < 1 or not 1 <= branching <= n_symbols:
            raise ValueError("need n_symbols >= 2, n_topics >= 1 and 1 <= branching <= n_symbols")
        if not 0.0 < eos_prob[0] <= eos_prob[1] < 1.0:
            raise ValueError("eos_prob must be a range inside (0, 1)")
        if prompt_len < 1 or max_response_len < 1:
            raise ValueError("prompt_len and max_response_len must be at least 1")
        self.n_symbols, self.n_topics, self.prompt_len, self.max_response_len = n_symbols, n_topics, prompt_len, \
            max_response_len
        self.vocab_size = n_symbols + 1
        rng = np.random.default_rng(seed)
        # table[k, prev, next]: row `prev` (a symbol id, row 0 unused) of topic k, over the whole vocabulary.
        table = np.zeros((n_topics, self.vocab_size, self.vocab_size))
        for k in range(n_topics):
            for prev in range(1, self.vocab_size):
                support = rng.choice(np.arange(1, self.vocab_size), size=branching, replace=False)
                eos = rng.uniform(*eos_prob)
                table[k, prev, support] = (1 - eos) * rng.dirichlet(np.full(branching, alpha))
                table[k, prev, EOS] = eos
            table[k, EOS, EOS] = 1.0  # never used; keeps rows normalised
        self.table = torch.tensor(table, dtype=torch.float64)
        with np.errstate(divide="ignore"):
            self.log_table = torch.tensor(np.log(table), dtype=torch.float64)

    # ----------------------------------------------------------------------------------------
    def topics(self, prompts: torch.Tensor) -> torch.Tensor:
        """The topic each prompt selects."""
        return (prompts[:, 0] - 1) % self.n_topics

    def sample_prompts(self, n: int, generator: torch.Generator) -> torch.Tensor:
        """``n`` prompts, each symbol uniform over 1..n_symbols."""
        return torch.randint(1, self.vocab_size, (n, self.prompt_len), generator=generator)

    def next_token_probs(self, prompts: torch.Tensor, prefix: torch.Tensor) -> torch.Tensor:
        """``[n, vocab]`` probabilities of the next response token after ``prefix`` (``[n, t]``, no EOS inside)."""
        prev = prefix[:, -1] if prefix.shape[1] else prompts[:, -1]
        probs = self.table[self.topics(prompts), prev].clone()
        if prefix.shape[1] >= self.max_response_len:  # the length cap forces EOS
            probs.zero_()
            probs[:, EOS] = 1.0
        return probs

    def sample(self, n: int, generator: torch.Generator, prompts: torch.Tensor | None = None) -> SequenceBatch:
        """``n`` responses (to ``prompts``, or to fresh prompts), one per prompt."""
        if prompts is None:
            prompts = self.sample_prompts(n, generator)
        if prompts.shape[0] != n or prompts.shape[1] != self.prompt_len:
            raise ValueError(f"prompts must be [{n}, {self.prompt_len}], got {list(prompts.shape)}")
        topics = self.topics(prompts)
        prev = prompts[:, -1].clone()
        out = torch.full((n, self.max_response_len + 1), EOS, dtype=torch.long)
        done = torch.zeros(n, dtype=torch.bool)
        for t in range(self.max_response_len):
            tok = torch.multinomial(self.table[topics, prev], 1, generator=generator).squeeze(-1)
            tok = torch.where(done, torch.full_like(tok, EOS), tok)
            out[:, t] = tok
            done |= tok == EOS
            prev = torch.where(done, prev, tok)
        # Slot max_response_len stays EOS: the cap forces it (probability 1 in log_prob).
        return SequenceBatch(prompts, out, response_mask(out))

    def token_log_probs(self, batch: SequenceBatch) -> torch.Tensor:
        """``[n, max_response_len + 1]`` exact log-probs of each response token (0 on padding and on a forced EOS)."""
        topics = self.topics(batch.prompts)
        prev = torch.cat([batch.prompts[:, -1:], batch.responses[:, :-1]], dim=1)
        lp = self.log_table[topics[:, None], prev, batch.responses]
        lp[:, self.max_response_len] = 0.0  # EOS after the cap has probability 1
        return torch.where(batch.mask, lp, torch.zeros_like(lp))

    def log_prob(self, batch: SequenceBatch) -> torch.Tensor:
        """Exact ``log p(response | prompt)`` per row (float64)."""
        return self.token_log_probs(batch).sum(-1)

    def entropy_mc(self, n: int, generator: torch.Generator) -> float:
        """A Monte-Carlo estimate of the mean response entropy (nats per sequence)."""
        return float(-self.log_prob(self.sample(n, generator)).mean())

    def enumerate_responses(self, prompt: torch.Tensor) -> SequenceBatch:
        """Every possible response to one prompt (only for tiny ``n_symbols`` and ``max_response_len``)."""
        rows = []
        for length in range(self.max_response_len + 1):
            for syms in itertools.product(range(1, self.vocab_size), repeat=length):
                rows.append(list(syms) + [EOS] * (self.max_response_len + 1 - length))
        if len(rows) > 200_000:
            raise ValueError("too many responses to enumerate")
        responses = torch.tensor(rows, dtype=torch.long)
        prompts = prompt.reshape(1, -1).expand(len(rows), -1)
        return SequenceBatch(prompts.clone(), responses, response_mask(responses))
