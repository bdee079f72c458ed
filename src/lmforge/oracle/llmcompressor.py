"""llm-compressor's GPTQ, AWQ, SparseGPT and Wanda as an oracle for lmforge's own implementations.

:func:`run_llmcompressor` compresses an in-memory Hugging Face causal LM with llm-compressor's
``oneshot`` on given calibration token ids, on CPU, and writes the result back into the model as
plain dense weights: quantized layers hold their dequantized (fake-quant) weights, pruned layers
their zeros, AWQ's smoothing lands in the norms and linear layers it rescales. The model that comes
back is an ordinary ``nn.Module`` with no quantization wrappers, hooks or offloading, so any
evaluation (perplexity, generation) runs on it unchanged. ``lm_head`` is never compressed.

How: ``oneshot`` runs on a deep copy of the model (llm-compressor leaves its own state on the model
it calibrates: offload caches, wrapped ``forward`` methods, qparams), then every parameter of the copy
is copied back into the caller's model by name, a quantized linear weight as
``fake_quantize(weight, weight_scale, weight_zero_point)``. So the caller's model objects and
parameters stay the same; only their values change.

Handled pitfalls of llm-compressor 0.14 on CPU-only torch:

* SparseGPT and Wanda silently prune nothing when ``targets`` is a string: ``["Linear"]`` is passed.
* The pruning modifiers only skip ``lm_head`` as ``ignore=["re:.*lm_head"]`` (they match the module
  name with a trailing dot), so that form is used for every modifier.
* AWQ pins its cached activations (``IntermediatesCache.pin_memory``), which fails without an
  accelerator ("Cannot access accelerator device"); that method is a no-op during the call.
* GPTQModifier defaults to ``actorder="static"``: ``actorder=False`` passes ``actorder=None``.
* ``oneshot`` re-reads the model's config with ``AutoConfig.from_pretrained(config.name_or_path)``;
  the copy's config is saved to a temporary folder and pointed to, so no hub lookup happens.
* Importing llmcompressor replaces every loguru handler with its own stdout one; the import here
  sets ``LLM_COMPRESSOR_LOG_DISABLED`` so that it leaves loguru alone (its logger stays disabled).
  During a call its and compressed-tensors' logs, warnings and progress bars are silenced.

Nothing is written to the working directory or home: ``oneshot`` gets no ``output_dir``/``log_dir``
and the calibration set is an in-memory ``datasets.Dataset``.

Checked: ``tests/oracle/test_llmcompressor_adapter.py`` pins the llm-compressor behaviour lmforge
relies on (GPTQ's grid, SparseGPT's and Wanda's mask granularity), so an upgrade that changes it
fails there rather than silently moving the reference.
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import logging
import os
import sys
import tempfile
import warnings
from collections.abc import Iterator, Sequence
from typing import Any

import torch
from torch import nn

__all__ = ["METHODS", "available", "run_llmcompressor"]

METHODS = ("gptq", "awq", "sparsegpt", "wanda")

# The only spelling of "skip lm_head" that all four modifiers honour.
_IGNORE = ["re:.*lm_head"]
_TARGETS = ["Linear"]

_import_error: BaseException | None = None
_imported_quietly = False


def _import_llmcompressor() -> Any:
    """Import llmcompressor without letting it reconfigure loguru's handlers."""
    global _imported_quietly
    if "llmcompressor" not in sys.modules:
        key = "LLM_COMPRESSOR_LOG_DISABLED"
        previous = os.environ.get(key)
        if previous is None:
            os.environ[key] = "true"
        # with logging disabled its import-time configure_logger() only disables its logger
        _imported_quietly = os.environ[key].lower() == "true"
        try:
            module = importlib.import_module("llmcompressor")
        finally:
            if previous is None:
                os.environ.pop(key, None)
    else:
        module = importlib.import_module("llmcompressor")
    from loguru import logger

    # a disabled llmcompressor logger skips registering the "METRIC" level it logs at,
    # and loguru rejects unknown levels even for disabled loggers
    try:
        logger.level("METRIC")
    except ValueError:
        logger.level("METRIC", no=38)
    return module


def available() -> bool:
    """True when llmcompressor (and compressed-tensors) can be imported."""
    global _import_error
    if importlib.util.find_spec("llmcompressor") is None:
        return False
    try:
        _import_llmcompressor()
        importlib.import_module("compressed_tensors")
    except Exception as exc:  # a broken install counts as not available
        _import_error = exc
        return False
    return True


