"""A fixed set of decode slots, each holding one sequence that fills its own cache row at its own pace.

`models.sampler` runs a batch in lockstep: one cache index for every row, so a row whose answer ended idles
until the longest one ends, and a new turn starts only when the whole batch starts it. Here each slot b has
its own fill `fill_b[b]` (the next cache column it writes), so the host can, between two decode calls:
- `admit` a new sequence into a free slot (its row is cleared; its prompt is prefilled from column 0),
- `admit` a continuation into a slot whose sequence is waiting (the pending token and the new turn's ids are
  prefilled after what the row already holds),
while the other slots keep their state and continue decoding. Writes address (row, column) pairs; a column
past the buffer drops the write (padding, rows not admitted), so nothing outside a row's own tokens moves.

Tokens depend only on the sequence: the key of the token a sequence samples at position p is
fold_in(fold_in(key, sequence id), p), never the slot or the batch around it. Log-probabilities and entropies
are those of `models.sampler` (log_softmax(logits / T) over the full vocabulary, before top-k/top-p).

Cost: prefill and decode attend to cache columns [0, W), W = `attention_window` of the fullest live row; the
window is copied out and back once per call as in `models.sampler`. On TPU the pod-scale form is a ragged
paged-attention kernel, where each slot reads only its own pages and W is per row.
"""
from __future__ import annotations

import functools
from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from models.llama import KVCache
from models.sampler import (Layers, _constrain_cache, _maybe_mesh, _pick, _put_window, _Static, _window_of)


@flax.struct.dataclass
class SlotState:
    """Device-side state of the slots. A slot is live while it decodes; its tokens of the current turn are
    tokens_bn[b, :count_b[b]]."""

    cache: KVCache
    fill_b: jax.Array  # int32: the next cache column of the row
    last_b: jax.Array  # int32: the last sampled token, not yet in the cache
    position_b: jax.Array  # int32: the position `last_b` takes when it is fed
    sequence_b: jax.Array  # int32: the id whose key the slot samples with
    live_b: jax.Array  # bool: decoding
    count_b: jax.Array  # int32: tokens generated in the current turn
    tokens_bn: jax.Array  # int32 [B, max_new]
    logprobs_bn: jax.Array  # float32 [B, max_new]
    entropy_bn: jax.Array  # float32 [B, max_new]

    @classmethod
    def init(cls, cache: KVCache, max_new: int) -> "SlotState":
        batch = cache.valid_bs.shape[0]
        zeros = lambda: jnp.zeros((batch,), jnp.int32)  # noqa: E731 (separate buffers: the state is donated)
        return cls(cache=cache, fill_b=zeros(), last_b=zeros(), position_b=zeros(), sequence_b=zeros(),
                   live_b=jnp.zeros((batch,), bool), count_b=zeros(),
                   tokens_bn=jnp.zeros((batch, max_new), jnp.int32),
                   logprobs_bn=jnp.zeros((batch, max_new), jnp.float32),
                   entropy_bn=jnp.zeros((batch, max_new), jnp.float32))


