"""Advantages and losses against hand-computed small cases."""
import jax.numpy as jnp
import numpy as np
import pytest

from rljax.advantages import gae_over_turns, group_advantages, kl_shaped_turn_rewards
from rljax.grpo import grpo_loss, kl_estimate
from rljax.ppo import clipped_policy_loss, clipped_value_loss, masked_aggregate


def test_kl_shaped_rewards_subtract_beta_times_the_per_turn_kl_sum():
    kl = np.array([[0.4 + 0.6, 2.0, 0.0]])  # per-turn sums of log(pi/rho) over each answer's tokens
    got = kl_shaped_turn_rewards(np.array([[0.0, 0.0, 1.0]]), kl, np.array([[1, 1, 0]]), beta=0.05)
    np.testing.assert_allclose(got, [[-0.05, -0.1, 0.0]])


def test_gae_over_three_turns_by_hand():
    r, v = np.array([[0.0, -0.2, 1.0]]), np.array([[0.5, 0.1, 0.3]])
    gamma, lam = 0.9, 0.5
    d2 = 1.0 - 0.3
    d1 = -0.2 + gamma * 0.3 - 0.1
    d0 = 0.0 + gamma * 0.1 - 0.5
    a2, a1 = d2, d1 + gamma * lam * d2
    a0 = d0 + gamma * lam * a1
    adv, ret = gae_over_turns(r, v, np.ones((1, 3)), gamma, lam)
    np.testing.assert_allclose(adv, [[a0, a1, a2]])
    np.testing.assert_allclose(ret, [[a0 + 0.5, a1 + 0.1, a2 + 0.3]])
    # an episode that ended after one turn: no bootstrap from the padded turns
    adv, _ = gae_over_turns(np.array([[1.0, 5.0, 5.0]]), np.array([[0.25, 9.0, 9.0]]), np.array([[1, 0, 0]]))
    np.testing.assert_allclose(adv, [[0.75, 0.0, 0.0]])


def test_group_advantages_with_ties_and_groups_of_one():
    got = group_advantages(np.array([1.0, 0.0, 0.0, 1.0, 0.5, 0.5]), group_size=2, eps=0.0 + 1e-12)
    np.testing.assert_allclose(got, [1.0, -1.0, -1.0, 1.0, 0.0, 0.0], atol=1e-9)
    np.testing.assert_array_equal(group_advantages(np.array([3.0, -1.0]), group_size=1), [0.0, 0.0])
    with pytest.raises(ValueError, match="do not split into groups of 4"):
        group_advantages(np.zeros(6), group_size=4)


def test_clipping_on_both_sides_and_masking():
    old = jnp.zeros((1, 4))
    logp = jnp.log(jnp.array([[1.5, 0.5, 1.1, 3.0]]))  # ratios 1.5, 0.5, 1.1, 3.0
    adv = jnp.array([[1.0, -1.0, 1.0, 7.0]])
    mask = jnp.array([[1.0, 1.0, 1.0, 0.0]])  # the last token is feedback: ignored
    loss, metrics = clipped_policy_loss(logp, old, adv, mask, clip_eps=0.2)
    # token 0: A>0, ratio above 1.2 -> clipped to 1.2; token 1: A<0, ratio below 0.8 -> clipped to 0.8
    np.testing.assert_allclose(loss, (-1.2 + 0.8 - 1.1) / 3, rtol=1e-6)
    np.testing.assert_allclose(metrics["clip_fraction"], 2 / 3, rtol=1e-6)


def test_aggregations_and_value_clipping():
    x = jnp.array([[1.0, 3.0, 0.0], [10.0, 0.0, 0.0]])
    mask = jnp.array([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    np.testing.assert_allclose(masked_aggregate(x, mask, "token_mean"), 14 / 3)
    np.testing.assert_allclose(masked_aggregate(x, mask, "sequence_mean"), (2 + 10) / 2)
    # v moved from 0 to 1, clip 0.2 -> clipped value 0.2; target 1: max(0, 0.64) / 2
    np.testing.assert_allclose(clipped_value_loss(jnp.array([1.0]), jnp.array([0.0]), jnp.array([1.0]),
                                                  jnp.array([1.0])), 0.32, rtol=1e-6)


def test_kl_estimators_and_grpo_kl_in_loss():
    logp, ref = jnp.log(jnp.array([[0.5]])), jnp.log(jnp.array([[0.25]]))
    np.testing.assert_allclose(kl_estimate(logp, ref, "k1"), [[np.log(2)]], rtol=1e-6)
    np.testing.assert_allclose(kl_estimate(logp, ref, "k3"), [[0.5 - np.log(0.5) - 1]], rtol=1e-6)
    base, _ = grpo_loss(logp, logp, ref, jnp.array([[1.0]]), jnp.ones((1, 1)), kl_coef=0.0)
    with_kl, m = grpo_loss(logp, logp, ref, jnp.array([[1.0]]), jnp.ones((1, 1)), kl_coef=0.1, kl_estimator="k1")
    np.testing.assert_allclose(base, -1.0, rtol=1e-6)
    np.testing.assert_allclose(with_kl, -1.0 + 0.1 * np.log(2), rtol=1e-6)
