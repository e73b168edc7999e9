"""Run a program on CodeContests-style stdin/stdout tests, or on HumanEval-style assertion tests."""
from __future__ import annotations

import collections
import dataclasses
import json
import secrets
import threading
from typing import Any, Mapping, Sequence

from executor.judge import outputs_match
from executor.batch import run_program_batch
from executor.sandbox import RunResult, run_program

DEFAULT_TIME_LIMIT_S = 10.0  # RLEF's limits
DEFAULT_MEMORY_LIMIT_MB = 1024
DEFAULT_OUTPUT_LIMIT = 1 << 20


@dataclasses.dataclass(frozen=True)
class Test:
    __test__ = False  # not a pytest class
    input: str
    output: str


@dataclasses.dataclass(frozen=True)
class AssertTest:
    """HumanEval style: `test_code` runs after the solution (and `check(entry_point)` when given); `shown_input`
    and `shown_expected` are what the feedback shows. Statements that print go to `actual` in the result."""

    __test__ = False
    test_code: str
    entry_point: str | None = None
    shown_input: str = ""
    shown_expected: str = ""


@dataclasses.dataclass(frozen=True)
class Limits:
    time_limit_s: float = DEFAULT_TIME_LIMIT_S
    memory_limit_mb: int = DEFAULT_MEMORY_LIMIT_MB
    output_limit_bytes: int = DEFAULT_OUTPUT_LIMIT

    def run_kwargs(self) -> dict[str, float | int]:
        """The keyword arguments of `run_program` / `run_program_batch`."""
        return dataclasses.asdict(self)


@dataclasses.dataclass
class TestResult:
    index: int
    passed: bool
    status: str  # sandbox status, or "wrong_answer" for a clean run with the wrong output
    input: str
    expected: str
    actual: str
    stderr: str
    wall_s: float


