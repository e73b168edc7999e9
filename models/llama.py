"""Llama 3 / 3.1 / 3.3 (and SmolLM2) in Flax NNX, with layers stacked for `lax.scan`.

Names carry their shapes: B batch, T query length, S key/cache length, D model width, N query heads,
K key/value heads, G = N // K query heads per KV head, H head dim, F MLP width, V vocab, L layers.
RoPE uses the rotate-half layout of Hugging Face, so HF q/k weights load with transpose + reshape only.
The same module serves the policy (logits), the sampler (KV cache) and the value model (hidden states).
"""
from __future__ import annotations

from typing import Any

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from models.config import LlamaConfig
from models.logprobs import token_logprobs_and_entropy
from models.sharding import constrain

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


@flax.struct.dataclass
class KVCache:
    """Static-shape KV cache for all layers. Slots [0, index) are written; `valid` marks non-padding slots."""

    k_lbskh: jax.Array
    v_lbskh: jax.Array
    valid_bs: jax.Array  # bool
    index: jax.Array  # int32 scalar: the next slot to write

    @classmethod
    def init(cls, config: LlamaConfig, batch: int, length: int, dtype: Any = None) -> "KVCache":
        shape = (config.num_layers, batch, length, config.num_kv_heads, config.head_dim)
        dtype = dtype or config.dtype
        return cls(jnp.zeros(shape, dtype), jnp.zeros(shape, dtype), jnp.zeros((batch, length), bool),
                   jnp.zeros((), jnp.int32))

    @property
    def length(self) -> int:
        return self.k_lbskh.shape[2]


def dense(x: jax.Array, w: jax.Array, contract: int = 1, out_dtype: Any = None) -> jax.Array:
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
    out = jnp.dot(x.reshape(-1, k), w.astype(x.dtype).reshape(k, -1), preferred_element_type=out_dtype)
    return out.reshape(*lead, *w.shape[contract:])


