"""Rollouts: dialogs sampled on the device, answers scored on executor-pool threads, turn by turn.

The batch is cut into `num_chunks` chunks, each with its own sampler state. While chunk c's answers are being
scored on the host CPUs, the device generates chunk c+1, so scoring overlaps device work; the time the main
thread still waits for scores is measured (`RolloutStats.score_wait_s`). Every dialog keeps exactly the token
ids the sampler consumed and produced, the mask of the ids the policy sampled, and per answer the index of the
token whose logits produced the answer's first token (where the value model predicts that turn's return).

In a multi-host run each process runs its own share of the episodes: every sampler call gathers the chunk's
prompts from all processes (the device batch is global, host-major) and each process keeps its own rows.
A chunk shares one cache index (lockstep), so a later turn's room is what the chunk's longest dialog left;
`rljax.engine` (`rollout.engine = "slots"`) gives each dialog its own cache row and refills slots as turns end.
"""
from __future__ import annotations

import concurrent.futures as cf
import dataclasses
import time
import traceback
from typing import Any, Sequence

import jax
import numpy as np

from executor.pool import ExecutorPool
from models.sampler import FINISH_EOS, Completion, Sampler, SamplingParams
from rljax.dialog import DialogCodec
from rljax.distributed import gather_rows
from rljax.envs.base import Env, Episode, StepResult

EXECUTOR_ERROR = "executor_error"
CONTEXT_FULL = "context_full"


@dataclasses.dataclass
class Trajectory:
    """One dialog: ids in order, which of them the policy sampled (and their sampler logprobs), per answer."""

    problem: str
    group: int  # dialogs with the same group answer the same problem in this batch (GRPO's groups)
    tokens: list[int] = dataclasses.field(default_factory=list)
    sampled: list[bool] = dataclasses.field(default_factory=list)
    sampler_logprobs: list[float] = dataclasses.field(default_factory=list)
    turn_of_token: list[int] = dataclasses.field(default_factory=list)  # -1 where not sampled
    value_positions: list[int] = dataclasses.field(default_factory=list)
    rewards: list[float] = dataclasses.field(default_factory=list)
    statuses: list[str] = dataclasses.field(default_factory=list)
    finish_reasons: list[str] = dataclasses.field(default_factory=list)
    answers: list[str] = dataclasses.field(default_factory=list)
    sampled_entropy: float = 0.0  # summed entropy of the sampling distribution over the sampled tokens
    done: bool = False
    trainable: bool = True  # False after an executor error: kept and counted, but given no loss weight

    @property
    def num_turns(self) -> int:
        return len(self.rewards)

    @property
    def solved(self) -> bool:
        return bool(self.statuses) and self.statuses[-1] in ("solved", "exact")

    def append(self, ids: Sequence[int], sampled: bool, logprobs: Sequence[float] | None = None) -> None:
        turn = len(self.value_positions) - 1
        self.tokens += list(ids)
        self.sampled += [sampled] * len(ids)
        self.sampler_logprobs += list(map(float, logprobs)) if logprobs is not None else [0.0] * len(ids)
        self.turn_of_token += [turn if sampled else -1] * len(ids)


@dataclasses.dataclass
class RolloutStats:
    total_s: float = 0.0
    generate_s: float = 0.0  # device time in generate/extend (including host-side decode of the result)
    score_wait_s: float = 0.0  # main-thread time blocked on executor results: the devices wait on the hosts
    executor_errors: int = 0
    context_full: int = 0
    decode_steps: int = 0  # decode steps run (the slots engine)
    decode_slot_steps: int = 0  # rows computed x decode steps (the slots engine; a kept token fills one of them)
    decode_kv_slots_read: int = 0  # cache slots the decode steps attended to, summed over slots and steps
    admit_tokens: int = 0  # tokens the slots engine's admissions prefilled (a prompt shared by a group once)
    admit_token_slots: int = 0  # segments x width those admissions computed, padding included
    admit_s: float = 0.0  # the slots engine's time in admissions (part of generate_s; the rest is decode)

    def add(self, other: "RolloutStats") -> None:
        """Accumulate another round's counts and times (dynamic sampling runs several rounds per step)."""
        for field in dataclasses.fields(self):
            setattr(self, field.name, getattr(self, field.name) + getattr(other, field.name))


