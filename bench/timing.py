"""Shared timing for the benchmarks: the first call (compile + run) apart from the steady state."""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable


def first_and_median(step: Callable[[], Any], repeats: int) -> tuple[float, float]:
    """(seconds of the first call, median seconds of `repeats` more); `step` must block until its work is done."""
    first, median = interleaved({"step": step}, repeats)
    return first["step"], median["step"]


def interleaved(steps: dict[str, Callable[[], Any]], repeats: int) -> tuple[dict[str, float], dict[str, float]]:
    """({name: seconds of its first call}, {name: median seconds of `repeats` more}), the steps taking turns
    (a, b, c, a, b, c, ...) so that a slow spell of a shared machine falls on every step alike instead of on
    whichever ran in it; each step must block until its work is done."""
    first = {}
    for name, step in steps.items():
        start = time.perf_counter()
        step()
        first[name] = time.perf_counter() - start
    times: dict[str, list[float]] = {name: [] for name in steps}
    for _ in range(repeats):
        for name, step in steps.items():
            start = time.perf_counter()
            step()
            times[name].append(time.perf_counter() - start)
    return first, {name: statistics.median(ts) for name, ts in times.items()}


def host_memory() -> str:
    """Set host memory as the `rljax` command does (rljax.host_memory; call before the first JAX computation)
    and say which setting the timings ran under."""
    from rljax.host_memory import ENV, retain_freed_host_memory

    if retain_freed_host_memory():
        return f"host memory: freed buffers retained and reused ({ENV}=retain)"
    return f"host memory: glibc's defaults (freed large buffers unmapped and faulted in again; {ENV}=retain reuses them)"
