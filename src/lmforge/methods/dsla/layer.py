"""The DSLA layer: dual-state gated linear attention, a drop-in for a Llama attention module.

Ro et al., "On-the-Fly Adaptive Distillation of Transformer to Dual-State Linear Attention for
Long-Context LLM Serving" (ICML 2025). What is implemented here, and from which official file of
https://github.com/utnslab/DSLA-Serve:

* ``src/layer.py`` (``DualStateLinearAttention``): the layer itself. It takes over the teacher's
  q/k/v/o projections, applies NO rotary embedding (the official layer builds one and never uses
  it), no feature map and no normaliser, and keeps two gated-linear-attention states per head whose
  per-key-dimension log-gates are ``clamp_min(logsigmoid(W^i x + b^i) / 16, -50)``; ``gk_proj``
  (``W^1``) starts as the identity with bias 0, ``gk_proj2`` (``W^2``) with ``nn.Linear``'s default
  initialisation and bias 0; the two outputs are mixed by ``softmax(alpha)``, ``alpha ~ U(0, 1)``
  (the official parameter is called ``alpha_list``; here it is ``alpha``). The states are the decode
  cache.
* ``src/small_fla.py`` (``fused_recurrent_gla``, a trimmed copy of flash-linear-attention): the GLA
  recurrence ``S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t``, ``o_t = scale * q_t S_t`` with the
  default ``scale = d_k ** -0.5``, evaluated in float32.

flash-linear-attention (``fla``, fla-org/flash-linear-attention) was checked: its GLA kernels
(``fused_recurrent``, ``chunk``) are Triton, i.e. GPU-only, and its ``naive_recurrent_gla`` is the
same loop as :func:`gla_recurrent`. The CPU forms are therefore written here: :func:`gla_recurrent`
(the reference loop, used for single-token decode) and :func:`gla_chunked` (the chunked parallel
form for prefill and training, equal to the loop to float64 round-off).

Added here (the official code assumes multi-head attention and has no mask handling):
grouped-query attention (:func:`expand_kv_weight` expands ``k_proj``/``v_proj`` exactly as
transformers' ``repeat_kv`` expands keys and values), a clear error for padded batches, a cache
layer that keeps transformers' ``Cache`` consistent (:class:`DSLACacheLayer`), and the optional
:func:`energy_rescale_`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers.cache_utils import Cache, DynamicLayer

__all__ = [
    "DSLACacheLayer",
    "DSLAConfig",
    "DualStateLinearAttention",
    "dsla_cache_layer",
    "energy_rescale_",
    "expand_kv_weight",
    "gla_chunked",
    "gla_recurrent",
]

# Sub-block length inside a chunk of gla_chunked (see there): decays between sub-blocks go through
# matrix products, only the diagonal sub-blocks need the explicit [s, s, d_k] decay tensor.
_SUB_BLOCK = 16
# Target size (elements) of the largest temporary of one slice of gla_chunked's intra-chunk part.
_SLICE_ELEMENTS = 1 << 20


# --------------------------------------------------------------------------------------------------
# Math
# --------------------------------------------------------------------------------------------------


def expand_kv_weight(weight: torch.Tensor, n_heads: int, n_kv_heads: int, head_dim: int) -> torch.Tensor:
    """Expand a grouped-query ``k_proj``/``v_proj`` weight (or bias) to one block per query head.

    Key/value head ``j`` serves query heads ``j*g ... j*g + g - 1`` (``g = n_heads // n_kv_heads``),
    exactly as ``transformers.models.llama.modeling_llama.repeat_kv`` expands projected keys and
    values, so ``expanded(x)`` viewed as heads equals ``repeat_kv(original(x) viewed as heads, g)``.

    Args:
        weight: ``[n_kv_heads * head_dim, in_features]`` (a weight) or ``[n_kv_heads * head_dim]``
            (a bias).
        n_heads: number of query heads.
        n_kv_heads: number of key/value heads; must divide ``n_heads``.
        head_dim: per-head dimension.

    Returns:
        A new tensor ``[n_heads * head_dim, ...]`` (a copy even when ``n_heads == n_kv_heads``).
    """
    if n_kv_heads <= 0 or n_heads % n_kv_heads:
        raise ValueError(f"n_heads ({n_heads}) must be a positive multiple of n_kv_heads ({n_kv_heads})")
    if weight.shape[0] != n_kv_heads * head_dim:
        raise ValueError(f"expected {n_kv_heads} x {head_dim} = {n_kv_heads * head_dim} rows, got {weight.shape[0]}")
    groups = n_heads // n_kv_heads
    blocks = weight.reshape(n_kv_heads, head_dim, *weight.shape[1:])
    return blocks.repeat_interleave(groups, dim=0).reshape(n_heads * head_dim, *weight.shape[1:]).clone()


def _compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """float64 stays float64; everything else (float32, float16, bfloat16) is computed in float32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def gla_recurrent(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    scale: float,
    state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gated linear attention as a plain loop over time (the reference; used for decode).

    ``S_t = diag(exp(g_t)) S_{t-1} + k_t^T v_t`` and ``o_t = scale * q_t S_t``, the recurrence of the
    official ``fused_recurrent_gla`` (``small_fla.py``).

    Args:
        q: ``[B, H, T, d_k]`` queries.
        k: ``[B, H, T, d_k]`` keys.
        v: ``[B, H, T, d_v]`` values.
        g: ``[B, H, T, d_k]`` log-gates (``<= 0``; a gate of 0 keeps the state, -50 all but erases it).
        scale: output scale (fla's default is ``d_k ** -0.5``).
        state: ``[B, H, d_k, d_v]`` state before step 0, or None for zeros.

    Returns:
        ``(o, final_state)``: ``o`` ``[B, H, T, d_v]`` in ``q``'s dtype and the state after the last
        step ``[B, H, d_k, d_v]``, kept in the compute dtype (float32, or float64 for float64 inputs).
    """
    ct = _compute_dtype(q.dtype)
    B, H, T, dk = q.shape
    dv = v.shape[-1]
    qf, kf, vf, gf = (t.to(ct) for t in (q, k, v, g))
    s = q.new_zeros(B, H, dk, dv, dtype=ct) if state is None else state.to(ct)
    outs = []
    for t in range(T):
        s = s * gf[:, :, t].exp().unsqueeze(-1) + kf[:, :, t].unsqueeze(-1) * vf[:, :, t].unsqueeze(-2)
        outs.append(torch.einsum("bhk,bhkv->bhv", qf[:, :, t], s))
    o = torch.stack(outs, dim=2) if outs else vf.new_zeros(B, H, 0, dv)
    return (o * scale).to(q.dtype), s


def gla_chunked(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    scale: float,
    chunk: int = 64,
    state: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Gated linear attention in the chunked parallel form (prefill and training); equals :func:`gla_recurrent`.

    The sequence is cut into chunks of ``chunk`` steps (the last one padded with ``k = v = 0``,
    ``g = 0``, which leaves the state unchanged). Inside a chunk, with ``G`` the inclusive cumulative
    sum of the log-gates from the chunk start,

    ``o_i = scale * [ (q_i * exp(G_i)) S_0 + sum_{j <= i} (sum_d q_id k_jd exp(G_id - G_jd)) v_j ]``
    ``S_end = exp(G_last) * S_0 + sum_j (k_j * exp(G_last - G_j))^T v_j``

    and every exponent is ``<= 0`` (``G`` is non-increasing), so nothing overflows with gates as low
    as -50 per step; decays that underflow to 0 are truly negligible. The intra-chunk term is split
    into sub-blocks of 16: between sub-blocks ``a > b`` the decay factorises through the cumulative
    gate ``R_a`` at the end of sub-block ``a - 1`` into ``exp(G_i - R_a) * exp(R_a - G_j)``, both
    exponents ``<= 0``, so it is a matrix product; only the diagonal sub-blocks use the explicit
    ``exp(G_i - G_j)`` tensor, causally masked (acausal pairs, whose exponent would be positive, are
    clamped to exponent 0 and their scores zeroed by the mask). The states between chunks follow the
    recurrence (one multiply-add per chunk); everything else is batched over chunks, in cache-sized
    slices. Autograd works through it (training keeps ``~T * 16 * d_k`` floats per head and state).

    Args:
        q: ``[B, H, T, d_k]`` queries.
        k: ``[B, H, T, d_k]`` keys.
        v: ``[B, H, T, d_v]`` values.
        g: ``[B, H, T, d_k]`` log-gates (``<= 0``).
        scale: output scale.
        chunk: chunk length (any positive integer; ``T`` need not be a multiple of it).
        state: ``[B, H, d_k, d_v]`` initial state, or None for zeros.

    Returns:
        ``(o, final_state)`` as :func:`gla_recurrent`.
    """
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    ct = _compute_dtype(q.dtype)
    B, H, T, dk = q.shape
    dv = v.shape[-1]
    s0 = q.new_zeros(B, H, dk, dv, dtype=ct) if state is None else state.to(ct)
    if T == 0:
        return v.new_zeros(B, H, 0, dv), s0
    C = min(chunk, T)
    N = -(-T // C)
    pad = N * C - T
    qf, kf, vf, gf = (t.to(ct) for t in (q, k, v, g))
    if pad:
        qf, kf, vf, gf = (F.pad(t, (0, 0, 0, pad)) for t in (qf, kf, vf, gf))
    qc, kc, gc = (t.reshape(B, H, N, C, dk) for t in (qf, kf, gf))
    vc = vf.reshape(B, H, N, C, dv)
    G = gc.cumsum(dim=-2)  # [B, H, N, C, dk], non-increasing along C, G <= 0
    G_last = G[..., -1:, :]  # [B, H, N, 1, dk]

    # Intra-chunk part: A[i, j] = sum_d q_id k_jd exp(G_id - G_jd) (j <= i), o = A v, computed on
    # slices of (batch, head, chunk) rows so the [rows, C, s, d_k] temporaries stay cache-sized
    # (allocating fresh ~100 MB temporaries costs more than the arithmetic on CPU).
    rows = B * H * N
    q2, k2, G2, v2 = qc.reshape(rows, C, dk), kc.reshape(rows, C, dk), G.reshape(rows, C, dk), vc.reshape(rows, C, dv)
    step = max(1, _SLICE_ELEMENTS // (C * min(C, _SUB_BLOCK) * dk))
    o = torch.cat([_intra_chunk_scores(q2[r:r + step], k2[r:r + step], G2[r:r + step]) @ v2[r:r + step]
                   for r in range(0, rows, step)]).reshape(B, H, N, C, dv)

    # Chunk-to-chunk state recurrence: S_{n+1} = exp(G_last_n) * S_n + (k_n exp(G_last_n - G_n))^T v_n.
    k_to_end = kc * (G_last - G).exp()
    U = k_to_end.transpose(-1, -2) @ vc  # [B, H, N, dk, dv]
    decay = G_last.squeeze(-2).exp().unsqueeze(-1)  # [B, H, N, dk, 1]
    entering = []
    s = s0
    for n in range(N):
        entering.append(s)
        s = decay[:, :, n] * s + U[:, :, n]
    S_in = torch.stack(entering, dim=2)  # [B, H, N, dk, dv]: the state before each chunk
    o = o + (qc * G.exp()) @ S_in
    o = (o * scale).reshape(B, H, N * C, dv)[:, :, :T]
    return o.to(q.dtype), s


def _intra_chunk_scores(q: torch.Tensor, k: torch.Tensor, G: torch.Tensor) -> torch.Tensor:
    """``A[i, j] = sum_d q_id k_jd exp(G_id - G_jd)`` for ``j <= i`` (else 0), per chunk; no exponent is > 0.

    Exponents that would be positive (the masked, acausal pairs) are clamped to 0 before the exp and
    the resulting scores are zeroed afterwards by the causal mask, so nothing overflows and no
    ``inf * 0`` arises (also in the backward pass).

    Args:
        q: ``[R, C, d_k]`` (R = batch x heads x chunks rows).
        k: ``[R, C, d_k]``.
        G: ``[R, C, d_k]`` inclusive cumulative log-gates within each chunk.

    Returns:
        ``[R, C, C]`` lower-triangular scores.
    """
    R_, C, dk = q.shape
    s = _SUB_BLOCK if C % _SUB_BLOCK == 0 and C > _SUB_BLOCK else C
    m = C // s
    # In-place element-wise ops only when autograd does not need the intermediates.
    inplace = not (torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or G.requires_grad))
    qb, kb, Gb = (t.reshape(R_, m, s, dk) for t in (q, k, G))
    # Diagonal sub-blocks: explicit decays exp(G_i - G_j); for j <= i the exponent is <= 0 as is.
    e = Gb.unsqueeze(-2) - Gb.unsqueeze(-3)  # [R, m, s(i), s(j), dk]
    if inplace:
        e = e.clamp_max_(0.0).exp_().mul_(kb.unsqueeze(-3))
    else:
        e = e.clamp_max(0.0).exp() * kb.unsqueeze(-3)
    A_diag = torch.linalg.vecdot(e, qb.unsqueeze(-2))  # [R, m, s(i), s(j)] (faster than a bmm with 1 column)
    tril = torch.ones(s, s, dtype=torch.bool, device=q.device).tril()
    A_diag = A_diag * tril
    if m == 1:
        return A_diag.reshape(R_, C, C)
    # Off-diagonal sub-blocks a > b go through R_a, the cumulative gate at the end of sub-block a - 1:
    # exp(G_i - G_j) = exp(G_i - R_a) * exp(R_a - G_j) with both exponents <= 0 for i in a, j in b < a.
    R = torch.cat([torch.zeros_like(Gb[:, :1, -1]), Gb[:, :-1, -1]], dim=1)  # [R, m, dk]
    q_ref = qb * (Gb - R.unsqueeze(-2)).exp()  # [R, m(a), s(i), dk]
    e = R[:, :, None, None, :] - Gb[:, None, :, :, :]  # [R, m(a), m(b), s(j), dk]; <= 0 where b < a
    if inplace:
        k_ref = e.clamp_max_(0.0).exp_().mul_(kb.unsqueeze(1))
    else:
        k_ref = e.clamp_max(0.0).exp() * kb.unsqueeze(1)
    A_off = q_ref @ k_ref.reshape(R_, m, m * s, dk).transpose(-1, -2)  # [R, m(a), s(i), m(b) * s(j)]
    below = torch.ones(m, m, dtype=torch.bool, device=q.device).tril(-1)  # [a, b]: b < a
    A = A_off.view(R_, m, s, m, s) * below[:, None, :, None]
    A = A + A_diag.unsqueeze(-2) * torch.eye(m, dtype=q.dtype, device=q.device)[:, None, :, None]
    return A.reshape(R_, C, C)


# --------------------------------------------------------------------------------------------------
# Cache
# --------------------------------------------------------------------------------------------------


class DSLACacheLayer(DynamicLayer):
    """The slot of a transformers ``DynamicCache`` that a DSLA layer owns: its GLA states and token count.

    It is a ``DynamicLayer`` (hence a ``CacheLayerMixin``), so ``Cache.get_seq_length()`` and
    ``get_mask_sizes()`` — which read layer 0 by default — report the number of tokens this layer
    has consumed even when layer 0 (or every layer) is DSLA. It stores no keys or values.

    Attributes:
        states: ``[B, n_states, H, d_k, d_v]`` GLA states after the last consumed token, or None.
        n_tokens: tokens consumed so far.
    """

    is_croppable = False
    supports_early_init = False

    def __init__(self) -> None:
        super().__init__()
        self.states: torch.Tensor | None = None
        self.n_tokens = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        """Nothing to allocate: the states are set by the DSLA layer."""
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
        """Refuses: a softmax-attention layer must not write keys/values into a DSLA layer's slot."""
        raise RuntimeError("this cache slot belongs to a DSLA layer (GLA states, no keys/values); "
                           "a softmax-attention layer with the same layer_idx wrote to it")

    def get_seq_length(self) -> int:
        """Tokens consumed so far."""
        return self.n_tokens

    def advance(self, states: torch.Tensor, n_new: int) -> None:
        """Store the states after ``n_new`` more tokens."""
        self.states = states
        self.n_tokens += n_new
        self.is_initialized = True

    def reset(self) -> None:
        """Forget the states (a fresh sequence)."""
        self.states = None
        self.n_tokens = 0

    def offload(self) -> None:
        """No-op: the states do not grow with the sequence, they stay where they are."""

    def prefetch(self) -> None:
        """No-op (see :meth:`offload`)."""

    def crop(self, tokens_to_remove: int) -> None:
        """Only ``crop(0)`` is possible: a recurrent state cannot be rolled back."""
        if tokens_to_remove != 0:
            raise ValueError("a DSLA layer's recurrent state cannot be cropped (rolled back); "
                             "assisted/speculative decoding with cache rollback is not supported")

    def reorder_cache(self, beam_idx: torch.LongTensor) -> None:
        """Reorder the batch for beam search."""
        if self.states is not None:
            self.states = self.states.index_select(0, beam_idx.to(self.states.device))

    def batch_repeat_interleave(self, repeats: int) -> None:
        """Repeat each batch row ``repeats`` times."""
        if self.states is not None:
            self.states = self.states.repeat_interleave(repeats, dim=0)

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        """Keep only the given batch rows."""
        if self.states is not None:
            self.states = self.states[indices, ...]


def dsla_cache_layer(cache: Cache, layer_idx: int) -> DSLACacheLayer:
    """The :class:`DSLACacheLayer` of ``layer_idx`` in ``cache``, installing it on first use.

    Args:
        cache: a transformers ``DynamicCache`` (with or without ``config``; lazily grown ones too).
        layer_idx: the DSLA layer's index.

    Returns:
        The cache slot holding this layer's states.

    Raises:
        ValueError: the slot already holds softmax keys/values, or the cache is not dynamic
            (``StaticCache``, quantized, sliding-window and offloaded-static caches are not supported).
    """
    # NOTE: cache approach. A DSLA layer's decode cache is its GLA states, not keys/values, yet
    # transformers reads the sequence length (positions, mask sizes, generate's bookkeeping) from
    # cache layer 0 by default, and layer 0 may be DSLA. Writing zero-width keys/values ([B, 1, T, 0])
    # through `Cache.update` does NOT work in transformers 5.17: `DynamicLayer.get_seq_length()`
    # returns 0 whenever `keys.numel() == 0`, so positions and masks would restart at 0 after every
    # step. A side table keyed by the cache object would also miss `reorder_cache` (beam search),
    # `batch_select_indices`, `reset` and `copy.deepcopy(cache)`. Instead the DSLA layer replaces its
    # own slot of the cache with a `DSLACacheLayer` (a `DynamicLayer` subclass) that holds the states
    # and counts the tokens: length and mask sizes stay right at O(1) memory per layer, the states
    # live and die with the cache object, and beam reordering/batch selection act on them.
    # Only dynamic caches are supported; anything else raises instead of silently mis-decoding.
    layers = cache.layers
    if cache.layer_class_to_replicate is not None:
        while len(layers) < layer_idx:
            layers.append(cache.layer_class_to_replicate())
        if len(layers) == layer_idx:
            layers.append(DSLACacheLayer())
    if layer_idx >= len(layers):
        raise ValueError(f"the cache has {len(layers)} layers, DSLA layer {layer_idx} has no slot in it")
    slot = layers[layer_idx]
    if isinstance(slot, DSLACacheLayer):
        return slot
    if type(slot) is DynamicLayer:
        if slot.get_seq_length() > 0:
            raise ValueError(f"cache layer {layer_idx} already holds {slot.get_seq_length()} tokens of softmax "
                             "keys/values (the layer was converted mid-sequence); start a new cache")
        slot = DSLACacheLayer()
        layers[layer_idx] = slot
        return slot
    raise ValueError(f"DSLA layers need a DynamicCache; cache layer {layer_idx} is a {type(slot).__name__} "
                     f"(in a {type(cache).__name__})")


def _check_no_padding(attention_mask: Any, n_seen: int, layer_idx: int) -> None:
    """Raise if the mask hides any of the ``n_seen`` tokens the layer has consumed (i.e. padding).

    Accepts None, a 2-D padding mask ``[B, K]`` (0 = padding), or the 4-D mask transformers builds
    (bool: True = attend; float: 0 = attend). In a 4-D mask the last query row must attend to at
    least ``n_seen`` keys; with left or right padding some of them are hidden. Non-tensor masks
    (e.g. flex-attention block masks) cannot be inspected and are accepted, as the official layer
    accepts every mask.
    """
    if attention_mask is None or not isinstance(attention_mask, torch.Tensor):
        return
    if attention_mask.ndim == 2:
        padded = bool((attention_mask == 0).any())
    elif attention_mask.ndim == 4:
        allowed = attention_mask if attention_mask.dtype == torch.bool else attention_mask == 0
        padded = bool((allowed[:, 0, -1, :].sum(-1) < n_seen).any())
    else:
        raise ValueError(f"DSLA layer {layer_idx}: unsupported attention_mask shape {tuple(attention_mask.shape)}")
    if padded:
        raise ValueError(f"DSLA layer {layer_idx}: the attention mask has padding, but dual-state linear "
                         "attention has no masking (like the official layer); pass unpadded batches "
                         "(equal-length sequences)")


# --------------------------------------------------------------------------------------------------
# Module
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DSLAConfig:
    """Hyperparameters of a DSLA layer (defaults: the official ``src/layer.py``).

    Attributes:
        gate_normalizer: the log-gate is ``logsigmoid(.) / gate_normalizer`` (official: 16).
        clamp_min: lower clamp of the log-gate per step (official: -50).
        n_states: 2 (DSLA) or 1 (the single-state GLA ablation: only the identity-initialised gate).
        chunk: chunk length of :func:`gla_chunked` for prefill/training.
        seed: seeds ``gk_proj2`` and ``alpha`` (per layer: ``seed * 100003 + layer_idx``).
    """

    gate_normalizer: float = 16.0
    clamp_min: float = -50.0
    n_states: int = 2
    chunk: int = 64
    seed: int = 0

    def __post_init__(self) -> None:
        if self.n_states not in (1, 2):
            raise ValueError(f"n_states must be 1 or 2, got {self.n_states}")
        if self.chunk < 1:
            raise ValueError(f"chunk must be >= 1, got {self.chunk}")
        if not self.gate_normalizer > 0:
            raise ValueError(f"gate_normalizer must be > 0, got {self.gate_normalizer}")


class DualStateLinearAttention(nn.Module):
    """Dual-state linear attention, a drop-in for transformers 5.17's ``LlamaAttention``.

    ``o_t = sum_i softmax(alpha)_i * scale * q_t S^i_t`` with ``S^i_t = diag(exp(g^i_t)) S^i_{t-1} +
    k_t^T v_t`` and ``g^i = clamp_min(logsigmoid(gk_proj^i(x)) / 16, -50)``, then ``o_proj``. No RoPE,
    feature map or normaliser (as the official layer). Prefill (``T > 1``) uses :func:`gla_chunked`,
    single-token steps the recurrence; with a cache the layer resumes from, and stores, its states.

    Attributes:
        q_proj, k_proj, v_proj, o_proj: projections (k/v expanded to ``num_heads`` heads).
        gk_proj: first gate projection (identity-initialised, bias 0).
        gk_proj2: second gate projection (default ``nn.Linear`` init, bias 0); None when ``n_states == 1``.
        alpha: ``[n_states]`` mixing logits, ``U(0, 1)`` initialised (official name ``alpha_list``:
            official checkpoints need that one key renamed).
        n_states: 1 or 2.
        num_heads, head_dim, hidden_size, layer_idx, scale: shapes, position in the model, ``head_dim ** -0.5``.
    """

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        head_dim: int,
        *,
        bias: bool = False,
        o_bias: bool | None = None,
        dsla_cfg: DSLAConfig | None = None,
        layer_idx: int = 0,
    ) -> None:
        """Build a freshly initialised layer (use :meth:`from_attention` to take over a teacher's).

        Args:
            hidden_size: model width.
            num_heads: attention heads (keys/values have as many heads: GQA is expanded).
            head_dim: per-head dimension (also the gate/kernel dimension).
            bias: whether q/k/v projections have a bias.
            o_bias: whether ``o_proj`` has a bias (defaults to ``bias``).
            dsla_cfg: hyperparameters (defaults: :class:`DSLAConfig`).
            layer_idx: index of the decoder layer (its cache slot; also varies the init seed).
        """
        super().__init__()
        cfg = dsla_cfg or DSLAConfig()
        self.dsla_cfg = cfg
        self.hidden_size = hidden_size
        self.num_heads = num_heads
        self.head_dim = head_dim
        self.layer_idx = layer_idx
        self.n_states = cfg.n_states
        self.scale = head_dim**-0.5
        inner = num_heads * head_dim
        # Initialised from a private seed: converting a layer neither reads nor advances the global RNG.
        with torch.random.fork_rng(devices=[]):
            torch.random.default_generator.manual_seed(cfg.seed * 100003 + layer_idx)  # CPU only
            self.q_proj = nn.Linear(hidden_size, inner, bias=bias)
            self.k_proj = nn.Linear(hidden_size, inner, bias=bias)
            self.v_proj = nn.Linear(hidden_size, inner, bias=bias)
            self.o_proj = nn.Linear(inner, hidden_size, bias=bias if o_bias is None else o_bias)
            self.gk_proj = nn.Linear(hidden_size, inner, bias=True)
            self.gk_proj2: nn.Linear | None = None
            if cfg.n_states == 2:
                self.gk_proj2 = nn.Linear(hidden_size, inner, bias=True)  # nn.Linear's default init, as official
            self.alpha = nn.Parameter(torch.rand(cfg.n_states))  # U(0, 1)
        with torch.no_grad():
            nn.init.eye_(self.gk_proj.weight)
            self.gk_proj.bias.zero_()
            if self.gk_proj2 is not None:
                self.gk_proj2.bias.zero_()

    @classmethod
    def from_attention(
        cls,
        attn: nn.Module,
        config: Any,
        dsla_cfg: DSLAConfig | None = None,
        layer_idx: int | None = None,
    ) -> DualStateLinearAttention:
        """A DSLA layer that takes over a Llama-style attention's q/k/v/o projections (copies).

        Args:
            attn: the teacher attention (``q_proj``/``k_proj``/``v_proj``/``o_proj`` linears, ``head_dim``).
            config: the Hugging Face model config (``hidden_size``, ``num_attention_heads``,
                ``num_key_value_heads``).
            dsla_cfg: hyperparameters.
            layer_idx: the decoder layer index (default: ``attn.layer_idx``).

        Returns:
            The layer, on the teacher's device and in its dtype; k/v expanded for GQA.
        """
        n_heads = int(config.num_attention_heads)
        n_kv = int(getattr(config, "num_key_value_heads", None) or n_heads)
        head_dim = int(attn.head_dim)
        idx = int(layer_idx if layer_idx is not None else getattr(attn, "layer_idx", 0))
        w = attn.q_proj.weight
        layer = cls(
            int(config.hidden_size), n_heads, head_dim,
            bias=attn.q_proj.bias is not None, o_bias=attn.o_proj.bias is not None,
            dsla_cfg=dsla_cfg, layer_idx=idx,
        )
        layer.to(device=w.device, dtype=w.dtype)
        with torch.no_grad():
            layer.q_proj.weight.copy_(attn.q_proj.weight)
            layer.o_proj.weight.copy_(attn.o_proj.weight)
            layer.k_proj.weight.copy_(expand_kv_weight(attn.k_proj.weight, n_heads, n_kv, head_dim))
            layer.v_proj.weight.copy_(expand_kv_weight(attn.v_proj.weight, n_heads, n_kv, head_dim))
            if attn.q_proj.bias is not None:
                layer.q_proj.bias.copy_(attn.q_proj.bias)
                layer.k_proj.bias.copy_(expand_kv_weight(attn.k_proj.bias, n_heads, n_kv, head_dim))
                layer.v_proj.bias.copy_(expand_kv_weight(attn.v_proj.bias, n_heads, n_kv, head_dim))
            if attn.o_proj.bias is not None:
                layer.o_proj.bias.copy_(attn.o_proj.bias)
        return layer

    def gates(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Per-key-dimension log-gates of every state, ``[B, n_states, H, T, head_dim]``."""
        B, T, _ = hidden_states.shape
        cfg = self.dsla_cfg
        projs = [self.gk_proj] + ([self.gk_proj2] if self.gk_proj2 is not None else [])
        gs = []
        for proj in projs:
            g = F.logsigmoid(proj(hidden_states)) / cfg.gate_normalizer
            g = torch.clamp_min(g, cfg.clamp_min)
            gs.append(g.view(B, T, self.num_heads, self.head_dim).transpose(1, 2))
        return torch.stack(gs, dim=1)

    def forward(
        self,
        hidden_states: torch.Tensor,
        position_embeddings: tuple[torch.Tensor, torch.Tensor] | None = None,
        attention_mask: torch.Tensor | None = None,
        past_key_values: Cache | None = None,
        **kwargs: Any,
    ) -> tuple[torch.Tensor, None]:
        """Attend over ``hidden_states`` ``[B, T, hidden]``, resuming from the cache's states if given.

        Args:
            hidden_states: the normalised residual stream.
            position_embeddings: ignored (DSLA applies no rotary embedding).
            attention_mask: checked for padding only (raises ValueError if any); no masking is applied.
            past_key_values: a transformers ``DynamicCache`` (see :func:`dsla_cache_layer`) or None.
            **kwargs: ignored (``position_ids``, ``use_cache``, ...).

        Returns:
            ``(attn_output [B, T, hidden], None)``.
        """
        B, T, _ = hidden_states.shape
        H, d, n = self.num_heads, self.head_dim, self.n_states
        slot = dsla_cache_layer(past_key_values, self.layer_idx) if past_key_values is not None else None
        past = slot.n_tokens if slot is not None else 0
        _check_no_padding(attention_mask, past + T, self.layer_idx)

        def heads(t: torch.Tensor) -> torch.Tensor:
            return t.view(B, T, H, d).transpose(1, 2)

        x = hidden_states
        q, k, v = heads(self.q_proj(x)), heads(self.k_proj(x)), heads(self.v_proj(x))
        g = self.gates(hidden_states).reshape(B, n * H, T, d)
        # All states at once: the n states are n groups of H "heads" sharing q, k, v.
        qn, kn, vn = (t.repeat(1, n, 1, 1) for t in (q, k, v))
        state = None
        if slot is not None and slot.states is not None:
            state = slot.states.reshape(B, n * H, d, d)
        if T == 1:
            o, new_state = gla_recurrent(qn, kn, vn, g, self.scale, state)
        else:
            o, new_state = gla_chunked(qn, kn, vn, g, self.scale, self.dsla_cfg.chunk, state)
        if slot is not None:
            # NOTE: two small deviations from the official fused_recurrent_gla, neither changing a forward
            # value in float32: (1) the state is kept in float32 (float64 for float64 models) even for
            # half-precision models, as fla's own naive reference does, where the official kernel
            # returns it in q's dtype; (2) states passed between calls are not detached (the official
            # kernel detaches the initial and final state, i.e. truncates backprop at cache
            # boundaries). Callers that train across cached calls and want truncation detach themselves.
            slot.advance(new_state.reshape(B, n, H, d, d), T)
        w = torch.softmax(self.alpha, dim=0).to(o.dtype)
        o = torch.einsum("n,bnhtd->bhtd", w, o.view(B, n, H, T, d))
        out = o.transpose(1, 2).reshape(B, T, H * d).to(hidden_states.dtype)
        return self.o_proj(out), None


@torch.no_grad()
def energy_rescale_(dsla: DualStateLinearAttention, x: torch.Tensor, teacher_out: torch.Tensor) -> float:
    """Scale ``dsla.o_proj.weight`` so the layer's output has the teacher's norm on ``x``; returns the factor.

    Args:
        dsla: the layer (called without a cache).
        x: its input hidden states ``[B, T, hidden]``.
        teacher_out: the teacher attention's output on ``x`` (same shape).

    Returns:
        ``||teacher_out|| / ||dsla(x)||`` (Frobenius norms over all of it), by which ``o_proj.weight``
        was multiplied (an ``o_proj`` bias, absent in Llama, is left as it is).
    """
    # NOTE: deviation from the official initialisation, used only when asked. The official layer
    # starts from the teacher's projections as they are; with no normaliser its unnormalised sums
    # make the teacher-initialised layer's output far too large: ~4,500x in energy (squared norm),
    # i.e. ~50-110x in norm, measured on SmolLM2-135M-Instruct layers 0/15/25 over 128-4096 tokens
    # of text. This optionally rescales o_proj once by the ratio of output norms on the given inputs.
    out, _ = dsla(x)
    factor = float(teacher_out.double().norm() / out.double().norm())
    dsla.o_proj.weight.mul_(factor)
    return factor
