"""Policy-optimisation variants against hand-computed cases: clip-higher and dual-clip, GSPO's sequence ratio,
RLOO's baseline, Dr.GRPO's constant normaliser, truncated importance sampling, DAPO's overlong shaping and
dynamic sampling."""
from __future__ import annotations

import types

import jax.numpy as jnp
import numpy as np
import pytest
from ml_collections import ConfigDict

from rljax import batching
from rljax.advantages import group_advantages
from rljax.grpo import grpo_loss
from rljax.ppo import clipped_policy_terms, sequence_log_ratio
from rljax.rollout import RolloutStats, Trajectory
from rljax.run_config import base_config, validate
from rljax.shaping import mask_turns, overlong_penalty
from rljax.trainer import Trainer, split_informative_groups

RATIOS = np.array([0.5, 0.9, 1.1, 1.25, 1.4])


def _terms(advantage: float, **kw) -> np.ndarray:
    logp = jnp.log(jnp.asarray(RATIOS))[None]
    loss, _ = clipped_policy_terms(logp, jnp.zeros_like(logp), jnp.full_like(logp, advantage), 0.2, **kw)
    return np.asarray(loss[0])


def test_clip_higher_moves_only_the_upper_bound():
    # A > 0: -min(r, 1 + eps_high); below 1 - eps_low the unclipped term is the larger loss
    np.testing.assert_allclose(_terms(1.0, clip_eps_high=0.28), [-0.5, -0.9, -1.1, -1.25, -1.28], rtol=1e-6)
    np.testing.assert_allclose(_terms(1.0), [-0.5, -0.9, -1.1, -1.2, -1.2], rtol=1e-6)  # symmetric
    # A < 0: max(r, clip(r, 0.8, 1.28)): the lower bound 0.8 binds below it, the upper one never does
    np.testing.assert_allclose(_terms(-1.0, clip_eps_high=0.28), [0.8, 0.9, 1.1, 1.25, 1.4], rtol=1e-6)


def test_dual_clip_caps_negative_advantages_only():
    logp = jnp.log(jnp.array([[5.0, 0.5]]))
    for advantage, expected in ((-1.0, [3.0, 0.8]), (1.0, [-1.2, -0.5])):
        loss, clipped = clipped_policy_terms(logp, jnp.zeros_like(logp), jnp.full_like(logp, advantage), 0.2,
                                             dual_clip=3.0)
        np.testing.assert_allclose(np.asarray(loss[0]), expected, rtol=1e-6)
    assert bool(clipped[0, 0])  # r = 5, A > 0: the upper clip


def test_gspo_sequence_ratio_is_the_length_normalised_mean_and_clips_per_sequence():
    logp = jnp.array([[0.1, 0.3, 9.0], [-0.2, -0.2, -0.2]])
    mask = jnp.array([[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]])  # the 9.0 is padding and must not count
    np.testing.assert_allclose(np.asarray(sequence_log_ratio(logp, jnp.zeros_like(logp), mask)),
                               [[0.2] * 3, [-0.2] * 3], rtol=1e-6)
    advantages = jnp.array([[1.0] * 3, [-1.0] * 3])
    weights = jnp.asarray(batching.aggregation_weights(np.asarray(mask), "sequence_mean"))
    loss, _ = grpo_loss(logp, jnp.zeros_like(logp), logp, advantages, mask, clip_eps=0.2, kl_coef=0.0,
                        weights_bt=weights, ratio_level="sequence")
    s1, s2 = np.exp(0.2), np.exp(-0.2)  # 1.221 -> clipped to 1.2 (A > 0); 0.819 stays (A < 0: max(r, 0.8))
    expected = (-min(s1, 1.2) + max(s2, 0.8)) / 2
    assert float(loss) == pytest.approx(expected, rel=1e-6)


def test_rloo_leave_one_out_baseline():
    np.testing.assert_allclose(group_advantages(np.array([1.0, 0.0]), 2, scale_by_std=False,
                                                baseline="leave_one_out"), [1.0, -1.0])
    np.testing.assert_allclose(group_advantages(np.array([1.0, 0.0, 0.0, 2.0, 2.0, 5.0]), 3, scale_by_std=False,
                                                baseline="leave_one_out"), [1.0, -0.5, -0.5, -1.5, -1.5, 3.0])
    with pytest.raises(ValueError, match="at least 2"):
        group_advantages(np.array([1.0, 0.0]), 1, baseline="leave_one_out")


def test_dr_grpo_constant_normaliser_ignores_answer_length():
    mask = np.array([[1, 1, 0, 0], [1, 1, 1, 0], [0, 0, 0, 0]], np.float32)
    weights = batching.aggregation_weights(mask, "constant_length", constant_length=10)
    np.testing.assert_allclose(weights, mask / (10 * 2))  # two sequences with tokens, budget 10 each
    np.testing.assert_allclose(group_advantages(np.array([1.0, 0.0, 0.0, 0.0]), 4, scale_by_std=False),
                               [0.75, -0.25, -0.25, -0.25])
    with pytest.raises(ValueError, match="needs the episode token budget"):
        batching.aggregation_weights(mask, "constant_length")


