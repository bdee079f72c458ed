"""Load a local Hugging Face causal LM and its tokenizer, safely and offline.

``load(spec)`` accepts a local model folder, a ``.gguf`` file (or a folder holding one, converted once
into a cached safetensors folder by :mod:`lmforge.models.gguf`), ``real:NAME`` (a real checkpoint that
installs from the package registries, :mod:`lmforge.models.real`) or ``zoo:NAME`` (a tiny model
lmforge builds itself, see :mod:`lmforge.models.zoo`). It never downloads anything: every Hugging Face call gets
``local_files_only=True`` and the Hub's offline switch is on while loading. It refuses, by default,
the two things that can run arbitrary code on load: pickle weights (``*.bin``/``*.pt``, opt in with
``allow_pickle``) and custom modelling code named by ``auto_map`` (opt in with
``trust_remote_code``). Every problem the user can fix is a one-line :class:`UserError`.

Checkpoints saved by :func:`lmforge.models.quantized.save_compressed` (config.json's
``quantization_config.quant_method == "lmforge"``) are built by
:func:`lmforge.models.quantized.build_compressed_model`, with packed quantized layers.

Supported models are decoder-only causal LMs that transformers knows (Llama, Qwen2/3, Mistral,
GPT-2, Gemma, Phi, ...); encoder-only and encoder-decoder models are refused.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from lmforge.common.errors import UserError
from lmforge.common.progress import progress_enabled

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = ["REAL_PREFIX", "ZOO_PREFIX", "load", "resolve_spec"]

ZOO_PREFIX = "zoo:"
REAL_PREFIX = "real:"

# Weight files transformers loads directly, in its order of preference.
_SAFE_SINGLE = "model.safetensors"
_SAFE_INDEX = "model.safetensors.index.json"
_PICKLE_SINGLE = "pytorch_model.bin"
_PICKLE_INDEX = "pytorch_model.bin.index.json"
_PICKLE_SUFFIXES = (".bin", ".pt", ".pth", ".ckpt", ".pkl")

# Files from which AutoTokenizer can build a tokenizer.
_TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "tokenizer.model",
    "vocab.json",
    "vocab.txt",
    "spiece.model",
)

_DTYPES: dict[str, torch.dtype | str] = {
    "auto": "auto",
    "float32": torch.float32,
    "fp32": torch.float32,
    "float": torch.float32,
    "bfloat16": torch.bfloat16,
    "bf16": torch.bfloat16,
    "float16": torch.float16,
    "fp16": torch.float16,
    "half": torch.float16,
}

# "owner/name" with Hub-legal characters and no path-looking prefix.
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


def _one_line(exc: BaseException | str, limit: int = 200) -> str:
    """The first non-empty line of an exception's message, shortened to ``limit`` characters."""
    text = str(exc).strip()
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "")
    if not line:
        line = type(exc).__name__ if isinstance(exc, BaseException) else "unknown error"
    if len(line) > limit:
        line = line[: limit - 3] + "..."
    return line


def resolve_spec(spec: str | os.PathLike[str]) -> Path:
    """Turn a model spec into an existing local folder.

    Args:
        spec: a local folder, a ``.gguf`` file or a folder holding one (converted on first use),
            ``real:NAME`` for a packaged real checkpoint, or ``zoo:NAME`` for a zoo model (built on
            first use).

    Returns:
        The model folder.

    Raises:
        UserError: the folder does not exist or is not a folder, the spec looks like a Hub id (lmforge
            never downloads), or the zoo name is empty or unknown.
    """
    text = os.fspath(spec)
    if text.startswith(ZOO_PREFIX):
        name = text[len(ZOO_PREFIX) :].strip()
        if not name:
            raise UserError("empty zoo model name; use zoo:NAME (see `lmforge zoo list`)")
        from lmforge.models.zoo import ensure_built  # lazy: the zoo imports training code

        return Path(ensure_built(name))
    if text.startswith(REAL_PREFIX):
        from lmforge.models.real import ensure_converted

        return ensure_converted(text[len(REAL_PREFIX) :])
    if not text.strip():
        raise UserError("empty model spec; pass a local model folder, a .gguf file, real:NAME or zoo:NAME")
    path = Path(text).expanduser()
    if not path.exists():
        if _HUB_ID.match(text) and not text.startswith("."):
            raise UserError(
                f"model folder '{text}' does not exist; it looks like a Hugging Face Hub id, but lmforge "
                "loads only local folders or zoo:NAME and never downloads (download it yourself and pass "
                "the folder)"
            )
        raise UserError(f"model folder '{path}' does not exist")
    from lmforge.models import gguf

    if path.is_file() and path.name.endswith(gguf.GGUF_SUFFIX):
        return gguf.convert(path)
    if not path.is_dir():
        raise UserError(f"'{path}' is a file, not a model folder (nor a .gguf file)")
    inner = gguf.find_gguf(path)
    if inner is not None:
        return gguf.convert(inner)
    return path


