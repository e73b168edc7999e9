"""CodeContests judge comparison, code extraction, feedback text, assertion tests, limits, the test-run cache."""
import pytest

from executor import Limits, Test, extract_code, feedback_text, limits_for_problem, outputs_match, run_assert_tests
from executor import run_tests
from executor.feedback import NO_CODE, RETRY, TRUNCATION_MARKER


@pytest.mark.parametrize("actual,expected,ok", [
    ("3\n", "3", True), ("3   \n\n\n", "3\n", True), ("1 2\n3", "1 2 3", True),
    ("1.0", "1", True), ("1", "1.0", True), ("0.333333", "0.3333333", True), ("0.3333", "0.33333", False),
    ("YES", "yes", True), ("", "", True), ("", "0", False), ("1 2", "1 2 3", False), ("1 2 3", "1 2", False),
    ("10", "1", False), ("12", "12.000001", True), ("3", "4", False), ("ünï ✓", "ÜNÏ ✓", True), ("1e-6", "0", True),
    ("nan", "nan", True), ("inf", "1", False), ("100000000000000000001", "100000000000000000000", False),
])
def test_codecontests_comparison(actual, expected, ok):
    assert outputs_match(actual, expected) is ok


def test_extract_code_rules():
    assert extract_code("Here:\n```python\nprint(1)\n```\nand ```python\nprint(2)\n```") == "print(1)"
    assert extract_code("```py\nx = 1\nprint(x)\n```") == "x = 1\nprint(x)"
    assert extract_code("no code here") is None
    assert extract_code("```python\ndef f(:\n```") is None  # does not parse
    assert extract_code("```\nprint(1)\n```") is None  # not a python block
    assert extract_code("```python\nprint(1)") == "print(1)"  # cut at max tokens but parses
    assert extract_code("```python\n   \n```") is None


def test_feedback_text_full_none_and_truncation():
    tests = [Test("1 2\n", "3\n"), Test("5 5\n", "10\n"), Test("0 0\n", "0\n")]
    results = run_tests("a, b = map(int, input().split())\nprint(a * b if a else 1 / a)", tests)
    text = feedback_text(results)
    assert text.splitlines()[0] == "Your code failed the following tests:"
    assert "- input '1 2' failed: Expected output '3' but got '2'" in text
    assert "- input '0 0' failed: Traceback (most recent call last):" in text and "ZeroDivisionError" in text
    assert text.endswith(RETRY) and feedback_text(results) == text  # deterministic
    assert feedback_text(results, mode="none") == RETRY
    assert feedback_text([r for r in results if r.passed]) == ""
    slow = run_tests("import time\ntime.sleep(5)", [Test("", "1")], Limits(time_limit_s=0.5))
    assert "Execution took too long." in feedback_text(slow)
    big = run_tests("x = ' ' * 2**33", [Test("", "1")], Limits(memory_limit_mb=256))
    assert "Out of memory." in feedback_text(big)
    long = run_tests("print('y' * 5000)", [Test("x" * 3000, "z")])
    short = feedback_text(long, max_chars=100)
    assert short.count(TRUNCATION_MARKER) == 2 and len(short) < 400
    with pytest.raises(ValueError, match="feedback mode"):
        feedback_text(results, mode="bogus")
    assert "```python" in NO_CODE


def test_humaneval_style_assertion_tests():
    check = "def check(candidate):\n    assert candidate(2, 3) == 5\n    assert candidate(-1, 1) == 0\n"
    assert run_assert_tests("def add(a, b):\n    return a + b", check, "add").passed
    wrong = run_assert_tests("def add(a, b):\n    return a - b", check, "add")
    assert not wrong.passed and wrong.status == "runtime_error" and "AssertionError" in wrong.stderr
    for cheat in ("import sys\nsys.exit(0)", "import os\nos._exit(0)", "def add(a, b):\n    raise SystemExit(0)"):
        assert not run_assert_tests(cheat, check, "add").passed, cheat


def test_limits_from_codecontests_row():
    row = {"time_limit": {"seconds": 2, "nanos": 500_000_000}, "memory_limit_bytes": 256 * 2**20}
    assert limits_for_problem(row) == Limits(2.5, 256)
    assert limits_for_problem({"time_limit": None, "memory_limit_bytes": 0}) == Limits(10.0, 1024)


def test_stop_at_first_failure():
    tests = [Test("1\n", "1\n"), Test("2\n", "3\n"), Test("3\n", "3\n")]
    assert len(run_tests("print(input())", tests, stop_at_first_failure=True)) == 2
    assert [r.passed for r in run_tests("print(input())", tests)] == [True, False, True]


def test_test_run_cache_runs_a_program_once_per_tests_and_limits_and_evicts_by_size():
    from executor.testing import TestRunCache

    cache = TestRunCache(max_chars=10_000)
    tests = [Test("3\n", "6"), Test("5\n", "10")]
    # a program that prints a fresh random number each run: a second sandbox run would differ
    source = "import random\nn = int(input())\nprint(2 * n if random.random() < 2 else 0, random.random())"
    first = cache.run(source, tests)
    assert (cache.hits, cache.misses) == (0, 1) and not any(r.passed for r in first)
    again = cache.run(source, list(tests))  # equal tests, another list
    assert (cache.hits, cache.misses) == (1, 1) and [r.actual for r in again] == [r.actual for r in first]
    cache.run(source, tests[:1])  # other tests, other limits, other source: each its own run
    cache.run(source, tests, Limits(time_limit_s=5.0))
    cache.run(source + "\n", tests)
    assert (cache.hits, cache.misses) == (1, 4)
    right = "print(2 * int(input()))"
    assert all(r.passed for r in cache.run(right, tests)) and all(r.passed for r in cache.run(right, tests))
    assert (cache.hits, cache.misses) == (2, 5)

    small = TestRunCache(max_chars=40)  # room for one entry: the program (23 characters) and its outputs (5)
    small.run(right, tests)
    small.run("print(3 * int(input()))", tests)  # evicts the first
    small.run(right, tests)
    assert (small.hits, small.misses) == (0, 3)
    with pytest.raises(ValueError, match="TestRunCache.max_chars must be > 0"):
        TestRunCache(0)


def test_rlef_env_scores_a_repeated_answer_from_its_cache():
    from rljax.envs import RLEFEnv

    row = {"name": "double", "description": "Print twice the number.",
           "public_tests": {"input": ["3\n"], "output": ["6\n"]},
           "private_tests": {"input": ["5\n", "0\n"], "output": ["10\n", "0\n"]}}
    env = RLEFEnv(max_turns=2, test_cache_chars=1 << 20)
    wrong, right = "```python\nprint(int(input()) + 1)\n```", "```python\nprint(2 * int(input()))\n```"
    results = [env.reset(row).step(answer) for answer in (wrong, wrong, right, right)]
    assert [r.status for r in results] == ["retry", "retry", "solved", "solved"]
    assert results[0].feedback == results[1].feedback and results[2].reward == results[3].reward == 1.0
    # sandbox runs: wrong on the public tests once; right on the public, then the private tests once
    assert (env.test_runs.hits, env.test_runs.misses) == (3, 3)
    assert RLEFEnv().test_runs is None  # off unless asked (the trainer's env.test_cache_mb turns it on)