def test_truncated_importance_weights_at_the_cap():
    from rljax.learner import Learner, LossConfig, OptimConfig
    from flax import nnx
    from models.config import LlamaConfig
    from models.llama import Llama
    from tests.test_trainer import synthetic_batch

    logp = jnp.zeros((1, 3))
    weights = jnp.minimum(jnp.exp(logp - jnp.log(jnp.array([[1 / 3, 2.0, 1.0]]))), 2.0)  # [3 -> 2, 0.5, 1]
    np.testing.assert_allclose(np.asarray(weights), [[2.0, 0.5, 1.0]], rtol=1e-6)
    loss, _ = grpo_loss(logp, logp, logp, jnp.ones((1, 3)), jnp.ones((1, 3)), kl_coef=0.0,
                        weights_bt=jnp.full((1, 3), 1 / 3), is_weights_bt=weights)
    assert float(loss) == pytest.approx(-(2.0 + 0.5 + 1.0) / 3, rel=1e-6)
    # in the learner: the weights come from the batch's sampler logprobs and are logged
    cfg = LlamaConfig.preset("tiny", vocab_size=64)
    batch = synthetic_batch(4, 12, 64)
    learner = Learner(Llama(cfg, rngs=nnx.Rngs(0)), LossConfig("grpo", tis_cap=2.0), OptimConfig(1e-3, 0), 1)
    trainer_logp, _ = learner.score(learner.policy_state.params, {k: jnp.asarray(v) for k, v in batch.items()})
    batch["sampler_logp"] = np.asarray(trainer_logp) - np.log(3.0)  # the sampler found every token 3x less likely
    batch = {k: jnp.asarray(v) for k, v in batch.items() if k not in ("old_logp", "ref_logp")}
    metrics = learner.update_policy(batch)
    assert float(metrics["tis_weight_mean"]) == pytest.approx(2.0, rel=1e-5)  # 3 capped at 2 on every token
    assert float(metrics["max_tis_weight"]) == pytest.approx(2.0, rel=1e-5)


def test_overlong_penalty_at_the_buffer_edges_and_truncated_masking():
    got = overlong_penalty(np.array([50, 80, 81, 90, 100]), max_new_tokens=100, buffer=20, penalty=0.5)
    np.testing.assert_allclose(got, [0.0, 0.0, -0.025, -0.25, -0.5])
    np.testing.assert_array_equal(overlong_penalty(np.array([100]), 100, 0), [0.0])
    sampled = np.array([[0, 1, 1, 0, 1, 1]], np.float32)
    turns = np.array([[-1, 0, 0, -1, 1, 1]])
    np.testing.assert_array_equal(mask_turns(sampled, turns, np.array([[False, True]])), [[0, 1, 1, 0, 0, 0]])


def _group(problem: str, rewards: list[float]) -> list[Trajectory]:
    out = []
    for r in rewards:
        t = Trajectory(problem, 0)
        t.rewards.append(r)
        out.append(t)
    return out


def test_dynamic_sampling_drops_equal_groups_and_refills_from_new_problems():
    first = _group("a", [1, 1]) + _group("b", [0, 1]) + _group("c", [0, 0])
    informative, spare = split_informative_groups(first, 2)
    assert [g[0].problem for g in informative] == ["b"] and [g[0].problem for g in spare] == ["a", "c"]
    rounds = iter([_group("d", [0, 0]) + _group("e", [1, 0]) + _group("f", [1, 0])])
    config = ConfigDict({"rollout": {"samples_per_problem": 2, "problems_per_step": 3},
                         "algo": {"dynamic_sampling_rounds": 3}})
    trainer = types.SimpleNamespace(config=config, _rollout_round=lambda index: (next(rounds), RolloutStats()))
    batch, metrics = Trainer._dynamic_sampling(trainer, first, RolloutStats())
    assert [t.problem for t in batch] == ["b", "b", "e", "e", "f", "f"]  # equal groups replaced, size kept
    assert [t.group for t in batch] == [0, 0, 1, 1, 2, 2]
    assert metrics == {"rollout/rounds": 2, "rollout/informative_groups": 3}
    # rounds run out: the batch is topped up with equal groups (their advantage is 0; rljax.learner skips them)
    trainer = types.SimpleNamespace(config=config, _rollout_round=lambda index: (_group("z", [1, 1]) * 3,
                                                                                 RolloutStats()))
    batch, metrics = Trainer._dynamic_sampling(trainer, first, RolloutStats())
    assert [t.problem for t in batch] == ["b", "b", "a", "a", "c", "c"]
    assert metrics == {"rollout/rounds": 4, "rollout/informative_groups": 1}


@pytest.mark.parametrize("key, value, message", [
    ("algo.dual_clip", 0.5, r"expected 0 \(off\) or a value > 1"),
    ("algo.ratio_level", "episode", "is not one of"),
    ("algo.group_baseline", "median", "is not one of"),
    ("algo.overlong_buffer", 10_000, "is more than rollout.max_new_tokens"),
    ("algo.tis_cap", -1.0, "expected >= 0"),
])
def test_bad_variant_settings_fail_with_one_line(key, value, message):
    config = base_config()
    config.model.preset = "tiny"
    section, name = key.split(".")
    config[section][name] = value
    with pytest.raises(ValueError, match=message):
        validate(config)


def test_gspo_with_token_mean_and_group_variants_with_ppo_are_refused():
    config = base_config()
    config.model.preset = "tiny"
    config.algo.ratio_level = "sequence"
    with pytest.raises(ValueError, match="set algo.aggregation to sequence_mean"):
        validate(config)
    config = base_config()
    config.model.preset = "tiny"
    config.algo.dynamic_sampling_rounds = 2
    with pytest.raises(ValueError, match="group variants need algo.name grpo"):
        validate(config)
