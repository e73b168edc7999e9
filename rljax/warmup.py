"""Supervised warm-up before RL: a few steps of next-token cross-entropy on demonstration answers.

A policy that never produces a well-formed answer gets the same reward on every sample, and GRPO's group
advantages are then all zero: RL has no signal. Measured here: SmolLM2-135M writes no SWE-RL answer in the
<think>/<solution> format (64 of 64 training answers malformed). The warm-up teaches the format from the
environment's demonstrations (`Env.demonstration(row)`: SWE-RL's oracle edits, an RLEF row's reference
solution) and is off by default (`warmup.steps` 0): neither paper has it (SWE-RL starts from Llama-3.3-70B,
which follows the format), and the RL that follows is the paper's.

Loss on a batch of demonstrations (prompt p, answer a, ending with the stop token):
    L = -(1 / N) * sum over demonstrations and answer tokens t of log pi(a_t | p, a_<t),   N = answer tokens,
at temperature 1, with the same trainable parameters as RL (adapters only with LoRA) and an optimizer of its own
(`warmup.learning_rate`, constant); RL then starts with fresh optimizer state from the warmed weights, and a
run that weighs KL takes the warmed policy as its reference (as RLHF takes the SFT model; with LoRA, a copy of
the warmed adapters), saved in its checkpoints.
"""
from __future__ import annotations

import dataclasses
import functools
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from rljax.batching import aggregation_weights, build_batch, shared_prefixes
from rljax.learner import (Learner, OptimConfig, TrainState, accumulate_and_apply, init_state, make_optimizer,
                           token_logprobs)
from rljax.rollout import Trajectory


@dataclasses.dataclass
class Demonstrations:
    """Demonstration dialogs (one answer each, every answer token marked sampled) and counted skips."""

    trajectories: list[Trajectory]
    skipped: dict[str, int]  # reason -> rows


def demonstrations(env: Any, codec: Any, rows: Sequence[dict[str, Any]], max_answer_tokens: int,
                   cache_capacity: int) -> Demonstrations:
    """One demonstration dialog per row that has one and fits: its prompt ids as the rollout builds them, then
    the answer's ids and the stop id. Rows without a demonstration, whose answer is longer than the RL budget
    (`max_answer_tokens`: the warm-up must not teach answers RL would cut) or whose dialog is over the cache
    are skipped and counted."""
    out: list[Trajectory] = []
    skipped = {"no_demonstration": 0, "answer_over_budget": 0, "over_cache": 0, "refused": 0}
    for row in rows:
        name = str(row.get("name") or row.get("instance_id"))
        try:
            problem = env.parse(row)
            answer = env.demonstration(row)
        except ValueError:  # ProblemError, or an oracle no search/replace edit can write
            skipped["refused"] += 1
            continue
        if answer is None:
            skipped["no_demonstration"] += 1
            continue
        prompt = codec.prompt_ids(env.open(problem).messages)
        ids = codec.answer_ids(answer)
        if len(ids) > max_answer_tokens:
            skipped["answer_over_budget"] += 1
            continue
        if len(prompt) + len(ids) > cache_capacity:
            skipped["over_cache"] += 1
            continue
        t = Trajectory(name, len(out))
        t.append(prompt, sampled=False)
        t.value_positions.append(len(t.tokens) - 1)
        t.append(ids, sampled=True)
        t.rewards.append(0.0)
        out.append(t)
    return Demonstrations(out, {k: v for k, v in skipped.items() if v})


def demonstration_batch(trajectories: Sequence[Trajectory], seq_bucket: int, pad_id: int,
                        shared_prefix_micro_batches: int = 0, suffix_bucket: int = 0) -> dict[str, np.ndarray]:
    """The model inputs and the per-token weights of L: 1 / N on every answer token. With
    `shared_prefix_micro_batches`, the `shared_prefixes` arrays too (`train.share_prompts`): the prompts run
    without the vocabulary projection, which only the answer positions need."""
    arrays = build_batch(trajectories, 1, seq_bucket, pad_id)
    batch = {k: arrays[k] for k in ("tokens", "positions", "valid", "sampled")}
    batch["weights"] = aggregation_weights(arrays["sampled"], "token_mean")
    if shared_prefix_micro_batches:
        batch.update(shared_prefixes(arrays, shared_prefix_micro_batches, seq_bucket, suffix_bucket))
    return batch


class SupervisedWarmup:
    """Jitted cross-entropy updates of a `Learner`'s trainable policy parameters (its frozen part is shared).
    The learner holds no policy state until `finish()`: only one optimizer state is alive at a time."""

    def __init__(self, learner: Learner, optim: OptimConfig, num_micro: int = 1, vocab_chunk: int = 32):
        self.learner = learner
        self.num_micro = num_micro
        self.vocab_chunk = vocab_chunk
        self.tx = make_optimizer(optim)
        params = learner.policy_state.params
        learner.policy_state = None  # RL's optimizer state is freed (it starts fresh after the warm-up)
        self.state = init_state(params, self.tx)
        self._update = jax.jit(self._update_impl, donate_argnums=0)

    def _loss(self, params: Any, frozen: Any, mb: dict[str, jax.Array]) -> tuple[jax.Array, dict[str, jax.Array]]:
        model = nnx.merge(self.learner.policy_graphdef, frozen, params)
        logp, _ = token_logprobs(model, mb, 1.0, self.vocab_chunk)
        return -jnp.sum(logp * mb["weights"]), {}

    def _update_impl(self, state: TrainState, frozen: Any, batch: dict[str, jax.Array]):
        return accumulate_and_apply(functools.partial(self._loss, frozen=frozen), self.tx, state, batch,
                                    self.num_micro)

    def update(self, batch: dict[str, jax.Array]) -> dict[str, float]:
        """One step on `batch`; its NLL per answer token (before the step) and the gradient norm."""
        self.state, metrics = self._update(self.state, self.learner.policy_frozen, batch)
        return {"nll": float(metrics["loss"]), "grad_norm": float(metrics["grad_norm"])}

    def finish(self) -> None:
        """Hand the warmed weights to the learner, with a fresh RL optimizer state."""
        self.learner.policy_state = init_state(self.state.params, self.learner.policy_tx)
        self.state = None


def schedule(count: int, steps: int, batch: int, seed: int) -> list[list[int]]:
    """Demonstration indices for each warm-up step: epochs of seeded permutations, read `batch` at a time."""
    order: list[int] = []
    epoch = 0
    while len(order) < steps * batch:
        order += list(np.random.default_rng([seed, epoch]).permutation(count))
        epoch += 1
    return [order[i * batch:(i + 1) * batch] for i in range(steps)]