def _parse_dtype(dtype: torch.dtype | str) -> torch.dtype | str:
    if isinstance(dtype, torch.dtype):
        return dtype
    key = str(dtype).strip().lower().removeprefix("torch.")
    if key not in _DTYPES:
        known = ", ".join(k for k in _DTYPES if k in ("auto", "float32", "bfloat16", "float16"))
        raise UserError(f"unknown dtype '{dtype}'; use one of {known}")
    return _DTYPES[key]


def _parse_device(device: str | torch.device) -> torch.device:
    try:
        dev = torch.device(device)
    except (RuntimeError, ValueError, TypeError) as exc:
        raise UserError(f"unknown device '{device}': {_one_line(exc)}") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"device '{device}' requested but CUDA is not available")
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise UserError(f"device '{device}' requested but MPS is not available")
    return dev


@contextlib.contextmanager
def _offline() -> Iterator[None]:
    """Turn the Hugging Face Hub's offline switch on for the block (and restore it afterwards).

    ``huggingface_hub`` reads ``HF_HUB_OFFLINE`` once at import, so the environment variables alone are
    not enough in a running process; the module constant is patched too. ``local_files_only=True`` is
    passed everywhere as well, so this is a second line of defence.
    """
    names = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "HF_HUB_DISABLE_TELEMETRY")
    saved_env = {n: os.environ.get(n) for n in names}
    for n in names:
        os.environ[n] = "1"
    try:
        import huggingface_hub.constants as hub_constants
    except ImportError:  # pragma: no cover - transformers depends on it
        hub_constants = None
    saved_const = getattr(hub_constants, "HF_HUB_OFFLINE", None)
    if hub_constants is not None:
        hub_constants.HF_HUB_OFFLINE = True
    try:
        yield
    finally:
        if hub_constants is not None:
            hub_constants.HF_HUB_OFFLINE = saved_const
        for n, v in saved_env.items():
            if v is None:
                os.environ.pop(n, None)
            else:
                os.environ[n] = v


def _read_config_json(folder: Path) -> dict[str, Any]:
    cfg_file = folder / "config.json"
    if not cfg_file.is_file():
        raise UserError(f"'{folder}' has no config.json; is it a Hugging Face model folder?")
    try:
        raw = json.loads(cfg_file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise UserError(f"config.json in '{folder}' is not valid JSON: {_one_line(exc)}") from None
    if not isinstance(raw, dict):
        raise UserError(f"config.json in '{folder}' is not a JSON object")
    return raw


def _check_safetensors_file(file: Path) -> None:
    """Open ``file``'s header (cheap, no tensor data read) or raise the 'corrupt' UserError."""
    from safetensors import safe_open

    if not file.is_file():
        raise UserError(f"weights file '{file}' is missing")
    try:
        with safe_open(str(file), framework="pt") as fh:
            fh.keys()
    except Exception as exc:  # SafetensorError, OSError, ...
        reason = _one_line(exc).removeprefix("Error while deserializing header: ")
        raise UserError(f"weights file '{file}' is corrupt: {reason}") from None


def _sharded_files(index_file: Path) -> list[Path]:
    try:
        index = json.loads(index_file.read_text(encoding="utf-8"))
        shards = sorted(set(index["weight_map"].values()))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError) as exc:
        raise UserError(f"weights index '{index_file}' is corrupt: {_one_line(exc)}") from None
    files = [index_file.parent / str(s) for s in shards]
    for f in files:
        if not f.is_file():
            raise UserError(f"weights file '{f}' named by '{index_file.name}' is missing")
    return files


