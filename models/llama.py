"""Llama 3 / 3.1 / 3.3 (and SmolLM2) in Flax NNX, with layers stacked for `lax.scan`.

Names carry their shapes: B batch, T query length, S key/cache length, D model width, N query heads,
K key/value heads, G = N // K query heads per KV head, H head dim, F MLP width, V vocab, L layers.
RoPE uses the rotate-half layout of Hugging Face, so HF q/k weights load with transpose + reshape only.
The same module serves the policy (logits), the sampler (KV cache) and the value model (hidden states).
"""
from __future__ import annotations

from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from models.config import LlamaConfig
from models.kv_cache import (KVCache, keys_bkhs, matmul_scores, one_query_scores, set_key_columns,
                             write_first_keys, write_keys_at)
from models.logprobs import token_logprobs_and_entropy
from models.lora import lora_matmul, merged_delta
from models.sharding import constrain, mesh_active

_MASKED = -1e30  # finite, so a query with no visible key (left padding) gives a uniform row, not NaN

# name -> (logical axes, shape function) of every per-layer parameter; the stacked array has a leading L axis.
LAYER_PARAMS: dict[str, tuple[tuple[str, ...], Any]] = {
    "attn_norm_d": (("norm",), lambda c: (c.hidden_size,)),
    "q_dnh": (("embed", "heads", "head_dim"), lambda c: (c.hidden_size, c.num_heads, c.head_dim)),
    "k_dkh": (("embed", "kv_heads", "head_dim"), lambda c: (c.hidden_size, c.num_kv_heads, c.head_dim)),
    "v_dkh": (("embed", "kv_heads", "head_dim"), lambda c: (c.hidden_size, c.num_kv_heads, c.head_dim)),
    "o_nhd": (("heads", "head_dim", "embed"), lambda c: (c.num_heads, c.head_dim, c.hidden_size)),
    "mlp_norm_d": (("norm",), lambda c: (c.hidden_size,)),
    "gate_df": (("embed", "mlp"), lambda c: (c.hidden_size, c.intermediate_size)),
    "up_df": (("embed", "mlp"), lambda c: (c.hidden_size, c.intermediate_size)),
    "down_fd": (("mlp", "embed"), lambda c: (c.intermediate_size, c.hidden_size)),
}


def rope_inv_freq(config: LlamaConfig) -> np.ndarray:
    """Inverse RoPE frequencies [H/2] in float32, with Llama 3.1 scaling applied when configured."""
    dim = config.head_dim
    exponents = np.arange(0, dim, 2, dtype=np.int64).astype(np.float32) / np.float32(dim)
    inv_freq = (np.float32(1.0) / (np.float32(config.rope_theta) ** exponents)).astype(np.float32)
    scaling = config.rope_scaling
    if scaling is None:
        return inv_freq
    old_context = np.float32(scaling.original_max_position_embeddings)
    low_wavelen = old_context / np.float32(scaling.low_freq_factor)
    high_wavelen = old_context / np.float32(scaling.high_freq_factor)
    wavelen = np.float32(2 * np.pi) / inv_freq
    scaled = np.where(wavelen > low_wavelen, inv_freq / np.float32(scaling.factor), inv_freq)
    smooth = (old_context / wavelen - np.float32(scaling.low_freq_factor)) / np.float32(
        scaling.high_freq_factor - scaling.low_freq_factor)
    smoothed = (1 - smooth) * scaled / np.float32(scaling.factor) + smooth * scaled
    is_medium = ~(wavelen < high_wavelen) & ~(wavelen > low_wavelen)
    return np.where(is_medium, smoothed, scaled).astype(np.float32)


def apply_rope(x_btnh: jax.Array, positions_bt: jax.Array, inv_freq: np.ndarray) -> jax.Array:
    """Rotate-half RoPE: x*cos + rotate_half(x)*sin with angles position * inv_freq (fp32)."""
    freqs = positions_bt.astype(jnp.float32)[..., None] * jnp.asarray(inv_freq)  # [B, T, H/2]
    angles = jnp.concatenate([freqs, freqs], axis=-1)[:, :, None, :]
    cos, sin = jnp.cos(angles).astype(x_btnh.dtype), jnp.sin(angles).astype(x_btnh.dtype)
    half = x_btnh.shape[-1] // 2
    rotated = jnp.concatenate([-x_btnh[..., half:], x_btnh[..., :half]], axis=-1)
    return x_btnh * cos + rotated * sin


def rms_norm(x: jax.Array, scale: jax.Array, eps: float) -> jax.Array:
    """RMSNorm with statistics in fp32, as HF: scale * (x / rms(x)) cast back to x's dtype."""
    x32 = x.astype(jnp.float32)
    normed = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
    return scale.astype(x.dtype) * normed.astype(x.dtype)


