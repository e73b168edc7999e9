"""PPO pieces (jax): masked aggregation, the clipped policy objective, the clipped value loss, entropy and
explained variance. Token arrays are [B, T] with a float mask that is 1 on tokens the assistant wrote."""
from __future__ import annotations

import jax
import jax.numpy as jnp

AGGREGATIONS = ("token_mean", "sequence_mean", "constant_length")  # the last needs precomputed weights


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
    raise ValueError(f"loss aggregation {mode!r}: expected token_mean or sequence_mean here ({mode} needs the "
                     "weights of rljax.batching.aggregation_weights)")


RATIO_LEVELS = ("token", "sequence")


def sequence_log_ratio(logp_bt: jax.Array, old_logp_bt: jax.Array, mask_bt: jax.Array) -> jax.Array:
    """GSPO's (Zheng et al. 2025) length-normalised sequence log-ratio, on every token of its row:
    log s_i = (1 / |y_i|) sum_t (log pi(y_it) - log pi_old(y_it)) over the row's masked tokens. [B, T]."""
    mask = mask_bt.astype(jnp.float32)
    mean = jnp.sum((logp_bt - old_logp_bt) * mask, axis=-1, keepdims=True) / jnp.maximum(
        jnp.sum(mask, axis=-1, keepdims=True), 1.0)
    return jnp.broadcast_to(mean, logp_bt.shape)


def clipped_policy_terms(logp_bt: jax.Array, old_logp_bt: jax.Array, advantages_bt: jax.Array,
                         clip_eps: float, clip_eps_high: float | None = None, dual_clip: float = 0.0,
                         log_ratio_bt: jax.Array | None = None) -> tuple[jax.Array, jax.Array]:
    """Per-token PPO loss max(-A r, -A clip(r, 1 - eps_low, 1 + eps_high)) and whether a clip was taken.

    r = exp(logp - old_logp), or exp(`log_ratio_bt`) when given (GSPO's sequence ratio). eps_low = clip_eps,
    eps_high = clip_eps_high (DAPO's clip-higher, Yu et al. 2025; None = symmetric). dual_clip c > 1 (Ye et al.
    2020): where A < 0 the loss is also capped at -c A, so one very unlikely-then-likely token cannot dominate.
    """
    high = clip_eps if clip_eps_high is None else clip_eps_high
    ratio = jnp.exp(logp_bt - old_logp_bt if log_ratio_bt is None else log_ratio_bt)
    unclipped = -advantages_bt * ratio
    clipped = -advantages_bt * jnp.clip(ratio, 1.0 - clip_eps, 1.0 + high)
    loss = jnp.maximum(unclipped, clipped)
    was_clipped = clipped > unclipped
    if dual_clip:
        cap = -advantages_bt * dual_clip
        capped = (advantages_bt < 0) & (loss > cap)
        loss = jnp.where(capped, cap, loss)
        was_clipped = was_clipped | capped
    return loss, was_clipped


def aggregate(x_bt: jax.Array, mask_bt: jax.Array, aggregation: str, weights_bt: jax.Array | None) -> jax.Array:
    """`masked_aggregate`, or sum(x * weights) when the weights already hold the aggregation over a larger
    batch (`rljax.batching.aggregation_weights`), which makes micro-batch losses add up exactly."""
    return masked_aggregate(x_bt, mask_bt, aggregation) if weights_bt is None else jnp.sum(x_bt * weights_bt)


def clipped_policy_loss(logp_bt: jax.Array, old_logp_bt: jax.Array, advantages_bt: jax.Array, mask_bt: jax.Array,
                        clip_eps: float = 0.2, aggregation: str = "token_mean", weights_bt: jax.Array | None = None,
                        clip_eps_high: float | None = None, dual_clip: float = 0.0, ratio_level: str = "token",
                        is_weights_bt: jax.Array | None = None) -> tuple[jax.Array, dict]:
    """The PPO policy loss and its diagnostics (clip fraction, approximate KL to the sampling policy).
    ratio_level "sequence" uses GSPO's sequence ratio; `is_weights_bt` (truncated importance sampling) scales
    each token's loss."""
    log_ratio = sequence_log_ratio(logp_bt, old_logp_bt, mask_bt) if ratio_level == "sequence" else None
    per_token, was_clipped = clipped_policy_terms(logp_bt, old_logp_bt, advantages_bt, clip_eps, clip_eps_high,
                                                  dual_clip, log_ratio)
    if is_weights_bt is not None:
        per_token = per_token * is_weights_bt
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