def _check_weights(folder: Path, allow_pickle: bool) -> str:
    """Check the folder's weights before transformers touches them; return 'safetensors' or 'pickle'."""
    safe_index = folder / _SAFE_INDEX
    safe_single = folder / _SAFE_SINGLE
    if safe_single.is_file():
        _check_safetensors_file(safe_single)
        return "safetensors"
    if safe_index.is_file():
        for f in _sharded_files(safe_index):
            _check_safetensors_file(f)
        return "safetensors"

    pickles = sorted(p.name for p in folder.iterdir() if p.is_file() and p.name.endswith(_PICKLE_SUFFIXES))
    pickle_index = (folder / _PICKLE_INDEX).is_file()
    if pickles or pickle_index:
        if not allow_pickle:
            raise UserError(f"refusing to load pickle weights from '{folder}' (pass --allow-pickle to trust them)")
        if (folder / _PICKLE_SINGLE).is_file():
            return "pickle"
        if pickle_index:
            _sharded_files(folder / _PICKLE_INDEX)
            return "pickle"
        raise UserError(
            f"'{folder}' has pickle weights ({', '.join(pickles[:3])}) but not under the name transformers "
            f"loads ({_PICKLE_SINGLE}); rename or convert them"
        )

    stray = sorted(p.name for p in folder.glob("*.safetensors"))
    if stray:
        raise UserError(
            f"'{folder}' has safetensors files ({', '.join(stray[:3])}) but no {_SAFE_SINGLE} or "
            f"{_SAFE_INDEX}; is the checkpoint incomplete?"
        )
    raise UserError(f"'{folder}' has no model weights ({_SAFE_SINGLE}, {_SAFE_INDEX} or {_PICKLE_SINGLE})")


def _load_config(folder: Path, trust_remote_code: bool) -> Any:
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(folder), trust_remote_code=trust_remote_code, local_files_only=True)
    except UserError:
        raise
    except Exception as exc:
        raw = _read_config_json(folder)
        if raw.get("auto_map") and not trust_remote_code:
            raise UserError(
                f"'{folder}' needs custom model code (auto_map in config.json); pass --trust-remote-code "
                "only if you trust that code"
            ) from None
        raise UserError(f"could not read the config in '{folder}': {_one_line(exc)}") from None


def _check_causal_lm(folder: Path, config: Any, trust_remote_code: bool) -> None:
    """Refuse anything that is not a decoder-only causal LM."""
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    model_type = getattr(config, "model_type", None) or "unknown"
    auto_map = getattr(config, "auto_map", None) or {}
    custom_causal = trust_remote_code and isinstance(auto_map, dict) and "AutoModelForCausalLM" in auto_map
    known_causal = model_type in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES
    encoder_decoder = bool(getattr(config, "is_encoder_decoder", False))
    # BERT-like encoders also have a causal-LM head class, used only when configured with is_decoder=True.
    encoder_only = model_type in MODEL_FOR_MASKED_LM_MAPPING_NAMES and not getattr(config, "is_decoder", False)
    if encoder_decoder or encoder_only or not (known_causal or custom_causal):
        raise UserError(f"'{folder}' holds a {model_type} model, not a decoder-only causal LM")


def _check_tokenizer_files(folder: Path) -> None:
    if not any((folder / name).is_file() for name in _TOKENIZER_FILES):
        raise UserError(
            f"'{folder}' has no tokenizer (none of {', '.join(_TOKENIZER_FILES[:3])}); "
            "save the tokenizer into the model folder"
        )


