"""Reward models with Bradley–Terry, mean-variance and classification heads.

Three bodies share one interface, ``model.score(batch) -> Tensor (n, out_dim)``:

* :class:`MLPRewardModel`: a small MLP on feature vectors (tests, synthetic studies).
* :class:`LMRewardModel`: a causal LM's last-token hidden state (last non-padding position) under a
  linear head, as in the paper's Llama-3-8B-Instruct reward models and TRL's reward models.
* :class:`SeqClsRewardModel`: any ``AutoModelForSequenceClassification`` with ``num_labels`` set to
  the head's width (1 for BT: what public reward models such as Skywork-Reward ship).

:func:`head_outputs` turns the raw outputs into rewards: BT r = out₀; mean-variance μ = out₀,
σ = softplus(out₁) + min_sigma; classification: softmax over ratings, reward = expected rating.

Folders: :func:`save_reward_model` writes ``reward.json`` (the head config) beside the weights
(safetensors only); :func:`load_reward_model` reads them back, and also opens any plain Hugging Face
sequence-classification folder (a public reward model) as a BT head. Loading is local and safe:
safetensors weights only, no remote code, offline (:mod:`lmforge.models.load`'s checks).
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from lmforge.common.errors import UserError
from lmforge.methods.diverging_prefs.config import DivergingPrefsConfig

logger = logging.getLogger(__name__)

REWARD_JSON = "reward.json"
HEAD_WEIGHTS = "reward_head.safetensors"


@dataclass
class RewardOutputs:
    """Interpreted head outputs for n responses (numpy arrays).

    Attributes:
        reward: the scalar reward (BT r, μ, or the expected rating).
        sigma: σ per response (mean-variance heads), else None.
        probs: rating distribution (classification heads), else None.
    """

    reward: np.ndarray
    sigma: np.ndarray | None = None
    probs: np.ndarray | None = None


def head_outputs(raw: torch.Tensor, cfg: DivergingPrefsConfig) -> dict[str, torch.Tensor]:
    """Raw (n, out_dim) outputs as tensors: ``reward`` (+ ``sigma`` or ``logits``)."""
    if raw.dim() != 2 or raw.shape[1] != cfg.out_dim:
        raise ValueError(f"expected (n, {cfg.out_dim}) outputs for head '{cfg.head}', got {tuple(raw.shape)}")
    if cfg.head == "bt":
        return {"reward": raw[:, 0]}
    if cfg.head == "meanvar":
        return {"reward": raw[:, 0], "sigma": F.softplus(raw[:, 1]) + cfg.min_sigma}
    logits = raw
    ratings = torch.arange(1, cfg.num_ratings + 1, dtype=raw.dtype, device=raw.device)
    return {"reward": (torch.softmax(logits, -1) * ratings).sum(-1), "logits": logits}


def to_outputs(raw: torch.Tensor, cfg: DivergingPrefsConfig) -> RewardOutputs:
    """:func:`head_outputs` as numpy :class:`RewardOutputs`."""
    out = head_outputs(raw.detach().float(), cfg)
    return RewardOutputs(
        reward=out["reward"].cpu().numpy().astype(np.float64),
        sigma=out["sigma"].cpu().numpy().astype(np.float64) if "sigma" in out else None,
        probs=torch.softmax(out["logits"], -1).cpu().numpy().astype(np.float64) if "logits" in out else None,
    )


# ------------------------------------------------------------------------------------------ bodies


class MLPRewardModel(nn.Module):
    """An MLP from a feature vector to the head's outputs.

    Args:
        in_dim: features per response.
        out_dim: head width (:attr:`DivergingPrefsConfig.out_dim`).
        hidden: hidden width.
        depth: hidden layers.
    """

    kind = "mlp"

    def __init__(self, in_dim: int, out_dim: int, hidden: int = 64, depth: int = 2) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        d = in_dim
        for _ in range(depth):
            layers += [nn.Linear(d, hidden), nn.GELU()]
            d = hidden
        layers.append(nn.Linear(d, out_dim))
        self.net = nn.Sequential(*layers)
        self.spec = {"in_dim": in_dim, "out_dim": out_dim, "hidden": hidden, "depth": depth}

    def score(self, batch: torch.Tensor) -> torch.Tensor:
        return self.net(batch.float())


def format_text(tokenizer: Any, prompt: str, response: str) -> str:
    """The text a reward model reads: the chat template (user prompt, assistant response) when the
    tokenizer has one, else ``prompt + "\\n" + response``."""
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(
            [{"role": "user", "content": prompt}, {"role": "assistant", "content": response}], tokenize=False
        )
    return f"{prompt}\n{response}"


def _encode(tokenizer: Any, texts: list[str], max_length: int, device: torch.device) -> dict[str, torch.Tensor]:
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    tokenizer.padding_side = "right"
    enc = tokenizer(list(texts), return_tensors="pt", padding=True, truncation=True, max_length=max_length)
    return {k: v.to(device) for k, v in enc.items() if k in ("input_ids", "attention_mask")}


class LMRewardModel(nn.Module):
    """A causal LM body with a linear head on the last non-padding token's final hidden state.

    Args:
        lm: a Hugging Face causal LM (its base model is used; the LM head is not run).
        tokenizer: its tokenizer.
        out_dim: head width.
        max_length: tokens per text at most (right-truncated).
    """

    kind = "lm"

    def __init__(self, lm: Any, tokenizer: Any, out_dim: int, max_length: int = 512) -> None:
        super().__init__()
        self.lm = lm
        self.tokenizer = tokenizer
        self.max_length = max_length
        hidden = lm.config.hidden_size
        self.head = nn.Linear(hidden, out_dim)
        nn.init.normal_(self.head.weight, std=1.0 / (hidden + 1) ** 0.5)  # TRL's reward-head init
        nn.init.zeros_(self.head.bias)
        self.spec = {"out_dim": out_dim, "max_length": max_length}

    def score(self, batch: list[str]) -> torch.Tensor:
        device = next(self.parameters()).device
        enc = _encode(self.tokenizer, batch, self.max_length, device)
        body = getattr(self.lm, self.lm.base_model_prefix, self.lm)
        hidden = body(**enc).last_hidden_state  # (n, T, H)
        last = enc["attention_mask"].sum(1) - 1  # right padding: the last real token
        h = hidden[torch.arange(hidden.shape[0], device=device), last]
        return self.head(h.float())


class SeqClsRewardModel(nn.Module):
    """An ``AutoModelForSequenceClassification`` whose ``num_labels`` logits are the head outputs."""

    kind = "seqcls"

    def __init__(self, model: Any, tokenizer: Any, max_length: int = 512, select: int | None = None) -> None:
        super().__init__()
        self.model = model
        self.select = select
        self.tokenizer = tokenizer
        self.max_length = max_length
        if getattr(model.config, "pad_token_id", None) is None:
            if tokenizer.pad_token_id is None:
                tokenizer.pad_token = tokenizer.eos_token
            model.config.pad_token_id = tokenizer.pad_token_id
        self.spec = {"out_dim": int(model.config.num_labels) if select is None else 1, "max_length": max_length}

    def score(self, batch: list[str]) -> torch.Tensor:
        device = next(self.parameters()).device
        enc = _encode(self.tokenizer, batch, self.max_length, device)
        logits = self.model(**enc).logits.float()
        # A public reward model read as a BT head: only the reward logit.
        return logits if self.select is None else logits[:, self.select : self.select + 1]


def make_model(cfg: DivergingPrefsConfig, *, in_dim: int | None = None, lm_spec: str | os.PathLike[str] | None = None,
               body: str = "lm", hidden: int = 64, max_length: int = 512) -> nn.Module:
    """A fresh reward model for ``cfg``: an MLP (``in_dim``) or an HF body (``lm_spec``: ``zoo:NAME`` or a
    local folder; ``body="lm"`` for a causal LM with a last-token head, ``"seqcls"`` for
    ``AutoModelForSequenceClassification`` built from the same folder's weights)."""
    torch.manual_seed(cfg.seed)
    if in_dim is not None:
        return MLPRewardModel(in_dim, cfg.out_dim, hidden=hidden)
    if lm_spec is None:
        raise UserError("a reward model needs either feature inputs (in_dim) or a model (lm_spec)")
    if body == "lm":
        from lmforge.models.load import load

        lm, tok = load(lm_spec)
        return LMRewardModel(lm, tok, cfg.out_dim, max_length=max_length)
    if body == "seqcls":
        model, tok = _load_seqcls(lm_spec, num_labels=cfg.out_dim)
        return SeqClsRewardModel(model, tok, max_length=max_length)
    raise UserError(f"body must be 'lm' or 'seqcls', got '{body}'")


# ------------------------------------------------------------------------------------ persistence


def _load_seqcls(spec: str | os.PathLike[str], num_labels: int | None = None) -> tuple[Any, Any]:
    """``AutoModelForSequenceClassification`` + tokenizer from a local folder: safetensors only, no
    remote code, offline. ``num_labels`` re-initialises the score layer when it differs (a fresh
    head on a causal LM's weights); None keeps the folder's."""
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from lmforge.models.load import _check_weights, _load_config, _offline, _one_line, resolve_spec

    folder = resolve_spec(spec)
    _check_weights(folder, allow_pickle=False)
    with _offline():
        config = _load_config(folder, trust_remote_code=False)
        if num_labels is not None:
            config.num_labels = num_labels
        try:
            model, info = AutoModelForSequenceClassification.from_pretrained(
                str(folder), config=config, local_files_only=True, trust_remote_code=False, use_safetensors=True,
                dtype=torch.float32, ignore_mismatched_sizes=num_labels is not None, output_loading_info=True,
            )
            tok = AutoTokenizer.from_pretrained(str(folder), local_files_only=True, trust_remote_code=False)
        except UserError:
            raise
        except Exception as exc:
            raise UserError(f"could not load '{folder}' as a sequence-classification reward model: {_one_line(exc)}") from None
    missing = sorted(info.get("missing_keys") or [])
    if missing and num_labels is None:
        # A reward model must bring its own head: a causal LM folder would get a random one.
        raise UserError(f"'{folder}' is not a sequence-classification reward model: {len(missing)} tensors missing "
                        f"(e.g. {', '.join(missing[:2])}); train a head with `lmforge reward train`")
    model.eval()
    return model, tok


def save_reward_model(model: nn.Module, cfg: DivergingPrefsConfig, out: str | os.PathLike[str],
                      extra: dict[str, Any] | None = None) -> Path:
    """Write ``model`` into the existing folder ``out`` (safetensors + ``reward.json``)."""
    from safetensors.torch import save_file

    out = Path(out)
    meta: dict[str, Any] = {"format": "lmforge-reward", "kind": model.kind, "config": asdict(cfg),
                            "spec": model.spec, **(extra or {})}
    if isinstance(model, MLPRewardModel):
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(out / HEAD_WEIGHTS))
    elif isinstance(model, LMRewardModel):
        model.lm.save_pretrained(out, safe_serialization=True)
        model.tokenizer.save_pretrained(out)
        save_file({k: v.contiguous() for k, v in model.head.state_dict().items()}, str(out / HEAD_WEIGHTS))
    elif isinstance(model, SeqClsRewardModel):
        model.model.save_pretrained(out, safe_serialization=True)
        model.tokenizer.save_pretrained(out)
    else:
        raise TypeError(f"cannot save a {type(model).__name__}")
    (out / REWARD_JSON).write_text(json.dumps(meta, indent=2), encoding="utf-8")
    return out


