"""GGUF in, safetensors out: a ``.gguf`` file becomes a cached Hugging Face folder, once.

``convert(path)`` dequantizes a GGUF checkpoint with transformers' own GGUF support
(``from_pretrained(folder, gguf_file=...)``, which reads the file with the ``gguf`` package) and
saves it as an ordinary safetensors folder in lmforge's cache, keyed by the file's sha256:
``$LMFORGE_CACHE/gguf/<sha256[:16]>/``. Every later call loads that folder. The folder is written to
a temporary path and renamed into place, so an interrupted conversion leaves nothing half-made.

Checked before writing this by hand: transformers 5 loads GGUF directly but keeps a ``GgufHfQuantizer``
on the model and ``quantization_config.quant_method == "gguf"`` in its config, so its
``save_pretrained`` output is not a plain checkpoint, and each load dequantizes again (30-50 s for
SmolLM2-135M here). lmforge clears the quantizer and the config entry before saving. The ``gguf``
package is used only to read the header (tensor types, special-token ids) before transformers runs,
so an unsupported quantization type or a truncated file is one line instead of a traceback.

NOTE: transformers' GGUF tokenizer conversion names the BOS token as EOS for SmolLM2 (eos_token
``<|im_start|>``); the GGUF header's ``tokenizer.ggml.{bos,eos,padding}_token_id`` are authoritative
and are written into the converted tokenizer and generation config.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

from lmforge.common.errors import UserError
from lmforge.common.progress import save_pretrained_quietly

__all__ = ["GGUF_SUFFIX", "cache_dir", "convert", "file_sha256", "find_gguf", "read_header"]

GGUF_SUFFIX = ".gguf"
META_FILE = "lmforge_gguf.json"
# Bumped when the conversion itself changes, so older cache entries are rebuilt.
CONVERSION_VERSION = 2
# Raw float types gguf.quants.dequantize reads without a quantization trait.
_FLOAT_TYPES = {"F32", "F16", "F64", "BF16"}


def file_sha256(path: Path, chunk: int = 1 << 22) -> str:
    """The sha256 of a file, read in 4 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def _cache_root() -> Path:
    from lmforge.models.zoo import cache_root

    return cache_root() / "gguf"


def cache_dir(sha256: str) -> Path:
    """The converted folder of the GGUF file whose sha256 is ``sha256``."""
    return _cache_root() / sha256[:16]


def find_gguf(folder: Path) -> Path | None:
    """The one ``.gguf`` file of a folder that has no ``config.json`` (a GGUF download), else None.

    Raises:
        UserError: the folder holds several GGUF files (the user must name one).
    """
    if (folder / "config.json").is_file():
        return None
    files = sorted(p for p in folder.iterdir() if p.is_file() and p.name.endswith(GGUF_SUFFIX))
    if len(files) > 1:
        names = ", ".join(p.name for p in files[:4])
        raise UserError(f"'{folder}' holds {len(files)} GGUF files ({names}); pass the one to load")
    return files[0] if files else None


def _supported_types() -> set[str]:
    import gguf.quants as gq
    from gguf import GGMLQuantizationType

    traits = getattr(gq, "_type_traits", {})
    return _FLOAT_TYPES | {t.name for t in GGMLQuantizationType if t in traits}


def read_header(path: Path) -> dict[str, Any]:
    """What lmforge needs from a GGUF header: architecture, tensor types and special-token ids.

    Raises:
        UserError: the ``gguf`` package is missing, the file is not a readable GGUF (truncated,
            corrupt), or one of its tensors has a quantization type that cannot be dequantized.
    """
    try:
        from gguf import GGUFReader
    except ImportError:
        raise UserError("loading a .gguf file needs the gguf package: pip install 'gguf>=0.10'") from None
    try:
        reader = GGUFReader(str(path))
    except Exception as exc:  # ValueError (bad magic / shapes past the end), OSError, ...
        reason = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(f"'{path}' is not a readable GGUF file (truncated or corrupt?): {reason[:160]}") from None

    def field(name: str) -> Any:
        f = reader.fields.get(name)
        if f is None:
            return None
        part = f.parts[f.data[0]] if f.data else f.parts[-1]
        if part.dtype.kind == "u" and part.dtype.itemsize == 1:  # a string
            return bytes(part).decode("utf-8", errors="replace")
        return part.tolist()[0] if len(part) == 1 else part.tolist()

    types: dict[str, int] = {}
    for t in reader.tensors:
        types[t.tensor_type.name] = types.get(t.tensor_type.name, 0) + 1
    supported = _supported_types()
    bad = sorted(k for k in types if k not in supported)
    if bad:
        raise UserError(
            f"'{path.name}' uses GGUF quantization type {', '.join(bad)}, which transformers cannot dequantize "
            f"(supported: {', '.join(sorted(supported))})"
        )
    return {
        "architecture": field("general.architecture"),
        "name": field("general.name"),
        "tensor_types": types,
        "bos_token_id": field("tokenizer.ggml.bos_token_id"),
        "eos_token_id": field("tokenizer.ggml.eos_token_id"),
        "padding_token_id": field("tokenizer.ggml.padding_token_id"),
        "context_length": field(f"{field('general.architecture')}.context_length"),
    }


