"""A bounded pool of sandbox workers: futures, `run_many` in submission order, per-job timeout, no job lost.

Each job's untrusted code runs in its own sandboxed process tree (executor.sandbox), so the pool's workers
are threads that wait on those processes; a job whose process is killed, or that raises, still returns
exactly one `Outcome` (with the error), and the worker goes on with the next job.
"""
from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import os
import threading
import time
import traceback
from typing import Any, Callable, Generic, Iterable, TypeVar

T = TypeVar("T")


@dataclasses.dataclass
class Outcome(Generic[T]):
    value: T | None
    error: str | None = None  # "timeout: ..." or the traceback of an exception in the job

    @property
    def ok(self) -> bool:
        return self.error is None


class ExecutorPool:
    """`workers` threads (default: one per core), at most `max_pending` jobs queued or running."""

    def __init__(self, workers: int | None = None, max_pending: int | None = None,
                 job_timeout_s: float | None = None):
        self.workers = workers or os.cpu_count() or 1
        self.job_timeout_s = job_timeout_s
        self._slots = threading.BoundedSemaphore(max_pending or 4 * self.workers)
        self._executor = cf.ThreadPoolExecutor(self.workers, thread_name_prefix="rljax-executor")

    def submit(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> cf.Future:
        """Queue one job; blocks while `max_pending` jobs are already queued or running."""
        self._slots.acquire()
        try:
            future = self._executor.submit(fn, *args, **kwargs)
        except BaseException:
            self._slots.release()
            raise
        future.add_done_callback(lambda _: self._slots.release())
        return future

    def _timed_call(self, fn: Callable[..., T], item: Any, started: list[float]) -> tuple[T, float]:
        started.append(time.monotonic())
        value = fn(item)
        return value, time.monotonic() - started[0]

    def _outcome(self, future: cf.Future, started: list[float]) -> Outcome:
        """Wait for one job; past `job_timeout_s` of its own run time it counts as a timeout."""
        limit = self.job_timeout_s
        try:
            while limit is not None and not future.done():
                if started and time.monotonic() - started[0] > limit:
                    return Outcome(None, f"timeout: job exceeded the pool's {limit} s limit")
                cf.wait([future], timeout=0.01)
            value, elapsed = future.result()
        except Exception:
            return Outcome(None, traceback.format_exc(limit=5))
        if limit is not None and elapsed > limit:
            return Outcome(None, f"timeout: job exceeded the pool's {limit} s limit ({elapsed:.2f} s)")
        return Outcome(value)

    def run_many(self, fn: Callable[..., T], items: Iterable[Any]) -> list[Outcome[T]]:
        """`fn(item)` for every item, results in submission order, one Outcome per item."""
        jobs: list[tuple[cf.Future, list[float]]] = []
        for item in items:
            started: list[float] = []
            jobs.append((self.submit(self._timed_call, fn, item, started), started))
        return [self._outcome(future, started) for future, started in jobs]

    def close(self) -> None:
        self._executor.shutdown(wait=True)

    def __enter__(self) -> "ExecutorPool":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
