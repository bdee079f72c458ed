"""A µnit Scaling (µS) Llama-style causal LM, its standard-parametrization (SP) counterpart, save/load.

The SP baseline (:class:`SPForCausalLM`) is the same model but for the parametrization (placement of
the norms, init, multipliers), as the paper's comparison is.

Narayan et al., "µnit Scaling: Simple and Scalable FP8 LLM Training" (ICML 2025). The µS model:

* Res-Post-LayerNorm around both sublayers, ``x <- sqrt(1-tau) x + sqrt(tau) LN(f(x))``, fixed τ;
* every weight initialised N(0, 1);
* output multipliers: embedding 1, hidden linears ``1/sqrt(fan_in)`` (the GEMM's α), LM head
  ``1/fan_in``;
* hidden linears (QKV, attention out, FFN up/gate/down) optionally in FP8 with static casts
  (:mod:`lmforge.methods.unit_scaling.fp8`); embedding and head stay in float32.

The model is built from a transformers ``LlamaConfig`` (width, depth, heads, FFN width, vocab,
RoPE) and reuses transformers' Llama rotary embedding, but its decoder layer is µS's, so it is a
plain ``torch.nn.Module`` returning HF-style ``CausalLMOutputWithPast`` (``.loss``, ``.logits``).
NOTE: it is not a ``PreTrainedModel`` (no ``generate``/KV cache, no ``from_pretrained``); it saves
with :func:`save_mus` and loads with :func:`load_mus`, without remote code.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from transformers import LlamaConfig
from transformers.modeling_outputs import CausalLMOutputWithPast
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

from lmforge.common.errors import UserError
from lmforge.methods.unit_scaling.config import MuSConfig
from lmforge.methods.unit_scaling.fp8 import FP8Counters, fp8_linear

MODEL_TYPE = "lmforge-mus"
HIDDEN_LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


class MuSLinear(nn.Module):
    """A bias-free linear with N(0,1) weights and static output multiplier ``alpha = 1/sqrt(fan_in)``.

    With ``fp8`` set, the GEMM runs through :func:`fp8_linear` (E4M3 forward, E5M2 backward).
    """

    def __init__(self, fan_in: int, fan_out: int, name: str = "linear") -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.randn(fan_out, fan_in))
        self.alpha = 1.0 / math.sqrt(fan_in)
        self.fp8 = False
        self.counters: FP8Counters | None = None
        self.name = name
        self.grad_scale = 1.0  # static E5M2 gradient scale, set by the model per batch shape

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``alpha * x @ W.T``, in FP8 when enabled."""
        if self.fp8:
            return fp8_linear(x, self.weight, self.alpha, self.counters, self.name, self.grad_scale)
        return F.linear(x, self.weight) * self.alpha

    def extra_repr(self) -> str:
        return f"fan_in={self.weight.shape[1]}, fan_out={self.weight.shape[0]}, alpha={self.alpha:.4g}, fp8={self.fp8}"


class MuSAttention(nn.Module):
    """Causal multi-head attention (grouped KV heads as in Llama) with µS linears and RoPE."""

    def __init__(self, cfg: LlamaConfig, mus: MuSConfig, prefix: str) -> None:
        super().__init__()
        d = cfg.hidden_size
        self.n_heads = cfg.num_attention_heads
        self.n_kv = cfg.num_key_value_heads or self.n_heads
        self.head_dim = getattr(cfg, "head_dim", None) or d // self.n_heads
        self.q_proj = MuSLinear(d, self.n_heads * self.head_dim, f"{prefix}.q_proj")
        self.k_proj = MuSLinear(d, self.n_kv * self.head_dim, f"{prefix}.k_proj")
        self.v_proj = MuSLinear(d, self.n_kv * self.head_dim, f"{prefix}.v_proj")
        self.o_proj = MuSLinear(self.n_heads * self.head_dim, d, f"{prefix}.o_proj")
        self.scale = self.head_dim ** -mus.softmax_scale

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor | None) -> torch.Tensor:
        b, t, _ = x.shape
        q = self.q_proj(x).view(b, t, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(b, t, self.n_kv, self.head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, cos, sin)
        if self.n_kv != self.n_heads:
            rep = self.n_heads // self.n_kv
            k, v = k.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
        if mask is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)
        else:
            out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=self.scale)
        return self.o_proj(out.transpose(1, 2).reshape(b, t, -1))