def dense(x: jax.Array, w: jax.Array, contract: int = 1, out_dtype: Any = None,
          adapter: tuple[jax.Array, jax.Array] | None = None) -> jax.Array:
    """Contract the last `contract` axes of x with the first `contract` axes of w as one 2-D matmul over all
    leading (token) axes: [..., In] x [In, Out] -> [..., Out].

    Why not einsum("btd,dnh->btnh")? XLA:CPU lays out the backward of 3-D contractions with transposed copies
    of the activations; flattened 2-D matmuls are ~1.7x faster fwd+bwd there (bench/bench_train.py) and
    partition the same way (the merged leading axis keeps the batch sharding, the merged weight axes keep theirs).
    """
    lead, inner = x.shape[:x.ndim - contract], x.shape[x.ndim - contract:]
    if w.shape[:contract] != inner:
        raise ValueError(f"dense: input axes {inner} do not match weight axes {w.shape[:contract]}")
    k = int(np.prod(inner))
    if adapter is None:
        out = jnp.dot(x.reshape(-1, k), w.astype(x.dtype).reshape(k, -1), preferred_element_type=out_dtype)
    else:  # LoRA (A [In..., r], B [r, Out...]): one matmul through W + A B (models.lora.lora_matmul)
        a, b = adapter
        out = lora_matmul(x.reshape(-1, k), w.reshape(k, -1), a.reshape(k, -1), b.reshape(b.shape[0], -1))
    return out.reshape(*lead, *w.shape[contract:])


def project(x: jax.Array, p: dict[str, Any], name: str, contract: int = 1) -> jax.Array:
    """x times the layer weight `name`, through W + A B where `p["lora"]` has an adapter for it (B pre-scaled
    by alpha / r; `models.lora.lora_matmul`), flattened to 2-D as `dense` does."""
    return dense(x, p[name], contract, adapter=p.get("lora", {}).get(name))


