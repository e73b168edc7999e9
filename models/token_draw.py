"""How a generation call draws each row's next token from its logits, and records it.

Shared by the chunked sampler (`models.sampler`) and the slots engine (`models.slots`), so both draw a token
for a key exactly alike:
- greedy (temperature 0): the first index of the maximum (`first_argmax`);
- otherwise a Gumbel-max draw from softmax(logits / T) (`categorical`, the same token as
  `jax.random.categorical` for the same key), restricted to top-k and then to the top-p nucleus when those are on;
- with it, the token's log-probability under softmax(logits / T) over the whole vocabulary (before top-k/top-p
  truncation; T = 1 when greedy) and that distribution's entropy, both in float32.
"""
from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp

_CANDIDATES = 256  # top-p is searched among this many most likely tokens first


@dataclasses.dataclass(frozen=True)
class DrawStatic:
    """The compile-time choices of one generation call: how its tokens are drawn (greedy, top-k, top-p on or
    off) and when a row ends (a stop id, or max_new tokens)."""

    greedy: bool
    top_k: int
    use_top_p: bool
    stop_ids: tuple[int, ...]
    max_new: int


def first_argmax(x_bv: jax.Array) -> jax.Array:
    """`jnp.argmax` over the last axis (the first index of the maximum) as two plain reductions, a max and a
    min of the indices holding it: XLA:CPU vectorises those but not argmax's (value, index) reduction, which
    took 12 of the 16 ms of a draw over [32, 49152] on 2 cores (this takes ~1 ms there)."""
    top_b1 = jnp.max(x_bv, axis=-1, keepdims=True)
    index_v = jnp.arange(x_bv.shape[-1], dtype=jnp.int32)
    first_b = jnp.min(jnp.where(x_bv == top_b1, index_v, x_bv.shape[-1]), axis=-1)
    return jnp.minimum(first_b, x_bv.shape[-1] - 1)  # a row of NaNs has no maximum


def categorical(key: jax.Array, logits_bv: jax.Array) -> jax.Array:
    """`jax.random.categorical(key, logits_bv)`, the same draw for the same key (the Gumbel-max argmax of
    logits + gumbel(key, shape)), through `first_argmax`."""
    return first_argmax(logits_bv + jax.random.gumbel(key, logits_bv.shape, logits_bv.dtype))


def _nucleus_mask_full(scaled_bv: jax.Array, top_p: jax.Array) -> jax.Array:
    """Exact top-p set over the whole vocabulary without a sort: bisection on the bit pattern of the
    probabilities (monotone for non-negative floats) for the largest threshold whose mass is >= top_p."""
    probs = jax.nn.softmax(scaled_bv, axis=-1)
    bits = jax.lax.bitcast_convert_type(probs, jnp.int32)
    lo = jnp.zeros(bits.shape[:1] + (1,), jnp.int32)
    hi = jnp.max(bits, axis=-1, keepdims=True) + 1

    def halve(_, bounds):
        lo, hi = bounds
        mid = lo + (hi - lo) // 2
        enough = jnp.sum(jnp.where(bits >= mid, probs, 0.0), axis=-1, keepdims=True) >= top_p
        return jnp.where(enough, mid, lo), jnp.where(enough, hi, mid)

    lo, _ = jax.lax.fori_loop(0, 32, halve, (lo, hi))
    return bits >= lo


def _sample_filtered(scaled_bv: jax.Array, key: jax.Array, top_p: jax.Array, static: DrawStatic) -> jax.Array:
    """Sample from softmax(scaled) restricted to top-k, then to the top-p nucleus of what remains.

    The nucleus is searched among the top `_CANDIDATES` tokens (one `lax.top_k`, no sort of the vocabulary);
    when those do not hold top_p of the mass for some row, an exact full-vocabulary search is used instead.
    """
    vocab = scaled_bv.shape[-1]
    width = min(static.top_k or _CANDIDATES, vocab)
    values_bc, index_bc = jax.lax.top_k(scaled_bv, width)
    keep_bc = jnp.ones(values_bc.shape, bool)
    if static.use_top_p:
        # probabilities relative to what the top-k filter left (all of the vocabulary when top_k is off)
        log_norm = (jax.nn.logsumexp(values_bc, axis=-1, keepdims=True) if static.top_k
                    else jax.nn.logsumexp(scaled_bv, axis=-1, keepdims=True))
        probs_bc = jnp.exp(values_bc - log_norm)
        keep_bc = (jnp.cumsum(probs_bc, axis=-1) - probs_bc) < top_p
    pick_b = categorical(key, jnp.where(keep_bc, values_bc, -jnp.inf))
    token_b = jnp.take_along_axis(index_bc, pick_b[:, None], axis=-1)[:, 0]
    if not static.use_top_p or static.top_k or width == vocab:
        return token_b
    covered = jnp.all(jnp.sum(probs_bc, axis=-1) >= top_p)

    def full_search() -> jax.Array:
        masked = jnp.where(_nucleus_mask_full(scaled_bv, top_p), scaled_bv, -jnp.inf)
        return categorical(key, masked)

    return jax.lax.cond(covered, lambda: token_b, full_search)


def pick(logits_bv: jax.Array, key: jax.Array, temperature: jax.Array, top_p: jax.Array, static: DrawStatic
          ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Sampled (or argmax) token per row, its log-probability under softmax(logits / temperature) and that
    distribution's entropy."""
    if static.greedy:
        token = first_argmax(logits_bv)
        scaled = logits_bv
    else:
        scaled = logits_bv / temperature
        if static.top_k or static.use_top_p:
            token = _sample_filtered(scaled, key, top_p, static)
        else:
            token = categorical(key, scaled)
    token = token.astype(jnp.int32)
    log_probs = jax.nn.log_softmax(scaled, axis=-1)
    logprob = jnp.take_along_axis(log_probs, token[:, None], axis=-1)[:, 0]
    entropy = -jnp.sum(jnp.exp(log_probs) * log_probs, axis=-1)
    return token, logprob, entropy


def append_tokens(state: Any, live_b: jax.Array, token_b: jax.Array, logprob_b: jax.Array, entropy_b: jax.Array,
                   static: DrawStatic) -> tuple[dict[str, jax.Array], jax.Array]:
    """Each live row's new token, its logprob and entropy put at the row's count in `state`'s [B, max_new]
    buffers. Returns the new `tokens_bn`, `logprobs_bn`, `entropy_bn`, `count_b`, `last_b` and whether each row
    ends here (a stop id, or max_new tokens)."""
    rows = jnp.arange(token_b.shape[0])
    slot = jnp.minimum(state.count_b, static.max_new - 1)

    def put(buffer: jax.Array, value: jax.Array) -> jax.Array:
        return buffer.at[rows, slot].set(jnp.where(live_b, value, buffer[rows, slot]))

    count = state.count_b + live_b
    is_stop = jnp.isin(token_b, jnp.asarray(static.stop_ids, jnp.int32)) if static.stop_ids else False
    fields = {"tokens_bn": put(state.tokens_bn, token_b), "logprobs_bn": put(state.logprobs_bn, logprob_b),
              "entropy_bn": put(state.entropy_bn, entropy_b), "count_b": count,
              "last_b": jnp.where(live_b, token_b, state.last_b)}
    return fields, is_stop | (count >= static.max_new)