def _split_sequences(calib: Sequence[torch.Tensor]) -> list[torch.Tensor]:
    """One 1-D int64 tensor per calibration sequence (rows of 2-D tensors are separate sequences)."""
    seqs: list[torch.Tensor] = []
    for t in calib:
        t = torch.as_tensor(t)
        if t.dim() == 1:
            t = t.unsqueeze(0)
        if t.dim() != 2:
            raise ValueError(f"calibration tensors must be (batch, seq) or (seq,), got shape {tuple(t.shape)}")
        if t.dtype.is_floating_point or t.dtype == torch.bool:
            raise ValueError(f"calibration tensors must hold integer token ids, got {t.dtype}")
        for row in t:
            if row.numel() == 0:
                raise ValueError("empty calibration sequence")
            seqs.append(row.detach().to("cpu", torch.int64))
    if not seqs:
        raise ValueError("no calibration sequences")
    return seqs


def _parse_pattern(pattern: str | None) -> str:
    """llm-compressor's ``mask_structure``: ``"N:M"`` (N weights zeroed in every M), ``"0:0"`` unstructured."""
    if pattern is None:
        return "0:0"
    try:
        n_str, m_str = str(pattern).split(":")
        n, m = int(n_str), int(m_str)
    except ValueError:
        raise ValueError(f"pattern must look like '2:4', got {pattern!r}") from None
    if not (0 < n < m):
        raise ValueError(f"pattern N:M needs 0 < N < M, got {pattern!r}")
    return f"{n}:{m}"


def _weight_scheme(bits: int, group_size: int, sym: bool) -> Any:
    from compressed_tensors.quantization import QuantizationArgs, QuantizationScheme

    kwargs: dict[str, Any] = {"num_bits": int(bits), "type": "int", "symmetric": bool(sym), "dynamic": False}
    if group_size is not None and group_size > 0:
        kwargs.update(strategy="group", group_size=int(group_size))
    else:
        kwargs.update(strategy="channel")
    return QuantizationScheme(targets=list(_TARGETS), weights=QuantizationArgs(**kwargs))


def _build_recipe(
    method: str,
    *,
    bits: int,
    group_size: int,
    sym: bool,
    actorder: bool,
    sparsity: float,
    pattern: str | None,
    dampening_frac: float,
    block_size: int,
) -> list[Any]:
    if method == "gptq":
        from llmcompressor.modifiers.gptq import GPTQModifier

        return [
            GPTQModifier(
                config_groups={"group_0": _weight_scheme(bits, group_size, sym)},
                ignore=list(_IGNORE),
                block_size=int(block_size),
                dampening_frac=float(dampening_frac),
                # GPTQModifier's default is "static" (= "weight"); None turns act-order off.
                actorder="static" if actorder else None,
            )
        ]
    if method == "awq":
        from llmcompressor.modifiers.quantization import QuantizationModifier
        from llmcompressor.modifiers.transform.awq import AWQModifier

        # AWQ only rescales; the QuantizationModifier after it quantizes (min-max per group).
        return [
            AWQModifier(),
            QuantizationModifier(
                config_groups={"group_0": _weight_scheme(bits, group_size, sym)},
                ignore=list(_IGNORE),
            ),
        ]
    if not 0.0 <= sparsity < 1.0:
        raise ValueError(f"sparsity must be in [0, 1), got {sparsity}")
    mask_structure = _parse_pattern(pattern)
    if method == "sparsegpt":
        from llmcompressor.modifiers.pruning.sparsegpt import SparseGPTModifier

        return [
            SparseGPTModifier(
                sparsity=float(sparsity),
                mask_structure=mask_structure,
                block_size=int(block_size),
                dampening_frac=float(dampening_frac),
                targets=list(_TARGETS),
                ignore=list(_IGNORE),
            )
        ]
    if method == "wanda":
        from llmcompressor.modifiers.pruning.wanda import WandaPruningModifier

        return [
            WandaPruningModifier(
                sparsity=float(sparsity),
                mask_structure=mask_structure,
                targets=list(_TARGETS),
                ignore=list(_IGNORE),
            )
        ]
    raise ValueError(f"method must be one of {METHODS}, got {method!r}")


