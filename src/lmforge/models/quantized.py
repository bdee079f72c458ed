"""Checkpoints of compressed models: lmforge's packed format, pruned models, and compressed-tensors export.

**lmforge format** (:func:`save_compressed`, read back by :func:`lmforge.models.load` through
:func:`build_compressed_model`): a normal Hugging Face folder (config.json, safetensors, tokenizer)
whose quantized linear layers are stored packed, as the in-memory
:class:`~lmforge.common.qlinear.UniformQuantLinear` / :class:`~lmforge.common.qlinear.CodebookQuantLinear`
hold them. Tensor names are the module name plus ``qweight`` (int32, ``32 // bits`` codes a word,
code ``k`` at bit ``k * bits``), ``scales``/``zeros`` (float32, ``(out, n_groups)``) and optional
``g_idx`` (int32) for uniform layers; ``qweight``, ``codebook`` (float32, ``(out, 2^bits)``) and
optional ``outlier_rows``/``outlier_cols`` (int32) / ``outlier_vals`` (float32) for codebook layers;
``bias`` for both. config.json's ``quantization_config`` is::

    {"quant_method": "lmforge", "version": 1, "format": "uniform" | "codebook" | "mixed",
     "method": "gptq" | ..., "bits": 4, "group_size": 128, "sym": true,
     "packing": "int32-lsb-first", "modules": {"model.layers.0.self_attn.q_proj": "uniform", ...},
     "module_overrides": {name: {"bits": 3, ...}},   # only modules that differ from the defaults
     ...}                                             # plus the method's own settings

``bits``/``group_size``/``sym`` are the most common values; whether a layer has ``g_idx``, outliers
(and how many) or a bias is read from the tensors themselves.

**Pruned models** (:func:`save_pruned`) are plain dense checkpoints with a ``sparsity`` record in
config.json: ``{"method", "sparsity", "pattern", "per_layer"}``.

**compressed-tensors** (:func:`export_compressed_tensors`): uniform 4- and 8-bit grouped or
per-channel codes, symmetric or asymmetric, become a ``pack-quantized`` checkpoint that vLLM and
transformers read unchanged. The module is written through compressed-tensors' own
``PackedQuantizationCompressor.compress`` and ``QuantizationConfig``/``ModelCompressor.update_config``;
lmforge's unsigned codes ``q`` with zero point ``z`` are its signed codes ``q - 2^(b-1)`` with zero
point ``z - 2^(b-1)`` (0 for the symmetric grid), so the export is exact.

Checked for reuse: transformers 5.17's quantizers know no format with per-row codebooks or
lmforge's packing, and an unknown ``quant_method`` makes ``from_pretrained`` skip quantization and
load non-strictly (it warns "Unknown quantization type ... we will skip the quantization"), so the
lmforge format is loaded here: the model is built from its config (without the
``quantization_config``), the listed layers are swapped for empty quantized layers and the whole
state dict is loaded strictly. compressed-tensors 0.19 (``ModelCompressor``, the pack-quantized
compressor, ``QuantizationConfig``) does the compressed-tensors export.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import os
from collections import Counter
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from lmforge.common.errors import UserError
from lmforge.common.io import atomic_dir, atomic_write_json
from lmforge.common.progress import progress_enabled
from lmforge.common.qlinear import (
    CodebookQuantLinear,
    UniformQuantLinear,
    _is_conv1d,
    _linear_shape,
    is_quant_linear,
    swap_linear,
)

if TYPE_CHECKING:
    from transformers import PreTrainedModel, PreTrainedTokenizerBase

__all__ = [
    "FORMAT_VERSION",
    "QUANT_METHOD",
    "build_compressed_model",
    "export_compressed_tensors",
    "is_lmforge_compressed",
    "load_compressed",
    "quantized_modules",
    "save_compressed",
    "save_pruned",
]

QUANT_METHOD = "lmforge"
FORMAT_VERSION = 1
_PACKING = "int32-lsb-first"
_KINDS = {UniformQuantLinear: "uniform", CodebookQuantLinear: "codebook"}
# Keys of quantization_config that save_compressed derives from the modules themselves.
_DERIVED = (
    "quant_method", "version", "format", "bits", "group_size", "sym", "packing", "modules", "module_overrides"
)
_SAFE_SINGLE = "model.safetensors"
_SAFE_INDEX = "model.safetensors.index.json"


# --------------------------------------------------------------------------------------------------
# Shared helpers


def quantized_modules(model: nn.Module) -> dict[str, nn.Module]:
    """``{name: module}`` of the lmforge quantized linear layers in ``model``."""
    return {name: m for name, m in model.named_modules() if name and is_quant_linear(m)}


def is_lmforge_compressed(raw_config: dict[str, Any]) -> bool:
    """Whether a parsed config.json describes an lmforge compressed checkpoint."""
    qc = raw_config.get("quantization_config")
    return isinstance(qc, dict) and qc.get("quant_method") == QUANT_METHOD


def _one_line(exc: BaseException | str, limit: int = 200) -> str:
    text = str(exc).strip()
    line = next((ln.strip() for ln in text.splitlines() if ln.strip()), "") or type(exc).__name__
    return line if len(line) <= limit else line[: limit - 3] + "..."


def _quiet_hf() -> None:
    if not progress_enabled():
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()  # "Writing model shards" bars; LMFORGE_NO_PROGRESS=1


def _save_hf(
    model: nn.Module, tokenizer: Any, folder: Path, state_dict: dict[str, torch.Tensor] | None = None
) -> None:
    """``save_pretrained`` of the model (safetensors; tied duplicates dropped) and the tokenizer."""
    _quiet_hf()
    kwargs: dict[str, Any] = {}
    if state_dict is not None:
        kwargs["state_dict"] = state_dict
    model.save_pretrained(str(folder), **kwargs)
    if tokenizer is not None:
        tokenizer.save_pretrained(str(folder))


def _update_config_json(folder: Path, set_keys: dict[str, Any], drop_keys: tuple[str, ...] = ()) -> None:
    path = folder / "config.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    for key in drop_keys:
        data.pop(key, None)
    data.update(set_keys)
    atomic_write_json(path, data)


def _stale_lmforge_qc(model: nn.Module) -> tuple[str, ...]:
    """``("quantization_config",)`` when the model's config still carries an lmforge record (a model
    loaded from an lmforge checkpoint) that would be wrong for a dense save."""
    qc = getattr(getattr(model, "config", None), "quantization_config", None)
    return ("quantization_config",) if isinstance(qc, dict) and qc.get("quant_method") == QUANT_METHOD else ()


def _dense_weight(module: nn.Module) -> torch.Tensor:
    """The ``(out, in)`` weight of a ``nn.Linear`` or GPT-2 ``Conv1D``."""
    w = module.weight.detach()
    return w.t() if _is_conv1d(module) else w


# --------------------------------------------------------------------------------------------------
# lmforge format: save


def _module_spec(module: nn.Module) -> tuple[str, dict[str, Any]]:
    if isinstance(module, UniformQuantLinear):
        return "uniform", {"bits": module.bits, "group_size": module.group_size, "sym": module.sym}
    return "codebook", {"bits": module.bits}


def _most_common(values: list[Any]) -> Any:
    return Counter(values).most_common(1)[0][0] if values else None


def _derived_quant_config(qmods: dict[str, nn.Module]) -> dict[str, Any]:
    specs = {name: _module_spec(m) for name, m in qmods.items()}
    kinds = {kind for kind, _ in specs.values()}
    uniform = [s for k, s in specs.values() if k == "uniform"]
    defaults = {
        "bits": _most_common([s["bits"] for _, s in specs.values()]),
        "group_size": _most_common([s["group_size"] for s in uniform]),
        "sym": _most_common([s["sym"] for s in uniform]),
    }
    overrides = {}
    for name, (_, spec) in specs.items():
        diff = {k: v for k, v in spec.items() if defaults.get(k) != v}
        if diff:
            overrides[name] = diff
    return {
        "quant_method": QUANT_METHOD,
        "version": FORMAT_VERSION,
        "format": kinds.pop() if len(kinds) == 1 else "mixed",
        **defaults,
        "packing": _PACKING,
        "modules": {name: kind for name, (kind, _) in specs.items()},
        "module_overrides": overrides,
    }


def save_compressed(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase | None,
    out_dir: str | os.PathLike[str],
    *,
    quant_config: dict[str, Any],
    extra_files: dict[str, dict[str, Any]] | None = None,
    overwrite: bool = False,
) -> Path:
    """Save a model whose quantized layers are swapped in, in the packed lmforge format.

    Args:
        model: a Hugging Face causal LM with :class:`UniformQuantLinear` / :class:`CodebookQuantLinear`
            layers in place of (some of) its linear layers.
        tokenizer: saved alongside (None to skip).
        out_dir: the checkpoint folder, written atomically.
        quant_config: the method's record: ``"method"`` (``"gptq"``, ``"awq"``, ``"rtn"``,
            ``"ganq"``...) and any settings worth keeping (damping, calibration set...). The format
            keys (``bits``, ``group_size``, ``sym``, ``modules``...) are derived from the layers; a
            setting given under one of those names that differs from the layers (a ``group_size`` of
            128 on layers with 64 inputs is stored per-channel) is kept under ``"requested"``.
        extra_files: ``{file name: JSON object}`` written next to the checkpoint (reports, logs).
        overwrite: replace an existing ``out_dir``.

    Returns:
        ``out_dir`` as a Path.

    Raises:
        UserError: ``out_dir`` exists and ``overwrite`` is off, or the model has no quantized layer.
        ValueError: ``quant_config`` has no ``method`` or a ``quant_method`` other than "lmforge"; a bad
            extra file name.
    """
    qmods = quantized_modules(model)
    if not qmods:
        raise UserError("the model has no quantized layers; save a pruned or dense model with save_pruned")
    method = quant_config.get("method")
    if not isinstance(method, str) or not method:
        raise ValueError("quant_config needs a 'method' string (e.g. 'gptq')")
    if quant_config.get("quant_method", QUANT_METHOD) != QUANT_METHOD:
        raise ValueError(f"quant_config['quant_method'] must be {QUANT_METHOD!r} (or absent)")
    derived = _derived_quant_config(qmods)
    record = {**derived, **{k: v for k, v in quant_config.items() if k not in _DERIVED}}
    # The layers are the truth about the format; what the method was asked for is kept beside it.
    requested = {k: quant_config[k] for k in _DERIVED if k in quant_config and quant_config[k] != derived[k]}
    if requested:
        record["requested"] = requested
    json.dumps(record, default=str)  # fail before writing anything
    extra = dict(extra_files or {})
    for name in extra:
        if not name or Path(name).name != name or name.startswith("."):
            raise ValueError(f"extra file name {name!r} must be a plain file name")

    with atomic_dir(out_dir, overwrite=overwrite) as tmp:
        _save_hf(model, tokenizer, tmp)
        _update_config_json(tmp, {"quantization_config": record})
        for name, obj in extra.items():
            if (tmp / name).exists():
                raise ValueError(f"extra file {name!r} would replace a checkpoint file")
            atomic_write_json(tmp / name, obj)
    return Path(out_dir)


# --------------------------------------------------------------------------------------------------
# lmforge format: load


def _safetensors_files(folder: Path) -> list[Path]:
    single = folder / _SAFE_SINGLE
    if single.is_file():
        return [single]
    index = folder / _SAFE_INDEX
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
            raise UserError(f"weights index '{index}' is corrupt: {_one_line(exc)}") from None
        return [folder / s for s in shards]
    raise UserError(
        f"'{folder}' is an lmforge compressed checkpoint but has no {_SAFE_SINGLE}; it must be safetensors"
    )


def _tensor_shapes(files: list[Path]) -> dict[str, tuple[int, ...]]:
    from safetensors import safe_open

    shapes: dict[str, tuple[int, ...]] = {}
    for f in files:
        with safe_open(str(f), framework="pt") as fh:
            for key in fh.keys():
                shapes[key] = tuple(fh.get_slice(key).get_shape())
    return shapes


def _parse_quant_config(raw: dict[str, Any], folder: Path) -> dict[str, Any]:
    qc = raw["quantization_config"]
    version = qc.get("version", FORMAT_VERSION)
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise UserError(
            f"'{folder}' uses lmforge format version {version}; this lmforge reads up to {FORMAT_VERSION}"
        )
    modules = qc.get("modules")
    if not isinstance(modules, dict) or not modules:
        raise UserError(f"quantization_config in '{folder}/config.json' lists no modules")
    bad = sorted({str(k) for k in modules.values()} - {"uniform", "codebook"})
    if bad:
        raise UserError(f"quantization_config in '{folder}/config.json' has unknown module kind '{bad[0]}'")
    overrides = qc.get("module_overrides") or {}
    if not isinstance(overrides, dict):
        raise UserError(f"module_overrides in '{folder}/config.json' is not an object")
    return qc


def _module_params(qc: dict[str, Any], name: str, folder: Path) -> dict[str, Any]:
    where = f"quantization_config in '{folder}/config.json'"
    spec = {k: qc.get(k) for k in ("bits", "group_size", "sym")}
    overrides = qc.get("module_overrides") or {}
    if not isinstance(overrides, dict) or not isinstance(overrides.get(name, {}), dict):
        raise UserError(f"{where}: 'module_overrides' must map module names to objects")
    spec.update(overrides.get(name, {}))
    bits = spec.get("bits")
    if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= 8:
        raise UserError(f"{where} gives module '{name}' no valid bits")
    gs = spec.get("group_size") or 0
    if isinstance(gs, bool) or not isinstance(gs, int) or gs < -1:
        raise UserError(f"{where} gives module '{name}' an invalid group_size {spec.get('group_size')!r}")
    if not isinstance(spec.get("sym", False), (bool, type(None))):
        raise UserError(f"{where} gives module '{name}' a non-boolean sym {spec.get('sym')!r}")
    return spec


def _resolve_dtype(dtype: torch.dtype | str, config: Any) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    stored = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None)
    if isinstance(stored, str):
        stored = getattr(torch, stored, None)
    return stored if isinstance(stored, torch.dtype) else torch.float32


def build_compressed_model(
    folder: str | os.PathLike[str],
    config: Any,
    raw_config: dict[str, Any],
    *,
    dtype: torch.dtype | str = torch.float32,
    attn_implementation: str | None = None,
) -> PreTrainedModel:
    """Build the model of an lmforge compressed checkpoint (called by :func:`lmforge.models.load`).

    The model is built from ``config`` without its ``quantization_config``, the listed layers are
    swapped for empty quantized layers of the stored shapes, and the safetensors state dict is loaded
    strictly: every tensor must have a place of the right shape and every model tensor must be in the
    file, except a tied weight (such as ``lm_head.weight``) that shares its tensor with one that is.

    Args:
        folder: the checkpoint folder.
        config: its transformers config (as ``AutoConfig`` read it).
        raw_config: config.json as parsed JSON.
        dtype: dtype of the non-quantized parameters (quantized layers keep int32 codes and float32
            scales/codebooks); ``"auto"`` takes the checkpoint's.
        attn_implementation: passed to transformers.

    Raises:
        UserError: a malformed ``quantization_config``, missing/unexpected tensors, wrong shapes.
    """
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    folder = Path(folder)
    qc = _parse_quant_config(raw_config, folder)
    files = _safetensors_files(folder)
    shapes = _tensor_shapes(files)

    cfg = copy.deepcopy(config)
    if hasattr(cfg, "quantization_config"):
        # transformers would warn about (and skip) the unknown method; the model is plain until swapped.
        delattr(cfg, "quantization_config")
    kwargs: dict[str, Any] = {"dtype": _resolve_dtype(dtype, config)}
    if attn_implementation is not None:
        kwargs["attn_implementation"] = attn_implementation
    # NOTE: the model is built (and randomly initialised) dense before its layers are swapped, so
    # loading briefly needs the dense model's memory; transformers' meta-device loading would avoid
    # that but does not know these layers.
    try:
        model = AutoModelForCausalLM.from_config(cfg, **kwargs)
    except Exception as exc:
        raise UserError(f"could not build the model in '{folder}': {_one_line(exc)}") from None

    for name, kind in qc["modules"].items():
        try:
            old = model.get_submodule(name)
        except AttributeError:
            raise UserError(
                f"quantization_config in '{folder}/config.json' names module '{name}', which the model lacks"
            ) from None
        shape = _linear_shape(old)
        if shape is None:
            raise UserError(
                f"module '{name}' listed in '{folder}/config.json' is a {type(old).__name__}, not a linear layer"
            )
        in_f, out_f = shape
        spec = _module_params(qc, name, folder)
        old_bias = getattr(old, "bias", None)
        bias_kw = {"bias": old_bias is not None, "dtype": old_bias.dtype if old_bias is not None else kwargs["dtype"]}
        if kind == "uniform":
            new: nn.Module = UniformQuantLinear(
                in_f,
                out_f,
                bits=spec["bits"],
                group_size=int(spec.get("group_size") or 0),
                sym=bool(spec.get("sym")),
                act_order=f"{name}.g_idx" in shapes,
                **bias_kw,
            )
        else:
            vals = shapes.get(f"{name}.outlier_vals")
            n_outliers = int(vals[0]) if vals else 0
            new = CodebookQuantLinear(in_f, out_f, bits=spec["bits"], n_outliers=n_outliers, **bias_kw)
        swap_linear(model, name, new)

    expected = model.state_dict()
    for key, shape in shapes.items():
        if key in expected and tuple(expected[key].shape) != shape:
            raise UserError(
                f"weights in '{folder}' do not match its config: '{key}' has shape {list(shape)}, "
                f"expected {list(expected[key].shape)}"
            )
    unexpected = sorted(set(shapes) - set(expected))
    if unexpected:
        raise UserError(
            f"weights in '{folder}' do not match its config: {len(unexpected)} unexpected tensors "
            f"(e.g. {', '.join(unexpected[:3])})"
        )
    state: dict[str, torch.Tensor] = {}
    for f in files:
        state.update(load_file(str(f)))
    result = model.load_state_dict(state, strict=False)
    missing = [k for k in result.missing_keys if not _tied_to_loaded(model, k, state)]
    if missing:
        raise UserError(
            f"weights in '{folder}' do not match its config: {len(missing)} tensors missing "
            f"(e.g. {', '.join(sorted(missing)[:3])})"
        )
    for name, kind in qc["modules"].items():
        if kind == "codebook":
            _check_outliers(model.get_submodule(name), f"'{folder}' module '{name}'")
    # from_config leaves the generation settings at config.json's; the saved ones win, as with
    # from_pretrained.
    if (folder / "generation_config.json").is_file():
        from transformers import GenerationConfig

        try:
            model.generation_config = GenerationConfig.from_pretrained(str(folder), local_files_only=True)
        except Exception as exc:
            raise UserError(f"cannot read '{folder}/generation_config.json': {_one_line(exc)}") from None
    model.config.quantization_config = copy.deepcopy(qc)
    return model.eval()


def _check_outliers(module: nn.Module, where: str) -> None:
    """Outlier positions of a codebook layer must be in range and distinct (a duplicate would be
    added twice by the matmul but stored once by the dequantized weight)."""
    rows, cols = getattr(module, "outlier_rows", None), getattr(module, "outlier_cols", None)
    if rows is None or cols is None or rows.numel() == 0:
        return
    out_f, in_f = module.out_features, module.in_features
    r, c = rows.long(), cols.long()
    if bool(((r < 0) | (r >= out_f) | (c < 0) | (c >= in_f)).any()):
        raise UserError(f"{where}: outlier positions out of range")
    if torch.unique(r * in_f + c).numel() != r.numel():
        raise UserError(f"{where}: duplicate outlier positions")


def _tied_to_loaded(model: nn.Module, key: str, state: dict[str, torch.Tensor]) -> bool:
    """Whether the missing ``key`` is a weight tied to (the very same tensor as) a loaded one."""
    tied = getattr(model, "all_tied_weights_keys", None) or getattr(model, "_tied_weights_keys", None) or {}
    if not isinstance(tied, dict) or key not in tied:
        return False
    target = tied[key]
    try:
        return target in state and model.get_parameter(key) is model.get_parameter(target)
    except AttributeError:
        return False


def load_compressed(path: str | os.PathLike[str], **kwargs: Any) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """Load an lmforge compressed checkpoint: :func:`lmforge.models.load` (which dispatches here),
    refusing a folder that is not one.

    Args:
        path: checkpoint folder (or ``zoo:NAME``).
        **kwargs: passed to :func:`lmforge.models.load` (``dtype``, ``device``, ``attn_implementation``).

    Raises:
        UserError: the folder is not an lmforge compressed checkpoint, or any loading error.
    """
    from lmforge.models.load import _read_config_json, load, resolve_spec

    folder = resolve_spec(path)
    if not is_lmforge_compressed(_read_config_json(folder)):
        raise UserError(
            f"'{folder}' is not an lmforge compressed checkpoint (no quantization_config with quant_method 'lmforge')"
        )
    return load(folder, **kwargs)


# --------------------------------------------------------------------------------------------------
# Pruned models


def _check_sparsity_record(record: Any) -> dict[str, Any]:
    if not isinstance(record, dict):
        raise ValueError("sparsity_config must be a dict")
    for key in ("method", "sparsity", "pattern"):
        if key not in record:
            raise ValueError(f"sparsity_config needs {key!r} (method, sparsity, pattern, per_layer)")
    pattern = "unstructured" if record["pattern"] is None else record["pattern"]
    if not isinstance(record["method"], str) or not isinstance(pattern, str):
        raise ValueError("sparsity_config 'method' and 'pattern' must be strings (pattern None: unstructured)")
    try:
        sparsity = float(record["sparsity"])
    except (TypeError, ValueError):
        sparsity = float("nan")
    if not 0.0 <= sparsity <= 1.0:
        raise ValueError(f"sparsity_config 'sparsity' must be in [0, 1], got {record['sparsity']!r}")
    per_layer = record.get("per_layer", {})
    if not isinstance(per_layer, dict):
        raise ValueError("sparsity_config 'per_layer' must be a dict")
    out = {**record, "pattern": pattern, "sparsity": sparsity}
    out.setdefault("per_layer", {})
    json.dumps(out, default=str)
    return out


def nm_violations(weight: torch.Tensor, n: int, m: int) -> int:
    """How many full runs of ``m`` consecutive inputs of the ``(out, in)`` ``weight`` have fewer than
    ``n`` zeros (lmforge's, Wanda's, SparseGPT's and llm-compressor's N:M: N pruned in every M). A
    trailing run shorter than ``m`` is not checked, as :func:`lmforge.common.sparsity.nm_mask` prunes
    it proportionally."""
    out_f, in_f = weight.shape
    full = in_f - in_f % m
    zeros = (weight[:, :full].reshape(out_f, full // m, m) == 0).sum(dim=-1)
    return int((zeros < n).sum())


def _check_pattern(model: nn.Module, record: dict[str, Any]) -> None:
    """For an ``"N:M"`` pattern, every layer named in ``per_layer`` must prune N of each M."""
    from lmforge.common.sparsity import parse_pattern

    pattern = parse_pattern(record["pattern"])  # UserError for a malformed pattern
    if pattern is None:
        return
    n, m = pattern.n, pattern.m
    for name in record.get("per_layer", {}):
        try:
            module = model.get_submodule(name)
        except AttributeError:
            continue  # a per-layer key that is not a module path (e.g. a layer index)
        if isinstance(module, nn.Linear) or _is_conv1d(module):
            bad = nm_violations(_dense_weight(module), n, m)
            if bad:
                raise UserError(f"'{name}' is not {n}:{m} sparse ({bad} runs of {m} inputs have fewer than {n} zeros)")


def save_pruned(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase | None,
    out_dir: str | os.PathLike[str],
    *,
    sparsity_config: dict[str, Any],
    extra_files: dict[str, dict[str, Any]] | None = None,
    overwrite: bool = False,
) -> Path:
    """Save a pruned model as a normal dense checkpoint with a ``sparsity`` record in config.json.

    Args:
        model: the pruned model (dense layers; zeros where pruned).
        tokenizer: saved alongside (None to skip).
        out_dir: the checkpoint folder, written atomically.
        sparsity_config: ``{"method", "sparsity", "pattern", "per_layer": {module: sparsity}}``; an
            ``"N:M"`` pattern is checked on the layers named in ``per_layer``. It is also set as
            ``model.config.sparsity``.
        extra_files: ``{file name: JSON object}`` written next to the checkpoint, inside the same
            atomic write.
        overwrite: replace an existing ``out_dir``.

    Raises:
        UserError: ``out_dir`` exists and ``overwrite`` is off; the model has quantized layers; a layer
            breaks the stated N:M pattern.
        ValueError: a malformed ``sparsity_config``.
    """
    record = _check_sparsity_record(sparsity_config)
    for name in extra_files or {}:
        if not name or Path(name).name != name or name.startswith(".") or name in ("config.json", "generation_config.json") \
                or name.endswith((".safetensors", ".bin")) or name.startswith("tokenizer"):
            raise ValueError(f"extra file name {name!r} must be a plain file name that is not a checkpoint file")
    if quantized_modules(model):
        raise UserError("the model has quantized layers; save it with save_compressed")
    _check_pattern(model, record)
    with atomic_dir(out_dir, overwrite=overwrite) as tmp:
        _save_hf(model, tokenizer, tmp)
        _update_config_json(tmp, {"sparsity": record}, drop_keys=_stale_lmforge_qc(model))
        for name, obj in (extra_files or {}).items():
            atomic_write_json(tmp / name, obj)
    # The in-memory model now says what the saved one says (export_compressed_tensors reads it).
    model.config.sparsity = record
    return Path(out_dir)


# --------------------------------------------------------------------------------------------------
# compressed-tensors export


_CT_BITS = (4, 8)


def _ct_key(module: UniformQuantLinear) -> tuple[int, int, bool]:
    """``(bits, group_size or 0 for per-channel, sym)`` of a layer, as compressed-tensors sees it."""
    gs = module.group_size if module.n_groups > 1 else 0  # one group per row is per-channel
    return module.bits, gs, module.sym


# Linear layers vLLM fuses into one (q/k/v, gate/up): they must share one quantization scheme.
_FUSED = (("q_proj", "k_proj", "v_proj"), ("gate_proj", "up_proj"))


def _check_fused_schemes(model: nn.Module, qmods: dict[str, nn.Module]) -> None:
    for parent_name, parent in model.named_modules():
        for group in _FUSED:
            members = [f"{parent_name}.{n}" if parent_name else n for n in group if hasattr(parent, n)]
            if len(members) < 2:
                continue
            keys = {(_ct_key(qmods[m]) if m in qmods else None) for m in members}
            if len(keys) > 1:
                raise UserError(
                    f"{', '.join(members)} are fused into one layer by vLLM and must share one quantization "
                    "scheme (or all stay dense); they do not"
                )


def _check_ct_exportable(name: str, module: nn.Module) -> None:
    if isinstance(module, CodebookQuantLinear):
        raise UserError(f"'{name}' is codebook-quantized (GANQ); compressed-tensors has no per-row codebook format")
    assert isinstance(module, UniformQuantLinear)
    if getattr(module, "source_type", None) == "Conv1D":
        raise UserError(
            f"'{name}' replaces a GPT-2 Conv1D; compressed-tensors quantizes only nn.Linear layers, "
            "so transformers and vLLM could not load it"
        )
    if module.bits not in _CT_BITS:
        raise UserError(
            f"'{name}' is {module.bits}-bit; vLLM serves compressed-tensors weight-only quantization "
            "at 4 and 8 bits only"
        )
    if module.g_idx is not None:
        default = torch.arange(module.in_features, device=module.g_idx.device) // max(1, module.group_size)
        if module.group_size <= 0 or not torch.equal(module.g_idx.long(), default):
            raise UserError(
                f"'{name}' has act-order groups (g_idx); compressed-tensors 0.19 removed act-order "
                "group storage (actorder='group')"
            )
    if module.n_groups > 1 and module.in_features % module.group_size:
        raise UserError(
            f"'{name}' has {module.in_features} inputs, not a multiple of its group size "
            f"{module.group_size}; compressed-tensors needs whole groups"
        )
    if module.sym and not torch.all(module.zeros == 2 ** (module.bits - 1)):
        raise UserError(f"'{name}' is marked symmetric but its zero points are not {2 ** (module.bits - 1)}")


def _ct_scheme(bits: int, group_size: int, sym: bool, targets: list[str]) -> Any:
    from compressed_tensors.config import CompressionFormat
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    args = QuantizationArgs(
        num_bits=bits,
        type="int",
        symmetric=sym,
        strategy="group" if group_size else "channel",
        group_size=group_size or None,
    )
    return QuantizationScheme(targets=targets, weights=args, format=CompressionFormat.pack_quantized.value)


def _ct_compress(name: str, module: UniformQuantLinear, scheme: Any) -> dict[str, torch.Tensor]:
    """The module's tensors as compressed-tensors' pack-quantized compressor writes them."""
    from compressed_tensors.compressors.pack_quantized.base import PackedQuantizationCompressor
    from compressed_tensors.compressors.pack_quantized.helpers import unpack_from_int32

    q = module.to_quantized()
    offset = 2 ** (q.bits - 1)
    channel = scheme.weights.strategy == "channel"
    scales = q.scales[:, :1] if channel else q.scales
    zeros = q.zeros[:, :1] if channel else q.zeros
    local = {
        "weight": q.dequantize(),
        "weight_scale": scales.to(torch.float32).contiguous(),
        # compressed-tensors' signed codes: q - 2^(b-1), zero point z - 2^(b-1) (0 when symmetric)
        "weight_zero_point": (zeros - offset).round().to(torch.int8).contiguous(),
    }
    out = PackedQuantizationCompressor.compress(local, scheme)
    # The compressor re-derives the codes as round(W / scale + zero); check it got ours back.
    signed = unpack_from_int32(out["weight_packed"], q.bits, out["weight_shape"])
    if not torch.equal(signed.to(torch.int16) + offset, q.codes.to(torch.int16)):
        raise RuntimeError(f"compressed-tensors did not reproduce the codes of '{name}'")
    out = {f"{name}.{k}": v for k, v in out.items()}
    if module.bias is not None:
        out[f"{name}.bias"] = module.bias.detach()
    return out


def export_compressed_tensors(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase | None,
    out_dir: str | os.PathLike[str],
    *,
    sparsity_config: dict[str, Any] | None = None,
    overwrite: bool = False,
) -> Path:
    """Write a checkpoint that vLLM and transformers load as compressed-tensors, unchanged.

    * A model with :class:`UniformQuantLinear` layers (RTN, GPTQ, AWQ) becomes a ``pack-quantized``
      checkpoint: one config group per distinct (bits, group size, symmetry), ``targets: ["Linear"]``
      when there is one, the unquantized ``nn.Linear`` layers (``lm_head``) in ``ignore``; tensors
      ``weight_packed``, ``weight_scale``, ``weight_shape`` and, when asymmetric, ``weight_zero_point``.
    * A model without quantized layers (a pruned one) is written as a dense checkpoint, with its
      ``sparsity`` record (N:M pattern checked) when it has one, and without a compressed-tensors
      ``sparsity_config``: compressed-tensors 0.19, transformers 5.17 and current vLLM no longer take
      one (see the note in the body).

    Args:
        model: a quantized (lmforge uniform layers) or pruned Hugging Face causal LM.
        tokenizer: saved alongside (None to skip).
        out_dir: the checkpoint folder, written atomically.
        sparsity_config: the pruning record (see :func:`save_pruned`); defaults to
            ``model.config.sparsity`` when present.
        overwrite: replace an existing ``out_dir``.

    Raises:
        UserError: a format compressed-tensors (or vLLM) cannot express: codebook (GANQ) layers,
            2/3-bit codes, act-order ``g_idx``, a group size that does not divide the layer, GPT-2
            ``Conv1D`` layers; a record whose N:M pattern the weights break; an existing ``out_dir``.
    """
    if importlib.util.find_spec("compressed_tensors") is None:
        raise UserError(
            "exporting to compressed-tensors needs the compressed-tensors package (pip install compressed-tensors)"
        )

    record = sparsity_config
    if record is None:
        record = getattr(getattr(model, "config", None), "sparsity", None)
    if record is not None:
        record = _check_sparsity_record(record)
        _check_pattern(model, record)
    qmods = quantized_modules(model)
    sparsity_keys = {"sparsity": record} if record is not None else {}

    if not qmods:
        # NOTE: the brief asked for sparse-24-bitmask or dense + sparsity metadata. compressed-tensors
        # 0.19 has no sparse compressor any more (sparse-24-bitmask/sparse-bitmask are config classes
        # only, ModelCompressor.update_config always writes "sparsity_config": {}), vLLM removed 2:4
        # (Sparse24) support and refuses a sparsity_config with targets, and transformers 5.17 crashes
        # on a compressed-tensors quantization_config without config groups. A 2:4 model is therefore
        # exported as the dense checkpoint every engine serves, with lmforge's sparsity record.
        with atomic_dir(out_dir, overwrite=overwrite) as tmp:
            _save_hf(model, tokenizer, tmp)
            _update_config_json(tmp, sparsity_keys, drop_keys=_stale_lmforge_qc(model))
        return Path(out_dir)

    for name, module in qmods.items():
        _check_ct_exportable(name, module)
    _check_fused_schemes(model, qmods)

    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import QuantizationConfig, QuantizationStatus

    groups: dict[tuple[int, int, bool], list[str]] = {}
    for name, module in qmods.items():
        groups.setdefault(_ct_key(module), []).append(name)
    single = len(groups) == 1
    schemes = {key: _ct_scheme(*key, targets=["Linear"] if single else names) for key, names in groups.items()}
    # Linear layers left dense must be ignored explicitly when the scheme targets the class "Linear".
    ignore = [n for n, m in model.named_modules() if isinstance(m, nn.Linear)] if single else []

    state: dict[str, torch.Tensor] = {}
    for key, tensor in model.state_dict().items():
        if key.rpartition(".")[0] not in qmods:
            state[key] = tensor
    for key, names in groups.items():
        for name in names:
            state.update(_ct_compress(name, qmods[name], schemes[key]))

    qconfig = QuantizationConfig(
        config_groups={f"group_{i}": scheme for i, scheme in enumerate(schemes.values())},
        format="pack-quantized",
        quantization_status=QuantizationStatus.COMPRESSED,
        ignore=ignore,
    )
    with atomic_dir(out_dir, overwrite=overwrite) as tmp:
        _save_hf(model, tokenizer, tmp, state_dict=state)
        _update_config_json(tmp, sparsity_keys, drop_keys=("quantization_config",))
        ModelCompressor(quantization_config=qconfig).update_config(str(tmp))
    return Path(out_dir)