def _pick_rows(logits_bv: jax.Array, key: jax.Array, sequence_b: jax.Array, position_b: jax.Array,
               temperature: jax.Array, top_p: jax.Array, static: _Static
               ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """`models.sampler._pick` for each row with its own key fold_in(fold_in(key, sequence), position)."""
    keys = jax.vmap(lambda s, p: jax.random.fold_in(jax.random.fold_in(key, s), p))(sequence_b, position_b)
    token, logprob, entropy = jax.vmap(
        lambda row, k: _pick(row[None], k, temperature, top_p, static))(logits_bv, keys)
    return token[:, 0], logprob[:, 0], entropy[:, 0]


def _record(state: SlotState, live_b: jax.Array, token_b: jax.Array, logprob_b: jax.Array, entropy_b: jax.Array,
            static: _Static) -> SlotState:
    """Append the new token of each live row; a row stops being live on a stop id or at max_new tokens."""
    rows = jnp.arange(token_b.shape[0])
    slot = jnp.minimum(state.count_b, static.max_new - 1)

    def put(buffer: jax.Array, value: jax.Array) -> jax.Array:
        return buffer.at[rows, slot].set(jnp.where(live_b, value, buffer[rows, slot]))

    count = state.count_b + live_b
    is_stop = jnp.isin(token_b, jnp.asarray(static.stop_ids, jnp.int32)) if static.stop_ids else jnp.zeros_like(live_b)
    return state.replace(tokens_bn=put(state.tokens_bn, token_b), logprobs_bn=put(state.logprobs_bn, logprob_b),
                         entropy_bn=put(state.entropy_bn, entropy_b), count_b=count,
                         last_b=jnp.where(live_b, token_b, state.last_b),
                         live_b=live_b & ~is_stop & (count < static.max_new))


def _rows_of(cache: KVCache, rows_a: jax.Array) -> KVCache:
    return KVCache(tuple(jnp.take(k, rows_a, axis=0) for k in cache.k_bkhs),
                   tuple(jnp.take(v, rows_a, axis=0) for v in cache.v_bksh), jnp.take(cache.valid_bs, rows_a, axis=0),
                   cache.index)


def _put_rows(cache: KVCache, rows_a: jax.Array, part: KVCache) -> KVCache:
    """`part`'s rows written over rows `rows_a` of `cache` (a row index past the batch: dropped)."""
    put = lambda full, rows: full.at[rows_a].set(rows, mode="drop")  # noqa: E731
    return KVCache(tuple(map(put, cache.k_bkhs, part.k_bkhs)), tuple(map(put, cache.v_bksh, part.v_bksh)),
                   put(cache.valid_bs, part.valid_bs), cache.index)


@functools.partial(jax.jit, static_argnames=("graphdef", "static", "mesh_rules", "window"),
                   donate_argnames=("state",))
def admit(graphdef: nnx.GraphDef, params: nnx.State, layers: Layers, state: SlotState, tokens_ut: jax.Array,
          length_u: jax.Array, row_u: jax.Array, reset_u: jax.Array, slot_a: jax.Array, source_a: jax.Array,
          sequence_a: jax.Array, key: jax.Array, temperature: jax.Array, top_p: jax.Array, static: _Static,
          mesh_rules: Any, window: int) -> SlotState:
    """Prefill U segments and start A slots on them. Segment u is `tokens_ut[u, :length_u[u]]` (right-padded):
    with `reset_u`, a new sequence's prompt (a cleared row, from column and position 0); otherwise a
    continuation of slot `row_u[u]`'s row, starting with its pending token. Slot `slot_a[a]` (a slot index past
    the batch: padding) takes segment `source_a[a]`'s keys/values and samples its first token as sequence
    `sequence_a[a]`: the G answers of a group share one prompt segment, computed once. Slots not named are
    unchanged. Columns [0, window) hold every write."""
    with _maybe_mesh(mesh_rules):
        model = nnx.merge(graphdef, params)
        fill_u = jnp.where(reset_u, 0, state.fill_b[row_u])
        start_u = jnp.where(reset_u, 0, state.position_b[row_u])
        offsets = jnp.arange(tokens_ut.shape[1])[None, :]
        columns = jnp.where(offsets < length_u[:, None], fill_u[:, None] + offsets, window)
        rows = jnp.minimum(slot_a, state.fill_b.shape[0] - 1)
        cleared = state.cache.valid_bs[rows] & ~reset_u[source_a][:, None]  # what a new sequence's row held goes
        full = state.cache.replace(valid_bs=state.cache.valid_bs.at[slot_a].set(cleared, mode="drop"))
        window_cache = _window_of(full, window)
        part = _rows_of(window_cache, row_u)
        part = part.replace(valid_bs=part.valid_bs & ~reset_u[:, None])
        h_utd, part = model.layers.with_row_cache(model.embed(tokens_ut), start_u[:, None] + offsets, columns, part,
                                                  layers)
        cache = _put_window(full, _put_rows(window_cache, slot_a, _rows_of(part, source_a)))
        last_h = jnp.take_along_axis(h_utd, jnp.maximum(length_u - 1, 0)[:, None, None], axis=1)
        logits = model.logits(model.final_norm(last_h))[:, 0][source_a]
        position = (start_u + length_u)[source_a]
        token, logprob, entropy = _pick_rows(logits, key, sequence_a, position, temperature, top_p, static)
        is_stop = (jnp.isin(token, jnp.asarray(static.stop_ids, jnp.int32)) if static.stop_ids
                   else jnp.zeros(token.shape, bool))
        put = lambda buffer, value: buffer.at[slot_a].set(value, mode="drop")  # noqa: E731
        first = lambda buffer, value: buffer.at[slot_a, 0].set(value, mode="drop")  # noqa: E731
        return state.replace(
            cache=_constrain_cache(cache), fill_b=put(state.fill_b, (fill_u + length_u)[source_a]),
            last_b=put(state.last_b, token), position_b=put(state.position_b, position),
            sequence_b=put(state.sequence_b, sequence_a),
            live_b=put(state.live_b, ~is_stop & (static.max_new > 1)),
            count_b=put(state.count_b, jnp.ones_like(sequence_a)), tokens_bn=first(state.tokens_bn, token),
            logprobs_bn=first(state.logprobs_bn, logprob), entropy_bn=first(state.entropy_bn, entropy))


@functools.partial(jax.jit, static_argnames=("graphdef", "static", "mesh_rules", "window"),
                   donate_argnames=("state",))
def decode(graphdef: nnx.GraphDef, params: nnx.State, layers: Layers, state: SlotState, steps: jax.Array,
           key: jax.Array, temperature: jax.Array, top_p: jax.Array, static: _Static, mesh_rules: Any, window: int
           ) -> SlotState:
    """Up to `steps` decode steps of every live slot (fewer when none is left live). Each live slot feeds its
    pending token at its own column and samples the next; the others write nothing. Every live row's fill
    stays below `window` (the caller's choice)."""
    with _maybe_mesh(mesh_rules):
        model = nnx.merge(graphdef, params)

        def cond(carry: tuple[jax.Array, SlotState]) -> jax.Array:
            step, s = carry
            return (step < steps) & jnp.any(s.live_b)

        def body(carry: tuple[jax.Array, SlotState]) -> tuple[jax.Array, SlotState]:
            step, s = carry
            live = s.live_b
            columns = jnp.where(live, s.fill_b, window)[:, None]
            h_btd, cache = model.layers.with_row_cache(model.embed(s.last_b[:, None]), s.position_b[:, None],
                                                       columns, s.cache, layers)
            logits = model.logits(model.final_norm(h_btd))[:, 0]
            position = s.position_b + live
            token, logprob, entropy = _pick_rows(logits, key, s.sequence_b, position, temperature, top_p, static)
            s = s.replace(cache=_constrain_cache(cache), fill_b=s.fill_b + live, position_b=position)
            return step + 1, _record(s, live, token, logprob, entropy, static)

        full = state.cache
        _, state = jax.lax.while_loop(cond, body, (jnp.zeros((), jnp.int32),
                                                   state.replace(cache=_window_of(full, window))))
        return state.replace(cache=_constrain_cache(_put_window(full, state.cache)))


def host_rows(state: SlotState) -> dict[str, np.ndarray]:
    """The per-slot bookkeeping the host schedules with (small arrays; the cache stays on the device)."""
    return {name: np.asarray(getattr(state, name)) for name in ("fill_b", "last_b", "live_b", "count_b")}
