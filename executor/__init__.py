"""Execution of untrusted model code and reward computation on CPU hosts. Pure Python: no JAX here."""
from executor.extract import extract_code
from executor.feedback import feedback_text
from executor.judge import outputs_match
from executor.pool import ExecutorPool, Outcome
from executor.sandbox import STATUSES, RunResult, isolation_mode, run_program
from executor.swe_reward import compute_reward
from executor.testing import (AssertTest, Limits, Test, TestResult, TestRunCache, limits_for_problem, run_assert_tests,
                              run_tests)

__all__ = ["STATUSES", "AssertTest", "ExecutorPool", "Limits", "Outcome", "RunResult", "Test", "TestResult",
           "TestRunCache", "compute_reward",
           "extract_code", "feedback_text", "isolation_mode", "limits_for_problem", "outputs_match",
           "run_assert_tests", "run_program", "run_tests"]