@contextlib.contextmanager
def _silenced() -> Iterator[None]:
    """Mute llm-compressor's loguru logs, Python warnings and tqdm bars for the duration."""
    from loguru import logger
    from tqdm import std as tqdm_std

    patched: list[tuple[Any, str, Any]] = []
    quiet_classes: dict[type, type] = {}

    def quiet(cls: type) -> type:
        if cls not in quiet_classes:
            def __init__(self: Any, *args: Any, **kwargs: Any) -> None:  # noqa: N807
                kwargs["disable"] = True
                cls.__init__(self, *args, **kwargs)

            quiet_classes[cls] = type(f"Quiet{cls.__name__}", (cls,), {"__init__": __init__})
        return quiet_classes[cls]

    for name, module in list(sys.modules.items()):
        if module is None or not name.startswith(("llmcompressor", "compressed_tensors")):
            continue
        obj = getattr(module, "tqdm", None)
        if isinstance(obj, type) and issubclass(obj, tqdm_std.tqdm):
            patched.append((module, "tqdm", obj))
            setattr(module, "tqdm", quiet(obj))

    logger.disable("llmcompressor")
    logger.disable("compressed_tensors")
    # standard-library loggers: torch.fx tracing (the sequential pipeline) warns once, and a few
    # compressed-tensors modules log through `logging`
    std_names = ("torch.fx._symbolic_trace", "compressed_tensors", "llmcompressor")
    std_loggers = [logging.getLogger(n) for n in std_names]
    std_levels = [lg.level for lg in std_loggers]
    for lg in std_loggers:
        lg.setLevel(logging.ERROR)
    env_key = "TOKENIZERS_PARALLELISM"
    env_before = os.environ.get(env_key)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        for module, attr, obj in patched:
            setattr(module, attr, obj)
        for lg, level in zip(std_loggers, std_levels):
            lg.setLevel(level)
        logger.enable("compressed_tensors")
        if not _imported_quietly:
            logger.enable("llmcompressor")
        if env_before is None:
            os.environ.pop(env_key, None)
        else:
            os.environ[env_key] = env_before


@contextlib.contextmanager
def _cpu_patches() -> Iterator[None]:
    """Without an accelerator, AWQ's ``IntermediatesCache.pin_memory`` raises; make it a no-op."""
    from llmcompressor.pipelines.cache import IntermediatesCache

    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None and accelerator.is_available():
        yield
        return
    original = IntermediatesCache.__dict__["pin_memory"]
    IntermediatesCache.pin_memory = lambda self, *args, **kwargs: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        IntermediatesCache.pin_memory = original  # type: ignore[method-assign]


def _calibration_dataset(seqs: list[torch.Tensor]) -> Any:
    from datasets import Dataset

    return Dataset.from_dict(
        {
            "input_ids": [s.tolist() for s in seqs],
            "attention_mask": [[1] * s.numel() for s in seqs],
        }
    )


def _dense_weight(module: nn.Module) -> torch.Tensor | None:
    """The weight a quantized module's forward uses (fake-quant), or None for an unquantized one."""
    from compressed_tensors.quantization import QuantizationStatus
    from compressed_tensors.quantization.lifecycle.forward import forward_quantize

    scheme = getattr(module, "quantization_scheme", None)
    args = getattr(scheme, "weights", None) if scheme is not None else None
    if args is None or not hasattr(module, "weight_scale"):
        return None
    status = getattr(module, "quantization_status", None)
    if status is not None and status >= QuantizationStatus.COMPRESSED:
        raise RuntimeError("llm-compressor left a weight in compressed form; cannot read it back")
    return forward_quantize(module, module.weight.detach(), "weight", args)


@torch.no_grad()
def _copy_back(src: nn.Module, dst: nn.Module) -> None:
    """Write every parameter of the compressed copy ``src`` into ``dst`` (same module names)."""
    src_modules = dict(src.named_modules())
    for name, module in dst.named_modules():
        other = src_modules.get(name)
        if other is None:
            raise RuntimeError(f"module {name!r} disappeared from the compressed copy")
        for pname, param in module.named_parameters(recurse=False):
            new = _dense_weight(other) if pname == "weight" else None
            if new is None:
                new = getattr(other, pname)
            if new.shape != param.shape:
                raise RuntimeError(f"{name}.{pname} changed shape: {tuple(param.shape)} -> {tuple(new.shape)}")
            new = new.to(device=param.device, dtype=param.dtype)
            if not torch.equal(new, param):
                param.copy_(new)