def _attention(cfg: LlamaConfig, x_btd: jax.Array, p: dict[str, jax.Array], positions_bt: jax.Array,
               allowed_new_btt: jax.Array, inv_freq: np.ndarray,
               cached: tuple[jax.Array, jax.Array, jax.Array] | None) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Self-attention of one layer over the cached keys (read only) and the T new tokens' own keys.

    cached = (k_bskh, v_bskh, allowed_old_bts) of this layer, or None without a cache. The two score blocks share
    one softmax. Returns the output and the new keys/values, which the caller writes into the cache once for
    all layers (so the cache is never copied per layer).
    """
    dt = x_btd.dtype
    q_btnh = apply_rope(dense(x_btd, p["q_dnh"]), positions_bt, inv_freq)
    k_btkh = apply_rope(dense(x_btd, p["k_dkh"]), positions_bt, inv_freq)
    v_btkh = dense(x_btd, p["v_dkh"])
    if cached is None:
        blocks = query_block_count(cfg, q_btnh.shape[1])
        out_btnh = _blocked_self_attention(q_btnh, k_btkh, v_btkh, allowed_new_btt, blocks)
    else:
        b, t, n, h = q_btnh.shape
        kv = cfg.num_kv_heads
        q_btkgh = q_btnh.reshape(b, t, kv, n // kv, h)
        scale = h ** -0.5
        k_bskh, v_bskh, allowed_old_bts = cached
        new = jnp.einsum("btkgh,bskh->bkgts", q_btkgh, k_btkh, preferred_element_type=jnp.float32)
        new = jnp.where(allowed_new_btt[:, None, None], new * scale, _MASKED)
        old = jnp.einsum("btkgh,bskh->bkgts", q_btkgh, k_bskh.astype(dt), preferred_element_type=jnp.float32)
        old = jnp.where(allowed_old_bts[:, None, None], old * scale, _MASKED)
        probs = jax.nn.softmax(jnp.concatenate([old, new], axis=-1), axis=-1).astype(dt)
        s = old.shape[-1]
        out_btkgh = (jnp.einsum("bkgts,bskh->btkgh", probs[..., :s], v_bskh.astype(dt))
                     + jnp.einsum("bkgts,bskh->btkgh", probs[..., s:], v_btkh))
        out_btnh = out_btkgh.reshape(b, t, n, h)
    out_btnh = constrain(out_btnh, ("batch", "length", "heads", "head_dim"))
    return dense(out_btnh, p["o_nhd"], contract=2), k_btkh, v_btkh


MIN_QUERY_BLOCK = 32  # shorter blocks cost more in small matmuls and copies than the skipped keys save


def query_block_count(config: LlamaConfig, length: int) -> int:
    """How many query blocks cache-less attention over `length` tokens uses: the config's count, but no
    block shorter than MIN_QUERY_BLOCK positions."""
    return max(1, min(config.attention_query_blocks, length // MIN_QUERY_BLOCK))


def _blocked_self_attention(q_btnh: jax.Array, k_btkh: jax.Array, v_btkh: jax.Array, allowed_btt: jax.Array,
                            num_blocks: int) -> jax.Array:
    """T tokens attending to their own keys (no cache), the queries split into `num_blocks` blocks.

    The block of queries [start, end) scores only the keys [0, end): the later ones are causally masked anyway,
    so 8 blocks skip ~44% of the score and value matmuls (padding is still masked by `allowed_btt`). Heads lead
    ([B, kv heads, group * block, H]) so XLA:CPU's batched matmuls need no transposed copies backwards.
    SmolLM2 layer fwd+bwd at 8 x 256 on 2 CPU cores: 56 ms token-major in one block, 32 ms this way.
    """
    b, t, n, h = q_btnh.shape
    kv = k_btkh.shape[2]
    g = n // kv
    dt = q_btnh.dtype
    q_bkgth = q_btnh.reshape(b, t, kv, g, h).transpose(0, 2, 3, 1, 4)
    k_bksh, v_bksh = k_btkh.transpose(0, 2, 1, 3), v_btkh.transpose(0, 2, 1, 3)
    size = -(-t // num_blocks)
    blocks = []
    for start in range(0, t, size):
        end = min(start + size, t)
        rows = end - start
        q_block = q_bkgth[:, :, :, start:end].reshape(b, kv, g * rows, h)
        scores = jnp.einsum("bkqh,bksh->bkqs", q_block, k_bksh[:, :, :end], preferred_element_type=jnp.float32)
        scores = jnp.where(allowed_btt[:, None, None, start:end, :end], scores.reshape(b, kv, g, rows, end) * h ** -0.5,
                           _MASKED)
        probs = jax.nn.softmax(scores, axis=-1).astype(dt).reshape(b, kv, g * rows, end)
        blocks.append(jnp.einsum("bkqs,bksh->bkqh", probs, v_bksh[:, :, :end]).reshape(b, kv, g, rows, h))
    out_bkgth = jnp.concatenate(blocks, axis=3) if len(blocks) > 1 else blocks[0]
    return out_bkgth.transpose(0, 3, 1, 2, 4).reshape(b, t, n, h)


def _mlp(x_btd: jax.Array, p: dict[str, jax.Array]) -> jax.Array:
    act = constrain(jax.nn.silu(dense(x_btd, p["gate_df"])) * dense(x_btd, p["up_df"]), ("batch", "length", "mlp"))
    return dense(act, p["down_fd"])


class DecoderStack(nnx.Module):
    """All decoder layers, each parameter stacked on a leading layer axis and run with `lax.scan`."""

    def __init__(self, config: LlamaConfig, *, rngs: nnx.Rngs):
        self.config = config
        init = nnx.initializers.normal(0.02)
        for name, (axes, shape_fn) in LAYER_PARAMS.items():
            shape = (config.num_layers,) + shape_fn(config)
            if name.endswith("norm_d"):
                value = jnp.ones(shape, config.param_dtype)
            else:
                value = init(rngs.params(), shape, config.param_dtype)
            setattr(self, name, nnx.Param(value, axes=("layers",) + axes))

    def __call__(self, h_btd: jax.Array, positions_bt: jax.Array, allowed_new_btt: jax.Array,
                 cache: KVCache | None, mask_bt: jax.Array) -> tuple[jax.Array, KVCache | None]:
        cfg = self.config
        inv_freq = rope_inv_freq(cfg)
        params = {name: getattr(self, name)[...] for name in LAYER_PARAMS}
        allowed_old_bts = cache.valid_bs[:, None, :] if cache is not None else None

        def layer(h, xs):
            p, cached_kv = xs
            cached = None if cached_kv is None else (*cached_kv, allowed_old_bts)
            attn, k_new, v_new = _attention(cfg, rms_norm(h, p["attn_norm_d"], cfg.rms_norm_eps), p, positions_bt,
                                            allowed_new_btt, inv_freq, cached)
            h = h + attn
            h = h + _mlp(rms_norm(h, p["mlp_norm_d"], cfg.rms_norm_eps), p)
            new_kv = None if cache is None else (k_new, v_new)
            return constrain(h, ("batch", "length", "act_embed")), new_kv

        if cfg.remat == "full":
            layer = jax.checkpoint(layer)
        elif cfg.remat == "dots_saveable":
            layer = jax.checkpoint(layer, policy=jax.checkpoint_policies.dots_with_no_batch_dims_saveable)
        cache_xs = (cache.k_lbskh, cache.v_lbskh) if cache is not None else None
        h_btd, new_kv = jax.lax.scan(layer, h_btd, (params, cache_xs))
        if cache is None:
            return h_btd, None
        # one in-place write of all layers' new keys/values at slots [index, index + T)
        start = (0, 0, cache.index, 0, 0)
        k_all = jax.lax.dynamic_update_slice(cache.k_lbskh, new_kv[0].astype(cache.k_lbskh.dtype), start)
        v_all = jax.lax.dynamic_update_slice(cache.v_lbskh, new_kv[1].astype(cache.v_lbskh.dtype), start)
        valid = jax.lax.dynamic_update_slice(cache.valid_bs, mask_bt, (0, cache.index))
        t = h_btd.shape[1]
        return h_btd, KVCache(k_all, v_all, valid, cache.index + t)


class Llama(nnx.Module):
    """Decoder-only Llama. `__call__` gives fp32 logits [B, T, V]; `hidden_states` the final-normed [B, T, D]."""

    def __init__(self, config: LlamaConfig, *, rngs: nnx.Rngs):
        self.config = config
        init = nnx.initializers.normal(0.02)
        d, v = config.hidden_size, config.vocab_size
        self.embed_vd = nnx.Param(init(rngs.params(), (v, d), config.param_dtype), axes=("vocab", "embed"))
        self.layers = DecoderStack(config, rngs=rngs)
        self.final_norm_d = nnx.Param(jnp.ones((d,), config.param_dtype), axes=("norm",))
        if not config.tie_word_embeddings:
            self.lm_head_dv = nnx.Param(init(rngs.params(), (d, v), config.param_dtype), axes=("embed", "vocab"))

    def hidden_states(self, tokens_bt: jax.Array, positions_bt: jax.Array | None = None,
                      attention_mask_bt: jax.Array | None = None, cache: KVCache | None = None
                      ) -> tuple[jax.Array, KVCache | None]:
        """Final-normed hidden states. With `cache`, tokens are written at slots [index, index + T).

        attention_mask_bt: 1/True for real tokens, 0 for padding (left or right). Without a cache,
        positions default to the count of real tokens before each one (HF's left-padding convention).
        """
        b, t = tokens_bt.shape
        mask_bt = (jnp.ones((b, t), bool) if attention_mask_bt is None else attention_mask_bt.astype(bool))
        if positions_bt is None:
            if cache is not None:
                raise ValueError("Llama.hidden_states: positions_bt is required when a KV cache is given")
            positions_bt = jnp.maximum(jnp.cumsum(mask_bt, axis=-1) - 1, 0)
        allowed_new_btt = jnp.tril(jnp.ones((t, t), bool))[None] & mask_bt[:, None, :]
        dt = jnp.dtype(self.config.dtype)
        h_btd = constrain(jnp.take(self.embed_vd[...], tokens_bt, axis=0).astype(dt), ("batch", "length", "act_embed"))
        h_btd, cache = self.layers(h_btd, positions_bt, allowed_new_btt, cache, mask_bt)
        return rms_norm(h_btd, self.final_norm_d[...], self.config.rms_norm_eps), cache

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
                 attention_mask_bt: jax.Array | None = None, cache: KVCache | None = None
                 ) -> tuple[jax.Array, KVCache | None]:
        h_btd, cache = self.hidden_states(tokens_bt, positions_bt, attention_mask_bt, cache)
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
