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
