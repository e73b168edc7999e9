"""Host memory for XLA:CPU: reuse freed buffers instead of page-faulting fresh ones on every program run.

XLA:CPU allocates each execution's temporaries with posix_memalign on one of its worker threads (a GRPO update
on SmolLM2-135M, 8 x 256 tokens: one 5.7 GB buffer). glibc serves such a thread from its own arena, whose heaps
are capped at 64 MiB, so every large request becomes a fresh mmap, unmapped again when the program ends, and
the kernel zero-fills every 4 KiB page of it on first touch on every run: measured here, 1.4 M page faults and
3-15 s of system time in a 13-20 s update (torch's update on the same machine: 0.7-1.6 M).

`retain_freed_host_memory()` puts every thread on glibc's main arena (M_ARENA_MAX = 1), serves large requests
from its brk heap rather than mmap (M_MMAP_MAX = 0) and never trims that heap (M_TRIM_THRESHOLD = -1): a freed
buffer stays mapped and the next run reuses it without a fault. The price is the one device allocators pay: the
process keeps its peak heap until it exits, and a heap that fragments grows past it (once, by one buffer, in a
run of ten updates here; a 128 MiB probe program grew it at 0-8 of 24 runs, tests/test_host_memory.py; `rljax
demo` peaked at 19.9 GB resident under it). It is therefore opt-in:
`RLJAX_HOST_MEMORY=retain` turns it on for the `rljax` command, the benchmarks and the test session; `system`
(the default) keeps glibc's defaults. On an accelerator host it would change only host-side allocations (not
measured there).

It must run before the first JAX computation: a thread keeps the arena of its first allocation, and XLA's
worker threads make theirs when they first run a program.
"""
from __future__ import annotations

import ctypes
import ctypes.util
import os

# glibc's mallopt parameters (malloc.h)
M_TRIM_THRESHOLD, M_MMAP_MAX, M_ARENA_MAX = -1, -4, -8
ENV = "RLJAX_HOST_MEMORY"


def retain_freed_host_memory() -> bool:
    """Where `RLJAX_HOST_MEMORY=retain`, make freed host buffers reusable without page faults (see the module
    doc); True when applied, False under glibc's defaults (`system`, the default) or where the C library has no
    mallopt (not glibc). Raises ValueError for another value of RLJAX_HOST_MEMORY."""
    choice = os.environ.get(ENV, "system")
    if choice not in ("retain", "system"):
        raise ValueError(f"{ENV}={choice!r}: expected 'system' (the default) or 'retain'")
    if choice == "system":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    return all(mallopt(param, value) == 1
               for param, value in ((M_ARENA_MAX, 1), (M_MMAP_MAX, 0), (M_TRIM_THRESHOLD, -1)))