class MuSMLP(nn.Module):
    """``down(act(up(x)))`` (paper, MPT-style) or Llama's gated ``down(act(gate(x)) * up(x))``."""

    def __init__(self, cfg: LlamaConfig, mus: MuSConfig, prefix: str) -> None:
        super().__init__()
        d, i = cfg.hidden_size, cfg.intermediate_size
        self.up_proj = MuSLinear(d, i, f"{prefix}.up_proj")
        self.gate_proj = MuSLinear(d, i, f"{prefix}.gate_proj") if mus.gated_mlp else None
        self.down_proj = MuSLinear(i, d, f"{prefix}.down_proj")
        self.act = F.gelu if mus.activation == "gelu" else F.silu

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.act(self.up_proj(x)) if self.gate_proj is None else self.act(self.gate_proj(x)) * self.up_proj(x)
        return self.down_proj(h)


class MuSDecoderLayer(nn.Module):
    """One µS block: Res-Post-LN with fixed τ around attention and around the MLP."""

    def __init__(self, cfg: LlamaConfig, mus: MuSConfig, idx: int) -> None:
        super().__init__()
        prefix = f"layers.{idx}"
        self.self_attn = MuSAttention(cfg, mus, f"{prefix}.self_attn")
        self.mlp = MuSMLP(cfg, mus, f"{prefix}.mlp")
        # LayerNorm as in the paper (not Llama's RMSNorm); no bias, unit gain at init.
        self.attn_norm = nn.LayerNorm(cfg.hidden_size, bias=False)
        self.mlp_norm = nn.LayerNorm(cfg.hidden_size, bias=False)
        # Variance-preserving weights: (1-τ)·Var(x) + τ·Var(LN(·)) = 1 when Var(x) = 1.
        self.skip = math.sqrt(1.0 - mus.tau)
        self.branch = math.sqrt(mus.tau)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor | None) -> torch.Tensor:
        x = self.skip * x + self.branch * self.attn_norm(self.self_attn(x, cos, sin, mask))
        return self.skip * x + self.branch * self.mlp_norm(self.mlp(x))


