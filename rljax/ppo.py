"""PPO pieces (jax): masked aggregation, the clipped policy objective, the clipped value loss, entropy and
explained variance. Token arrays are [B, T] with a float mask that is 1 on tokens the assistant wrote."""
from __future__ import annotations

import jax
import jax.numpy as jnp

AGGREGATIONS = ("token_mean", "sequence_mean")


def masked_aggregate(x_bt: jax.Array, mask_bt: jax.Array, mode: str) -> jax.Array:
    """token_mean: mean over all masked tokens of the batch; sequence_mean: mean over sequences (with at least
    one masked token) of each sequence's token mean."""
    mask_bt = mask_bt.astype(jnp.float32)
    if mode == "token_mean":
        return jnp.sum(x_bt * mask_bt) / jnp.maximum(jnp.sum(mask_bt), 1.0)
    if mode == "sequence_mean":
        per_seq = jnp.sum(x_bt * mask_bt, axis=-1) / jnp.maximum(jnp.sum(mask_bt, axis=-1), 1.0)
        has_tokens = (jnp.sum(mask_bt, axis=-1) > 0).astype(jnp.float32)
        return jnp.sum(per_seq * has_tokens) / jnp.maximum(jnp.sum(has_tokens), 1.0)
    raise ValueError(f"loss aggregation {mode!r}: expected one of {AGGREGATIONS}")


def clipped_policy_terms(logp_bt: jax.Array, old_logp_bt: jax.Array, advantages_bt: jax.Array,
                         clip_eps: float) -> tuple[jax.Array, jax.Array]:
    """Per-token PPO loss max(-A r, -A clip(r, 1-eps, 1+eps)) with r = exp(logp - old_logp), and whether the
    clipped branch was taken."""
    ratio = jnp.exp(logp_bt - old_logp_bt)
    unclipped = -advantages_bt * ratio
    clipped = -advantages_bt * jnp.clip(ratio, 1.0 - clip_eps, 1.0 + clip_eps)
    return jnp.maximum(unclipped, clipped), clipped > unclipped


def aggregate(x_bt: jax.Array, mask_bt: jax.Array, aggregation: str, weights_bt: jax.Array | None) -> jax.Array:
    """`masked_aggregate`, or sum(x * weights) when the weights already hold the aggregation over a larger
    batch (`rljax.batching.aggregation_weights`), which makes micro-batch losses add up exactly."""
    return masked_aggregate(x_bt, mask_bt, aggregation) if weights_bt is None else jnp.sum(x_bt * weights_bt)


def clipped_policy_loss(logp_bt: jax.Array, old_logp_bt: jax.Array, advantages_bt: jax.Array, mask_bt: jax.Array,
                        clip_eps: float = 0.2, aggregation: str = "token_mean", weights_bt: jax.Array | None = None
                        ) -> tuple[jax.Array, dict]:
    """The PPO policy loss and its diagnostics (clip fraction, approximate KL to the sampling policy)."""
    per_token, was_clipped = clipped_policy_terms(logp_bt, old_logp_bt, advantages_bt, clip_eps)
    metrics = {"clip_fraction": masked_aggregate(was_clipped.astype(jnp.float32), mask_bt, "token_mean"),
               "approx_kl": masked_aggregate(old_logp_bt - logp_bt, mask_bt, "token_mean")}
    return aggregate(per_token, mask_bt, aggregation, weights_bt), metrics


def clipped_value_loss(values: jax.Array, old_values: jax.Array, returns: jax.Array, mask: jax.Array,
                       clip: float = 0.2, weights: jax.Array | None = None) -> jax.Array:
    """0.5 * max((v - R)^2, (clip(v, v_old - c, v_old + c) - R)^2), averaged over the mask (or weighted)."""
    clipped = old_values + jnp.clip(values - old_values, -clip, clip)
    per = 0.5 * jnp.maximum((values - returns) ** 2, (clipped - returns) ** 2)
    return aggregate(per, mask, "token_mean", weights)


def token_entropy(logits_btv: jax.Array) -> jax.Array:
    """Entropy of softmax(logits) at every position, [B, T]."""
    logp = jax.nn.log_softmax(logits_btv, axis=-1)
    return -jnp.sum(jnp.exp(logp) * logp, axis=-1)


def explained_variance(predicted: jax.Array, target: jax.Array, mask: jax.Array) -> jax.Array:
    """1 - Var(target - predicted) / Var(target) over the mask (1 is perfect, 0 no better than the mean)."""
    mean = masked_aggregate(target, mask, "token_mean")
    var_target = masked_aggregate((target - mean) ** 2, mask, "token_mean")
    residual = target - predicted
    res_mean = masked_aggregate(residual, mask, "token_mean")
    var_residual = masked_aggregate((residual - res_mean) ** 2, mask, "token_mean")
    return 1.0 - var_residual / jnp.maximum(var_target, 1e-8)