def run_llmcompressor(
    model: nn.Module,
    tokenizer: Any,
    method: str,
    calib: list[torch.Tensor],
    *,
    bits: int = 4,
    group_size: int = 128,
    sym: bool = True,
    actorder: bool = False,
    sparsity: float = 0.5,
    pattern: str | None = None,
    dampening_frac: float = 0.01,
    block_size: int = 128,
) -> nn.Module:
    """Compress ``model`` in place with llm-compressor's ``oneshot`` and return it (dense weights).

    Args:
        model: a Hugging Face causal LM (``PreTrainedModel``), on any device.
        tokenizer: its tokenizer (handed to ``oneshot`` as the processor; the ids are not re-tokenized).
            None makes ``oneshot`` load one from ``model.config.name_or_path``.
        method: ``"gptq"``, ``"awq"``, ``"sparsegpt"`` or ``"wanda"``.
        calib: calibration token ids, tensors of shape ``(seq,)``, ``(1, seq)`` or ``(batch, seq)``
            without padding; every row is one calibration sample (``oneshot`` batch size 1, samples
            in descending-length order, all of them used, none truncated).
        bits: weight bits (GPTQ, AWQ); integer grid ``[-2^(b-1), 2^(b-1)-1]``.
        group_size: columns per quantization group, which must divide the input width of every
            linear layer (llm-compressor has no ragged last group; agent-small's 192 rules out the
            default 128); ``<= 0`` means one group per output row (per-channel).
        sym: symmetric (zero point 0) or asymmetric min-max grid.
        actorder: GPTQ act-order (llm-compressor's ``"static"``/``"weight"``: columns processed in
            decreasing ``diag(H)`` order, groups stay the contiguous original-column groups).
        sparsity: fraction of weights to prune (SparseGPT, Wanda; ignored with ``pattern``).
        pattern: ``"N:M"`` semi-structured sparsity: N of every M consecutive input weights of a row
            are zeroed (llm-compressor's ``mask_structure``; ``"2:4"`` is 50%). None = unstructured.
        dampening_frac: GPTQ/SparseGPT dampening, a fraction of ``mean(diag(H))``.
        block_size: GPTQ/SparseGPT column block size.

    Returns:
        ``model`` itself, its parameters overwritten with the compressed values.
    """
    method = str(method).lower()
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    seqs = _split_sequences(calib)
    if not any(isinstance(m, nn.Linear) and "lm_head" not in n for n, m in model.named_modules()):
        # llm-compressor targets nn.Linear; GPT-2's Conv1D layers would be left untouched silently.
        raise ValueError("the model has no nn.Linear layers besides lm_head (GPT-2 Conv1D?); llm-compressor would do nothing")
    if method in ("gptq", "awq") and group_size is not None and group_size > 0:
        # compressed-tensors' observers reshape a row into whole groups: no ragged last group
        linears = [m for n, m in model.named_modules() if isinstance(m, nn.Linear) and "lm_head" not in n]
        ragged = sorted({m.in_features for m in linears if m.in_features % group_size})
        if ragged:
            raise ValueError(
                f"group_size={group_size} does not divide the input width of every linear layer {ragged}; "
                "llm-compressor needs whole groups (use a divisor, or group_size=-1 for per-channel)"
            )
    if not available():
        raise ImportError(f"llmcompressor is not importable: {_import_error!r}")
    recipe = _build_recipe(
        method,
        bits=bits,
        group_size=group_size,
        sym=sym,
        actorder=actorder,
        sparsity=sparsity,
        pattern=pattern,
        dampening_frac=dampening_frac,
        block_size=block_size,
    )

    from llmcompressor import oneshot
    from llmcompressor.core import reset_session

    work = copy.deepcopy(model)
    try:
        with _silenced(), _cpu_patches(), tempfile.TemporaryDirectory(prefix="lmforge-llmc-") as tmp:
            # oneshot re-reads the config from config.name_or_path; give it a local copy
            work.config.save_pretrained(tmp)
            work.config._name_or_path = tmp
            compressed = oneshot(
                model=work,
                processor=tokenizer,
                recipe=recipe,
                dataset=_calibration_dataset(seqs),
                num_calibration_samples=len(seqs),
                max_seq_length=max(s.numel() for s in seqs),
                shuffle_calibration_samples=False,
                batch_size=1,
                output_dir=None,
                log_dir=None,
            )
            _copy_back(compressed, model)
    finally:
        reset_session()
        del work
    return model
