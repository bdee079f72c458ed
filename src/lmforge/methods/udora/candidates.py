"""UDora's GCG-style candidate step: token gradients, top-k sampling, the token blocklist and the
retokenisation filter.

* :func:`token_gradients` — the gradient of a loss w.r.t. the one-hot matrix of the adversarial
  tokens: ``one_hot(optim_ids) @ E`` replaces the adversarial tokens' embeddings, the model runs on
  ``prefix ⊕ optim ⊕ suffix`` embeddings (or ``optim ⊕ suffix`` on top of a prefix KV cache), and
  ``∂loss/∂one_hot`` (n_optim, vocab) comes back. Row ``i`` of it equals ``E @ ∂loss/∂e_i``.
* :func:`sample_candidates` — ``search_width`` copies of the current ids, each with ``n_replace``
  distinct random positions set to a uniformly drawn token among the ``topk`` largest entries of
  ``-grad`` at that position; blocked ids get ``+inf`` gradient first so they are never drawn. The
  random draws (``rand`` for positions, then ``randint`` for the top-k slots) are made in the official
  order, so with the global generator seeded alike the candidates equal the official ones.
* :func:`ascii_blocklist` — ids whose single-token decode is not printable ASCII, plus the BOS, EOS,
  PAD and UNK ids (only ids below ``tokenizer.vocab_size`` are examined, as the official does: added
  tokens beyond it, e.g. Llama-3's reserved specials, stay allowed).
* :func:`filter_retokenization` — drops candidates whose ``batch_decode`` does not re-encode
  (``add_special_tokens=False``) to exactly the same ids; raises when none survives.

Follows the official ``udora/attack.py`` (``UDora.compute_token_gradient``, ``sample_ids_from_grad``,
``filter_ids``) and ``udora/utils.py`` (``get_nonascii_toks``) of AI-secure/UDora (MIT), which are
nanoGCG's functions of the same names; checked against nanoGCG 0.3.0's wheel source (``gcg.py``,
``utils.py``), which is identical for these. Nothing is imported from nanogcg; it installs with
``--no-deps`` (its metadata pins ``transformers<=4.47.1``) and is the reference of
``tests/methods/udora/test_nanogcg_reference.py`` (same candidates from equally seeded generators). Official defaults:
``UDoraConfig`` ``search_width=512, topk=256, n_replace=1, allow_non_ascii=False, filter_ids=True``;
the InjecAgent script passes ``search_width=256, topk=64`` (webshop.py 128/32, agentharm.py 256/64).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

import torch


def ascii_blocklist(tokenizer: Any, device: str | torch.device = "cpu") -> torch.Tensor:
    """Ids never to sample: non-printable-ASCII single-token decodes, and the BOS/EOS/PAD/UNK ids."""
    blocked: list[int] = []
    for i in range(tokenizer.vocab_size):
        text = tokenizer.decode([i])
        if not (text.isascii() and text.isprintable()):
            blocked.append(i)
    for special in (tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.unk_token_id):
        if special is not None:
            blocked.append(int(special))
    # NOTE: sorted and deduplicated (the official list may repeat a special id); as an index set the
    # two are the same.
    return torch.tensor(sorted(set(blocked)), dtype=torch.long, device=device)


def sample_candidates(
    optim_ids: torch.Tensor,
    grad: torch.Tensor,
    search_width: int,
    topk: int = 256,
    n_replace: int = 1,
    not_allowed_ids: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
) -> torch.Tensor:
    """(search_width, n_optim) candidate ids; ``generator=None`` draws from torch's global generator."""
    ids = optim_ids.reshape(-1)
    grad = grad.reshape(ids.shape[0], -1)
    n_optim, vocab = grad.shape
    if not 1 <= n_replace <= n_optim:
        raise ValueError(f"n_replace must be in [1, {n_optim}], got {n_replace}")
    # NOTE: the official writes +inf into the caller's gradient in place; a copy is changed here.
    grad = grad.clone()
    if not_allowed_ids is not None and not_allowed_ids.numel():
        blocked = not_allowed_ids.to(grad.device).long()
        grad[:, blocked] = float("inf")
        n_allowed = vocab - int(torch.unique(blocked).numel())
    else:
        n_allowed = vocab
    if not 1 <= topk <= n_allowed:
        # NOTE: the official would silently let blocked ids into the top-k when topk exceeds the number
        # of allowed ids; refused here instead.
        raise ValueError(f"topk must be in [1, {n_allowed}] (allowed ids), got {topk}")
    top = (-grad).topk(topk, dim=1).indices  # (n_optim, topk)
    positions = torch.argsort(torch.rand((search_width, n_optim), device=grad.device, generator=generator))[..., :n_replace]
    slots = torch.randint(0, topk, (search_width, n_replace, 1), device=grad.device, generator=generator)
    values = torch.gather(top[positions], 2, slots).squeeze(2)
    return ids.to(grad.device).repeat(search_width, 1).scatter_(1, positions, values)