def limits_for_problem(problem: Mapping[str, Any], default: Limits = Limits()) -> Limits:
    """Limits from a CodeContests row (`time_limit` {seconds, nanos}, `memory_limit_bytes`) or the defaults."""
    time_limit = default.time_limit_s
    raw = problem.get("time_limit")
    if isinstance(raw, Mapping) and (raw.get("seconds") or raw.get("nanos")):
        time_limit = float(raw.get("seconds") or 0) + float(raw.get("nanos") or 0) / 1e9
    memory = default.memory_limit_mb
    if problem.get("memory_limit_bytes"):
        memory = max(64, int(problem["memory_limit_bytes"]) // 2**20)
    return Limits(time_limit, memory, default.output_limit_bytes)


def run_tests(source: str, tests: Sequence[Test | AssertTest], limits: Limits = Limits(),
              stop_at_first_failure: bool = False) -> list[TestResult]:
    """Run `source` on every test (a fresh process each, one sandbox for all); a stdin/stdout test passes when
    the run is `ok` and its stdout matches. With `stop_at_first_failure`, tests run one by one until the first
    failure. Assertion tests (`AssertTest`, all of one kind per call) run one sandbox each."""
    if tests and isinstance(tests[0], AssertTest):
        return _run_assert_tests(source, tests, limits, stop_at_first_failure)
    results: list[TestResult] = []
    if stop_at_first_failure:
        runs = (run_program(source, t.input, **limits.run_kwargs()) for t in tests)
    else:
        runs = iter(run_program_batch(source, [t.input for t in tests], **limits.run_kwargs()))
    for index, (test, run) in enumerate(zip(tests, runs)):
        passed = run.status == "ok" and outputs_match(run.stdout, test.output)
        results.append(TestResult(index, passed, _status(run, passed), test.input, test.output, run.stdout,
                                  run.stderr, run.wall_s))
        if stop_at_first_failure and not passed:
            break
    return results


_ASSERT_HARNESS = '''import sys
def __rljax_main():
    token = sys.stdin.readline().strip()
    namespace = {"__name__": "__main__"}
    exec(compile(%(candidate)s, "solution.py", "exec"), namespace)
    exec(compile(%(tests)s, "tests.py", "exec"), namespace)
    %(call)s
    sys.stdout.write("\\n" + token + "\\n")
__rljax_main()
'''


WRONG_RESULT_EXIT = 97  # an AssertTest's own check ends with this status when the value differs (not a crash)


def run_assert_tests(source: str, test_code: str, entry_point: str | None = None, limits: Limits = Limits()
                     ) -> TestResult:
    """HumanEval style: run the solution, then `test_code` (and `check(entry_point)` when given).

    It passes only when the harness reaches its end and prints a per-run random token read from stdin, so a
    solution that exits early with status 0 (`sys.exit(0)`, `os._exit(0)`) does not fake a pass.
    """
    return _run_assert(source, test_code, entry_point, limits)[0]


def _run_assert(source: str, test_code: str, entry_point: str | None, limits: Limits) -> tuple[TestResult, RunResult]:
    token = secrets.token_hex(16)
    call = f"namespace['check'](namespace[{entry_point!r}])" if entry_point else "pass"
    program = _ASSERT_HARNESS % {"candidate": json.dumps(source), "tests": json.dumps(test_code), "call": call}
    run = run_program(program, token + "\n", **limits.run_kwargs())
    finished = run.stdout.rstrip("\n").endswith("\n" + token) or run.stdout.strip() == token
    passed = run.status == "ok" and finished
    actual = run.stdout.replace(token, "").rstrip("\n")
    return TestResult(0, passed, _status(run, passed), test_code, "", actual, run.stderr, run.wall_s), run


def _run_assert_tests(source: str, tests: Sequence[AssertTest], limits: Limits, stop_at_first_failure: bool
                      ) -> list[TestResult]:
    results = []
    for index, test in enumerate(tests):
        if not isinstance(test, AssertTest):
            raise TypeError(f"run_tests: test {index} is a {type(test).__name__}; do not mix test kinds in one call")
        result, run = _run_assert(source, test.test_code, test.entry_point, limits)
        if run.exit_code == WRONG_RESULT_EXIT and run.status == "runtime_error":  # a value, not a crash
            lines = result.actual.splitlines()
            result = dataclasses.replace(result, status="wrong_answer", stderr="", actual=lines[-1] if lines else "")
        results.append(dataclasses.replace(result, index=index, input=test.shown_input or test.test_code,
                                           expected=test.shown_expected))
        if stop_at_first_failure and not result.passed:
            break
    return results


def _status(run: RunResult, passed: bool) -> str:
    """The sandbox status, or "wrong_answer" for a clean run that did not pass."""
    return run.status if run.status != "ok" or passed else "wrong_answer"


class TestRunCache:
    """A memo of `run_tests` (stdin/stdout or assertion tests): the same source on the same tests under the same
    limits gets the stored results instead of another sandbox run. GRPO groups and later steps repeat answers
    (a tiny model's group of 8 often holds 2-3 distinct programs). A program whose verdict depends on timing or
    randomness keeps its first verdict. Thread-safe; the least recently used entries go once the stored outputs
    (stdout + stderr characters) pass `max_chars`; `hits` and `misses` count the calls."""

    def __init__(self, max_chars: int):
        if max_chars <= 0:
            raise ValueError(f"TestRunCache.max_chars must be > 0, got {max_chars}")
        self.max_chars = max_chars
        self.hits = self.misses = 0
        self._entries: collections.OrderedDict[Any, tuple[list[TestResult], int]] = collections.OrderedDict()
        self._chars = 0
        self._lock = threading.Lock()

    def run(self, source: str, tests: Sequence[Test | AssertTest], limits: Limits = Limits()) -> list[TestResult]:
        key = (source, tuple(tests), limits)
        with self._lock:
            entry = self._entries.get(key)
            if entry is not None:
                self._entries.move_to_end(key)
                self.hits += 1
                return list(entry[0])
            self.misses += 1
        results = run_tests(source, tests, limits)
        size = sum(len(r.actual) + len(r.stderr) for r in results) + len(source)
        with self._lock:
            if key not in self._entries and size <= self.max_chars:
                self._entries[key] = (results, size)
                self._chars += size
                while self._chars > self.max_chars:
                    self._chars -= self._entries.popitem(last=False)[1][1]
        return list(results)