class RolloutRunner:
    """Runs a batch of episodes to the end with a `Sampler`, a `DialogCodec` and an `ExecutorPool`."""

    refills_slots = False  # True: one call takes any number of dialogs (a fixed set of slots, refilled)

    def __init__(self, sampler: Sampler, codec: DialogCodec, env: Env, pool: ExecutorPool, sampling: SamplingParams,
                 cache_capacity: int, num_chunks: int = 2):
        if num_chunks < 1:
            raise ValueError(f"RolloutRunner.num_chunks must be >= 1, got {num_chunks}")
        self.sampler, self.codec, self.env, self.pool = sampler, codec, env, pool
        self.sampling = sampling
        self.cache_capacity = cache_capacity
        self.num_chunks = num_chunks

    def run(self, episodes: Sequence[Episode], groups: Sequence[int], names: Sequence[str], key: jax.Array
            ) -> tuple[list[Trajectory], RolloutStats]:
        start = time.perf_counter()
        stats = RolloutStats()
        trajectories = [Trajectory(name, group) for name, group in zip(names, groups)]
        chunks = [list(c) for c in np.array_split(np.arange(len(episodes)), min(self.num_chunks, len(episodes)))]
        states: list[Any] = [None] * len(chunks)
        pending: list[list[tuple[int, cf.Future]]] = [[] for _ in chunks]
        for turn in range(self.env.max_turns):
            for c, rows in enumerate(chunks):
                turn_key = jax.random.fold_in(jax.random.fold_in(key, turn), c)
                if turn == 0:
                    prompts = [self.codec.prompt_ids(episodes[i].messages) for i in rows]
                    for i, prompt in zip(rows, prompts):
                        trajectories[i].append(prompt, sampled=False)
                    t0 = time.perf_counter()
                    every, offset = gather_rows(prompts)
                    completions, states[c] = self.sampler.generate(every, self.sampling, turn_key,
                                                                   self.cache_capacity)
                    completions = completions[offset:offset + len(prompts)]
                    stats.generate_s += time.perf_counter() - t0
                    active = rows
                else:
                    self._collect(pending[c], episodes, trajectories, stats)
                    pending[c] = []
                    continuations = self._continuations(rows, episodes, trajectories, states[c], stats)
                    every, offset = gather_rows(continuations)
                    if not any(x is not None for x in every):
                        continue
                    t0 = time.perf_counter()
                    results, states[c] = self.sampler.extend(states[c], every, self.sampling, turn_key)
                    results = results[offset:offset + len(continuations)]
                    stats.generate_s += time.perf_counter() - t0
                    active = [i for i, x in zip(rows, continuations) if x is not None]
                    completions = [r for r in results if r is not None]
                for i, completion in zip(active, completions):
                    pending[c].append((i, self._record_answer(i, completion, episodes, trajectories, stats)))
        for c in range(len(chunks)):
            self._collect(pending[c], episodes, trajectories, stats)
        stats.total_s = time.perf_counter() - start
        return trajectories, stats

    def _record_answer(self, i: int, completion: Completion, episodes: Sequence[Episode],
                       trajectories: list[Trajectory], stats: RolloutStats) -> cf.Future:
        trajectory = trajectories[i]
        trajectory.value_positions.append(len(trajectory.tokens) - 1)
        trajectory.append(completion.token_ids, sampled=True, logprobs=completion.logprobs)
        if completion.entropies is not None:
            trajectory.sampled_entropy += float(np.sum(completion.entropies))
        trajectory.finish_reasons.append(completion.finish_reason)
        text = self.codec.answer_text(completion.token_ids)
        trajectory.answers.append(text)
        return self.pool.submit(_safe_step, episodes[i], text)

    def _collect(self, pending: list[tuple[int, cf.Future]], episodes: Sequence[Episode],
                 trajectories: list[Trajectory], stats: RolloutStats) -> None:
        t0 = time.perf_counter()
        for i, future in pending:
            self._take_result(trajectories[i], future.result(), stats)
        stats.score_wait_s += time.perf_counter() - t0

    @staticmethod
    def _take_result(trajectory: Trajectory, result: StepResult, stats: RolloutStats) -> None:
        trajectory.rewards.append(result.reward)
        trajectory.statuses.append(result.status)
        trajectory.done = result.done
        if result.status == EXECUTOR_ERROR:
            trajectory.trainable = False
            stats.executor_errors += 1

    def _continuations(self, rows: list[int], episodes: Sequence[Episode], trajectories: list[Trajectory],
                       state: Any, stats: RolloutStats) -> list[list[int] | None]:
        """The next turn's ids per row of a chunk (None when its dialog is over)."""
        room = self.cache_capacity - int(state.cache.index) - self.sampling.max_new_tokens
        return [self._next_turn(episodes[i], trajectories[i], room, stats) for i in rows]

    def _next_turn(self, episode: Episode, trajectory: Trajectory, room: int, stats: RolloutStats
                   ) -> list[int] | None:
        """The ids that continue a dialog after its scored answer, appended to its trajectory; None when the
        dialog is over. A dialog whose next turn (and its pending token) does not fit in `room` cache slots
        ends here as `context_full`, its last answer taken as final."""
        if trajectory.done:
            return None
        feedback = episode.messages[-1]["content"]
        ids = self.codec.continuation_ids(trajectory.finish_reasons[-1] == FINISH_EOS, feedback)
        if len(ids) + 1 > room:
            ended = episode.end_early(CONTEXT_FULL)
            trajectory.rewards[-1], trajectory.statuses[-1], trajectory.done = ended.reward, ended.status, True
            stats.context_full += 1
            return None
        trajectory.append(ids, sampled=False)
        return ids


def _safe_step(episode: Episode, answer: str) -> StepResult:
    """One answer scored; an exception in the executor becomes a counted `executor_error` that ends the dialog."""
    try:
        return episode.step(answer)
    except Exception:  # the rollout must not die for one job; the trace goes with the result
        return StepResult(0.0, True, None, EXECUTOR_ERROR, {"error": traceback.format_exc(limit=3)})
