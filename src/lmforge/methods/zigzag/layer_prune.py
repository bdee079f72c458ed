"""Layer pruning: score every transformer block, remove the most removable ones, save the smaller model.

Three criteria. Each gives every block ``ℓ`` (0-based) a score where **higher = more removable**:

``block-influence``
    ShortGPT (Men et al. 2024, "ShortGPT: Layers in Large Language Models are More Redundant Than You
    Expect", arXiv:2403.03853): ``BI_ℓ = 1 - E_{X,t}[cos(x_{ℓ,t}, x_{ℓ+1,t})]`` over every (non-pad) token
    ``t`` of every calibration text; ShortGPT removes the blocks of *lowest* BI, so the score is
    ``1 - BI_ℓ``, the mean cosine similarity of the block's input and output.
``angular``
    Gromov et al. 2024 ("The Unreasonable Ineffectiveness of the Deeper Layers", arXiv:2403.17887):
    ``d(x^ℓ, x^{ℓ+n}) = arccos(cos(x^ℓ_T, x^{ℓ+n}_T)) / π`` on the last token ``T`` of each prompt,
    averaged over prompts; to remove ``n`` layers take ``ℓ* = argmin_ℓ d(x^ℓ, x^{ℓ+n})`` and drop the
    contiguous blocks ``ℓ*, ..., ℓ*+n-1``. The per-block score (``n = 1``) is ``1 - d(x^ℓ, x^{ℓ+1})``.
``zigzag``
    Gardinazzi, Viswanathan et al. (ICML 2025, "Persistent Topological Features in Large Language
    Models"): ``r(ℓ) = Z̄_1(ℓ)``, the average inter-layer persistence of 1-dimensional holes of the
    zigzag filtration of the prompts' kNN graphs (computed by :mod:`lmforge.methods.zigzag.descriptors`).
    The paper removes every layer with ``r(ℓ) >= t · max r`` (``t = 0.9`` or ``0.8``).

Hidden-state convention: ``states[0]`` is the input of block 0 (the token embeddings) and ``states[ℓ+1]``
the output of block ``ℓ``: the residual stream, *before* the model's final norm.

NOTE: Hugging Face's ``output_hidden_states`` puts ``norm(x^L)`` last. The official ShortGPT code
(icip-cas/ShortGPT ``shortgpt/shortgpt.py``, ``metrics.py``) and PruneMe use those states as they come,
so for the last block they compare a pre-norm input with a post-norm output. Both papers define the
metric on the block's input and output. Here the last entry is the last block's own output, captured
with a forward hook. short-transformers, which the zigzag authors used for their baselines, records the
same pre-norm values.

NOTE: the baselines follow their own papers. The zigzag paper ran them through short-transformers,
which computes the angular distance over all tokens and removes contiguous blocks for both criteria;
here angular distance uses each prompt's last token (Gromov et al.) and Block Influence removes the
individually lowest blocks (ShortGPT), so a comparison with the zigzag paper's baseline numbers is of
the papers' criteria, not of that library's variants.

Layer removal (:func:`remove_layers`) works on Llama/Mistral/Qwen-style models (``model.model.layers``).
It re-indexes every remaining ``layer_idx`` (the KV-cache slot) and the per-layer config lists
(``layer_types``: sliding/full attention), so the pruned model generates correctly with a cache, in
memory and after ``from_pretrained``.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from lmforge.common.errors import UserError

__all__ = [
    "CRITERIA",
    "LAYER_PRUNE_FILE",
    "LayerStatistics",
    "SUPPORTED_MODEL_TYPES",
    "angular_distance",
    "angular_distance_window",
    "block_influence",
    "hidden_states",
    "layer_statistics",
    "official_point_clouds",
    "prune_layers",
    "remove_layers",
    "save_layer_pruned",
    "select_layers",
    "zigzag",
]

CRITERIA = ("zigzag", "angular", "block-influence")
LAYER_PRUNE_FILE = "layer_prune.json"

# Decoder-only models whose blocks differ only through ``config.layer_types`` (re-indexed here) and, for
# the MoE ones, ``mlp_only_layers`` (re-indexed) with ``decoder_sparse_step == 1`` (checked). I checked
# each modelling file (transformers 5): every per-index use is ``layer_idx`` (cache slot),
# ``config.layer_types[i]`` or, for the MoE ones, those two fields.
SUPPORTED_MODEL_TYPES = frozenset({
    "llama", "mistral", "mixtral", "qwen2", "qwen3", "qwen2_moe", "qwen3_moe",
    "gemma", "gemma2", "gemma3_text", "phi3", "olmo2", "granite",
})

_DEFAULT_MAX_LENGTH = 1024
_SCORE_MEANING = {
    "block-influence": "1 - BI = mean over tokens of cos(block input, block output) (ShortGPT removes the lowest BI)",
    "angular": "1 - d(x^l, x^(l+1)), d = arccos(cos)/pi on each prompt's last token, averaged (Gromov et al.)",
    "zigzag": "r(l) = mean_j Z_1(l, j) / beta_1(j) at the block's point cloud (Gardinazzi et al.)",
}


# --------------------------------------------------------------------------------------------------
# hidden states


def _decoder_layers(model: nn.Module) -> nn.ModuleList | None:
    """The model's list of transformer blocks, where it has a known one."""
    for path in ("model.layers", "transformer.h", "gpt_neox.layers", "model.decoder.layers"):
        obj: Any = model
        for part in path.split("."):
            obj = getattr(obj, part, None)
            if obj is None:
                break
        if isinstance(obj, nn.ModuleList):
            return obj
    return None


def _n_blocks(model: nn.Module) -> int | None:
    layers = _decoder_layers(model)
    n_cfg = getattr(getattr(model, "config", None), "num_hidden_layers", None)
    if layers is None:
        return int(n_cfg) if n_cfg is not None else None
    return min(len(layers), int(n_cfg)) if n_cfg is not None else len(layers)


def _one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "") or type(exc).__name__
    return line if len(line) <= 200 else line[:197] + "..."


def _resolve_max_length(model: nn.Module, max_length: int | None) -> int:
    from lmforge.common.generation import max_positions

    limit = max_positions(model)
    if max_length is None:
        return min(limit or _DEFAULT_MAX_LENGTH, _DEFAULT_MAX_LENGTH)
    if max_length < 1:
        raise UserError(f"--max-length must be at least 1, got {max_length}")
    if limit is not None and max_length > limit:
        raise UserError(f"--max-length {max_length} exceeds the model's {limit} positions")
    return int(max_length)


