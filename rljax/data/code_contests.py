"""CodeContests (Li et al. 2022) from the released parquet shards, filtered as RLEF does.

Each row has `name`, `description`, `public_tests` / `private_tests` / `generated_tests` ({input: [...],
output: [...]}), `time_limit` {seconds, nanos}, `memory_limit_bytes`, `difficulty`, `source`, ... . RLEF drops
problems without public or private tests (669 of 13,328 train problems); every drop is counted with its reason.
With `generated_as_private`, the generated tests join the private ones (a stricter final judge).
"""
from __future__ import annotations

import collections
import dataclasses
import glob
from pathlib import Path
from typing import Any, Iterable, Sequence

KEPT_FIELDS = ("name", "description", "public_tests", "private_tests", "generated_tests", "time_limit",
               "memory_limit_bytes", "difficulty", "source", "cf_rating")
REQUIRED_FIELDS = ("name", "description", "public_tests", "private_tests")


@dataclasses.dataclass
class LoadReport:
    """How many rows were read, kept and dropped (per reason)."""

    read: int = 0
    kept: int = 0
    dropped: collections.Counter = dataclasses.field(default_factory=collections.Counter)

    def summary(self) -> str:
        reasons = ", ".join(f"{n} {reason}" for reason, n in sorted(self.dropped.items())) or "none"
        return f"read {self.read}, kept {self.kept}, dropped {sum(self.dropped.values())} ({reasons})"


def _shard_paths(paths: str | Sequence[str]) -> list[Path]:
    patterns = [paths] if isinstance(paths, (str, Path)) else list(paths)
    found: list[Path] = []
    for pattern in patterns:
        pattern = str(pattern)
        if Path(pattern).is_dir():
            found += sorted(Path(pattern).glob("*.parquet"))
        else:
            found += [Path(p) for p in sorted(glob.glob(pattern))]
    if not found:
        raise FileNotFoundError(f"CodeContests: no parquet shards match {patterns}")
    return found


def _read_shard(path: Path) -> Iterable[dict[str, Any]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (pa.ArrowException, OSError) as err:
        raise ValueError(f"CodeContests shard {path}: not a readable parquet file ({err})") from None
    columns = [c for c in KEPT_FIELDS if c in table.column_names]
    return table.select(columns).to_pylist()


def _tests(value: Any) -> dict[str, list[str]] | None:
    if not isinstance(value, dict) or value.get("input") is None or value.get("output") is None:
        return None
    inputs, outputs = list(value["input"]), list(value["output"])
    return {"input": inputs, "output": outputs} if len(inputs) == len(outputs) else None


def _convert(row: dict[str, Any], generated_as_private: bool) -> tuple[dict[str, Any] | None, str]:
    """The RLEFEnv row, or None and the reason it is dropped."""
    missing = [f for f in REQUIRED_FIELDS if row.get(f) is None]
    if missing:
        return None, f"missing {missing[0]}"
    public, private = _tests(row["public_tests"]), _tests(row["private_tests"])
    if public is None or private is None:
        return None, "malformed tests"
    if generated_as_private:
        generated = _tests(row.get("generated_tests")) or {"input": [], "output": []}
        private = {k: private[k] + generated[k] for k in ("input", "output")}
    if not public["input"]:
        return None, "no public tests"
    if not private["input"]:
        return None, "no private tests"
    out = {k: row[k] for k in ("name", "description", "time_limit", "memory_limit_bytes", "difficulty", "source",
                               "cf_rating") if row.get(k) is not None}
    out.update(public_tests=public, private_tests=private)
    return out, ""


def load_code_contests(paths: str | Sequence[str], generated_as_private: bool = False,
                       max_problems: int | None = None) -> tuple[list[dict[str, Any]], LoadReport]:
    """Rows for `RLEFEnv` from parquet shards (a directory, a glob, or a list), and what was dropped and why."""
    report = LoadReport()
    rows: list[dict[str, Any]] = []
    for path in _shard_paths(paths):
        for raw in _read_shard(path):
            report.read += 1
            row, reason = _convert(raw, generated_as_private)
            if row is None:
                report.dropped[reason] += 1
                continue
            rows.append(row)
            if max_problems is not None and len(rows) >= max_problems:
                report.kept = len(rows)
                return rows, report
    report.kept = len(rows)
    return rows, report
