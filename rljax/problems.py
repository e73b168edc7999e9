"""Problem sources and the grain stream that feeds them to the rollouts, sharded per host and resumable.

A source is a list of dataset rows (dicts). The stream shuffles them with a seed, repeats, and hands out
batches of rows the environment accepts; a row it refuses is skipped, counted, and its reason logged once per
distinct message. In a multi-host run every process runs its own iterator over the same stream and keeps its
contiguous share of each global batch (`rljax.distributed.local_share`), so the iterator state is the same on
every host and a checkpoint resumes on any host count.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any, Callable

import grain.python as gp

from rljax.envs.base import ProblemError

log = logging.getLogger("rljax.problems")


def load_jsonl(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a JSON-lines file; a line that is not a JSON object fails with its line number."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"problems file {path}: no such file")
    rows = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as err:
            raise ValueError(f"{path}:{number}: not valid JSON ({err.msg})") from None
        if not isinstance(row, dict):
            raise ValueError(f"{path}:{number}: expected a JSON object per line, got {type(row).__name__}")
        rows.append(row)
    if not rows:
        raise ValueError(f"problems file {path}: no rows")
    return rows


def prompt_checked(env: Any, codec: Any, capacity: int, max_new_tokens: int) -> Callable[[dict[str, Any]], Any]:
    """`env.parse`, refusing (ProblemError, so the row is a counted skip) a problem whose first prompt plus one
    answer of `max_new_tokens` does not fit a dialog's KV cache of `capacity` tokens."""
    room = capacity - max_new_tokens

    def parse(row: dict[str, Any]) -> Any:
        problem = env.parse(row)
        length = len(codec.prompt_ids(env.open(problem).messages))
        if length > room:
            name = row.get("name") or row.get("instance_id") or "?"
            raise ProblemError(f"problem {name!r}: its prompt of {length} tokens plus an answer of {max_new_tokens} "
                               f"does not fit rollout.cache_capacity {capacity}")
        return problem

    return parse


class ProblemStream:
    """Batches of (row, parsed problem) from a grain pipeline, rows the environment refuses skipped and counted;
    `get_state`/`set_state` checkpoint its position."""

    def __init__(self, rows: list[dict[str, Any]], parse: Callable[[dict[str, Any]], Any], seed: int):
        if not rows:
            raise ValueError("ProblemStream: the problem source is empty")
        dataset = gp.MapDataset.source(rows).shuffle(seed=seed).repeat()
        self._iterator = dataset.to_iter_dataset().__iter__()
        self._parse = parse
        self._num_rows = len(rows)
        self.skipped = 0
        self._reasons: set[str] = set()

    def next_batch(self, size: int) -> list[tuple[dict[str, Any], Any]]:
        batch: list[tuple[dict[str, Any], Any]] = []
        misses = 0
        while len(batch) < size:
            row = next(self._iterator)
            try:
                problem = self._parse(row)
            except ProblemError as err:
                self.skipped += 1
                misses += 1
                if str(err) not in self._reasons:
                    self._reasons.add(str(err))
                    log.warning("skipping problem: %s", err)
                if misses > self._num_rows and not batch:
                    raise ValueError(f"ProblemStream: none of the {self._num_rows} problems is usable "
                                     f"(last: {err})") from None
                continue
            batch.append((row, problem))
        return batch

    def get_state(self) -> dict[str, Any]:
        return {"iterator": self._iterator.get_state(), "skipped": self.skipped}

    def set_state(self, state: dict[str, Any]) -> None:
        self._iterator.set_state(state["iterator"])
        self.skipped = int(state["skipped"])