def retokenization_stable(tokenizer: Any, candidate_ids: torch.Tensor) -> torch.Tensor:
    """Bool mask: which rows survive ``batch_decode`` then encoding without special tokens unchanged."""
    texts = tokenizer.batch_decode(candidate_ids)
    keep = []
    for row, text in zip(candidate_ids, texts):
        again = tokenizer(text, return_tensors="pt", add_special_tokens=False)["input_ids"][0].to(row.device)
        keep.append(bool(torch.equal(row, again)))
    return torch.tensor(keep, dtype=torch.bool, device=candidate_ids.device)


def filter_retokenization(tokenizer: Any, candidate_ids: torch.Tensor) -> torch.Tensor:
    """The retokenisation-stable rows of ``candidate_ids`` (order kept); RuntimeError if none is."""
    mask = retokenization_stable(tokenizer, candidate_ids)
    if not bool(mask.any()):
        raise RuntimeError("No candidate token sequence is unchanged by decoding and re-encoding; "
                           "disable the filter or start from a different adversarial string.")
    return candidate_ids[mask]


def _batch1(x: torch.Tensor | None, dim: int, like: torch.Tensor) -> torch.Tensor:
    if x is None:
        return like.new_zeros((1, 0, dim))
    if x.dim() == 2:
        x = x.unsqueeze(0)
    if x.dim() != 3 or x.shape[0] != 1 or x.shape[-1] != dim:
        raise ValueError(f"embeddings must be (1, len, {dim}) or (len, {dim}), got {tuple(x.shape)}")
    return x.to(dtype=like.dtype, device=like.device)


def token_gradients(
    model: torch.nn.Module,
    embed_matrix: torch.Tensor,
    optim_ids: torch.Tensor,
    prefix_embeds: torch.Tensor | None,
    suffix_embeds: torch.Tensor | None,
    loss_fn: Callable[[torch.Tensor], torch.Tensor],
    past_key_values: Any = None,
) -> torch.Tensor:
    """``∂ loss_fn(logits) / ∂ one_hot(optim_ids)``, shape (n_optim, vocab).

    ``embed_matrix`` is the model's input embedding weight (vocab, dim). Without ``past_key_values``
    the model sees ``prefix ⊕ optim ⊕ suffix`` and ``loss_fn`` gets the logits of all of it; with a
    KV cache of the prefix it sees ``optim ⊕ suffix`` and the logits cover only those positions
    (``prefix_embeds`` is then ignored). ``loss_fn`` must return a one-element tensor (e.g.
    ``gradient_loss(...)`` on batch 1). For several prompts the official differentiates the mean loss;
    by linearity that is the mean of this function's per-prompt results.
    """
    vocab, dim = embed_matrix.shape
    ids = optim_ids.reshape(1, -1).to(embed_matrix.device)
    one_hot = torch.nn.functional.one_hot(ids, num_classes=vocab).to(embed_matrix.dtype)
    one_hot.requires_grad_(True)
    optim_embeds = one_hot @ embed_matrix
    suffix = _batch1(suffix_embeds, dim, optim_embeds)
    if past_key_values is not None:
        # NOTE: transformers' Cache objects grow in place when forwarded; the official (written for the
        # legacy tuple caches) reuses its prefix cache as is, here a copy is forwarded instead.
        out = model(inputs_embeds=torch.cat([optim_embeds, suffix], dim=1),
                    past_key_values=copy.deepcopy(past_key_values), use_cache=True)
    else:
        prefix = _batch1(prefix_embeds, dim, optim_embeds)
        out = model(inputs_embeds=torch.cat([prefix, optim_embeds, suffix], dim=1))
    loss = loss_fn(out.logits)
    if loss.numel() != 1:
        raise ValueError(f"loss_fn must return one value, got shape {tuple(loss.shape)}")
    if not loss.requires_grad:
        # NOTE: with no target in the surrogate (an empty trace, or before_negative stopping at its first
        # token) the official loss is the constant 0 and autograd raises; a zero gradient is returned.
        return torch.zeros(ids.shape[1], vocab, dtype=embed_matrix.dtype, device=embed_matrix.device)
    (grad,) = torch.autograd.grad(loss.reshape(()), one_hot)
    return grad[0]
