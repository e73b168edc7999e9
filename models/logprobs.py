"""Per-token log-probabilities and entropies straight from final hidden states, without the [B, T, V] logits.

RL losses need, at every position, log p(next token) and the entropy of the distribution — two numbers per
token — yet the plain route materialises fp32 logits, log-softmax and their gradients over the whole
vocabulary ([B, T, V]: 0.4 GB for 8 x 256 tokens of a 49k vocabulary, 4 GB at 128k) and spends more time
streaming them than in the vocabulary matmul itself. Here the sequence is cut into chunks of `chunk_len`
positions; each chunk's logits exist only inside one `lax.scan` step, forward and backward (the backward
recomputes them: one extra matmul instead of keeping [B, T, V]). Chunks run along the sequence so every
chunk keeps the batch sharding of the mesh; a sharded vocabulary axis reduces through XLA's collectives.
The backward skips a chunk whose cotangents are all zero (`lax.cond`): the positions no loss term weights
(prompts, feedback turns and padding common to the batch's rows) cost no logits, softmax or head matmuls
there, three times the forward's vocabulary matmul per token.

Gradient, with z = logits / temperature, lse = logsumexp(z), p = softmax(z), H = -sum p log p:
  d logp_t / dz = onehot(t) - p,    d H / dz = -p * (z - lse + H).
"""
from __future__ import annotations

import functools

import jax
import jax.numpy as jnp


def _chunk_logits(h_bcd: jax.Array, head: jax.Array, vocab_axis: int, temperature: float) -> jax.Array:
    """fp32 z = (h @ head) / temperature for one chunk, [B*C, V]; head is [V, D] (vocab_axis 0) or [D, V]."""
    h_nd = h_bcd.reshape(-1, h_bcd.shape[-1])
    contract = 1 if vocab_axis == 0 else 0
    logits = jax.lax.dot_general(h_nd, head.astype(h_nd.dtype), (((1,), (contract,)), ((), ())),
                                 preferred_element_type=jnp.float32)
    return logits / temperature if temperature != 1.0 else logits


def _chunk_stats(z_nv: jax.Array, targets_n: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """(log p(target), entropy, logsumexp) per row of z."""
    lse = jax.nn.logsumexp(z_nv, axis=-1)
    target_z = jnp.take_along_axis(z_nv, targets_n[:, None], axis=-1)[:, 0]
    p = jnp.exp(z_nv - lse[:, None])
    entropy = lse - jnp.sum(p * z_nv, axis=-1)
    return target_z - lse, entropy, lse


def _to_chunks(x: jax.Array, chunk_len: int) -> jax.Array:
    """[B, T, ...] -> [T/C, B, C, ...] (T already padded to a multiple of C)."""
    b, t = x.shape[:2]
    return jnp.moveaxis(x.reshape((b, t // chunk_len, chunk_len) + x.shape[2:]), 1, 0)


def _from_chunks(x: jax.Array) -> jax.Array:
    """[T/C, B, C, ...] -> [B, T, ...]."""
    x = jnp.moveaxis(x, 0, 1)
    return x.reshape((x.shape[0], x.shape[1] * x.shape[2]) + x.shape[3:])


def _padded(x: jax.Array, chunk_len: int) -> jax.Array:
    extra = -x.shape[1] % chunk_len
    return jnp.pad(x, [(0, 0), (0, extra)] + [(0, 0)] * (x.ndim - 2)) if extra else x


@functools.partial(jax.custom_vjp, nondiff_argnums=(3, 4, 5))
def token_logprobs_and_entropy(h_btd: jax.Array, head: jax.Array, targets_bt: jax.Array, vocab_axis: int,
                               temperature: float, chunk_len: int) -> tuple[jax.Array, jax.Array]:
    """fp32 ([B, T] log softmax(h @ head / temperature)[targets], [B, T] entropy of that distribution).

    head: the output embedding, [V, D] (vocab_axis 0, tied to the input embedding) or [D, V] (vocab_axis 1).
    chunk_len: sequence positions per chunk (T is padded up to a multiple; padded rows are dropped).
    """
    return _forward(h_btd, head, targets_bt, vocab_axis, temperature, chunk_len)[0]


def _forward(h_btd, head, targets_bt, vocab_axis, temperature, chunk_len):
    t = h_btd.shape[1]
    h_chunks = _to_chunks(_padded(h_btd, chunk_len), chunk_len)
    target_chunks = _to_chunks(_padded(targets_bt, chunk_len), chunk_len)

    def step(_, xs):
        h_bcd, targets_bc = xs
        z = _chunk_logits(h_bcd, head, vocab_axis, temperature)
        logp, entropy, lse = _chunk_stats(z, targets_bc.reshape(-1))
        return None, tuple(v.reshape(targets_bc.shape) for v in (logp, entropy, lse))

    _, (logp, entropy, lse) = jax.lax.scan(step, None, (h_chunks, target_chunks))
    out = (_from_chunks(logp)[:, :t], _from_chunks(entropy)[:, :t])
    return out, (h_btd, head, targets_bt, _from_chunks(lse)[:, :t], out[1])


def _backward(vocab_axis, temperature, chunk_len, residuals, cotangents):
    h_btd, head, targets_bt, lse_bt, entropy_bt = residuals
    g_logp_bt, g_entropy_bt = cotangents
    pad = functools.partial(_padded, chunk_len=chunk_len)
    xs = tuple(_to_chunks(pad(x), chunk_len) for x in (h_btd, targets_bt, lse_bt, entropy_bt, g_logp_bt,
                                                         g_entropy_bt))

    def step(d_head, chunk):
        g_logp, g_entropy = chunk[4], chunk[5]
        needed = jnp.any(g_logp != 0) | jnp.any(g_entropy != 0)
        return jax.lax.cond(needed, chunk_gradients, lambda d_head, chunk: (d_head, jnp.zeros_like(chunk[0])),
                            d_head, chunk)

    def chunk_gradients(d_head, chunk):
        h_bcd, targets_bc, lse, entropy, g_logp, g_entropy = (x.reshape((-1,) + x.shape[2:]) for x in chunk)
        z = _chunk_logits(h_bcd, head, vocab_axis, temperature)
        p = jnp.exp(z - lse[:, None])
        onehot = jax.nn.one_hot(targets_bc, z.shape[-1], dtype=z.dtype)
        dz = (g_logp[:, None] * (onehot - p) - g_entropy[:, None] * p * (z - lse[:, None] + entropy[:, None]))
        dz = (dz / temperature if temperature != 1.0 else dz).astype(h_bcd.dtype)
        w = head.astype(h_bcd.dtype)
        if vocab_axis == 0:  # head [V, D]
            dh = dz @ w
            d_head = d_head + jax.lax.dot_general(dz, h_bcd, (((0,), (0,)), ((), ())),
                                                  preferred_element_type=jnp.float32)
        else:  # head [D, V]
            dh = jax.lax.dot_general(dz, w, (((1,), (1,)), ((), ())))
            d_head = d_head + jax.lax.dot_general(h_bcd, dz, (((0,), (0,)), ((), ())),
                                                  preferred_element_type=jnp.float32)
        return d_head, dh.reshape(chunk[0].shape)

    d_head, dh = jax.lax.scan(step, jnp.zeros(head.shape, jnp.float32), xs)
    t = h_btd.shape[1]
    return _from_chunks(dh)[:, :t].astype(h_btd.dtype), d_head.astype(head.dtype), None


token_logprobs_and_entropy.defvjp(_forward, _backward)
