"""lmforge's compiled CPU kernels for packed layers: codebook (GANQ) and uniform (GPTQ/AWQ/RTN) GEMV.

The C source (``csrc/lut_gemv.c``, shipped as package data) is compiled at first use with the system
C compiler (``$LMFORGE_CC``, default ``gcc``): ``-O3 -march=native -fopenmp -shared -fPIC``, retried
without ``-fopenmp`` and then without ``-march=native`` if the compiler refuses them. The library lands
in ``$LMFORGE_CACHE/kernels/`` (default ``~/.cache/lmforge/kernels/``) under a name keyed by the
source's hash, the compiler's identity (path and ``--version``), the flags and the CPU's flag line,
written to a temporary file and renamed (atomic), and is loaded with :mod:`ctypes`. It links OpenMP by
soname (``libgomp.so.1``), which resolves to the copy PyTorch has already loaded, so the kernel and
PyTorch share one thread pool.

What it computes (see the header of the C file): ``y = x W^T (+ bias)`` for one or a few tokens
straight from the packed int32 codes, without dequantizing the weight. With AVX-512 a chunk of 16
code words is one load, and ``_mm512_permutexvar_ps`` turns the low 4 bits of each 32-bit lane into one
of 16 table values, so 16 weights are dequantized per instruction (1..4-bit codes; the table repeats a
2^bits-entry codebook to 16 entries). Without AVX-512 the C falls back to plain loops. ``lut_dequant``
writes float32 weight rows (the same float32 operations as lmforge's dequantize) for the many-token
path (dequantize a block of rows, then ``F.linear``).

Checked for reuse: PyTorch's ``_weight_int4pack_mm_for_cpu`` (uniform 4-bit, groups of 32..256, bf16
activations: :mod:`lmforge.common.int4_cpu`, kept as ``kernel="int4"``) has no codebook variant and no
float32-exact fast path; torchao 0.18's CPU wheel has no other CPU kernel; ``torch.utils.cpp_extension``
needs ninja and the PyTorch headers at run time and takes a minute to build, whereas this needs only
a C compiler (about a second). llama.cpp's kernels use its own block formats, not lmforge's layout.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import platform
import shutil
import subprocess
import tempfile
import threading
import warnings
from pathlib import Path

import torch

__all__ = [
    "COMPILER",
    "GEMV_MAX_TOKENS",
    "NativeLayer",
    "available",
    "features",
    "library_path",
    "unavailable_reason",
]

# The C compiler (a name on PATH or a path). Tests point it at a missing file to check the fallback.
COMPILER = os.environ.get("LMFORGE_CC") or "gcc"

SOURCE = Path(__file__).resolve().parent / "csrc" / "lut_gemv.c"
_ABI = 1
_FLAG_SETS = (
    ("-O3", "-march=native", "-fopenmp"),
    ("-O3", "-march=native"),
    ("-O3",),
)

# At most this many tokens run through the GEMV (codes re-read per token from cache); more take the
# dequantize-a-block-then-F.linear path. NOTE: measured on the 2-core AVX-512 EPYC, 1 thread, 4-bit
# (benchmarks/lut_matmul.py, part "tokens"; here 4096 x 4096 / 576 x 576): at 16 tokens the GEMV takes
# 6.1 / 0.11 ms (codebook) and 9.7 / 0.15 ms (uniform g64) against 13.3 / 0.17 and 14.6 / 0.19 ms for
# the block path; at 32 tokens the uniform GEMV loses on 576 x 576 (0.33 vs 0.28 ms).
GEMV_MAX_TOKENS = 16

# Below this many multiply-adds (tokens x out x in) a call runs on one thread, above it on
# torch.get_num_threads() threads. NOTE: deliberately high (a batch-1 GEMV of any common layer runs on
# one thread). OpenMP splits the rows statically and returns when the slowest thread is done; on a
# 2-core machine shared with other work a descheduled second thread costs milliseconds (measured
# here: 4096 x 4096 4-bit, 2 threads 5.5 ms, 1 thread 0.30 ms), and waking a sleeping one under
# OMP_WAIT_POLICY=PASSIVE costs more than a SmolLM2-sized GEMV takes. One thread already streams the
# packed codes at about 22 GB/s from DRAM (dense fp32 F.linear: 23 GB/s), so a second adds little to
# a memory-bound call. benchmarks/lut_matmul.py reports both (``*_1thread`` / ``*_all_threads``).
PARALLEL_MIN_MACS = 1 << 26


class _Layer(ctypes.Structure):
    _fields_ = [
        ("kind", ctypes.c_int32),
        ("out", ctypes.c_int32),
        ("in_", ctypes.c_int32),
        ("bits", ctypes.c_int32),
        ("words", ctypes.c_int32),
        ("words_pad", ctypes.c_int32),
        ("group_size", ctypes.c_int32),
        ("n_groups", ctypes.c_int32),
        ("scale_mode", ctypes.c_int32),
        ("n_outliers", ctypes.c_int32),
        ("qweight", ctypes.c_void_p),
        ("table", ctypes.c_void_p),
        ("scales", ctypes.c_void_p),
        ("zeros", ctypes.c_void_p),
        ("group_of_word", ctypes.c_void_p),
        ("bias", ctypes.c_void_p),
        ("o_rows", ctypes.c_void_p),
        ("o_cols", ctypes.c_void_p),
        ("o_delta", ctypes.c_void_p),
    ]


class _Lib:
    def __init__(self, path: Path) -> None:
        self.path = path
        self.dll = ctypes.CDLL(str(path))
        self.dll.lut_abi.restype = ctypes.c_int
        self.dll.lut_features.restype = ctypes.c_int
        if self.dll.lut_abi() != _ABI:
            raise OSError(f"{path.name}: ABI {self.dll.lut_abi()} != {_ABI}")
        self.features = int(self.dll.lut_features())
        self.gemv = self.dll.lut_gemv
        self.gemv.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_int]
        self.gemv.restype = ctypes.c_int
        self.dequant = self.dll.lut_dequant
        self.dequant.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
        self.dequant.restype = ctypes.c_int


_lock = threading.Lock()
_state: dict = {}  # {"lib": _Lib} or {"error": str}, keyed by the compiler it was built with
_warned = False


def _cache_root() -> Path:
    # The same rule as lmforge.models.zoo.cache_root (not imported: that module imports transformers).
    if os.environ.get("LMFORGE_CACHE"):
        return Path(os.environ["LMFORGE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "lmforge"


def _cpu_id() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            lines = [ln for ln in fh if ln.startswith(("flags", "model name"))]
        return "".join(sorted(set(lines)))
    except OSError:
        return f"{platform.machine()} {platform.processor()}"


def _compiler_id(cc: str) -> tuple[str, str]:
    path = shutil.which(cc)
    if path is None:
        raise OSError(f"no C compiler '{cc}' (set LMFORGE_CC)")
    out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60)
    if out.returncode != 0:
        raise OSError(f"'{cc} --version' failed")
    return path, out.stdout.strip()


def _compile(path: str, flags: tuple[str, ...], tmp_dir: Path, target: Path) -> str | None:
    """Compile into a temporary file in ``tmp_dir`` and rename it onto ``target`` (atomic: a concurrent
    process sees either no file or a whole one); the temporary file never outlives a failure or a
    timeout. Returns None on success, else the compiler's last error line."""
    fd, tmp = tempfile.mkstemp(prefix=".lut_gemv-", suffix=".so", dir=tmp_dir)
    os.close(fd)
    try:
        cmd = [path, *flags, "-std=gnu11", "-shared", "-fPIC", "-o", tmp, str(SOURCE)]
        res = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        if res.returncode == 0:
            os.replace(tmp, target)
            return None
        return (res.stderr.strip().splitlines() or ["failed"])[-1]
    finally:
        Path(tmp).unlink(missing_ok=True)