class MuSForCausalLM(nn.Module):
    """A µS causal LM shaped by a ``LlamaConfig``.

    Attributes:
        config: the transformers ``LlamaConfig`` (shape only; its ``initializer_range`` is unused).
        mus_config: the :class:`MuSConfig`.
        fp8_counters: the counters of the FP8 casts once :func:`apply.enable_fp8` ran, else None.
    """

    is_mus = True

    def __init__(self, config: LlamaConfig, mus: MuSConfig) -> None:
        super().__init__()
        self.config = config
        self.mus_config = mus
        d = config.hidden_size
        self.embed_tokens = nn.Embedding(config.vocab_size, d)
        nn.init.normal_(self.embed_tokens.weight, 0.0, 1.0)  # N(0,1), multiplier 1
        self.layers = nn.ModuleList(MuSDecoderLayer(config, mus, i) for i in range(config.num_hidden_layers))
        # NOTE: a final LayerNorm before the head, as in Llama/MPT; the Res-Post-LN stream is already
        # near unit scale, so it only fixes the gain the head sees.
        self.norm = nn.LayerNorm(d, bias=False)
        # NOTE: the head is never tied to the embedding: µS gives them different multipliers
        # (1 vs 1/fan_in) and learning-rate rules, so `tie_word_embeddings` is ignored.
        self.lm_head = nn.Parameter(torch.randn(config.vocab_size, d))
        self.head_alpha = 1.0 / d
        self.rotary_emb = LlamaRotaryEmbedding(config)
        self.fp8_counters: FP8Counters | None = None

    def hidden_linears(self) -> dict[str, MuSLinear]:
        """Every FP8-eligible linear by its name (QKV, attention out, FFN up/gate/down)."""
        return {m.name: m for m in self.modules() if isinstance(m, MuSLinear)}

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None,
                labels: torch.Tensor | None = None, **_: Any) -> CausalLMOutputWithPast:
        """HF-style forward: ``labels`` are the inputs themselves (shifted inside), -100 ignored."""
        b, t = input_ids.shape
        # The paper casts gradients to E5M2 directly (the default). NOTE: our loss is a *mean* over the
        # batch's tokens and the head's forward multiplier 1/fan_in is also its backward multiplier, so
        # raw activation gradients are O(1/(n_tokens*d)) (measured: ~78% E5M2 underflow at d=64). The
        # option `fp8_grad_scale` casts them times the static constant n_tokens / head multiplier (from
        # the batch shape: a fixed loss scale, no amax, nothing data-dependent), which brings them to
        # O(1) at every width; with Lion the update is invariant to it otherwise.
        scale = float(b * max(t - 1, 1)) / self.head_alpha if self.mus_config.fp8_grad_scale else 1.0
        for lin in self.hidden_linears().values():
            lin.grad_scale = scale
        x = self.embed_tokens(input_ids)
        pos = torch.arange(t, device=input_ids.device)[None].expand(b, t)
        cos, sin = self.rotary_emb(x, pos)
        mask = None
        if attention_mask is not None and not bool(attention_mask.all()):
            causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            mask = (causal[None] & attention_mask.bool()[:, None, :])[:, None]
        for layer in self.layers:
            x = layer(x, cos, sin, mask)
        # The head stays in float32 (not FP8), multiplier 1/fan_in.
        logits = F.linear(self.norm(x), self.lm_head) * self.head_alpha
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1),
                                   ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits)


def build_mus(config: LlamaConfig, mus: MuSConfig, seed: int | None = None) -> MuSForCausalLM:
    """A freshly initialised µS model (``seed`` seeds torch's generator first when given)."""
    if config.hidden_size % config.num_attention_heads:
        raise UserError(f"hidden_size {config.hidden_size} is not divisible by num_attention_heads "
                        f"{config.num_attention_heads}")
    if seed is not None:
        torch.manual_seed(seed)
    return MuSForCausalLM(config, mus)


# --------------------------------------------------------------------------------------------
# Standard parametrization (SP): the comparison baseline.


class SPDecoderLayer(MuSDecoderLayer):
    """The same attention, MLP and norms as :class:`MuSDecoderLayer`, in the paper's SP placement:
    Pre-LayerNorm, ``x <- x + f(LN(x))`` (τ is unused)."""

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor | None) -> torch.Tensor:
        x = x + self.self_attn(self.attn_norm(x), cos, sin, mask)
        return x + self.mlp(self.mlp_norm(x))


class SPForCausalLM(MuSForCausalLM):
    """The SP baseline: µS's model in every part but the parametrization.

    The same attention (RoPE, softmax scale), MLP (``mus.activation``, gated or not), LayerNorm
    without bias, final norm and untied head as the µS model, so that only what the paper's
    comparison varies differs: Pre-LN placement instead of Res-Post-LN with a fixed τ, every weight
    N(0, ``config.initializer_range``²), and every multiplier 1 (hidden linears and head). FP8, where
    switched on (:func:`simulate_fp8_casts`), runs the same static casts as µS.
    """

    is_mus = False

    def __init__(self, config: LlamaConfig, mus: MuSConfig) -> None:
        super().__init__(config, mus)
        self.layers = nn.ModuleList(SPDecoderLayer(config, mus, i) for i in range(config.num_hidden_layers))
        std = float(config.initializer_range)
        for lin in self.hidden_linears().values():
            nn.init.normal_(lin.weight, 0.0, std)
            lin.alpha = 1.0
        nn.init.normal_(self.embed_tokens.weight, 0.0, std)
        nn.init.normal_(self.lm_head, 0.0, std)
        self.head_alpha = 1.0


