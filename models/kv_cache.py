"""The static-shape KV cache and the layout of its keys.

Shapes: B rows, K key/value heads, H head dim, S cache columns (slots), C column tiles, W columns per tile
(S = C * W), T new tokens, Q queries per kv head.

Keys are stored [B, K, C, H, W]: tiles of W columns, each tile head-dim-major. With one tile (C = 1, W = S,
the layout on TPU and everywhere but XLA:CPU) that is [B, K, H, S], the layout of the q.k matmul. On XLA:CPU a
decode step's scores (one query per kv head and query head) are a multiply summed over H; over [B, K, H, S]
that sum reads H rows S floats apart for every vector of output columns, and XLA:CPU's fused loop read the keys
at ~12 GB/s. In tiles of KEY_TILE_CPU = 32 columns those H reads are 128 bytes apart (one 8 KB stream per
tile). Measured on 2 cores (2026-12-07): 30 SmolLM2 layers of scores alone, 32 rows x 1024 columns, 26 ms
against 63-70 ms in one tile (W = 16: 38 ms, W = 64: 31 ms); a slots decode call of SmolLM2 (32 rows, 16 steps,
A/B in one process, the same tokens) 155.6 against 202.1 ms a step at a 1024-column window, 145.8 against 162.0
at 512, 124.6 against 135.9 at 256, and 8-16 rows at 128-256 columns 9-10% less. Attention of many queries (an
admission, an extend) puts the keys back into [B, K, H, S] once per layer and call (`keys_bkhs`) for its matmul.
Values stay [B, K, S, H], the layout of the probs.v matmul. On a TPU pod one tile keeps the MXU's layout; what
would replace this CPU path there is a ragged paged-attention kernel reading each row's filled pages.
"""
from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp

from models.config import LlamaConfig

KEY_TILE_CPU = 32
VALUE_AXES = ("batch", "kv_heads", "cache_length", "head_dim")  # KVCache.v_bksh
VALID_AXES = ("batch", "cache_length")  # KVCache.valid_bs


def default_key_tile(length: int, platform: str | None = None) -> int:
    """Columns per key tile for a cache of `length` columns on `platform` (default: JAX's default backend):
    KEY_TILE_CPU on CPU where it divides `length`, else one tile of all columns."""
    platform = platform or jax.default_backend()
    return KEY_TILE_CPU if platform == "cpu" and length % KEY_TILE_CPU == 0 else length


