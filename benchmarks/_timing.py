"""Timing shared by the benchmark scripts."""

from __future__ import annotations

import time


def time_interleaved(fns: dict, runs: int) -> dict[str, list[float]]:
    """Wall times of each function, ``runs`` times, interleaved (A B A B ...) after one warm-up each,
    so that background load on the machine affects every path alike."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(runs):
        for name, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - t0)
    return times


def save_result(path, result: dict, t0: float) -> dict:
    """Add the wall time since ``t0`` and the machine to ``result``, write it atomically as JSON."""
    import os
    import platform

    from lmforge.common.io import atomic_write_json

    result = {**result, "wall_s": time.perf_counter() - t0, "python": platform.python_version(),
              "machine": platform.machine(), "cpus": os.cpu_count()}
    atomic_write_json(path, result)
    print(f"wrote {path} ({result['wall_s']:.0f} s)")
    return result
