"""Inference dtype and thread count, chosen deliberately and recorded in every result file.

``resolve_dtype("auto")`` picks bfloat16 only where the CPU has native bf16 matrix instructions
(AMX-BF16 or AVX512-BF16, read from ``/proc/cpuinfo``; CUDA devices always qualify), else float32.
Measured (``benchmarks/real_model.py``): on a Xeon with AMX-BF16 a bf16 matmul ran 4.4x and SmolLM2
prefill 2.2x faster than fp32; on an AVX2-only AMD EPYC, torch's bf16 matmul ran about 30x *slower*
than fp32 (it falls back to a scalar kernel), so "bf16 when the CPU supports it" must mean the
instructions, not the dtype's availability.

Threads: torch defaults to one thread per core. With ``OMP_WAIT_POLICY=PASSIVE`` (the Makefile sets
it) idle OpenMP threads sleep instead of spinning; without it, two spinning threads on a loaded 2-core
machine decoded 20x slower than one. :func:`set_threads` applies a requested count and
:func:`runtime_record` is what result files store.
"""

from __future__ import annotations

import functools
import os
from typing import Any

import torch

from lmforge.common.errors import UserError

__all__ = ["cpu_has_fast_bf16", "resolve_dtype", "runtime_record", "set_threads", "DTYPE_CHOICES"]

DTYPE_CHOICES = ("auto", "float32", "bfloat16")


@functools.lru_cache(maxsize=1)
def cpu_has_fast_bf16() -> bool:
    """True when the CPU advertises AMX-BF16 or AVX512-BF16 (Linux ``/proc/cpuinfo`` flags)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.startswith("flags"):
                    flags = set(line.split(":", 1)[1].split())
                    return bool({"amx_bf16", "avx512_bf16"} & flags)
    except OSError:
        pass
    return False


def resolve_dtype(name: str | torch.dtype, device: str | torch.device = "cpu") -> torch.dtype:
    """``auto`` -> bfloat16 on CUDA or a CPU with native bf16 matmuls, else float32."""
    if isinstance(name, torch.dtype):
        return name
    key = str(name).strip().lower()
    aliases = {"fp32": "float32", "float": "float32", "bf16": "bfloat16"}
    key = aliases.get(key, key)
    if key == "auto":
        dev = torch.device(device)
        return torch.bfloat16 if dev.type == "cuda" or cpu_has_fast_bf16() else torch.float32
    if key == "float32":
        return torch.float32
    if key == "bfloat16":
        return torch.bfloat16
    raise UserError(f"--dtype must be one of {', '.join(DTYPE_CHOICES)}, not {name!r}")


def check_threads(threads: int | None) -> None:
    """A one-line error for a thread count below 1 (call before loading anything)."""
    if threads is not None and threads < 1:
        raise UserError(f"--threads must be at least 1, got {threads}")


def set_threads(threads: int | None) -> int:
    """Use ``threads`` intra-op threads (None keeps torch's choice); returns the count in force."""
    check_threads(threads)
    if threads is not None:
        torch.set_num_threads(threads)
    return torch.get_num_threads()


def runtime_record(dtype: torch.dtype | None = None) -> dict[str, Any]:
    """What a result file records about how it was computed."""
    return {
        "threads": torch.get_num_threads(),
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "dtype": str(dtype).removeprefix("torch.") if dtype is not None else None,
        "cpu_fast_bf16": cpu_has_fast_bf16(),
        "torch": torch.__version__,
    }