@flax.struct.dataclass
class KVCache:
    """Static-shape KV cache: one key and one value buffer per layer. Slots [0, index) are written; `valid`
    marks non-padding slots.

    Per-layer buffers (not one stacked [L, ...] array) let a decode step write each layer's new key in place
    and read it without slicing a copy out of a stack; keys are kept in tiles [B, K, C, H, W] (module doc),
    values [B, K, S, H], the layout of the probs.v matmul, so neither is transposed per decode step.
    """

    k_bkchw: tuple[jax.Array, ...]
    v_bksh: tuple[jax.Array, ...]
    valid_bs: jax.Array  # bool
    index: jax.Array  # int32 scalar: the next slot to write

    @classmethod
    def init(cls, config: LlamaConfig, batch: int, length: int, dtype: Any = None,
             key_tile: int | None = None) -> "KVCache":
        """An empty cache; `key_tile` columns per key tile (default: `default_key_tile(length)`)."""
        dtype = dtype or config.dtype
        tile = key_tile or default_key_tile(length)
        if length % tile:
            raise ValueError(f"KVCache: key_tile {tile} does not divide the cache length {length}")
        kv, h = config.num_kv_heads, config.head_dim
        layers = range(config.num_layers)
        return cls(tuple(jnp.zeros((batch, kv, length // tile, h, tile), dtype) for _ in layers),
                   tuple(jnp.zeros((batch, kv, length, h), dtype) for _ in layers),
                   jnp.zeros((batch, length), bool), jnp.zeros((), jnp.int32))

    @property
    def length(self) -> int:
        return self.valid_bs.shape[1]

    @property
    def key_tile(self) -> int:
        return self.k_bkchw[0].shape[-1]


def key_axes(k_bkchw: Any) -> tuple[str | None, ...]:
    """Logical axes of a key buffer: the tiles carry `cache_length` (with one tile, its columns do)."""
    if k_bkchw.shape[2] == 1:
        return ("batch", "kv_heads", None, "head_dim", "cache_length")
    return ("batch", "kv_heads", "cache_length", "head_dim", None)


def keys_bkhs(k_bkchw: jax.Array) -> jax.Array:
    """The keys as [B, K, H, S] (a copy unless there is one tile)."""
    b, k, c, h, w = k_bkchw.shape
    return k_bkchw.transpose(0, 1, 3, 2, 4).reshape(b, k, h, c * w)


def key_window_sizes(k_bkchw: jax.Array, window: int) -> dict[int, int]:
    """The axis sizes that keep columns [0, window) of a key buffer: whole tiles, or the first `window` columns
    of the one tile."""
    c, w = k_bkchw.shape[2], k_bkchw.shape[4]
    if c == 1:
        return {4: min(window, w)}
    if window % w:
        raise ValueError(f"KVCache: a window of {window} columns is not a whole number of {w}-column key tiles")
    return {2: window // w}


def window_tile(cache: KVCache, window: int) -> int:
    """Columns per key tile of a `window`-column cache laid out like `cache`."""
    return min(cache.key_tile, window)


def slice_keys(k_bkchw: jax.Array, window: int) -> jax.Array:
    """Columns [0, window) of a key buffer."""
    sizes = key_window_sizes(k_bkchw, window)
    return k_bkchw[tuple(slice(0, sizes.get(axis, n)) for axis, n in enumerate(k_bkchw.shape))]


def write_keys_at(k_bkchw: jax.Array, k_btkh: jax.Array, index: jax.Array) -> jax.Array:
    """New keys [B, T, K, H] written at columns [index, index + T) of every row."""
    if k_bkchw.shape[2] == 1:
        return jax.lax.dynamic_update_slice(k_bkchw, k_btkh.transpose(0, 2, 3, 1)[:, :, None], (0, 0, 0, 0, index))
    columns_t = index + jnp.arange(k_btkh.shape[1])
    w = k_bkchw.shape[4]
    return k_bkchw.at[:, :, columns_t // w, :, columns_t % w].set(k_btkh.transpose(1, 0, 2, 3), mode="drop")


def write_first_keys(k_bkchw: jax.Array, k_btkh: jax.Array) -> jax.Array:
    """New keys [B, T, K, H] written at columns [0, T) of every row (an empty cache: the columns past T of the
    last tile they touch are zeroed)."""
    b, t, kv, h = k_btkh.shape
    w = k_bkchw.shape[4]
    if k_bkchw.shape[2] == 1:
        return jax.lax.dynamic_update_slice(k_bkchw, k_btkh.transpose(0, 2, 3, 1)[:, :, None], (0, 0, 0, 0, 0))
    tiles = -(-t // w)
    padded = jnp.pad(k_btkh, ((0, 0), (0, tiles * w - t), (0, 0), (0, 0)))
    return jax.lax.dynamic_update_slice(
        k_bkchw, padded.reshape(b, tiles, w, kv, h).transpose(0, 3, 1, 4, 2), (0, 0, 0, 0, 0))


def set_key_columns(k_bkchw: jax.Array, rows: jax.Array, columns: jax.Array, new: jax.Array) -> jax.Array:
    """Key columns `columns` of rows `rows` (index arrays that broadcast to one shape I) set to `new` [*I, K, H];
    a column past the cache is dropped."""
    w = k_bkchw.shape[4]
    return k_bkchw.at[rows, :, columns // w, :, columns % w].set(new, mode="drop")


def get_key_columns(k_bkchw: jax.Array, rows: jax.Array, columns: jax.Array) -> jax.Array:
    """Key columns `columns` of rows `rows` (index arrays that broadcast to one shape I): [*I, K, H]."""
    w = k_bkchw.shape[4]
    return k_bkchw[rows, :, columns // w, :, columns % w]


def one_query_scores(q_bkqh: jax.Array, k_bkchw: jax.Array) -> jax.Array:
    """q.k of Q queries per kv head against every column, as a multiply summed over H per tile (XLA:CPU's fast
    form for few queries, module doc): float32 [B, K, Q, S]."""
    b, kv, q, _ = q_bkqh.shape
    s = k_bkchw.shape[2] * k_bkchw.shape[4]
    scores = jnp.sum(q_bkqh.astype(jnp.float32)[:, :, :, None, :, None] * k_bkchw.astype(jnp.float32)[:, :, None],
                     axis=4)
    return scores.reshape(b, kv, q, s)


def matmul_scores(q_bkqh: jax.Array, k_bkchw: jax.Array) -> jax.Array:
    """q.k as a matmul over H per tile (one tile: [Q, H] x [H, S] per row and kv head): float32 [B, K, Q, S]."""
    b, kv, q, _ = q_bkqh.shape
    s = k_bkchw.shape[2] * k_bkchw.shape[4]
    scores = jnp.einsum("bkqh,bkchw->bkqcw", q_bkqh, k_bkchw.astype(q_bkqh.dtype), preferred_element_type=jnp.float32)
    return scores.reshape(b, kv, q, s)
