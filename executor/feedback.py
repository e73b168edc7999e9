"""The feedback text an RLEF model reads between turns (Gehring et al. 2025), with ablation variants.

full:      the failed public tests, each with its input and expected/actual output, exception trace,
           "Execution took too long." or "Out of memory.", then "Give it another try."
none:      only "Give it another try."
unrelated: full feedback computed on another problem's tests (the caller passes those results).
Long fields are cut deterministically at `max_chars` with a marker.
"""
from __future__ import annotations

from typing import Sequence

from executor.testing import TestResult

MODES = ("full", "none", "unrelated")
HEADER = "Your code failed the following tests:"
RETRY = "Give it another try."
NO_CODE = "Your answer did not contain valid Python code in a ```python code block."
TRUNCATION_MARKER = "... (truncated)"


def truncate(text: str, max_chars: int) -> str:
    return text if len(text) <= max_chars else text[:max_chars] + TRUNCATION_MARKER


def describe_failure(result: TestResult, max_chars: int = 1000) -> str:
    shown_input = truncate(result.input.strip("\n"), max_chars)
    if result.status == "timeout":
        detail = "Execution took too long."
    elif result.status == "memory_limit":
        detail = "Out of memory."
    elif result.status == "output_limit":
        detail = "The program printed too much output."
    elif result.status in ("runtime_error", "sandbox_error"):
        detail = truncate(result.stderr.strip() or f"The program exited with an error ({result.status}).",
                          max_chars)
    else:
        detail = (f"Expected output '{truncate(result.expected.strip(), max_chars)}' but got "
                  f"'{truncate(result.actual.strip(), max_chars)}'")
    return f"- input '{shown_input}' failed: {detail}"


def feedback_text(results: Sequence[TestResult], mode: str = "full", max_chars: int = 1000,
                  max_tests: int = 10) -> str:
    """Feedback for the failed results; '' when nothing failed (the dialog ends instead)."""
    if mode not in MODES:
        raise ValueError(f"feedback mode {mode!r}: expected one of {MODES}")
    failed = [r for r in results if not r.passed]
    if not failed:
        return ""
    if mode == "none":
        return RETRY
    lines = [HEADER] + [describe_failure(r, max_chars) for r in failed[:max_tests]]
    if len(failed) > max_tests:
        lines.append(f"- ... and {len(failed) - max_tests} more failed tests")
    return "\n".join(lines + [RETRY])