def build_sp(config: LlamaConfig, seed: int | None = None, mus: MuSConfig | None = None) -> SPForCausalLM:
    """A freshly initialised SP baseline (:class:`SPForCausalLM`) with ``mus``'s block settings
    (activation, gated MLP, softmax scale; default :class:`MuSConfig`'s, the µS model's)."""
    if config.hidden_size % config.num_attention_heads:
        raise UserError(f"hidden_size {config.hidden_size} is not divisible by num_attention_heads "
                        f"{config.num_attention_heads}")
    if seed is not None:
        torch.manual_seed(seed)
    return SPForCausalLM(config, mus if mus is not None else MuSConfig())


def simulate_fp8_casts(model: SPForCausalLM, counters: FP8Counters | None = None) -> FP8Counters:
    """Run an SP baseline's hidden linears through the µS FP8 casts, to count what SP would lose.

    This is *not* a way to train SP in FP8 (static casts without scale factors are unsafe there,
    see ``apply.enable_fp8``); it exists for the paper's comparison that SP underflows far more. The
    gradient rule is the µS model's (``mus_config.fp8_grad_scale``: n_tokens / head multiplier, which
    is 1 under SP).

    Args:
        model: a :class:`SPForCausalLM`.
        counters: counters to record into; a new one when None.

    Returns:
        The counters the casts record into.
    """
    if not isinstance(model, SPForCausalLM):
        raise UserError("simulate_fp8_casts takes the SP baseline built by build_sp")
    counters = counters if counters is not None else FP8Counters()
    for lin in model.hidden_linears().values():
        lin.fp8 = True
        lin.counters = counters
    model.fp8_counters = counters
    return counters


# --------------------------------------------------------------------------------------------
# Save / load.


def save_mus(model: MuSForCausalLM, folder: str | Path) -> Path:
    """Write ``model.safetensors`` and ``config.json`` (Llama shape + µS fields) into ``folder``.

    Args:
        model: a µS model.
        folder: output directory (created).

    Returns:
        The folder.
    """
    from safetensors.torch import save_file

    if not getattr(model, "is_mus", False):
        raise UserError("save_mus needs a µS model (built by build_mus_model)")
    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(state, str(out / "model.safetensors"))
    cfg = {"model_type": MODEL_TYPE, "llama": model.config.to_dict(), "mus": model.mus_config.to_dict(),
           "fp8": any(m.fp8 for m in model.hidden_linears().values())}
    (out / "config.json").write_text(json.dumps(cfg, indent=2, default=str))
    return out


def load_mus(folder: str | Path) -> MuSForCausalLM:
    """Load a folder written by :func:`save_mus` (FP8 casts re-enabled if they were on).

    Args:
        folder: the directory.

    Returns:
        The µS model, in eval mode.
    """
    from safetensors.torch import load_file

    p = Path(folder)
    cfg_path = p / "config.json"
    if not cfg_path.is_file() or not (p / "model.safetensors").is_file():
        raise UserError(f"{p} is not a µS model folder (needs config.json and model.safetensors)")
    cfg = json.loads(cfg_path.read_text())
    if cfg.get("model_type") != MODEL_TYPE:
        raise UserError(f"{p} holds model_type {cfg.get('model_type')!r}, not a µS model ({MODEL_TYPE})")
    llama = dict(cfg["llama"])
    for k in ("transformers_version", "architectures", "model_type"):
        llama.pop(k, None)
    model = MuSForCausalLM(LlamaConfig(**llama), MuSConfig.from_dict(cfg["mus"]))
    model.load_state_dict(load_file(str(p / "model.safetensors")), strict=True)
    if cfg.get("fp8"):
        from lmforge.methods.unit_scaling.apply import enable_fp8

        enable_fp8(model)
    return model.eval()
