"""Shared timing for the benchmarks: the first call (compile + run) apart from the steady state."""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable


def first_and_median(step: Callable[[], Any], repeats: int) -> tuple[float, float]:
    """(seconds of the first call, median seconds of `repeats` more); `step` must block until its work is done."""
    start = time.perf_counter()
    step()
    first = time.perf_counter() - start
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        step()
        times.append(time.perf_counter() - start)
    return first, statistics.median(times)
