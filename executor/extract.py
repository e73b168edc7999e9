"""Take the Python code out of a model answer: the first ```python fenced block that parses."""
from __future__ import annotations

import ast
import re

_FENCE = re.compile(r"```[ \t]*(?:python3?|py)[ \t]*\n(.*?)(?:\n[ \t]*```|\Z)", re.S | re.I)


def extract_code(answer: str) -> str | None:
    """Code of the first ```python block, or None when there is none or it does not parse (RLEF's -0.2 case).

    An unclosed final block (the answer was cut at max tokens) is still taken if it parses.
    """
    for match in _FENCE.finditer(answer):
        code = match.group(1)
        if code.strip() and _parses(code):
            return code
        return None
    return None


def _parses(code: str) -> bool:
    try:
        ast.parse(code)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True