def _encode(tokenizer: Any, texts: Sequence[str], max_length: int) -> list[list[int]]:
    encoded = []
    for i, text in enumerate(texts):
        ids = list(tokenizer(text, add_special_tokens=True)["input_ids"])[:max_length]
        if not ids:
            raise UserError(f"calibration text {i} encodes to no tokens")
        encoded.append(ids)
    return encoded


def _right_padded(rows: Sequence[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids right-padded with 0 and their attention mask."""
    width = max(len(r) for r in rows)
    ids = torch.zeros((len(rows), width), dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for row, r in enumerate(rows):
        ids[row, : len(r)] = torch.tensor(list(r), dtype=torch.long)
        mask[row, : len(r)] = 1
    return ids, mask


def _forward_states(model: nn.Module, ids: torch.Tensor, mask: torch.Tensor) -> list[torch.Tensor]:
    """``[x^0, ..., x^L]``, each ``(B, T, d)``: embeddings, then every block's output (pre final norm)."""
    layers = _decoder_layers(model)
    n = _n_blocks(model)
    captured: list[torch.Tensor] = []
    handle = None
    if layers is not None and n:
        def hook(_mod: nn.Module, _args: Any, output: Any) -> None:
            captured.append(output[0] if isinstance(output, (tuple, list)) else output)

        handle = layers[n - 1].register_forward_hook(hook)
    try:
        out = model(input_ids=ids, attention_mask=mask, output_hidden_states=True, use_cache=False)
    except TypeError as exc:
        raise UserError(f"the model exposes no hidden states ({_one_line(exc)}); layer scores need them") from None
    finally:
        if handle is not None:
            handle.remove()
    hs = getattr(out, "hidden_states", None)
    if hs is None or len(hs) < 2:
        raise UserError("the model exposes no hidden states (output_hidden_states=True returned none); "
                        "layer scores need them")
    states = list(hs)
    if captured and n is not None and len(states) == n + 1:
        states[-1] = captured[-1]  # the last block's own output, not norm(output); see the module NOTE
    return states


def _run_states(
    model: nn.Module,
    tokenizer: Any,
    texts: Sequence[str],
    fn: Callable[[list[int], list[torch.Tensor], torch.Tensor], None],
    *,
    batch_size: int,
    max_length: int | None,
    progress: bool = False,
    description: str = "hidden states",
) -> None:
    """Call ``fn(text indices, states, lengths)`` per right-padded batch (longest texts first).

    ``states[ℓ]`` is ``(B, T, d)``; row ``b`` holds real tokens at positions ``< lengths[b]`` only. With
    right padding and a causal model those positions are exactly what the text alone gives.
    """
    import contextlib

    from lmforge.common.batching import inference
    from lmforge.common.generation import model_device
    from lmforge.common.progress import make_progress

    if batch_size < 1:
        raise UserError(f"--batch-size must be at least 1, got {batch_size}")
    texts = list(texts)
    if not texts:
        raise UserError("no calibration texts")
    encoded = _encode(tokenizer, texts, _resolve_max_length(model, max_length))
    order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i]))
    device = model_device(model)
    prog = make_progress() if progress else None
    with inference(model), prog if prog is not None else contextlib.nullcontext():
        task = prog.add_task(description, total=len(order), info="") if prog is not None else None
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            ids, mask = _right_padded([encoded[i] for i in idx])
            states = _forward_states(model, ids.to(device), mask.to(device))
            fn(idx, states, torch.tensor([len(encoded[i]) for i in idx], device=states[0].device))
            if prog is not None and task is not None:
                prog.advance(task, len(idx))


def hidden_states(
    model: nn.Module,
    tokenizer: Any,
    texts: Sequence[str],
    *,
    tokens: str = "all",
    batch_size: int = 8,
    max_length: int | None = None,
    progress: bool = False,
) -> list[torch.Tensor]:
    """The residual stream at every block boundary, for real (non-pad) tokens only.

    Args:
        model: a causal LM that returns ``hidden_states`` for ``output_hidden_states=True``.
        tokenizer: its tokenizer; each text is encoded with its special tokens (BOS), cut to ``max_length``.
        texts: the calibration texts.
        tokens: ``"all"``: every token, ``(n_tokens, d)`` per boundary, text by text in input order;
            ``"last"``: each text's last token, ``(n_texts, d)``.
        batch_size: texts per forward pass (right-padded; pads are dropped).
        max_length: tokens per text (default ``min(1024, max_position_embeddings)``).

    Returns:
        ``L + 1`` float32 CPU tensors: ``[0]`` the input of block 0 (embeddings), ``[ℓ+1]`` the output of
        block ``ℓ`` (before the final norm). Memory is ``(L+1) · n_tokens · d · 4`` bytes; pruning scores
        are computed batch by batch instead (see :func:`prune_layers`).

    Raises:
        UserError: the model exposes no hidden states; a text encodes to no tokens; bad arguments.
    """
    if tokens not in ("all", "last"):
        raise ValueError(f"tokens must be 'all' or 'last', got {tokens!r}")
    per_text: dict[int, list[torch.Tensor]] = {}

    def collect(idx: list[int], states: list[torch.Tensor], lengths: torch.Tensor) -> None:
        for row, i in enumerate(idx):
            n = int(lengths[row])
            if tokens == "last":
                per_text[i] = [s[row, n - 1 : n].float().cpu() for s in states]
            else:
                per_text[i] = [s[row, :n].float().cpu() for s in states]

    _run_states(model, tokenizer, texts, collect, batch_size=batch_size, max_length=max_length, progress=progress)
    n_states = len(per_text[0])
    return [torch.cat([per_text[i][ell] for i in range(len(per_text))]) for ell in range(n_states)]


# --------------------------------------------------------------------------------------------------
# criteria


def _as_states(states: Sequence[Any]) -> list[torch.Tensor]:
    out = [torch.as_tensor(s).detach().to(device="cpu", dtype=torch.float64) for s in states]
    if len(out) < 2:
        raise ValueError(f"need the states at >= 2 block boundaries (embeddings + block outputs), got {len(out)}")
    out = [s.reshape(-1, s.shape[-1]) for s in out]
    if any(s.shape != out[0].shape for s in out) or out[0].shape[0] == 0:
        raise ValueError(f"all states must have the same non-empty shape, got {[tuple(s.shape) for s in out]}")
    return out


