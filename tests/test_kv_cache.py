"""The KV cache's key tiles (models.kv_cache): every read and write against a plain [B, K, H, S] array, and
generation in tiles equal to generation in one tile (the layout of every platform but XLA:CPU)."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import models.kv_cache as kv_cache
from models import Llama, LlamaConfig
from models.kv_cache import (KVCache, default_key_tile, get_key_columns, key_window_sizes, keys_bkhs, matmul_scores,
                             one_query_scores, set_key_columns, slice_keys, write_first_keys, write_keys_at)

B, K, H, S = 3, 2, 4, 64


def _tiled(k_bkhs: np.ndarray, tile: int) -> jax.Array:
    b, k, h, s = k_bkhs.shape
    return jnp.asarray(k_bkhs.reshape(b, k, h, s // tile, tile).transpose(0, 1, 3, 2, 4))


def _plain(k_bkchw: jax.Array) -> np.ndarray:
    return np.asarray(keys_bkhs(k_bkchw))


@pytest.fixture
def keys() -> np.ndarray:
    return np.random.default_rng(0).normal(size=(B, K, H, S)).astype(np.float32)


@pytest.mark.parametrize("tile", [S, 16, 8])
def test_tiled_keys_read_and_write_what_a_plain_key_array_does(keys, tile):
    rng = np.random.default_rng(1)
    k = _tiled(keys, tile)
    np.testing.assert_array_equal(_plain(k), keys)

    new_btkh = rng.normal(size=(B, 5, K, H)).astype(np.float32)
    expected = keys.copy()
    expected[:, :, :, 21:26] = new_btkh.transpose(0, 2, 3, 1)
    np.testing.assert_array_equal(_plain(write_keys_at(k, jnp.asarray(new_btkh), jnp.int32(21))), expected)

    expected = np.zeros_like(keys)
    expected[:, :, :, :5] = new_btkh.transpose(0, 2, 3, 1)
    np.testing.assert_array_equal(_plain(write_first_keys(jnp.zeros_like(k), jnp.asarray(new_btkh))), expected)

    columns = np.array([[3, 40, S + 2], [63, 0, 17], [S, 9, 31]])  # a column past the cache: dropped
    rows = np.arange(B)[:, None]
    written = set_key_columns(k, rows, jnp.asarray(columns), jnp.asarray(new_btkh[:, :3]))
    expected = keys.copy()
    for b in range(B):
        for i, c in enumerate(columns[b]):
            if c < S:
                expected[b, :, :, c] = new_btkh[b, i]
    np.testing.assert_array_equal(_plain(written), expected)
    inside = np.minimum(columns, S - 1)
    np.testing.assert_array_equal(np.asarray(get_key_columns(k, rows, jnp.asarray(inside))),
                                  keys[rows, :, :, inside].reshape(B, 3, K, H))

    np.testing.assert_array_equal(_plain(slice_keys(k, 32)), keys[..., :32])


@pytest.mark.parametrize("tile", [S, 16])
def test_scores_in_tiles_equal_q_dot_k(keys, tile):
    q = np.random.default_rng(2).normal(size=(B, K, 3, H)).astype(np.float32)
    expected = np.einsum("bkqh,bkhs->bkqs", q.astype(np.float64), keys.astype(np.float64))
    for scores in (one_query_scores, matmul_scores):
        np.testing.assert_allclose(np.asarray(scores(jnp.asarray(q), _tiled(keys, tile))), expected, atol=1e-5)


def test_tile_choice_and_bad_layouts_fail_with_one_clear_line(keys):
    assert default_key_tile(1024, "cpu") == kv_cache.KEY_TILE_CPU
    assert default_key_tile(1000, "cpu") == 1000  # 32 does not divide it: one tile
    assert default_key_tile(1024, "tpu") == 1024
    config = LlamaConfig(vocab_size=16, hidden_size=8, intermediate_size=16, num_layers=2, num_heads=2,
                         num_kv_heads=1, head_dim=4)
    cache = KVCache.init(config, 2, 64, key_tile=16)
    assert cache.k_bkchw[0].shape == (2, 1, 4, 4, 16) and cache.key_tile == 16 and cache.length == 64
    with pytest.raises(ValueError, match="key_tile 24 does not divide the cache length 64"):
        KVCache.init(config, 2, 64, key_tile=24)
    with pytest.raises(ValueError, match="a window of 40 columns is not a whole number of 16-column key tiles"):
        key_window_sizes(_tiled(keys, 16), 40)
    assert key_window_sizes(_tiled(keys, S), 40) == {4: 40}


def test_generation_in_key_tiles_equals_generation_in_one_tile(monkeypatch):
    """Prefill, decode and a continued turn (many queries against the cache), with the keys in tiles of 16 and in
    one tile: the same tokens, logprobs within 1e-5 (the slots engine: tests/test_engine.py)."""
    from models.sampler import Sampler, SamplingParams

    prompts = [[5, 9, 11, 3], [7, 2], [4, 4, 8, 1, 6, 2, 9]]
    feedback = [[3] * 70, [8, 1], [2, 2, 5]]  # the first: more new tokens than one query block
    sampling = SamplingParams(max_new_tokens=12, temperature=1.0)
    runs = {}
    tiny = Llama(LlamaConfig.preset("tiny"), rngs=nnx.Rngs(0))
    for tile in (16, 1 << 30):
        monkeypatch.setattr(kv_cache, "KEY_TILE_CPU", tile)
        sampler = Sampler(tiny)
        first, state = sampler.generate(prompts, sampling, jax.random.key(0), cache_capacity=256)
        assert state.cache.key_tile == min(tile, 256)
        second, _ = sampler.extend(state, feedback, sampling, jax.random.key(1))
        runs[tile] = first + second
    tiled, whole = runs.values()
    assert [c.token_ids for c in tiled] == [c.token_ids for c in whole]
    np.testing.assert_allclose(np.concatenate([c.logprobs for c in tiled]),
                               np.concatenate([c.logprobs for c in whole]), atol=1e-5)
