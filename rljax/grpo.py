"""GRPO as in SWE-RL: clipped ratio loss on group-normalised advantages, with the KL to the reference policy
either in the loss (k1 or k3 estimator, per token) or folded into the reward before normalisation."""
from __future__ import annotations

import jax
import jax.numpy as jnp

from rljax.ppo import aggregate, clipped_policy_terms, masked_aggregate, sequence_log_ratio

KL_ESTIMATORS = ("k1", "k3")
KL_PLACEMENTS = ("loss", "reward", "none")


def kl_estimate(logp_bt: jax.Array, ref_logp_bt: jax.Array, estimator: str) -> jax.Array:
    """Per-token estimate of KL(pi || ref) from samples of pi: k1 = log(pi/ref); k3 = ref/pi - log(ref/pi) - 1
    (unbiased and non-negative, Schulman's k3)."""
    if estimator == "k1":
        return logp_bt - ref_logp_bt
    if estimator == "k3":
        log_ratio = ref_logp_bt - logp_bt
        return jnp.exp(log_ratio) - log_ratio - 1.0
    raise ValueError(f"KL estimator {estimator!r}: expected one of {KL_ESTIMATORS}")


def grpo_loss(logp_bt: jax.Array, old_logp_bt: jax.Array, ref_logp_bt: jax.Array, advantages_bt: jax.Array,
              mask_bt: jax.Array, clip_eps: float = 0.2, kl_coef: float = 0.0, kl_estimator: str = "k3",
              kl_in_loss: bool = True, aggregation: str = "token_mean", weights_bt: jax.Array | None = None,
              clip_eps_high: float | None = None, dual_clip: float = 0.0, ratio_level: str = "token",
              is_weights_bt: jax.Array | None = None) -> tuple[jax.Array, dict]:
    """Clipped policy loss (clip-higher, dual-clip, GSPO's sequence ratio and truncated importance weights as in
    `rljax.ppo.clipped_policy_loss`) plus, when `kl_in_loss`, kl_coef * the per-token KL estimate."""
    log_ratio = sequence_log_ratio(logp_bt, old_logp_bt, mask_bt) if ratio_level == "sequence" else None
    per_token, was_clipped = clipped_policy_terms(logp_bt, old_logp_bt, advantages_bt, clip_eps, clip_eps_high,
                                                  dual_clip, log_ratio)
    if is_weights_bt is not None:
        per_token = per_token * is_weights_bt
    kl = kl_estimate(logp_bt, ref_logp_bt, kl_estimator)
    if kl_in_loss and kl_coef:
        per_token = per_token + kl_coef * kl
    metrics = {"clip_fraction": masked_aggregate(was_clipped.astype(jnp.float32), mask_bt, "token_mean"),
               "kl": masked_aggregate(kl, mask_bt, "token_mean")}
    return aggregate(per_token, mask_bt, aggregation, weights_bt), metrics