def load_reward_model(spec: str | os.PathLike[str]) -> tuple[nn.Module, DivergingPrefsConfig]:
    """A reward model folder written by :func:`save_reward_model`, or any plain Hugging Face
    sequence-classification reward model folder (read as a BT head on its first logit)."""
    from safetensors.torch import load_file

    from lmforge.models.load import resolve_spec

    folder = resolve_spec(spec)
    meta_file = folder / REWARD_JSON
    if not meta_file.is_file():
        model, tok = _load_seqcls(folder)
        # NOTE: public reward models put the reward in logit 0 (num_labels = 1); with more labels we
        # still read logit 0 and say so, rather than guess a label convention.
        n_labels = int(getattr(model.config, "num_labels", 1))
        if n_labels > 1:
            logger.warning("%s is a sequence classifier with %d labels, not a 1-logit reward model; its logit 0 "
                           "is read as the reward (labels: %s)", folder, n_labels,
                           getattr(model.config, "id2label", None))
        return SeqClsRewardModel(model, tok, select=0), DivergingPrefsConfig(head="bt")
    try:
        meta = json.loads(meta_file.read_text(encoding="utf-8"))
        raw_cfg = dict(meta["config"])
        raw_cfg["cuts"] = tuple(raw_cfg["cuts"])
        cfg = DivergingPrefsConfig(**raw_cfg)
        kind, spec_d = meta["kind"], meta["spec"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(f"'{meta_file}' is not a valid reward-model description: {exc}") from None
    if kind == "mlp":
        model = MLPRewardModel(spec_d["in_dim"], spec_d["out_dim"], spec_d["hidden"], spec_d["depth"])
        model.load_state_dict(load_file(str(folder / HEAD_WEIGHTS)))
    elif kind == "lm":
        from lmforge.models.load import load

        lm, tok = load(folder)
        model = LMRewardModel(lm, tok, spec_d["out_dim"], spec_d["max_length"])
        model.head.load_state_dict(load_file(str(folder / HEAD_WEIGHTS)))
    elif kind == "seqcls":
        m, tok = _load_seqcls(folder)
        model = SeqClsRewardModel(m, tok, spec_d["max_length"])
    else:
        raise UserError(f"'{meta_file}' names an unknown reward-model kind '{kind}'")
    model.eval()
    return model, cfg