def _build(cc: str, rebuild: Path | None = None) -> Path:
    """The path of the compiled library (cached, else built now). ``rebuild``: a cached file that
    failed to load (truncated or corrupt), built again in its place."""
    path, version = _compiler_id(cc)
    source = SOURCE.read_bytes()
    cache = _cache_root() / "kernels"
    errors = []
    for flags in _FLAG_SETS:
        key = hashlib.sha256(b"\0".join(
            [source, path.encode(), version.encode(), " ".join(flags).encode(), _cpu_id().encode(),
             str(_ABI).encode()])).hexdigest()[:20]
        target = cache / f"lut_gemv-{key}.so"
        if target.exists() and target != rebuild:
            return target
        try:
            cache.mkdir(parents=True, exist_ok=True)
            err = _compile(path, flags, cache, target)
        except OSError:  # an unwritable cache: build in a temporary folder (no caching)
            tmp_dir = Path(tempfile.mkdtemp(prefix="lmforge-kernels-"))
            target = tmp_dir / target.name
            err = _compile(path, flags, tmp_dir, target)
        if err is None:
            return target
        errors.append(f"{' '.join(flags)}: {err}")
    raise OSError("compiling csrc/lut_gemv.c failed (" + "; ".join(errors) + ")")


def _load() -> _Lib | None:
    cc = COMPILER
    st = _state.get(cc)
    if st is None:
        with _lock:
            st = _state.get(cc)
            if st is None:
                try:
                    path = _build(cc)
                    try:
                        lib = _Lib(path)
                    except OSError:  # a cached file that does not load (truncated, corrupt): build it again
                        lib = _Lib(_build(cc, rebuild=path))
                    st = {"lib": lib}
                except (OSError, subprocess.SubprocessError) as exc:
                    st = {"error": str(exc).splitlines()[0] if str(exc) else type(exc).__name__}
                _state[cc] = st
    return st.get("lib")


