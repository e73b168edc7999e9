"""The demo's embedded problems: small original stdin/stdout tasks (tools/build_bundled_problems.py writes them)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

BUNDLED_PROBLEMS = Path(__file__).with_name("bundled") / "problems.jsonl"


def bundled_problems() -> list[dict[str, Any]]:
    """The bundled problems as CodeContests-schema rows (public + private tests, a reference solution)."""
    from rljax.problems import load_jsonl

    return load_jsonl(BUNDLED_PROBLEMS)
