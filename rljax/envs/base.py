"""The environment protocol shared by RLEF and SWE-RL: a problem opens an episode, answers step it.

An episode is a dialog. `Env.parse(row)` validates a dataset row once into the environment's problem;
`Env.open(problem)` starts an `Episode` on it (one per sample, so a problem sampled G times is parsed once),
whose `messages` are the first prompt; `Env.reset(row)` does both; `Episode.step(answer)` scores one assistant answer and returns a `StepResult`: the task
reward of that answer, whether the dialog is over, and (when it goes on) the user message to append. Steps run
untrusted code, so the rollout calls them on executor-pool threads; an episode holds no device state.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Protocol, Sequence

from models.chat import Message


class ProblemError(ValueError):
    """A problem (dataset row) an environment cannot run: missing tests, wrong field types."""


@dataclasses.dataclass
class StepResult:
    reward: float  # task reward of this answer (before any KL shaping)
    done: bool
    feedback: str | None  # the next user message when not done
    status: str  # how the answer was judged: passed | failed | no_code | ... (counted in the metrics)
    info: dict[str, Any] = dataclasses.field(default_factory=dict)


class Episode(Protocol):
    messages: list[Message]  # the dialog so far: the first prompt, then answers and feedback as they come
    turn: int  # answers given so far

    def step(self, answer: str) -> StepResult:
        """Score `answer` (the assistant's text for this turn); appends it and any feedback to `messages`."""

    def end_early(self, status: str) -> StepResult:
        """End a dialog that cannot go on (its next turn does not fit the context): the last answer, which
        did not pass, is taken as final."""


class Env(Protocol):
    max_turns: int

    def parse(self, row: Any) -> Any:
        """Validate a dataset row (raises ProblemError naming what is wrong) into the problem `open` takes."""

    def open(self, problem: Any) -> Episode:
        """A new dialog on a parsed problem."""

    def reset(self, row: Any) -> Episode:
        """`open(parse(row))`."""

    def demonstration(self, row: Any) -> str | None:
        """A good answer to the row's first prompt, for the supervised warm-up (rljax.warmup), or None."""


def require_fields(problem: Any, fields: Sequence[str], kind: str) -> None:
    """One clear line when a problem row lacks a field the environment needs."""
    if not isinstance(problem, dict):
        raise ProblemError(f"{kind} problem: expected a dict row, got {type(problem).__name__}")
    missing = [f for f in fields if f not in problem]
    if missing:
        name = problem.get("name") or problem.get("instance_id") or "?"
        raise ProblemError(f"{kind} problem {name!r}: missing field(s) {missing}")