def available() -> bool:
    """True when the compiled kernel is built (or buildable now) and loaded."""
    return _load() is not None


def unavailable_reason() -> str | None:
    """Why the compiled kernel cannot be used (one line), or None when it can."""
    if _load() is not None:
        return None
    return _state[COMPILER]["error"]


def features() -> dict:
    """What the loaded library was compiled with: ``{"avx512": bool, "openmp": bool, "path": str}``."""
    lib = _load()
    if lib is None:
        return {"avx512": False, "openmp": False, "path": None}
    return {"avx512": bool(lib.features & 1), "openmp": bool(lib.features & 2), "path": str(lib.path)}


def library_path() -> Path | None:
    lib = _load()
    return None if lib is None else lib.path


def warn_fallback_once() -> None:
    """One warning per process that the compiled kernel is unavailable and PyTorch's path runs instead."""
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(f"lmforge's compiled kernel is unavailable, using the PyTorch path: {unavailable_reason()}",
                      stacklevel=3)


def _reset() -> None:
    """Forget loaded libraries and the warning (tests)."""
    global _warned
    _state.clear()
    _warned = False


# --------------------------------------------------------------------------------------------------
# Layers


def unsupported_reason(kind: str, bits: int, group_size: int = 0, act_order: bool = False,
                       device: torch.device | str = "cpu") -> str | None:
    """Why the compiled GEMV cannot run a layer, or None when it can.

    ``kind`` is ``"codebook"`` or ``"uniform"``; uniform groups must hold whole code words
    (``group_size % (32 // bits) == 0``: any multiple of 8 at 4 bits).
    """
    if torch.device(device).type != "cpu":
        return f"the compiled kernel is CPU only, the layer is on {torch.device(device).type}"
    if not 1 <= bits <= 4:
        return f"the compiled kernel runs 1..4-bit codes, the layer has {bits}"
    if kind == "uniform":
        if act_order:
            return "the compiled kernel has no act-order (g_idx) column permutation"
        per = 32 // bits
        if group_size > 0 and group_size % per:
            return f"the compiled kernel needs {bits}-bit groups that hold whole words (a multiple of {per} columns)"
    return None