def _cosine(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Row-wise cosine similarity in float64, clamped to [-1, 1] (0 for a zero row)."""
    a, b = a.double(), b.double()
    den = (a.norm(dim=-1) * b.norm(dim=-1)).clamp_min(1e-300)
    return ((a * b).sum(-1) / den).clamp(-1.0, 1.0)


def block_influence(states: Sequence[Any], *, raw: bool = False) -> np.ndarray:
    """ShortGPT's Block Influence, as a removability score per block.

    Men et al. 2024 (ShortGPT, arXiv:2403.03853, eq. 2):
    ``BI_ℓ = 1 - E_{X,t}[ x_{ℓ,t}ᵀ x_{ℓ+1,t} / (||x_{ℓ,t}|| ||x_{ℓ+1,t}||) ]``, the expectation over
    every token ``t`` of every calibration text, where ``x_ℓ`` is block ``ℓ``'s input and ``x_{ℓ+1}``
    its output. ShortGPT removes the blocks of lowest BI (official code: ``np.argsort(importances)[:n]``
    with ``importances[ℓ] = Σ_t (1 - cos)``, a sum; the mean used here ranks identically).

    Args:
        states: ``L + 1`` arrays ``(n_tokens, d)``: real tokens only, aligned across boundaries (as
            :func:`hidden_states` with ``tokens="all"`` returns).
        raw: return ``BI_ℓ`` itself (lower = more removable) instead of the score.

    Returns:
        ``(L,)``: the score ``1 - BI_ℓ`` (higher = more removable), or ``BI_ℓ`` with ``raw``.
    """
    s = _as_states(states)
    cos = np.array([float(_cosine(s[ell], s[ell + 1]).mean()) for ell in range(len(s) - 1)])
    return 1.0 - cos if raw else cos


def _angular_distances(states: Sequence[Any], n: int) -> np.ndarray:
    s = _as_states(states)
    n_blocks = len(s) - 1
    if isinstance(n, bool) or not isinstance(n, (int, np.integer)) or not 1 <= n <= n_blocks:
        raise ValueError(f"n must be an integer in [1, {n_blocks}], got {n!r}")
    return np.array([float((torch.arccos(_cosine(s[ell], s[ell + n])) / math.pi).mean())
                     for ell in range(n_blocks - n + 1)])


def angular_distance(states: Sequence[Any], n: int = 1, *, raw: bool = False) -> np.ndarray:
    """Gromov et al.'s angular distance between the states ``n`` blocks apart, as a removability score.

    Gromov, Tirumala, Shapourian, Glorioso, Roberts 2024 ("The Unreasonable Ineffectiveness of the
    Deeper Layers", arXiv:2403.17887, eq. 7):
    ``d(x^ℓ, x^{ℓ+n}) = (1/π) · arccos( x^ℓ_T · x^{ℓ+n}_T / (||x^ℓ_T|| ||x^{ℓ+n}_T||) )`` for the last
    token ``T`` of a prompt, averaged over prompts; ``x^ℓ`` is the input of block ``ℓ``. Removing blocks
    ``ℓ..ℓ+n-1`` maps ``x^ℓ`` straight to where ``x^{ℓ+n}`` was, so a small ``d`` means a removable window.

    Args:
        states: ``L + 1`` arrays ``(n_prompts, d)`` of last-token states (:func:`hidden_states` with
            ``tokens="last"``). Any aligned rows work; the paper uses the last token.
        n: window length.
        raw: return ``d`` itself (lower = more removable) instead of the score.

    Returns:
        ``(L - n + 1,)``, entry ``ℓ`` for the window of blocks ``ℓ..ℓ+n-1``: ``1 - d(x^ℓ, x^{ℓ+n})``
        (higher = more removable), or ``d`` with ``raw``. With ``n = 1``: one score per block.
    """
    d = _angular_distances(states, n)
    return d if raw else 1.0 - d


def angular_distance_window(states: Sequence[Any], n: int) -> int:
    """Gromov et al.'s optimal block: ``ℓ*(n) = argmin_ℓ d(x^ℓ, x^{ℓ+n})``; remove blocks ``ℓ*..ℓ*+n-1``.

    Ties go to the shallowest window. ``n`` must leave a block, ``1 <= n < L``.
    """
    s = _as_states(states)
    if isinstance(n, (int, np.integer)) and not isinstance(n, bool) and n >= len(s) - 1 >= 1:
        raise UserError(f"cannot remove every layer: a window of {n} with {len(s) - 1} layers")
    return int(np.argmin(_angular_distances(s, n)))


def _check_k(k: int, n_prompts: int) -> None:
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 1:
        raise UserError(f"--k must be a positive integer, got {k!r}")
    if k >= n_prompts:
        raise UserError(f"--k {k} is too large for {n_prompts} prompts: each point's {k} nearest neighbours "
                        f"need at least {k + 1} prompts (raise --n-texts or lower --k)")


def _zigzag_functions() -> tuple[Callable[..., Any], Callable[..., Any]]:
    try:
        from lmforge.methods.zigzag.descriptors import layer_point_clouds, zigzag_layer_scores
    except ImportError as exc:
        raise UserError(f"the zigzag criterion is not available ({_one_line(exc)})") from None
    return layer_point_clouds, zigzag_layer_scores


def zigzag(
    model: nn.Module,
    tokenizer: Any,
    texts: Sequence[str],
    *,
    k: int = 4,
    p: int = 1,
    alpha: float = 0.0,
    batch_size: int = 16,
    cloud: str = "mid",
) -> np.ndarray:
    """The zigzag-persistence pruning score of every block (higher = more removable).

    Gardinazzi, Viswanathan et al. (ICML 2025), section on layer pruning:
    ``r(ℓ) = Z̄_p(ℓ) = Σ_j ω · Z_p(ℓ, j) / Σ_j ω`` with ``Z_p(ℓ, j) = Σ_{b ≤ min(ℓ,j), d > max(ℓ,j)}
    PÎ_p(b, d) / β_p(j)`` and ``ω = |ℓ - j|^α`` (official code: ``mean_j psim[ℓ, j] / betti[j]``,
    ``p = 1``, ``α = 0``). Persistence is of the clique complexes of the symmetrised ``k``-NN graphs of
    the prompts' last-token representations. The point clouds and ``r`` come from
    :mod:`lmforge.methods.zigzag.descriptors` (``layer_point_clouds``, ``zigzag_layer_scores``).

    NOTE (cloud-to-block mapping): the default ``cloud="mid"`` is the official code's (below). The
    alternatives use ``layer_point_clouds``' ``L + 1`` clouds, the HF hidden states: the embeddings
    (= block 0's input), the outputs of blocks ``0..L-2`` and the final norm's output (last block's
    output, normalised). With ``cloud="output"`` block ``ℓ`` gets ``r`` at its output cloud, ``clouds[ℓ + 1]``, and the max of the threshold rule runs over those ``L``
    values. The official pruning code (YuriGardinazzi/conferenceProject ``src/benchmark/benchmark.py``
    ``layers_to_cut_given_r``, representations from ``src/representation/rep-extraction`` with
    ``get_target_layers(option="norm2")``) differs. It also has ``L + 1`` clouds, but cloud ``i < L``
    is the output of ``model.layers[i].post_attention_layernorm``, taken inside block ``i`` after its
    attention and before its MLP. Cloud ``L`` is the ``model.norm`` output. It cuts block ``i`` when
    ``r[i] >= t · max(r)``, never cutting cloud ``L``, though the max includes it. So the official score
    of block ``ℓ`` sits half a block before our output cloud and half a block after its input cloud,
    ``clouds[ℓ]``. ``cloud="input"`` uses the input cloud and keeps the official "skip the last cloud"
    structure, but scores block 0 at the embeddings, where the official code has no cloud. Neither
    choice separates an identity block from a neighbour: its input and output clouds are equal.
    ``cloud="mid"`` reproduces the official clouds (:func:`official_point_clouds`): block ``ℓ`` gets
    ``r[ℓ]`` and the final-norm cloud is scored but never cut. With ``"input"`` and ``"mid"`` the
    threshold max of :func:`prune_layers` includes that last cloud, as the official code's does.

    Args:
        model, tokenizer: the model.
        texts: the prompts (one point per prompt per layer).
        k: neighbours of the kNN graph; needs ``k < len(texts)``.
        p: homology dimension (the paper prunes with ``p = 1``).
        alpha: distance weight exponent (``0``: plain mean).
        batch_size: prompts per forward pass.
        cloud: ``"mid"`` (the official clouds, default), ``"output"`` (block ``ℓ`` <- ``clouds[ℓ + 1]``)
            or ``"input"`` (<- ``clouds[ℓ]``); see the NOTE. Measured on agent-small with three
            consecutive identity blocks inserted: only ``"mid"`` ranks all three first, wherever
            they sit (the others tie an identity block with its neighbour).

    Returns:
        ``(L,)``: ``r`` at each block's cloud.

    Raises:
        UserError: ``k`` too large for the prompts; the descriptors module cannot be imported.
    """
    return _zigzag_r(model, tokenizer, texts, k=k, p=p, alpha=alpha, batch_size=batch_size, cloud=cloud)[0]


ZIGZAG_CLOUDS = ("output", "input", "mid")


def _zigzag_r(model: nn.Module, tokenizer: Any, texts: Sequence[str], *, k: int, p: int, alpha: float,
              batch_size: int, cloud: str) -> tuple[np.ndarray, np.ndarray]:
    """``(score per block, r at every cloud)``; see :func:`zigzag`."""
    if cloud not in ZIGZAG_CLOUDS:
        raise UserError(f"unknown zigzag cloud {cloud!r}; use one of {', '.join(ZIGZAG_CLOUDS)}")
    texts = list(texts)
    _check_k(k, len(texts))
    layer_point_clouds, zigzag_layer_scores = _zigzag_functions()
    if cloud == "mid":
        clouds = official_point_clouds(model, tokenizer, texts, batch_size=batch_size)
    else:
        clouds = layer_point_clouds(model, tokenizer, texts, pooling="last", batch_size=batch_size)
    n_blocks = _n_blocks(model)
    if n_blocks is None or len(clouds) != n_blocks + 1:
        raise RuntimeError(f"got {len(clouds)} point clouds for a model of {n_blocks} blocks; expected {n_blocks} + 1")
    r = np.asarray(zigzag_layer_scores(clouds, k=k, p=p, alpha=alpha), dtype=np.float64).reshape(-1)
    if r.shape[0] != len(clouds):
        raise RuntimeError(f"zigzag_layer_scores returned {r.shape[0]} scores for {len(clouds)} clouds")
    return (r[1:] if cloud == "output" else r[:-1]), r


def official_point_clouds(
    model: nn.Module,
    tokenizer: Any,
    texts: Sequence[str],
    *,
    batch_size: int = 16,
    max_length: int = 2048,
) -> list[np.ndarray]:
    """The point clouds of the official zigzag code: ``L + 1`` float32 arrays ``(n_texts, d)``.

    Cloud ``i < L`` is the last-token output of ``model.model.layers[i].post_attention_layernorm``,
    inside block ``i`` after its attention. Cloud ``L`` is the output of ``model.model.norm``.
    Each text is ``strip()``-ed, encoded without special tokens and cut to ``max_length`` tokens, as
    in the official code (YuriGardinazzi/conferenceProject ``src/representation/rep-extraction``:
    ``get_target_layers(option="norm2")``, ``extract_activations(use_last_token=True)`` and
    ``encode_func(add_special_tokens=False, max_seq_length=2048)``). The outputs are not normalised
    again: these modules are the model's own RMSNorms.

    Raises:
        UserError: the model's blocks have no ``post_attention_layernorm`` or it has no ``model.norm``.
    """
    from lmforge.common.batching import inference
    from lmforge.common.generation import model_device

    layers = getattr(getattr(model, "model", None), "layers", None)
    final = getattr(getattr(model, "model", None), "norm", None)
    n = _n_blocks(model)
    if not isinstance(layers, nn.ModuleList) or not isinstance(final, nn.Module) or not n or any(
            not isinstance(getattr(layers[i], "post_attention_layernorm", None), nn.Module) for i in range(n)):
        raise UserError("the official zigzag clouds need Llama-style blocks (post_attention_layernorm) and a "
                        "final model.norm; use another zigzag cloud")
    if batch_size < 1:
        raise UserError(f"--batch-size must be at least 1, got {batch_size}")
    encoded = []
    for i, text in enumerate(texts):
        ids = list(tokenizer(str(text).strip(), add_special_tokens=False)["input_ids"])[:max_length]
        if not ids:
            raise UserError(f"calibration text {i} encodes to no tokens")
        encoded.append(ids)
    modules = [layers[i].post_attention_layernorm for i in range(n)] + [final]
    captured: dict[int, torch.Tensor] = {}
    handles = [mod.register_forward_hook(
        lambda _m, _a, out, j=j: captured.__setitem__(j, out[0] if isinstance(out, (tuple, list)) else out))
        for j, mod in enumerate(modules)]
    points: list[np.ndarray | None] = [None] * len(encoded)
    order = sorted(range(len(encoded)), key=lambda i: -len(encoded[i]))
    device = model_device(model)
    try:
        with inference(model):
            for start in range(0, len(order), batch_size):
                idx = order[start : start + batch_size]
                ids, mask = _right_padded([encoded[i] for i in idx])
                captured.clear()
                model(input_ids=ids.to(device), attention_mask=mask.to(device), use_cache=False)
                for row, i in enumerate(idx):
                    last = len(encoded[i]) - 1
                    points[i] = np.stack([captured[j][row, last].float().cpu().numpy() for j in range(len(modules))])
    finally:
        for h in handles:
            h.remove()
    stacked = np.stack(points)  # (n_texts, L + 1, d)
    return [np.ascontiguousarray(stacked[:, j, :]) for j in range(stacked.shape[1])]


# --------------------------------------------------------------------------------------------------
# every criterion from one pass


@dataclass
class LayerStatistics:
    """Per-prompt statistics from which each criterion's scores follow, for any subset of the prompts.

    One forward pass over the calibration prompts gives all three criteria, and a subset of the
    prompts (fewer prompts, another draw) re-scores without another forward: Block Influence is a
    token-weighted mean of per-prompt sums, angular distance and zigzag use one point per prompt.

    Attributes:
        cos_sums: ``(n, L)``, per prompt, ``Σ_t cos(x_{ℓ,t}, x_{ℓ+1,t})`` over its tokens (float64).
        n_tokens: ``(n,)``, the tokens of each prompt in that sum.
        last: ``(n, L + 1, d)``, each prompt's last-token residual stream at every block boundary
            (the :func:`hidden_states` convention: embeddings, then each block's output before the
            final norm).
        clouds: ``(n, L + 1, d)``, the official zigzag clouds (:func:`official_point_clouds`).
    """

    cos_sums: np.ndarray
    n_tokens: np.ndarray
    last: np.ndarray
    clouds: np.ndarray

    @property
    def n_texts(self) -> int:
        return int(self.n_tokens.shape[0])

    @property
    def n_blocks(self) -> int:
        return int(self.cos_sums.shape[1])

    def subset(self, indices: Sequence[int]) -> "LayerStatistics":
        """The statistics of the prompts ``indices`` alone."""
        idx = np.asarray(list(indices), dtype=np.int64)
        if idx.size == 0:
            raise UserError("no calibration prompts in the subset")
        return LayerStatistics(self.cos_sums[idx], self.n_tokens[idx], self.last[idx], self.clouds[idx])

    def scores(self, criterion: str, *, k: int = 4, p: int = 1, alpha: float = 0.0) -> tuple[np.ndarray, float | None]:
        """``(score per block, higher = more removable; the threshold rule's extra maximum or None)``.

        The same numbers as :func:`prune_layers` computes for ``criterion`` on these prompts:
        ``block-influence`` the token-weighted mean cosine, ``angular`` ``1 - d(x^ℓ, x^{ℓ+1})`` on the
        last token, ``zigzag`` ``r`` at the official clouds with the final-norm cloud's ``r`` as the
        extra maximum (``cloud="mid"``).
        """
        crit = _check_criterion(criterion)
        if crit == "block-influence":
            return self.cos_sums.sum(0) / float(self.n_tokens.sum()), None
        if crit == "angular":
            return angular_distance(self._last_states(), 1), None
        _check_k(k, self.n_texts)
        _, zigzag_layer_scores = _zigzag_functions()
        r = np.asarray(zigzag_layer_scores([self.clouds[:, j, :] for j in range(self.clouds.shape[1])],
                                           k=k, p=p, alpha=alpha), dtype=np.float64).reshape(-1)
        return r[:-1], float(r.max())

    def select(self, criterion: str, *, remove: int | None = None, threshold: float | None = None, k: int = 4,
               p: int = 1, alpha: float = 0.0) -> list[int]:
        """The blocks :func:`prune_layers` removes for ``criterion`` and ``remove``/``threshold``: the
        top scores, angular distance's best contiguous window for ``remove``, or the threshold rule."""
        crit = _check_criterion(criterion)
        _check_selection(remove, threshold)
        if crit == "angular" and remove is not None:
            start = angular_distance_window(self._last_states(), remove)
            return list(range(start, start + int(remove)))
        scores, max_score = self.scores(crit, k=k, p=p, alpha=alpha)
        return select_layers(scores, remove=remove, threshold=threshold, max_score=max_score)

    def _last_states(self) -> list[np.ndarray]:
        return [self.last[:, j, :] for j in range(self.last.shape[1])]


def layer_statistics(model: nn.Module, tokenizer: Any, texts: Sequence[str], *, batch_size: int = 8,
                     max_length: int | None = None, progress: bool = False) -> LayerStatistics:
    """Everything the three criteria need, for each prompt (see :class:`LayerStatistics`).

    Block Influence and angular distance read the prompts as :func:`hidden_states` does (special
    tokens, cut to ``max_length``); the zigzag clouds as the official code does (stripped, no special
    tokens, 2048 tokens). Where both give the same token ids for every prompt (a tokenizer that adds
    no BOS, stripped prompts within both lengths) one forward pass serves all three; otherwise the
    clouds take a second pass (:func:`official_point_clouds`).
    """
    texts = [str(t) for t in texts]
    if not texts:
        raise UserError("no calibration texts")
    n_blocks = _n_blocks(model)
    layers = _decoder_layers(model)
    final = getattr(getattr(model, "model", None), "norm", None)
    if not n_blocks or layers is None or not isinstance(final, nn.Module) or any(
            not isinstance(getattr(layers[i], "post_attention_layernorm", None), nn.Module) for i in range(n_blocks)):
        raise UserError("layer statistics need Llama-style blocks (post_attention_layernorm) and a final model.norm")
    plain = _encode(tokenizer, texts, _resolve_max_length(model, max_length))
    official = [list(tokenizer(t.strip(), add_special_tokens=False)["input_ids"])[:2048] for t in texts]
    one_pass = plain == official
    n = len(texts)
    cos_sums = np.zeros((n, n_blocks), dtype=np.float64)
    n_tokens = np.zeros(n, dtype=np.int64)
    last: list[np.ndarray | None] = [None] * n
    clouds: list[np.ndarray | None] = [None] * n
    modules = [layers[i].post_attention_layernorm for i in range(n_blocks)] + [final]
    captured: dict[int, torch.Tensor] = {}
    handles = [mod.register_forward_hook(
        lambda _m, _a, out, j=j: captured.__setitem__(j, out[0] if isinstance(out, (tuple, list)) else out))
        for j, mod in enumerate(modules)] if one_pass else []

    def collect(idx: list[int], states: list[torch.Tensor], lengths: torch.Tensor) -> None:
        for row, i in enumerate(idx):
            m = int(lengths[row])
            for ell in range(len(states) - 1):
                cos_sums[i, ell] = float(_cosine(states[ell][row, :m], states[ell + 1][row, :m]).sum())
            n_tokens[i] = m
            last[i] = np.stack([s[row, m - 1].float().cpu().numpy() for s in states])
            if one_pass:
                clouds[i] = np.stack([captured[j][row, m - 1].float().cpu().numpy() for j in range(len(modules))])
        captured.clear()

    try:
        _run_states(model, tokenizer, texts, collect, batch_size=batch_size, max_length=max_length,
                    progress=progress, description="layer statistics")
    finally:
        for h in handles:
            h.remove()
    if one_pass:
        cloud_arr = np.stack(clouds)  # type: ignore[arg-type]
    else:
        cloud_arr = np.stack(official_point_clouds(model, tokenizer, texts, batch_size=batch_size), axis=1)
    return LayerStatistics(cos_sums, n_tokens, np.stack(last), cloud_arr)  # type: ignore[arg-type]


# --------------------------------------------------------------------------------------------------
# selection


def _check_selection(remove: int | None, threshold: float | None) -> None:
    if (remove is None) == (threshold is None):
        raise UserError("give exactly one of --remove K and --threshold t")
    if remove is not None:
        if isinstance(remove, bool) or not isinstance(remove, (int, np.integer)):
            raise UserError(f"--remove takes a whole number of layers, got {remove!r}")
        if remove < 1:
            raise UserError(f"--remove must be at least 1, got {remove}")
    if threshold is not None:
        t = float(threshold)
        if not (0.0 < t <= 1.0):  # also refuses NaN
            raise UserError(f"--threshold must be in (0, 1], got {threshold}")


def select_layers(scores: Sequence[float] | np.ndarray, *, remove: int | None = None,
                  threshold: float | None = None, max_score: float | None = None) -> list[int]:
    """The blocks to remove, given one score per block (higher = more removable).

    ``remove=K``: the ``K`` highest scores (ties: the shallower block first). The angular criterion's
    contiguous window is chosen by :func:`angular_distance_window`; :func:`prune_layers` does that.
    ``threshold=t``: the zigzag paper's rule, every block with ``score >= t · max(score)``, for
    ``t ∈ (0, 1]`` and a positive maximum (official: ``layers_to_cut_given_r``). ``max_score``: the
    maximum is taken over the scores and this value too (the official code's max includes the
    final-norm cloud, which it never cuts).

    Returns:
        Sorted block indices.

    Raises:
        UserError: both or neither of ``remove``/``threshold``; ``K < 1``; ``t`` outside ``(0, 1]``;
            the selection would remove every block or none; scores that are not finite.
    """
    _check_selection(remove, threshold)
    s = np.asarray(scores, dtype=np.float64).reshape(-1)
    n = s.shape[0]
    if n == 0:
        raise UserError("no layer scores to select from")
    if not np.all(np.isfinite(s)):
        raise UserError(f"the layer scores are not all finite: {s.tolist()}")
    if remove is not None:
        if remove >= n:
            raise UserError(f"cannot remove every layer: --remove {remove} with {n} layers (at most {n - 1})")
        return sorted(int(i) for i in np.argsort(-s, kind="stable")[:remove])
    t = float(threshold)  # type: ignore[arg-type]
    top = float(s.max()) if max_score is None else max(float(s.max()), float(max_score))
    if top <= 0:
        raise UserError(f"the threshold rule (score >= t x max score) needs a positive maximum score, got {top:.4g}")
    chosen = [i for i in range(n) if s[i] >= t * top]
    if not chosen:  # only with max_score above every block's score
        raise UserError(f"no layer scores >= {t:g} x the maximum {top:.4g} (an uncut cloud's); lower --threshold")
    if len(chosen) == n:
        raise UserError(f"cannot remove every layer: all {n} layers score >= {t:g} x the maximum; raise --threshold")
    return chosen


# --------------------------------------------------------------------------------------------------
# removal


def _supported_layers(model: nn.Module) -> nn.ModuleList:
    """``model.model.layers`` of a supported model, or a one-line UserError."""
    cfg = getattr(model, "config", None)
    model_type = getattr(cfg, "model_type", None)
    layers = getattr(getattr(model, "model", None), "layers", None)
    if model_type not in SUPPORTED_MODEL_TYPES or not isinstance(layers, nn.ModuleList):
        raise UserError(f"layer removal supports Llama/Mistral/Qwen-style decoders ({', '.join(sorted(SUPPORTED_MODEL_TYPES))}); "
                        f"this is a {model_type or type(model).__name__} model")
    if int(cfg.num_hidden_layers) != len(layers):
        raise UserError(f"config.num_hidden_layers is {cfg.num_hidden_layers} but the model has {len(layers)} layers")
    types = getattr(cfg, "layer_types", None)
    if types is not None and len(types) != len(layers):
        raise UserError(f"config.layer_types lists {len(types)} layers but the model has {len(layers)}")
    if model_type in ("qwen2_moe", "qwen3_moe") and getattr(cfg, "num_experts", 0) and getattr(cfg, "decoder_sparse_step", 1) != 1:
        raise UserError(f"layer removal of a {model_type} model with decoder_sparse_step={cfg.decoder_sparse_step} "
                        "is not supported (which blocks are MoE depends on their index)")
    return layers


def remove_layers(model: nn.Module, indices: Sequence[int]) -> nn.Module:
    """Drop decoder blocks from a Llama/Mistral/Qwen-style model, in place; returns the model.

    Besides the ``model.model.layers`` list it updates ``config.num_hidden_layers`` and every remaining
    module's ``layer_idx`` (the KV-cache slot; official zigzag code sets ``layer.self_attn.layer_idx``).
    It also re-indexes ``config.layer_types`` (sliding/full attention per block; the model picks each
    block's mask and the cache its per-layer kind by position), ``mlp_only_layers`` (Qwen MoE) and the
    per-module names of an lmforge ``sparsity`` record. The result generates correctly with a cache and
    saves and reloads with ``save_pretrained``/``from_pretrained``.

    Raises:
        UserError: an unsupported architecture (see :data:`SUPPORTED_MODEL_TYPES`), an index out of
            range, nothing to remove, or every layer.
    """
    layers = _supported_layers(model)
    cfg = model.config
    n = len(layers)
    drop = sorted({int(i) for i in indices})
    if not drop:
        raise UserError("no layers to remove")
    if drop[0] < 0 or drop[-1] >= n:
        raise UserError(f"layer index out of range: {drop} for a model of {n} layers")
    if len(drop) >= n:
        raise UserError(f"cannot remove every layer ({n} of {n})")
    keep = [i for i in range(n) if i not in set(drop)]
    # Check everything before changing anything.
    for old in keep:
        for name, mod in layers[old].named_modules():
            idx = getattr(mod, "layer_idx", None)
            if isinstance(idx, int) and not isinstance(idx, bool) and idx != old:
                raise UserError(f"block {old} has a module ({name or 'itself'}) with layer_idx {idx}; cannot re-index it")
    new_index = {old: new for new, old in enumerate(keep)}
    for old in keep:
        for mod in layers[old].modules():
            if isinstance(getattr(mod, "layer_idx", None), int):
                mod.layer_idx = new_index[old]
    model.model.layers = nn.ModuleList([layers[i] for i in keep])
    cfg.num_hidden_layers = len(keep)
    if getattr(cfg, "layer_types", None) is not None:
        cfg.layer_types = [cfg.layer_types[i] for i in keep]
    if getattr(cfg, "mlp_only_layers", None):
        cfg.mlp_only_layers = [new_index[i] for i in cfg.mlp_only_layers if i in new_index]
    sparsity = getattr(cfg, "sparsity", None)
    if isinstance(sparsity, dict) and isinstance(sparsity.get("per_layer"), dict):
        per_layer = {}
        for name, value in sparsity["per_layer"].items():
            m = re.match(r"^(model\.layers\.)(\d+)(\..*)?$", name)
            if m is None:
                per_layer[name] = value
            elif int(m.group(2)) in new_index:
                per_layer[f"{m.group(1)}{new_index[int(m.group(2))]}{m.group(3) or ''}"] = value
        cfg.sparsity = {**sparsity, "per_layer": per_layer}
    return model


def save_layer_pruned(model: nn.Module, tokenizer: Any, out: str | Path, record: dict[str, Any], *,
                      overwrite: bool = False) -> Path:
    """Save the pruned model (safetensors, config with the new ``num_hidden_layers``), its tokenizer and
    ``layer_prune.json``, in one atomic write; an existing ``out`` is replaced only with ``overwrite``."""
    import json

    from lmforge.common.io import atomic_dir, atomic_write_json
    from lmforge.common.progress import progress_enabled

    json.dumps(record, default=str)  # fail before writing anything
    if not progress_enabled():
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    with atomic_dir(out, overwrite=overwrite) as tmp:
        model.save_pretrained(str(tmp))
        if tokenizer is not None:
            tokenizer.save_pretrained(str(tmp))
        atomic_write_json(tmp / LAYER_PRUNE_FILE, record)
    return Path(out)


# --------------------------------------------------------------------------------------------------
# pipeline


def _mean_cosines(model: nn.Module, tokenizer: Any, texts: Sequence[str], *, batch_size: int,
                  max_length: int | None, progress: bool) -> tuple[np.ndarray, int]:
    """``E_t[cos(x_ℓ, x_{ℓ+1})]`` over every real token, accumulated batch by batch (same numbers as
    ``block_influence(hidden_states(..., tokens="all"))`` without holding all states)."""
    sums: list[float] = []
    count = [0]

    def accumulate(_idx: list[int], states: list[torch.Tensor], lengths: torch.Tensor) -> None:
        width = states[0].shape[1]
        mask = torch.arange(width, device=lengths.device)[None, :] < lengths[:, None]
        if not sums:
            sums.extend([0.0] * (len(states) - 1))
        for ell in range(len(states) - 1):
            sums[ell] += float(_cosine(states[ell][mask], states[ell + 1][mask]).sum())
        count[0] += int(mask.sum())

    _run_states(model, tokenizer, texts, accumulate, batch_size=batch_size, max_length=max_length,
                progress=progress, description="block influence")
    return np.array(sums) / count[0], count[0]


def _check_criterion(criterion: str) -> str:
    name = str(criterion).strip().lower().replace("_", "-")
    if name in ("bi", "shortgpt"):
        name = "block-influence"
    if name not in CRITERIA:
        raise UserError(f"unknown criterion '{criterion}'; use one of {', '.join(CRITERIA)}")
    return name


def _floats(values: Any) -> list[float]:
    return [float(v) for v in np.asarray(values, dtype=np.float64).reshape(-1)]


def prune_layers(
    model_spec: str | Path,
    criterion: str,
    *,
    remove: int | None = None,
    threshold: float | None = None,
    out: str | Path | None,
    overwrite: bool = False,
    texts: Sequence[str] | None = None,
    calib_file: str | Path | None = None,
    n_texts: int = 256,
    eval_texts: Sequence[str] | None = None,
    eval_file: str | Path | None = None,
    measure_ppl: bool = True,
    k: int = 4,
    p: int = 1,
    alpha: float = 0.0,
    zigzag_cloud: str = "mid",
    seed: int = 0,
    batch_size: int = 8,
    max_length: int | None = None,
    allow_pickle: bool = False,
    trust_remote_code: bool = False,
    dtype: torch.dtype | str = torch.float32,
    device: str | torch.device = "cpu",
    progress: bool = False,
) -> dict[str, Any]:
    """Load a model, score its blocks, remove the chosen ones, measure, save; returns the record.

    Args:
        model_spec: a local Hugging Face folder or ``zoo:NAME``.
        criterion: ``"zigzag"``, ``"angular"`` or ``"block-influence"`` (see the module docstring).
        remove: remove this many blocks: the top scores, or for ``angular`` the best contiguous window
            (Gromov et al.'s ``ℓ*(n)``).
        threshold: remove every block with ``score >= threshold · max score`` (the zigzag paper's rule).
        out: the output model folder (``None``: score and measure only, save nothing).
        overwrite: replace an existing ``out``.
        texts / calib_file: calibration prompts (at most one); default: ``n_texts`` passages of the Paul
            Graham essays' calibration split (:func:`lmforge.data.essays.passages`, seed ``seed``), or
            for a zoo model (or without the essays) documents of lmforge's built-in mixture. The first
            ``n_texts`` are used.
        eval_texts / eval_file: held-out text for the perplexity before/after (disjoint windows);
            default: the essays' evaluation split with the essays' calibration default, else the
            held-out answer-token perplexity of the zoo mixture (as ``lmforge compress``).
        measure_ppl: measure the perplexity before and after.
        k, p, alpha: zigzag's kNN size, homology dimension and weight exponent.
        zigzag_cloud: which cloud scores a block: ``"output"``, ``"input"`` or ``"mid"`` (the official
            clouds); see :func:`zigzag`.
        batch_size: texts per forward pass; max_length: tokens per text (default min(1024, context)).
        dtype, device: where the model runs.
        progress: show progress bars (stderr).

    Returns:
        The ``layer_prune.json`` record: criterion, the score per block and its meaning, the paper's
        raw metric, the removed and kept blocks, the selection rule, calibration details, the
        perplexity before/after, timings and the output path.

    Raises:
        UserError: bad arguments (both/neither of remove/threshold, removing every layer, ``k`` too
            large for the prompts, an existing ``out``), an unsupported architecture, a model that exposes
            no hidden states.
    """
    from lmforge.common.generation import max_positions
    from lmforge.common.io import check_output_dir
    from lmforge.data.calibration import builtin_texts, read_texts

    crit = _check_criterion(criterion)
    _check_selection(remove, threshold)
    if isinstance(n_texts, bool) or int(n_texts) != n_texts or n_texts < 1:
        raise UserError(f"--n-texts must be at least 1, got {n_texts}")
    if batch_size < 1:
        raise UserError(f"--batch-size must be at least 1, got {batch_size}")
    if texts is not None and calib_file is not None:
        raise UserError("pass calibration texts or a calibration file, not both")
    if eval_texts is not None and eval_file is not None:
        raise UserError("pass evaluation texts or an evaluation file, not both")
    from lmforge.data import essays

    # A model other than a zoo one, without texts of its own: real text, the essays (as `compress`),
    # its passages drawn once the tokenizer is loaded.
    essay_default = texts is None and calib_file is None and not str(model_spec).startswith("zoo:") and essays.available()
    if calib_file is not None:
        calib, source = read_texts(calib_file), str(calib_file)
    elif texts is not None:
        calib, source = [str(t) for t in texts], "given texts"
    elif essay_default:
        calib, source = [], "Paul Graham essays, calibration split: passages (lmforge.data.essays.passages)"
    else:
        calib, source = builtin_texts(seed, n_texts), "lmforge built-in zoo mixture"
    calib = calib[:n_texts]
    if not calib and not essay_default:
        raise UserError("no calibration texts")
    if crit == "zigzag":
        _check_k(k, n_texts if essay_default else len(calib))
        if isinstance(p, bool) or not isinstance(p, (int, np.integer)) or p < 0:
            raise UserError(f"the homology dimension p must be a non-negative integer, got {p!r}")
        if zigzag_cloud not in ZIGZAG_CLOUDS:
            raise UserError(f"unknown zigzag cloud {zigzag_cloud!r}; use one of {', '.join(ZIGZAG_CLOUDS)}")
        _zigzag_functions()  # unavailable: fail before loading the model
    held_out = read_texts(eval_file) if eval_file is not None else (list(eval_texts) if eval_texts is not None else None)
    if held_out is None and essay_default:
        held_out = essays.split("evaluation")  # held out by essay from the calibration passages
    if out is not None:
        check_output_dir(out, overwrite)

    from lmforge.models.load import load

    model, tok = load(model_spec, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code,
                      dtype=dtype, device=device)
    from lmforge.models.quantized import quantized_modules

    if quantized_modules(model):
        raise UserError("the model has quantized layers; prune the layers of the dense model, then quantize")
    n_layers = len(_supported_layers(model))
    if essay_default:
        calib = essays.passages(tok, n_texts, seed)
    if remove is not None and remove >= n_layers:
        raise UserError(f"cannot remove every layer: --remove {remove} with {n_layers} layers (at most {n_layers - 1})")

    record: dict[str, Any] = {"criterion": crit, "model": str(model_spec), "layers_before": n_layers}
    t0 = time.perf_counter()
    window: dict[str, Any] | None = None
    max_score: float | None = None
    if crit == "block-influence":
        cos, n_tok = _mean_cosines(model, tok, calib, batch_size=batch_size, max_length=max_length, progress=progress)
        scores = cos
        raw = {"name": "BI (block influence, lower = more removable)", "values": _floats(1.0 - cos)}
        tokens_used: dict[str, Any] = {"tokens": "all", "n_tokens": n_tok,
                                       "max_length": _resolve_max_length(model, max_length)}
    elif crit == "angular":
        last = hidden_states(model, tok, calib, tokens="last", batch_size=batch_size, max_length=max_length,
                             progress=progress)
        d1 = angular_distance(last, 1, raw=True)
        scores = 1.0 - d1
        raw = {"name": "angular distance d(x^l, x^(l+1)) (lower = more removable)", "values": _floats(d1)}
        tokens_used = {"tokens": "last", "n_tokens": len(calib), "max_length": _resolve_max_length(model, max_length)}
        if remove is not None:
            start = angular_distance_window(last, remove)
            window = {"n": int(remove), "start": start,
                      "distances": _floats(angular_distance(last, remove, raw=True))}
    else:
        scores, r_all = _zigzag_r(model, tok, calib, k=k, p=p, alpha=alpha, batch_size=batch_size, cloud=zigzag_cloud)
        raw = {"name": "r at every point cloud (zigzag inter-layer persistence, higher = more removable)",
               "values": _floats(r_all)}
        if zigzag_cloud in ("input", "mid"):
            max_score = float(r_all.max())  # official: the max includes the final-norm cloud
        # the clouds' own truncation: official 2048 tokens; layer_point_clouds' default, none
        tokens_used = {"tokens": "last", "n_tokens": len(calib), "max_length": 2048 if zigzag_cloud == "mid" else None}
        record["zigzag"] = {"k": int(k), "p": int(p), "alpha": float(alpha), "cloud": zigzag_cloud}
    scores = np.asarray(scores, dtype=np.float64)
    if scores.shape != (n_layers,):
        raise RuntimeError(f"the {crit} criterion gave {scores.shape} scores for {n_layers} layers")
    if window is not None:
        removed = list(range(window["start"], window["start"] + window["n"]))
    else:
        removed = select_layers(scores, remove=remove, threshold=threshold, max_score=max_score)
    score_seconds = time.perf_counter() - t0
    top = max(float(scores.max()), max_score if max_score is not None else -math.inf)

    limit = max_positions(model) or 2048
    seq_len = min(2048, limit)
    if measure_ppl:
        from lmforge.compression import heldout_perplexity

        record["ppl_before"], record["ppl_metric"] = heldout_perplexity(model, tok, held_out, seq_len=seq_len, seed=seed)
    remove_layers(model, removed)
    if measure_ppl:
        record["ppl_after"], _ = heldout_perplexity(model, tok, held_out, seq_len=seq_len, seed=seed)

    record.update(
        layers_after=n_layers - len(removed),
        removed=removed,
        kept=[i for i in range(n_layers) if i not in set(removed)],
        selection=({"rule": "contiguous window argmin_l d(x^l, x^(l+n))", **window} if window is not None
                   else {"rule": "top K scores", "remove": int(remove)} if remove is not None
                   else {"rule": "score >= t * max score", "threshold": float(threshold),  # type: ignore[arg-type]
                         "max_score": top, "cutoff": float(threshold) * top}),  # type: ignore[arg-type]
        scores=_floats(scores),
        score_meaning=_SCORE_MEANING[crit],
        raw_metric=raw,
        calibration={"texts": len(calib), "source": source, "seed": seed, "batch_size": batch_size, **tokens_used},
        seconds=round(score_seconds, 3),
    )
    if out is not None:
        record["path"] = str(out)
        save_layer_pruned(model, tok, out, record, overwrite=overwrite)
    return record