def _qkv(x_btd: jax.Array, p: dict[str, Any], positions_bt: jax.Array, inv_freq: np.ndarray
         ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Queries and keys (rotated to their positions) and values of T tokens, through LoRA paths where `p` has
    them (training and scoring; the cached attentions read per-layer weights with the adapters merged in)."""
    return (apply_rope(project(x_btd, p, "q_dnh"), positions_bt, inv_freq),
            apply_rope(project(x_btd, p, "k_dkh"), positions_bt, inv_freq), project(x_btd, p, "v_dkh"))


def _attention_output(cfg: LlamaConfig, q_btnh: jax.Array, k_bskh: jax.Array, v_bskh: jax.Array, p: dict[str, Any],
                      allowed_bts: jax.Array) -> jax.Array:
    """Blocked causal attention of T queries over S = offset + T keys (the last T are the queries' own), then
    the output projection: [B, T, D]."""
    blocks = query_block_count(cfg, q_btnh.shape[1])
    out_btnh = constrain(_blocked_self_attention(q_btnh, k_bskh, v_bskh, allowed_bts, blocks),
                         ("batch", "length", "heads", "head_dim"))
    return project(out_btnh, p, "o_nhd", contract=2)


def _attention(cfg: LlamaConfig, x_btd: jax.Array, p: dict[str, Any], positions_bt: jax.Array,
               allowed_btt: jax.Array, inv_freq: np.ndarray) -> jax.Array:
    """Causal self-attention of one layer over the T tokens themselves (no cache: training, scoring)."""
    q_btnh, k_btkh, v_btkh = _qkv(x_btd, p, positions_bt, inv_freq)
    return _attention_output(cfg, q_btnh, k_btkh, v_btkh, p, allowed_btt)


def _prefixed_attention(cfg: LlamaConfig, xp_upd: jax.Array, xs_btd: jax.Array, p: dict[str, Any],
                        positions_up: jax.Array, positions_bt: jax.Array, allowed_upp: jax.Array,
                        allowed_bts: jax.Array, prefix_row_b: jax.Array, inv_freq: np.ndarray
                        ) -> tuple[jax.Array, jax.Array]:
    """One layer's attention for U prefixes of P tokens and B suffixes of T tokens, suffix b continuing prefix
    prefix_row_b[b]: the prefixes attend to themselves; each suffix to its prefix's keys, then its own
    (`allowed_bts`, S = P + T). Returns the prefix and suffix outputs."""
    qp, kp, vp = _qkv(xp_upd, p, positions_up, inv_freq)
    qs, ks, vs = _qkv(xs_btd, p, positions_bt, inv_freq)
    keys = jnp.concatenate([jnp.take(kp, prefix_row_b, axis=0), ks], axis=1)
    values = jnp.concatenate([jnp.take(vp, prefix_row_b, axis=0), vs], axis=1)
    return (_attention_output(cfg, qp, kp, vp, p, allowed_upp),
            _attention_output(cfg, qs, keys, values, p, allowed_bts))


def _cached_attention(x_btd: jax.Array, p: dict[str, jax.Array], positions_bt: jax.Array, allowed_bts: jax.Array,
                      inv_freq: np.ndarray, k_bkchw: jax.Array, v_bksh: jax.Array, index: jax.Array
                      ) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One layer's attention for T new tokens against its cache: their keys/values are written at slots
    [index, index + T) first, then the queries score the whole cache (`allowed_bts`: valid slots up to each
    query's own). Returns the output and the updated key and value buffers."""
    q_btnh, k_btkh, v_btkh = _qkv(x_btd, p, positions_bt, inv_freq)
    k_bkchw = write_keys_at(k_bkchw, k_btkh.astype(k_bkchw.dtype), index)
    v_bksh = jax.lax.dynamic_update_slice(v_bksh, v_btkh.transpose(0, 2, 1, 3).astype(v_bksh.dtype), (0, 0, index, 0))
    return dense(_attend_cache(q_btnh, k_bkchw, v_bksh, allowed_bts), p["o_nhd"], contract=2), k_bkchw, v_bksh


CACHED_QUERY_BLOCK = 64  # XLA:CPU: queries per block when many new tokens attend to a cache


def _attend_cache(q_btnh: jax.Array, k_bkchw: jax.Array, v_bksh: jax.Array, allowed_bts: jax.Array) -> jax.Array:
    """T queries per row against a cache buffer (keys [B, K, C, H, W] in tiles, `models.kv_cache`; values
    [B, K, S, H]); `allowed_bts` marks the slots each query may see. Returns [B, T, N, H].

    Many queries (a prefill continuing a cache: a feedback turn) read the keys as [B, K, H, S] (`keys_bkhs`: put
    back once per layer when tiled) and on CPU go in blocks of CACHED_QUERY_BLOCK, each block's scores and
    softmax small enough to stay in cache: 1.4x on the attention of 4 rows x 512 new tokens against 1024 or 2048
    columns (SmolLM2 heads, XLA:CPU, interleaved A/B), the same values. Other platforms keep one block, which
    reads the keys and values once.
    """
    t = q_btnh.shape[1]
    if t == 1:
        return _attend_cache_block(q_btnh, k_bkchw, v_bksh, allowed_bts)
    k_bk1hs = keys_bkhs(k_bkchw)[:, :, None]
    if t <= CACHED_QUERY_BLOCK:
        return _attend_cache_block(q_btnh, k_bk1hs, v_bksh, allowed_bts)

    def blocked(q_btnh: jax.Array, k_bk1hs: jax.Array, v_bksh: jax.Array, allowed_bts: jax.Array) -> jax.Array:
        step = CACHED_QUERY_BLOCK
        blocks = [_attend_cache_block(q_btnh[:, i:i + step], k_bk1hs, v_bksh, allowed_bts[:, i:i + step])
                  for i in range(0, t, step)]
        return jnp.concatenate(blocks, axis=1)

    return jax.lax.platform_dependent(q_btnh, k_bk1hs, v_bksh, allowed_bts, cpu=blocked, default=_attend_cache_block)


def _attend_cache_block(q_btnh: jax.Array, k_bkchw: jax.Array, v_bksh: jax.Array, allowed_bts: jax.Array
                        ) -> jax.Array:
    """`_attend_cache` in one block of queries.

    With one query per row (decode) on CPU the scores are an elementwise multiply summed over H within each key
    tile (`models.kv_cache.one_query_scores`; its module doc has the measurements) rather than a batched matmul of
    [G, H] x [H, S] per (row, kv head), which XLA:CPU runs as many tiny matmuls. Other platforms keep the matmul
    (`lax.platform_dependent` picks at lowering): the TPU compiler's byte count of a decode step goes both ways
    (rlef_llama3_1_8b on v5p-64: 31.51 GB per chip with the matmul, 35.75 with the multiply-sum;
    rlef_llama3_1_70b on v5p-256: 64.76 against 56.74), and without a TPU to time them the MXU's form stays."""
    dt = q_btnh.dtype
    b, t, n, h = q_btnh.shape
    kv = k_bkchw.shape[1]
    g = n // kv
    q_bkqh = q_btnh.reshape(b, t, kv, g, h).transpose(0, 2, 3, 1, 4).reshape(b, kv, g * t, h)
    if t == 1:
        scores = jax.lax.platform_dependent(q_bkqh, k_bkchw, cpu=one_query_scores, default=matmul_scores)
    else:
        scores = matmul_scores(q_bkqh, k_bkchw)
    scores = jnp.where(allowed_bts[:, None, None], scores.reshape(b, kv, g, t, -1) * h ** -0.5, _MASKED)
    probs = jax.nn.softmax(scores, axis=-1).astype(dt).reshape(b, kv, g * t, -1)
    out_bkqh = jnp.einsum("bkqs,bksh->bkqh", probs, v_bksh.astype(dt))
    out_btnh = out_bkqh.reshape(b, kv, g, t, h).transpose(0, 3, 1, 2, 4).reshape(b, t, n, h)
    return constrain(out_btnh, ("batch", "length", "heads", "head_dim"))


def _row_cached_attention(x_btd: jax.Array, p: dict[str, jax.Array], positions_bt: jax.Array,
                          columns_bt: jax.Array, allowed_bts: jax.Array, inv_freq: np.ndarray, k_bkchw: jax.Array,
                          v_bksh: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """As `_cached_attention`, but token t of row b is written at its own slot columns_bt[b, t] (each row
    fills its cache at its own pace; a column past the buffer drops the write: padding, idle rows)."""
    q_btnh, k_btkh, v_btkh = _qkv(x_btd, p, positions_bt, inv_freq)
    k_btkh, v_btkh = k_btkh.astype(k_bkchw.dtype), v_btkh.astype(v_bksh.dtype)
    if mesh_active():  # a scatter per row, batched over the rows: each row's writes stay on its own chips, where
        # an index into the sharded row axis makes the partitioner all-gather the new keys and values
        k_bkchw = jax.vmap(lambda k_kchw, c_t, k_tkh: set_key_columns(k_kchw[None], 0, c_t, k_tkh)[0]
                           )(k_bkchw, columns_bt, k_btkh)
        v_bksh = jax.vmap(lambda v_ksh, c_t, v_tkh: v_ksh.at[:, c_t, :].set(v_tkh.transpose(1, 0, 2), mode="drop")
                          )(v_bksh, columns_bt, v_btkh)
    else:  # the same values; 3% faster on XLA:CPU (a SmolLM2 decode step of 32 rows at a 256-column window)
        rows = jnp.arange(x_btd.shape[0])[:, None]
        k_bkchw = set_key_columns(k_bkchw, rows, columns_bt, k_btkh)
        v_bksh = v_bksh.at[rows, :, columns_bt, :].set(v_btkh, mode="drop")
    return dense(_attend_cache(q_btnh, k_bkchw, v_bksh, allowed_bts), p["o_nhd"], contract=2), k_bkchw, v_bksh


def _fresh_cached_attention(cfg: LlamaConfig, x_utd: jax.Array, p: dict[str, jax.Array], positions_ut: jax.Array,
                            allowed_utt: jax.Array, inv_freq: np.ndarray, k_bkchw: jax.Array, v_bksh: jax.Array,
                            rows_b: jax.Array | None) -> tuple[jax.Array, jax.Array, jax.Array]:
    """One layer's attention for the first T tokens of an empty cache: the U input rows attend to themselves
    (blocked causal attention, as without a cache: no score against the empty slots), then cache row b gets the
    keys/values of input row rows_b[b] at slots [0, T) (a prompt shared by several sequences is computed once)."""
    q_utnh, k_utkh, v_utkh = _qkv(x_utd, p, positions_ut, inv_freq)
    out_utnh = _blocked_self_attention(q_utnh, k_utkh, v_utkh, allowed_utt,
                                       query_block_count(cfg, q_utnh.shape[1]))
    out_utnh = constrain(out_utnh, ("batch", "length", "heads", "head_dim"))
    if rows_b is not None:
        k_utkh, v_utkh = jnp.take(k_utkh, rows_b, axis=0), jnp.take(v_utkh, rows_b, axis=0)
    k_bkchw = write_first_keys(k_bkchw, k_utkh.astype(k_bkchw.dtype))
    v_bksh = jax.lax.dynamic_update_slice(v_bksh, v_utkh.transpose(0, 2, 1, 3).astype(v_bksh.dtype), (0, 0, 0, 0))
    return dense(out_utnh, p["o_nhd"], contract=2), k_bkchw, v_bksh


MIN_QUERY_BLOCK = 32  # shorter blocks cost more in small matmuls and copies than the skipped keys save


def query_block_count(config: LlamaConfig, length: int) -> int:
    """How many query blocks cache-less attention over `length` tokens uses: the config's count, but no
    block shorter than MIN_QUERY_BLOCK positions."""
    return max(1, min(config.attention_query_blocks, length // MIN_QUERY_BLOCK))


def _blocked_self_attention(q_btnh: jax.Array, k_bskh: jax.Array, v_bskh: jax.Array, allowed_bts: jax.Array,
                            num_blocks: int) -> jax.Array:
    """T tokens attending to their own keys (no cache), after S - T earlier keys (a shared prefix; usually none),
    the queries split into `num_blocks` blocks; `allowed_bts` is [B, T, S].

    The block of queries [start, end) scores only the keys [0, S - T + end): the later ones are causally masked
    anyway, so 8 blocks skip ~44% of the score and value matmuls (padding is still masked by `allowed_bts`).
    Heads lead ([B, kv heads, group * block, H]) so XLA:CPU's batched matmuls need no transposed copies backwards.
    SmolLM2 layer fwd+bwd at 8 x 256 on 2 CPU cores: 56 ms token-major in one block, 32 ms this way.
    """
    b, t, n, h = q_btnh.shape
    kv = k_bskh.shape[2]
    g = n // kv
    offset = k_bskh.shape[1] - t
    dt = q_btnh.dtype
    q_bkgth = q_btnh.reshape(b, t, kv, g, h).transpose(0, 2, 3, 1, 4)
    k_bksh, v_bksh = k_bskh.transpose(0, 2, 1, 3), v_bskh.transpose(0, 2, 1, 3)
    size = -(-t // num_blocks)
    blocks = []
    for start in range(0, t, size):
        end = min(start + size, t)
        rows, seen = end - start, offset + end
        q_block = q_bkgth[:, :, :, start:end].reshape(b, kv, g * rows, h)
        scores = jnp.einsum("bkqh,bksh->bkqs", q_block, k_bksh[:, :, :seen], preferred_element_type=jnp.float32)
        scores = jnp.where(allowed_bts[:, None, None, start:end, :seen],
                           scores.reshape(b, kv, g, rows, seen) * h ** -0.5, _MASKED)
        probs = jax.nn.softmax(scores, axis=-1).astype(dt).reshape(b, kv, g * rows, seen)
        blocks.append(jnp.einsum("bkqs,bksh->bkqh", probs, v_bksh[:, :, :seen]).reshape(b, kv, g, rows, h))
    out_bkgth = jnp.concatenate(blocks, axis=3) if len(blocks) > 1 else blocks[0]
    return out_bkgth.transpose(0, 3, 1, 2, 4).reshape(b, t, n, h)


def _mlp(x_btd: jax.Array, p: dict[str, Any]) -> jax.Array:
    gate, up = project(x_btd, p, "gate_df"), project(x_btd, p, "up_df")
    act = constrain(jax.nn.silu(gate) * up, ("batch", "length", "mlp"))
    return project(act, p, "down_fd")


class DecoderStack(nnx.Module):
    """All decoder layers, each parameter stacked on a leading layer axis and run with `lax.scan`."""

    def __init__(self, config: LlamaConfig, *, rngs: nnx.Rngs):
        self.config = config
        init = nnx.initializers.normal(config.initializer_range)
        for name, (axes, shape_fn) in LAYER_PARAMS.items():
            shape = (config.num_layers,) + shape_fn(config)
            if name.endswith("norm_d"):
                value = jnp.ones(shape, config.param_dtype)
            else:
                value = init(rngs.params(), shape, config.param_dtype)
            setattr(self, name, nnx.Param(value, axes=("layers",) + axes))

    def __call__(self, h_btd: jax.Array, positions_bt: jax.Array, allowed_btt: jax.Array) -> jax.Array:
        """All layers over T tokens without a cache, as one `lax.scan` (with the configured remat)."""
        cfg = self.config
        inv_freq = rope_inv_freq(cfg)

        def layer(h, p):
            h = h + _attention(cfg, rms_norm(h, p["attn_norm_d"], cfg.rms_norm_eps), p, positions_bt, allowed_btt,
                               inv_freq)
            return self._mlp_block(h, p), None

        h_btd, _ = jax.lax.scan(self._remat(layer), h_btd, self._stacked())
        return h_btd

    def with_shared_prefix(self, hp_upd: jax.Array, positions_up: jax.Array, allowed_upp: jax.Array,
                           hs_btd: jax.Array, positions_bt: jax.Array, allowed_bts: jax.Array,
                           prefix_row_b: jax.Array) -> jax.Array:
        """All layers over U prefixes [U, P] and B suffixes [B, T], suffix b continuing prefix prefix_row_b[b]
        (`allowed_bts` over S = P + T keys: its prefix's, then its own), without a cache: a prompt that G
        sequences share is computed once forward and backward (its gradient sums over the G). The same scan
        and remat as `__call__`; returns the suffixes' hidden states [B, T, D]."""
        cfg = self.config
        inv_freq = rope_inv_freq(cfg)

        def layer(carry, p):
            hp, hs = carry
            attn_p, attn_s = _prefixed_attention(cfg, rms_norm(hp, p["attn_norm_d"], cfg.rms_norm_eps),
                                                 rms_norm(hs, p["attn_norm_d"], cfg.rms_norm_eps), p, positions_up,
                                                 positions_bt, allowed_upp, allowed_bts, prefix_row_b, inv_freq)
            return (self._mlp_block(hp + attn_p, p), self._mlp_block(hs + attn_s, p)), None

        (_, hs_btd), _ = jax.lax.scan(self._remat(layer), (hp_upd, hs_btd), self._stacked())
        return hs_btd

    def _stacked(self) -> dict[str, Any]:
        """The stacked [L, ...] layer weights, with the LoRA adapters (B pre-scaled) under "lora"."""
        params: dict[str, Any] = {name: getattr(self, name)[...] for name in LAYER_PARAMS}
        if getattr(self, "lora", None) is not None:
            params["lora"] = self.lora.stacked(scaled=True)
        return params

    def _mlp_block(self, h_btd: jax.Array, p: dict[str, Any]) -> jax.Array:
        h_btd = h_btd + _mlp(rms_norm(h_btd, p["mlp_norm_d"], self.config.rms_norm_eps), p)
        return constrain(h_btd, ("batch", "length", "act_embed"))

    def _remat(self, layer: Any) -> Any:
        """`layer` under the configured rematerialisation policy."""
        if self.config.remat == "full":
            return jax.checkpoint(layer)
        if self.config.remat == "dots_saveable":
            return jax.checkpoint(layer, policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable)
        return layer

    def per_layer(self) -> tuple[dict[str, jax.Array], ...]:
        """Each layer's weights as separate arrays (a copy of the stacks), for `with_cache`, with LoRA adapters
        merged in (W + alpha / r * A B), in the compute dtype (`config.dtype`: with float32 master weights and
        bfloat16 compute, the sampler's copies are bfloat16). Every weight keeps its stack's layout: output-major
        copies of the MLP's gate and up ([F, D]), once faster on XLA:CPU, made a SmolLM2 decode step 5-10% slower
        with jaxlib 0.10.2 (4 to 32 rows, 128- to 1024-column windows; 2026-12-07)."""
        adapters = {} if getattr(self, "lora", None) is None else self.lora.stacked()
        scale = self.lora.config.scale if adapters else 1.0
        compute = jnp.dtype(self.config.dtype)
        layers = []
        for i in range(self.config.num_layers):
            p = {name: getattr(self, name)[i] for name in LAYER_PARAMS}
            for name, (a, b) in adapters.items():
                p[name] = p[name] + merged_delta(a[i], b[i], scale)
            layers.append({name: w.astype(compute) for name, w in p.items()})
        return tuple(layers)

    def with_cache(self, h_btd: jax.Array, positions_bt: jax.Array, mask_bt: jax.Array, cache: KVCache,
                   layers: Sequence[dict[str, jax.Array]] | None = None, *, fresh: bool = False,
                   rows_b: jax.Array | None = None) -> tuple[jax.Array, KVCache]:
        """All layers over T new tokens (`mask_bt`: real ones) appended to `cache` at slots [index, index + T).

        A Python loop over the layers, not a scan, reading `layers` (from `per_layer()`, default: sliced here):
        a decode step reads every weight once, and XLA:CPU materialises every slice of a stacked weight or cache
        (scanned or not) as a copy, ~45% of a SmolLM2 decode step. A sampler slices the weights once per call
        (outside its decode loop); each layer's cache is its own buffer, updated in place.

        fresh: the cache is empty (index 0), so the tokens attend only to each other (no scores against empty
        slots). Then `rows_b` may map cache row b to input row rows_b[b]: the U input rows are computed once
        and the hidden states returned are theirs ([U, T, D]).
        """
        cfg = self.config
        inv_freq = rope_inv_freq(cfg)
        t = h_btd.shape[1]
        if rows_b is not None and not fresh:
            raise ValueError("DecoderStack.with_cache: rows_b (shared rows) needs fresh=True")
        if fresh:
            allowed = jnp.tril(jnp.ones((t, t), bool))[None] & mask_bt[:, None, :]
            cache_mask_bt = mask_bt if rows_b is None else jnp.take(mask_bt, rows_b, axis=0)
            valid_bs = jax.lax.dynamic_update_slice(jnp.zeros_like(cache.valid_bs), cache_mask_bt, (0, 0))
            index = jnp.zeros((), jnp.int32)
        else:
            valid_bs = jax.lax.dynamic_update_slice(cache.valid_bs, mask_bt, (0, cache.index))
            visible_ts = jnp.arange(cache.length)[None, :] <= cache.index + jnp.arange(t)[:, None]
            allowed = valid_bs[:, None, :] & visible_ts[None]
            index = cache.index
        if fresh:
            def attention(x_btd, p, k_bkchw, v_bksh):
                return _fresh_cached_attention(cfg, x_btd, p, positions_bt, allowed, inv_freq, k_bkchw, v_bksh,
                                               rows_b)
        else:
            def attention(x_btd, p, k_bkchw, v_bksh):
                return _cached_attention(x_btd, p, positions_bt, allowed, inv_freq, k_bkchw, v_bksh, index)
        h_btd, keys, values = self._over_cache(h_btd, cache, self.per_layer() if layers is None else layers,
                                               attention)
        return h_btd, KVCache(keys, values, valid_bs, index + t)

    def with_row_cache(self, h_btd: jax.Array, positions_bt: jax.Array, columns_bt: jax.Array, cache: KVCache,
                       layers: Sequence[dict[str, jax.Array]]) -> tuple[jax.Array, KVCache]:
        """All layers over T tokens per row written at the row's own cache slots `columns_bt` (a column >= the
        cache length: not written, e.g. padding or a row that takes no token now). Each query sees the valid
        slots up to its own column. The cache's `index` is not used (rows keep their own fill)."""
        cfg = self.config
        inv_freq = rope_inv_freq(cfg)
        rows = jnp.arange(h_btd.shape[0])[:, None]
        valid_bs = cache.valid_bs.at[rows, columns_bt].set(True, mode="drop")
        allowed_bts = valid_bs[:, None, :] & (jnp.arange(cache.length)[None, None, :] <= columns_bt[:, :, None])
        h_btd, keys, values = self._over_cache(h_btd, cache, layers, lambda x_btd, p, k_bkchw, v_bksh: (
            _row_cached_attention(x_btd, p, positions_bt, columns_bt, allowed_bts, inv_freq, k_bkchw, v_bksh)))
        return h_btd, KVCache(keys, values, valid_bs, cache.index)

    def _over_cache(self, h_btd: jax.Array, cache: KVCache, layers: Sequence[dict[str, jax.Array]],
                    attention: Any) -> tuple[jax.Array, tuple[jax.Array, ...], tuple[jax.Array, ...]]:
        """Every layer in a Python loop: `attention(x_btd, p, k_bkchw, v_bksh) -> (out, k_bkchw, v_bksh)` against
        that layer's cache buffers, then the MLP. Returns the hidden states and each layer's new buffers."""
        eps = self.config.rms_norm_eps
        keys, values = [], []
        for p, k_bkchw, v_bksh in zip(layers, cache.k_bkchw, cache.v_bksh):
            attn, k_bkchw, v_bksh = attention(rms_norm(h_btd, p["attn_norm_d"], eps), p, k_bkchw, v_bksh)
            h_btd = h_btd + attn
            h_btd = constrain(h_btd + _mlp(rms_norm(h_btd, p["mlp_norm_d"], eps), p), ("batch", "length", "act_embed"))
            keys.append(k_bkchw)
            values.append(v_bksh)
        return h_btd, tuple(keys), tuple(values)


class Llama(nnx.Module):
    """Decoder-only Llama. `__call__` gives fp32 logits [B, T, V]; `hidden_states` the final-normed [B, T, D]."""

    def __init__(self, config: LlamaConfig, *, rngs: nnx.Rngs):
        self.config = config
        init = nnx.initializers.normal(config.initializer_range)
        d, v = config.hidden_size, config.vocab_size
        self.embed_vd = nnx.Param(init(rngs.params(), (v, d), config.param_dtype), axes=("vocab", "embed"))
        self.layers = DecoderStack(config, rngs=rngs)
        self.final_norm_d = nnx.Param(jnp.ones((d,), config.param_dtype), axes=("norm",))
        if not config.tie_word_embeddings:
            self.lm_head_dv = nnx.Param(init(rngs.params(), (d, v), config.param_dtype), axes=("embed", "vocab"))

    def hidden_states(self, tokens_bt: jax.Array, positions_bt: jax.Array | None = None,
                      attention_mask_bt: jax.Array | None = None, cache: KVCache | None = None,
                      layers: Sequence[dict[str, jax.Array]] | None = None, *, fresh: bool = False,
                      rows_b: jax.Array | None = None) -> tuple[jax.Array, KVCache | None]:
        """Final-normed hidden states. With `cache`, tokens are written at slots [index, index + T), reading
        the per-layer weights `layers` (`self.layers.per_layer()`) when given; `fresh` and `rows_b` as in
        `DecoderStack.with_cache` (an empty cache; cache rows that share an input row).

        attention_mask_bt: 1/True for real tokens, 0 for padding (left or right). Without a cache,
        positions default to the count of real tokens before each one (HF's left-padding convention).
        """
        b, t = tokens_bt.shape
        mask_bt = (jnp.ones((b, t), bool) if attention_mask_bt is None else attention_mask_bt.astype(bool))
        if positions_bt is None:
            if cache is not None:
                raise ValueError("Llama.hidden_states: positions_bt is required when a KV cache is given")
            positions_bt = jnp.maximum(jnp.cumsum(mask_bt, axis=-1) - 1, 0)
        h_btd = self.embed(tokens_bt)
        if cache is None:
            allowed_btt = jnp.tril(jnp.ones((t, t), bool))[None] & mask_bt[:, None, :]
            h_btd = self.layers(h_btd, positions_bt, allowed_btt)
        else:
            h_btd, cache = self.layers.with_cache(h_btd, positions_bt, mask_bt, cache, layers, fresh=fresh,
                                                  rows_b=rows_b)
        return self.final_norm(h_btd), cache

    def hidden_states_shared_prefix(self, prefix_tokens_up: jax.Array, prefix_positions_up: jax.Array,
                                    prefix_valid_up: jax.Array, tokens_bt: jax.Array, positions_bt: jax.Array,
                                    valid_bt: jax.Array, prefix_row_b: jax.Array) -> jax.Array:
        """Final-normed hidden states [B, T, D] of B suffixes, suffix b continuing the prefix
        prefix_row_b[b] of U prefixes (each computed once; `DecoderStack.with_shared_prefix`). Equals
        `hidden_states` of the concatenated rows at the suffix positions. Valid masks mark real tokens; a
        suffix's first token is the last token before the positions whose log-probabilities are wanted."""
        p, t = prefix_tokens_up.shape[1], tokens_bt.shape[1]
        causal = jnp.tril(jnp.ones((max(p, t), max(p, t)), bool))
        allowed_upp = causal[None, :p, :p] & prefix_valid_up[:, None, :]
        prefix_bs = jnp.broadcast_to(jnp.take(prefix_valid_up, prefix_row_b, axis=0)[:, None, :],
                                     (tokens_bt.shape[0], t, p))
        allowed_bts = jnp.concatenate([prefix_bs, causal[None, :t, :t] & valid_bt[:, None, :]], axis=2)
        h_btd = self.layers.with_shared_prefix(self.embed(prefix_tokens_up), prefix_positions_up, allowed_upp,
                                               self.embed(tokens_bt), positions_bt, allowed_bts, prefix_row_b)
        return self.final_norm(h_btd)

    def embed(self, tokens_bt: jax.Array) -> jax.Array:
        """Token embeddings [B, T, D] in the compute dtype."""
        h_btd = jnp.take(self.embed_vd[...], tokens_bt, axis=0).astype(jnp.dtype(self.config.dtype))
        return constrain(h_btd, ("batch", "length", "act_embed"))

    def final_norm(self, h_btd: jax.Array) -> jax.Array:
        return rms_norm(h_btd, self.final_norm_d[...], self.config.rms_norm_eps)

    def logits(self, h_btd: jax.Array) -> jax.Array:
        head_dv = self.embed_vd[...].T if self.config.tie_word_embeddings else self.lm_head_dv[...]
        return constrain(dense(h_btd, head_dv, out_dtype=jnp.float32), ("batch", "length", "vocab"))

    def token_logprobs(self, h_btd: jax.Array, targets_bt: jax.Array, temperature: float = 1.0,
                       chunk_len: int = 32) -> tuple[jax.Array, jax.Array]:
        """fp32 [B, T] log softmax(logits / temperature)[targets] and the entropy there, computed in chunks of
        `chunk_len` positions without materialising [B, T, V] logits (models/logprobs.py)."""
        if self.config.tie_word_embeddings:
            head, vocab_axis = self.embed_vd[...], 0
        else:
            head, vocab_axis = self.lm_head_dv[...], 1
        return token_logprobs_and_entropy(h_btd, head, targets_bt, vocab_axis, float(temperature),
                                          min(int(chunk_len), h_btd.shape[1]))

    def __call__(self, tokens_bt: jax.Array, positions_bt: jax.Array | None = None,
                 attention_mask_bt: jax.Array | None = None, cache: KVCache | None = None,
                 layers: Sequence[dict[str, jax.Array]] | None = None) -> tuple[jax.Array, KVCache | None]:
        h_btd, cache = self.hidden_states(tokens_bt, positions_bt, attention_mask_bt, cache, layers)
        return self.logits(h_btd), cache


class LlamaValueModel(nnx.Module):
    """A Llama backbone with a scalar head: values [B, T] (fp32) from the final hidden states (PPO critic)."""

    def __init__(self, config: LlamaConfig, *, rngs: nnx.Rngs):
        self.backbone = Llama(config, rngs=rngs)
        self.value_head_d = nnx.Param(jnp.zeros((config.hidden_size,), jnp.float32), axes=("embed",))
        self.value_bias = nnx.Param(jnp.zeros((), jnp.float32), axes=())

    def __call__(self, tokens_bt: jax.Array, positions_bt: jax.Array | None = None,
                 attention_mask_bt: jax.Array | None = None) -> jax.Array:
        h_btd, _ = self.backbone.hidden_states(tokens_bt, positions_bt, attention_mask_bt)
        return jnp.einsum("btd,d->bt", h_btd.astype(jnp.float32), self.value_head_d[...]) + self.value_bias[...]