def _f32(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to(torch.float32).contiguous()


def _i32(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to(torch.int32).contiguous()


class NativeLayer:
    """The compiled kernel's view of one packed layer: ctypes descriptor plus the tensors it points at.

    Built by :func:`codebook_layer` / :func:`uniform_layer`; the caller rebuilds it when a buffer changes
    (qlinear keys it on the buffers' versions). Extra bytes beyond the module's own buffers:
    :attr:`extra_bytes` (a codebook's table repeated to 16 entries per row: 2^(4-bits) x the codebook;
    outlier deltas; float32 copies of non-float32 buffers; a uniform layer's group index when its
    groups do not tile 16-word chunks).
    """

    def __init__(self, lib: _Lib, desc: _Layer, keep: dict[str, torch.Tensor], shared: set[str]) -> None:
        self.lib = lib
        self.desc = desc
        self.addr = ctypes.addressof(desc)
        self.keep = keep  # tensors the descriptor points into (kept alive here)
        self.out_features = int(desc.out)
        self.in_features = int(desc.in_)
        self.extra_bytes = sum(t.numel() * t.element_size() for k, t in keep.items() if k not in shared)

    def _threads(self, macs: int) -> int:
        return torch.get_num_threads() if macs >= PARALLEL_MIN_MACS else 1

    def run(self, x: torch.Tensor) -> torch.Tensor:
        """``(..., out)`` ``x @ W^T (+ bias, + outliers)`` in ``x``'s dtype for ``x`` ``(..., in)`` on the CPU
        (computed in float32; the caller checks the last dimension)."""
        dtype = x.dtype
        if dtype is not torch.float32:
            x = x.to(torch.float32)
        if not x.is_contiguous():
            x = x.contiguous()
        b = x.numel() // self.in_features
        y = torch.empty(x.shape[:-1] + (self.out_features,), dtype=torch.float32)
        macs = b * self.out_features * self.in_features
        if self.lib.gemv(self.addr, x.data_ptr(), y.data_ptr(), b,
                         torch.get_num_threads() if macs >= PARALLEL_MIN_MACS else 1):
            raise RuntimeError("lut_gemv failed (unsupported layer or out of memory)")
        return y if dtype is torch.float32 else y.to(dtype)

    def gemv(self, x2: torch.Tensor) -> torch.Tensor:
        """``(B, out)`` float32 ``x2 @ W^T (+ bias, + outliers)`` for ``x2`` ``(B, in)`` (any float dtype)."""
        if x2.dtype != torch.float32:
            x2 = x2.to(torch.float32)
        if not x2.is_contiguous():
            x2 = x2.contiguous()
        b = x2.shape[0]
        y = torch.empty(b, self.out_features, dtype=torch.float32)
        rc = self.lib.gemv(self.addr, x2.data_ptr(), y.data_ptr(), b,
                           self._threads(b * self.out_features * self.in_features))
        if rc:
            raise RuntimeError("lut_gemv failed (unsupported layer or out of memory)")
        return y

    def dequant(self, r0: int, r1: int, out: torch.Tensor | None = None) -> torch.Tensor:
        """Float32 weight rows ``r0:r1`` (outliers not written; bit for bit lmforge's dequantize), into
        ``out`` (a contiguous float32 tensor of at least that many elements) when given."""
        n = (r1 - r0) * self.in_features
        if out is None:
            w = torch.empty(r1 - r0, self.in_features, dtype=torch.float32)
        else:
            if out.dtype != torch.float32 or not out.is_contiguous() or out.numel() < n:
                raise ValueError("out must be a contiguous float32 tensor large enough for the rows")
            w = out.view(-1)[:n].view(r1 - r0, self.in_features)
        rc = self.lib.dequant(self.addr, r0, r1, w.data_ptr(), self._threads((r1 - r0) * self.in_features * 4))
        if rc:
            raise RuntimeError("lut_dequant failed")
        return w


_scratch = threading.local()


def scratch(numel: int) -> torch.Tensor:
    """A float32 buffer of at least ``numel`` elements, reused by this thread (freshly allocated blocks
    cost a page fault per 4 KiB on first touch: as long as the dequantization itself on this VM)."""
    buf = getattr(_scratch, "buf", None)
    if buf is None or buf.numel() < numel:
        buf = torch.empty(numel, dtype=torch.float32)
        _scratch.buf = buf
    return buf


def _check(name: str, t: torch.Tensor | None, shape: tuple[int, ...]) -> None:
    """The C kernel reads raw pointers with the layer's sizes: every tensor must be a CPU tensor of
    exactly the expected shape (one with fewer elements would be read past its end)."""
    if t is None:
        return
    if t.device.type != "cpu":
        raise ValueError(f"{name} is on {t.device.type}, the compiled kernel is CPU only")
    if tuple(t.shape) != shape:
        raise ValueError(f"{name} has shape {tuple(t.shape)}, the compiled kernel expects {shape}")


def _descriptor(kind: int, qweight: torch.Tensor, out_f: int, in_f: int, bits: int) -> tuple[_Layer, dict]:
    if not 1 <= bits <= 4 or out_f < 0 or in_f <= 0 or max(out_f, in_f) >= 2**31:
        raise ValueError(f"the compiled kernel cannot run a {bits}-bit {out_f}x{in_f} layer")
    if qweight.dtype != torch.int32 or tuple(qweight.shape) != (out_f, -(-in_f // (32 // bits))):
        raise ValueError(f"qweight must be int32 ({out_f}, {-(-in_f // (32 // bits))})")
    _check("qweight", qweight, (out_f, -(-in_f // (32 // bits))))
    q = qweight.detach().contiguous()
    d = _Layer()
    d.kind, d.out, d.in_, d.bits = kind, out_f, in_f, bits
    d.words = q.shape[1]
    d.words_pad = -(-d.words // 16) * 16
    d.qweight = q.data_ptr()
    return d, {"qweight": q}


def codebook_layer(qweight: torch.Tensor, codebook: torch.Tensor, in_features: int, bits: int,
                   bias: torch.Tensor | None = None,
                   outliers: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None) -> NativeLayer | None:
    """The compiled view of a codebook layer, or None when the library is unavailable.

    ``outliers`` is ``(rows, cols, delta)`` with ``delta = value - codebook[row, code]`` (float32).
    """
    lib = _load()
    if lib is None:
        return None
    out_f = qweight.shape[0]
    d, keep = _descriptor(0, qweight, out_f, in_features, bits)
    _check("codebook", codebook, (out_f, 2**bits))  # repeated to exactly 16 floats a row below
    _check("bias", bias, (out_f,))
    k = 2**bits
    if outliers is not None and outliers[2].numel():
        n = outliers[2].numel()
        for name, t in zip(("outlier rows", "outlier cols", "outlier deltas"), outliers):
            _check(name, t, (n,))
        # Raw indices into y and x: PyTorch's indexing would wrap a negative one, the C kernel would
        # write before y (the PyTorch path raises for them: index_add).
        rows, cols = outliers[0], outliers[1]
        if n and (int(rows.min()) < 0 or int(rows.max()) >= out_f or int(cols.min()) < 0
                  or int(cols.max()) >= in_features):
            raise ValueError(f"outlier positions must lie inside the {out_f}x{in_features} weight")
    table = _f32(codebook).repeat(1, 16 // k)  # table[r, s] = codebook[r, s mod 2^bits]
    keep["table"] = table
    d.table = table.data_ptr()
    if bias is not None:
        keep["bias"] = _f32(bias)
        d.bias = keep["bias"].data_ptr()
    if outliers is not None and outliers[2].numel():
        rows, cols, delta = _i32(outliers[0]), _i32(outliers[1]), _f32(outliers[2])
        keep.update(o_rows=rows, o_cols=cols, o_delta=delta)
        d.n_outliers = delta.numel()
        d.o_rows, d.o_cols, d.o_delta = rows.data_ptr(), cols.data_ptr(), delta.data_ptr()
    shared = {"qweight"} | ({"bias"} if bias is not None and keep["bias"].data_ptr() == bias.data_ptr() else set())
    for name, src in (("o_rows", outliers[0] if outliers else None), ("o_cols", outliers[1] if outliers else None)):
        if src is not None and name in keep and keep[name].data_ptr() == src.data_ptr():
            shared.add(name)
    return NativeLayer(lib, d, keep, shared)


def uniform_layer(qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, in_features: int, bits: int,
                  group_size: int, bias: torch.Tensor | None = None) -> NativeLayer | None:
    """The compiled view of a uniform layer (no act-order), or None when the library is unavailable."""
    lib = _load()
    if lib is None:
        return None
    out_f = qweight.shape[0]
    d, keep = _descriptor(1, qweight, out_f, in_features, bits)
    per = 32 // bits
    reason = unsupported_reason("uniform", bits, group_size)
    if reason is not None:
        raise ValueError(reason)
    n_groups = -(-in_features // group_size) if group_size > 0 else 1
    _check("scales", scales, (out_f, n_groups))
    _check("zeros", zeros, (out_f, n_groups))
    _check("bias", bias, (out_f,))
    s, z = _f32(scales), _f32(zeros)
    keep.update(scales=s, zeros=z)
    d.scales, d.zeros = s.data_ptr(), z.data_ptr()
    d.n_groups = s.shape[1]
    g = group_size if group_size > 0 else 0
    d.group_size = g
    chunk = 16 * per
    if g == 0:
        d.scale_mode = 0
    elif g % chunk == 0:
        d.scale_mode = 1
    elif chunk % g == 0 and g % per == 0:
        d.scale_mode = 2
    else:
        d.scale_mode = 3
        gw = (torch.arange(d.words_pad, dtype=torch.int64) * per // g).clamp(max=d.n_groups - 1).to(torch.int32)
        keep["group_of_word"] = gw
        d.group_of_word = gw.data_ptr()
    if bias is not None:
        keep["bias"] = _f32(bias)
        d.bias = keep["bias"].data_ptr()
    shared = {"qweight"}
    for name, src in (("scales", scales), ("zeros", zeros), ("bias", bias)):
        if src is not None and keep[name].data_ptr() == src.data_ptr():
            shared.add(name)
    return NativeLayer(lib, d, keep, shared)
