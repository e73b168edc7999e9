"""The environment protocol shared by RLEF and SWE-RL: a problem opens an episode, answers step it.

An episode is a dialog. `Env.reset(problem)` validates the problem and returns an `Episode` whose `messages`
are the first prompt; `Episode.step(answer)` scores one assistant answer and returns a `StepResult`: the task
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

    def reset(self, problem: Any) -> Episode:
        """Validate `problem` (raises ProblemError naming what is wrong) and open its dialog."""


def require_fields(problem: Any, fields: Sequence[str], kind: str) -> None:
    """One clear line when a problem row lacks a field the environment needs."""
    if not isinstance(problem, dict):
        raise ProblemError(f"{kind} problem: expected a dict row, got {type(problem).__name__}")
    missing = [f for f in fields if f not in problem]
    if missing:
        name = problem.get("name") or problem.get("instance_id") or "?"
        raise ProblemError(f"{kind} problem {name!r}: missing field(s) {missing}")