def _fix_special_tokens(tokenizer: Any, model: Any, header: dict[str, Any]) -> None:
    """Set BOS/EOS/PAD from the GGUF header's token ids (see the module NOTE)."""
    for role, key in (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("pad", "padding_token_id")):
        tid = header.get(key)
        if not isinstance(tid, int) or not 0 <= tid < len(tokenizer):
            continue
        setattr(tokenizer, f"{role}_token", tokenizer.convert_ids_to_tokens(tid))
        setattr(model.config, f"{role}_token_id", tid)
        gen = getattr(model, "generation_config", None)
        if gen is not None:
            setattr(gen, f"{role}_token_id", tid)


def convert(path: str | os.PathLike[str], *, sha256: str | None = None, progress: bool = True) -> Path:
    """The cached safetensors folder of a GGUF file, converting it on first use.

    Args:
        path: the ``.gguf`` file.
        sha256: its hash when the caller already computed (and checked) it.
        progress: show a spinner line while converting.

    Returns:
        The folder (config.json, model.safetensors, tokenizer files, ``lmforge_gguf.json``).

    Raises:
        UserError: unreadable or unsupported GGUF, or an architecture transformers cannot load.
    """
    src = Path(path).expanduser()
    if not src.is_file():
        raise UserError(f"GGUF file '{src}' does not exist")
    digest = sha256 or file_sha256(src)
    out = cache_dir(digest)
    meta_file = out / META_FILE
    if meta_file.is_file():
        try:
            meta = json.loads(meta_file.read_text(encoding="utf-8"))
            if meta.get("sha256") == digest and meta.get("conversion_version") == CONVERSION_VERSION:
                return out
        except (OSError, json.JSONDecodeError):
            pass  # a damaged cache entry is rebuilt below
    header = read_header(src)
    _convert_into(src, out, digest, header, progress)
    return out


def _convert_into(src: Path, out: Path, digest: str, header: dict[str, Any], progress: bool) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from lmforge.common.io import atomic_dir, atomic_write_json
    from lmforge.common.progress import console, progress_enabled
    from lmforge.models.load import _offline

    show = progress and progress_enabled()
    if show:
        console.print(f"converting {src.name} to safetensors once (cached in {out}) ...")
    if not show:
        from transformers.utils import logging as hf_logging

        hf_logging.disable_progress_bar()
    try:
        with _offline():
            model = AutoModelForCausalLM.from_pretrained(
                str(src.parent), gguf_file=src.name, dtype=torch.float32, local_files_only=True)
            tokenizer = AutoTokenizer.from_pretrained(str(src.parent), gguf_file=src.name, local_files_only=True)
    except UserError:
        raise
    except Exception as exc:
        reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise UserError(f"transformers could not load '{src.name}' (architecture "
                        f"{header.get('architecture')!r}): {reason}") from None
    # A plain checkpoint: no GGUF quantizer on the model, no quantization_config in config.json.
    model.hf_quantizer = None
    for attr in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(model.config, attr):
            delattr(model.config, attr)
    model.config.name_or_path = header.get("name") or src.stem
    _fix_special_tokens(tokenizer, model, header)
    # A byte-level BPE tokenizer must not "clean up" spaces before punctuation (transformers warns
    # on every load otherwise, and the clean-up changes decoded text).
    tokenizer.clean_up_tokenization_spaces = False
    if out.exists():
        import shutil

        shutil.rmtree(out)  # an incomplete or stale cache entry (no valid meta file)
    with atomic_dir(out) as tmp:
        save_pretrained_quietly(model, str(tmp), safe_serialization=True)
        tokenizer.save_pretrained(str(tmp))
        atomic_write_json(tmp / META_FILE, {
            "sha256": digest, "source": str(src), "source_name": src.name,
            "tensor_types": header["tensor_types"], "architecture": header.get("architecture"),
            "dequantized_dtype": "float32", "conversion_version": CONVERSION_VERSION,
        })
