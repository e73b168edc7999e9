"""Output comparison as the CodeContests judge does it.

Whitespace-split tokens, compared case-insensitively; the token counts must be equal; when either token of a
pair is a float, both are compared as numbers with absolute tolerance 1e-5; integers compare exactly.
"""
from __future__ import annotations

import math
import re

_INT = re.compile(r"[+-]?\d+\Z")
_FLOAT = re.compile(r"[+-]?(\d+\.\d*|\.\d+|\d+)([eE][+-]?\d+)?\Z")
FLOAT_TOLERANCE = 1e-5


def _is_float(token: str) -> bool:
    return bool(_FLOAT.match(token)) and not _INT.match(token)


def tokens_equal(actual: str, expected: str) -> bool:
    if actual.lower() == expected.lower():
        return True
    if (_is_float(actual) or _is_float(expected)) and _FLOAT.match(actual) and _FLOAT.match(expected):
        a, b = float(actual), float(expected)
        return math.isfinite(a) and math.isfinite(b) and abs(a - b) <= FLOAT_TOLERANCE
    return False


def outputs_match(actual: str, expected: str) -> bool:
    """True when the program's stdout is accepted for the expected output."""
    got, want = actual.split(), expected.split()
    return len(got) == len(want) and all(tokens_equal(a, b) for a, b in zip(got, want))
