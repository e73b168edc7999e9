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
are those of `models.sampler` (log_softmax(logits / T) over the full vocabulary, before top-k/top-p). The
float arithmetic of a row can follow the batch's row count in its last bits (XLA:CPU blocks a matmul by its
shape: one SmolLM2 row's logprobs differ by up to 3e-5 between batches of 1 and 32), so a sample that falls
within that of a boundary between two tokens could differ with the batch a call computes.

Cost: a decode call computes only the rows the host names (the live slots, rounded up to a few batch sizes),
so idle slots (their dialog ended or waits on its score) cost nothing where decode is compute-bound (a CPU).
Prefill and decode attend to cache columns [0, W), W = `attention_window` of the fullest row computed; those
rows' window is gathered once per call, and only the columns the call wrote go back into the cache. On TPU
the pod-scale form is a ragged paged-attention kernel, where each slot reads only its own pages and W is per
row, and where decode is memory-bound the batch size matters less than the bytes read.
"""
from __future__ import annotations

import functools
from typing import Any, Callable

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from models.kv_cache import KVCache, get_key_columns, key_window_sizes, set_key_columns, window_tile
from models.sampler import Layers, constrain_cache, maybe_mesh, put_window, window_of
from models.sharding import batch_sharding, host_array
from models.token_draw import DrawStatic, append_tokens, pick


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
               temperature: jax.Array, top_p: jax.Array, static: DrawStatic
               ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """`models.token_draw.pick` for each row with its own key fold_in(fold_in(key, sequence), position)."""
    keys = jax.vmap(lambda s, p: jax.random.fold_in(jax.random.fold_in(key, s), p))(sequence_b, position_b)
    token, logprob, entropy = jax.vmap(
        lambda row, k: pick(row[None], k, temperature, top_p, static))(logits_bv, keys)
    return token[:, 0], logprob[:, 0], entropy[:, 0]


def _record(state: SlotState, live_b: jax.Array, token_b: jax.Array, logprob_b: jax.Array, entropy_b: jax.Array,
            static: DrawStatic) -> SlotState:
    """Append the new token of each live row; a row stops being live on a stop id or at max_new tokens."""
    fields, ends = append_tokens(state, live_b, token_b, logprob_b, entropy_b, static)
    return state.replace(**fields, live_b=live_b & ~ends)


def _take_rows(x: jax.Array, rows_a: jax.Array, sizes: dict[int, int] | None = None) -> jax.Array:
    """Rows `rows_a` of x (an index past the batch: the last row), only the first sizes[axis] entries of the
    axes named: one gather that reads just that (a slice before it would copy every row's part first)."""
    sizes = sizes or {}
    slice_sizes = (1,) + tuple(sizes.get(axis, n) for axis, n in enumerate(x.shape) if axis)
    numbers = jax.lax.GatherDimensionNumbers(offset_dims=tuple(range(1, x.ndim)), collapsed_slice_dims=(0,),
                                             start_index_map=(0,))
    return jax.lax.gather(x, rows_a[:, None], numbers, slice_sizes, mode="clip")


def _rows_of(cache: KVCache, rows_a: jax.Array, window: int) -> KVCache:
    """Rows `rows_a` of `cache` (an index past the batch: its last row), their first `window` columns."""
    return KVCache(tuple(_take_rows(k, rows_a, key_window_sizes(k, window)) for k in cache.k_bkchw),
                   tuple(_take_rows(v, rows_a, {2: window}) for v in cache.v_bksh),
                   _take_rows(cache.valid_bs, rows_a, {1: window}), cache.index)


def _copy_columns(full: KVCache, part: KVCache, source_a: jax.Array, row_a: jax.Array, first_a: jax.Array,
                  count_a: jax.Array, width: int) -> KVCache:
    """Columns [first_a[a], first_a[a] + count_a[a]) (count <= `width`) of `part`'s row source_a[a] written over
    the same columns of `full`'s row row_a[a], which become valid (a row past `full`'s batch: dropped). Only the
    new tokens' keys and values move: no whole row is copied back."""
    offsets = jnp.arange(width)[None, :]
    source_aw = jnp.minimum(first_a[:, None] + offsets, part.length - 1)
    column_aw = jnp.where(offsets < count_a[:, None], first_a[:, None] + offsets, full.length)  # past: dropped
    src, dst = source_a[:, None], row_a[:, None]
    keys = tuple(set_key_columns(f, dst, column_aw, get_key_columns(p, src, source_aw))
                 for f, p in zip(full.k_bkchw, part.k_bkchw))
    values = tuple(f.at[dst, :, column_aw, :].set(p[src, :, source_aw, :], mode="drop")
                   for f, p in zip(full.v_bksh, part.v_bksh))
    return KVCache(keys, values, full.valid_bs.at[dst, column_aw].set(True, mode="drop"), full.index)


def slot_shards(mesh_rules: Any, slots: int) -> int:
    """Into how many blocks of consecutive slots the mesh splits `slots` slots (1: no mesh, or one that does not
    split them): block s is on the chips of batch shard s."""
    if mesh_rules is None:
        return 1
    mesh, rules = mesh_rules
    return slots // batch_sharding(mesh, 1, rules, batch_size=slots).shard_shape((slots,))[0]


def decodes_every_slot(mesh_rules: Any, slots: int) -> bool:
    """Whether `decode` should compute every slot (`rows_c` None): where the mesh splits the slots over shards,
    a gather of named rows would gather them onto every chip."""
    return slot_shards(mesh_rules, slots) > 1


def slot_order(slots: int, shards: int, group: int) -> list[int]:
    """The order in which new sequences take free slots: `group` consecutive sequences (answers sharing a prompt)
    on consecutive slots of one block, successive groups on successive blocks. One admission then spreads over
    every block (each prefills its share on its own chips), and a group's prompt is prefilled in one block (in
    as few as it spans where a group outgrows a block). Without blocks (`shards` 1): slot order."""
    block = slots // shards
    run = max(1, min(group, block))
    return sorted(range(slots), key=lambda b: ((b % block) // run, b // block, b % run))


def _by_shard(shards: int, fn: Callable[..., Any], *args: Any) -> Any:
    """fn(shard, *blocks) on each of `shards` blocks of consecutive rows of every array in `args` (each leading
    axis split evenly), the results' blocks put back in order. A gather or scatter of rows named by global index
    across a sharded axis is all-gathered onto every chip by the SPMD partitioner (it cannot know the indices
    stay on their shard); over the blocks it is a batched one, which stays on each block's chips. `fn` maps a
    global row index g of a block of n rows to its local g - shard * n (an index past the block: padding)."""
    if shards == 1:
        return fn(jnp.zeros((), jnp.int32), *args)
    for x in jax.tree.leaves(args):
        if x.shape[0] % shards:
            raise ValueError(f"models.slots: {x.shape[0]} rows do not split into {shards} blocks of slots")
    split = lambda x: x.reshape((shards, x.shape[0] // shards) + x.shape[1:])  # noqa: E731
    out = jax.vmap(fn)(jnp.arange(shards), *jax.tree.map(split, args))
    return jax.tree.map(lambda x: x.reshape((-1,) + x.shape[2:]), out)


@functools.partial(jax.jit, static_argnames=("graphdef", "static", "mesh_rules", "window", "fresh", "shards"),
                   donate_argnames=("state",))
def admit(graphdef: nnx.GraphDef, params: nnx.State, layers: Layers, state: SlotState, tokens_ut: jax.Array,
          length_u: jax.Array, row_u: jax.Array, reset_u: jax.Array, slot_a: jax.Array, source_a: jax.Array,
          sequence_a: jax.Array, key: jax.Array, temperature: jax.Array, top_p: jax.Array, static: DrawStatic,
          mesh_rules: Any, window: int, fresh: bool = False, shards: int = 1,
          final_a: jax.Array | None = None) -> SlotState:
    """Prefill U segments and start A slots on them. Segment u is `tokens_ut[u, :length_u[u]]` (right-padded):
    with `reset_u`, a new sequence's prompt (a cleared row, from column and position 0); otherwise a
    continuation of slot `row_u[u]`'s row, starting with its pending token. Slot `slot_a[a]` (a slot index past
    the batch: padding) takes segment `source_a[a]`'s keys/values and samples its first token as sequence
    `sequence_a[a]`: the G answers of a group share one prompt segment, computed once. Slots not named are
    unchanged. Columns [0, window) hold every write.

    final_a ([A] bool, None: all true): a slot whose start is not final takes the segment's keys/values (its
    fill and position advance) but samples nothing and stays idle: the segment is one chunk of a longer prompt or
    turn, whose next chunk continues that row in a later call (`rljax.engine` prefills in chunks of
    `rollout.admit_width` tokens).

    Cost: the U segments attend to their rows' first `window` columns (gathered once); only the segments' own
    columns are written into the slots' rows. `fresh` (every segment a new sequence: `reset_u` all true) gathers
    no rows: the segments start from blank rows (on a mesh that splits the slots, a gather of rows is an
    all-gather of them onto every chip).

    `shards` (`slot_shards`: the blocks of consecutive slots the mesh splits the slots into): the segments, the
    admissions and the slots are laid out in as many blocks, and segment u of block s serves (and continues) only
    slots of block s, so the rows' keys and values are read and written where they are (`_by_shard`); the host
    lays them out so (`rljax.engine`), computing a prompt shared by slots of two blocks once in each."""
    with maybe_mesh(mesh_rules):
        model = nnx.merge(graphdef, params)
        fill_u = jnp.where(reset_u, 0, state.fill_b[row_u])
        start_u = jnp.where(reset_u, 0, state.position_b[row_u])
        offsets = jnp.arange(tokens_ut.shape[1])[None, :]
        columns = jnp.where(offsets < length_u[:, None], fill_u[:, None] + offsets, window)
        slots_per_block = state.fill_b.shape[0] // shards
        segments_per_block = tokens_ut.shape[0] // shards
        cache = state.cache.replace(index=None)  # blocks of rows only (`_by_shard`)
        if fresh:
            history = constrain_cache(KVCache.init(model.config, tokens_ut.shape[0], window,
                                                   state.cache.k_bkchw[0].dtype, window_tile(state.cache, window)))
        else:
            history = _by_shard(shards, lambda shard, cache, row_u: _rows_of(
                cache, row_u - shard * slots_per_block, window), cache, row_u)
            history = history.replace(valid_bs=history.valid_bs & ~reset_u[:, None], index=state.cache.index)
        h_utd, part = model.layers.with_row_cache(model.embed(tokens_ut), start_u[:, None] + offsets, columns,
                                                  history, layers)

        def start_rows(shard: jax.Array, cache: KVCache, part: KVCache, slot_a: jax.Array, source_a: jax.Array,
                       first_a: jax.Array, count_a: jax.Array, reset_a: jax.Array) -> KVCache:
            slot_a, source_a = slot_a - shard * slots_per_block, source_a - shard * segments_per_block
            # what a new sequence's row held goes
            kept = (jnp.zeros((slot_a.shape[0], cache.length), bool) if fresh
                    else _take_rows(cache.valid_bs, slot_a) & ~reset_a[:, None])
            cache = cache.replace(valid_bs=cache.valid_bs.at[slot_a].set(kept, mode="drop"))
            return _copy_columns(cache, part, source_a, slot_a, first_a, count_a, tokens_ut.shape[1])

        cache = _by_shard(shards, start_rows, cache, part.replace(index=None), slot_a, source_a, fill_u[source_a],
                          length_u[source_a], reset_u[source_a]).replace(index=state.cache.index)
        last_h = jnp.take_along_axis(h_utd, jnp.maximum(length_u - 1, 0)[:, None, None], axis=1)
        logits = _by_shard(shards, lambda shard, logits_uv, source_a: (
            logits_uv[source_a - shard * segments_per_block]), model.logits(model.final_norm(last_h))[:, 0], source_a)
        position = (start_u + length_u)[source_a]
        token, logprob, entropy = _pick_rows(logits, key, sequence_a, position, temperature, top_p, static)
        is_stop = (jnp.isin(token, jnp.asarray(static.stop_ids, jnp.int32)) if static.stop_ids
                   else jnp.zeros(token.shape, bool))
        live = ~is_stop & (static.max_new > 1)
        sampled_a = slot_a if final_a is None else jnp.where(final_a, slot_a, state.fill_b.shape[0])
        put = lambda buffer, value: buffer.at[slot_a].set(value, mode="drop")  # noqa: E731
        put_sampled = lambda buffer, value: buffer.at[sampled_a].set(value, mode="drop")  # noqa: E731
        first = lambda buffer, value: buffer.at[sampled_a, 0].set(value, mode="drop")  # noqa: E731
        return state.replace(
            cache=constrain_cache(cache), fill_b=put(state.fill_b, (fill_u + length_u)[source_a]),
            last_b=put_sampled(state.last_b, token), position_b=put(state.position_b, position),
            sequence_b=put(state.sequence_b, sequence_a),
            live_b=put(state.live_b, live if final_a is None else live & final_a),
            count_b=put_sampled(state.count_b, jnp.ones_like(sequence_a)), tokens_bn=first(state.tokens_bn, token),
            logprobs_bn=first(state.logprobs_bn, logprob), entropy_bn=first(state.entropy_bn, entropy))


_ROW_FIELDS = ("fill_b", "last_b", "position_b", "sequence_b", "live_b", "count_b", "tokens_bn", "logprobs_bn",
               "entropy_bn")


@functools.partial(jax.jit, static_argnames=("graphdef", "static", "mesh_rules", "window", "steps"),
                   donate_argnames=("state",))
def decode(graphdef: nnx.GraphDef, params: nnx.State, layers: Layers, state: SlotState, rows_c: jax.Array | None,
           key: jax.Array, temperature: jax.Array, top_p: jax.Array, static: DrawStatic, mesh_rules: Any, window: int,
           steps: int) -> SlotState:
    """Up to `steps` decode steps of the live slots among `rows_c` ([C] slot indices; an index past the batch
    pads), fewer when none is left live. Each live slot feeds its pending token at its own column and samples
    the next; the others write nothing. Every live row's fill stays below `window` (the caller's choice).

    Only the C named rows are computed: decode costs C rows per step whatever the number of slots, so the host
    names the live ones (rounded up to a few sizes) and idle slots cost nothing. Their first `window` columns
    are gathered once per call, and only the columns the loop wrote are put back.

    rows_c None: every slot is computed, each shard on its own rows. On a mesh that splits the slots, gathering
    named rows would gather every shard's cache onto every chip (XLA's partitioner cannot know the indices stay
    on their shard); here the first `window` columns are a static slice, and they are written back whole. At a
    window of the whole cache that slice is the cache itself: nothing is copied, where named rows are gathered
    into a new buffer (32 SmolLM2 rows at 1024 columns: 1.5 GB; 260-278 against 380-384 ms a step on XLA:CPU;
    at 512 of 1024 columns, where both copy, 222.6 named against 234.5), so the engine names no rows when it
    would name every slot and the window is the whole cache."""
    with maybe_mesh(mesh_rules):
        model = nnx.merge(graphdef, params)
        if rows_c is None:
            rows = state.replace(cache=window_of(state.cache, window))
        else:
            rows = state.replace(cache=_rows_of(state.cache, rows_c, window),
                                 **{name: _take_rows(getattr(state, name), rows_c) for name in _ROW_FIELDS})
            rows = rows.replace(live_b=rows.live_b & (rows_c < state.fill_b.shape[0]))

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
            s = s.replace(cache=constrain_cache(cache), fill_b=s.fill_b + live, position_b=position)
            return step + 1, _record(s, live, token, logprob, entropy, static)

        _, done = jax.lax.while_loop(cond, body, (jnp.zeros((), jnp.int32), rows))
        if rows_c is None:
            return done.replace(cache=constrain_cache(put_window(state.cache, done.cache)))
        cache = _copy_columns(state.cache, done.cache, jnp.arange(rows_c.shape[0]), rows_c, rows.fill_b,
                              done.fill_b - rows.fill_b, steps)
        put = lambda full, part: full.at[rows_c].set(part, mode="drop")  # noqa: E731
        return state.replace(cache=constrain_cache(cache),
                             **{name: put(getattr(state, name), getattr(done, name)) for name in _ROW_FIELDS})


def host_rows(state: SlotState) -> dict[str, np.ndarray]:
    """The per-slot bookkeeping the host schedules with (small arrays; the cache stays on the device)."""
    return {name: host_array(getattr(state, name)) for name in ("fill_b", "last_b", "live_b", "count_b")}