def load(
    spec: str | os.PathLike[str],
    *,
    allow_pickle: bool = False,
    trust_remote_code: bool = False,
    dtype: torch.dtype | str = torch.float32,
    device: str | torch.device = "cpu",
    attn_implementation: str | None = None,
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load a local decoder-only causal LM and its tokenizer.

    Args:
        spec: a local model folder, a ``.gguf`` file, ``real:NAME`` or ``zoo:NAME``.
        allow_pickle: also accept pickle weights (``pytorch_model.bin``); off by default because
            unpickling can run code. Safetensors are preferred when both exist. Even with this on,
            transformers unpickles with ``torch.load(weights_only=True)``.
        trust_remote_code: run custom modelling/tokenizer code named by ``auto_map``; off by default.
        dtype: parameter dtype (``torch.float32`` by default; ``"auto"`` keeps the checkpoint's;
            strings such as ``"bfloat16"``/``"bf16"`` are accepted).
        device: where to put the model (``"cpu"``, ``"cuda"``, ``"cuda:1"``, ...).
        attn_implementation: passed to transformers (``"eager"``, ``"sdpa"``, ...); None keeps its default.

    Returns:
        ``(model, tokenizer)``; the model is in eval mode on ``device`` in ``dtype``. If the tokenizer has
        no pad token, its pad token is set to its eos token (and the model's generation config gets the
        matching ``pad_token_id`` if it had none), so that batched scoring and generation can pad.

    Raises:
        UserError: one-line message for a missing folder, a Hub id, a missing or invalid config.json,
            a model that is not a decoder-only causal LM, pickle weights without ``allow_pickle``, no
            weights, corrupt weights, weights that do not match the config, or a missing tokenizer.
    """
    folder = resolve_spec(spec)
    torch_dtype = _parse_dtype(dtype)
    dev = _parse_device(device)
    raw_config = _read_config_json(folder)  # clear errors for missing / unparsable config.json first

    if not progress_enabled():
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # transformers' "Loading weights" bar; LMFORGE_NO_PROGRESS=1
    with _offline():
        config = _load_config(folder, trust_remote_code)
        _check_causal_lm(folder, config, trust_remote_code)
        kind = _check_weights(folder, allow_pickle)
        _check_tokenizer_files(folder)
        if _is_lmforge_compressed(raw_config):
            # Packed lmforge quantization (GPTQ/AWQ/RTN/GANQ): transformers does not know the format.
            from lmforge.models.quantized import build_compressed_model

            model = build_compressed_model(
                folder, config, raw_config, dtype=torch_dtype, attn_implementation=attn_implementation
            )
        else:
            model = _load_model(folder, config, kind, allow_pickle, trust_remote_code, torch_dtype, attn_implementation)
        tokenizer = _load_tokenizer(folder, trust_remote_code)

    model.to(dev)
    model.eval()
    if tokenizer.pad_token is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
    gen_cfg = getattr(model, "generation_config", None)
    if gen_cfg is not None and getattr(gen_cfg, "pad_token_id", None) is None and tokenizer.pad_token_id is not None:
        gen_cfg.pad_token_id = tokenizer.pad_token_id
    return model, tokenizer


def _is_lmforge_compressed(raw_config: dict[str, Any]) -> bool:
    qc = raw_config.get("quantization_config")
    return isinstance(qc, dict) and qc.get("quant_method") == "lmforge"


def _load_model(
    folder: Path,
    config: Any,
    kind: str,
    allow_pickle: bool,
    trust_remote_code: bool,
    dtype: torch.dtype | str,
    attn_implementation: str | None,
) -> PreTrainedModel:
    from transformers import AutoModelForCausalLM

    kwargs: dict[str, Any] = {
        "config": config,
        "dtype": dtype,  # transformers 5 renamed torch_dtype -> dtype and defaults to "auto"
        "local_files_only": True,
        "trust_remote_code": trust_remote_code,
        # Without allow_pickle, transformers must not even look for .bin files.
        "use_safetensors": True if not allow_pickle else None,
        "output_loading_info": True,
    }
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    try:
        model, info = AutoModelForCausalLM.from_pretrained(str(folder), **kwargs)
    except UserError:
        raise
    except Exception as exc:
        msg = _one_line(exc)
        if kind == "safetensors" and type(exc).__name__ == "SafetensorError":
            raise UserError(f"weights in '{folder}' are corrupt: {msg}") from None
        raise UserError(f"could not load the model in '{folder}': {msg}") from None
    missing = sorted(info.get("missing_keys") or [])
    mismatched = info.get("mismatched_keys") or []
    if missing:
        raise UserError(
            f"weights in '{folder}' do not match its config: {len(missing)} tensors missing "
            f"(e.g. {', '.join(missing[:3])})"
        )
    if mismatched:
        raise UserError(f"weights in '{folder}' do not match its config: {len(mismatched)} tensors have the wrong shape")
    return model


def _load_tokenizer(folder: Path, trust_remote_code: bool) -> PreTrainedTokenizerBase:
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(str(folder), trust_remote_code=trust_remote_code, local_files_only=True)
    except UserError:
        raise
    except Exception as exc:
        raise UserError(f"could not load the tokenizer in '{folder}': {_one_line(exc)}") from None
