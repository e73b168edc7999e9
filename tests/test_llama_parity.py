"""Logits parity of models.Llama with transformers' LlamaForCausalLM (fp32, max abs diff <= 1e-4)."""
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import models
from models.checkpoint import convert_hf_to_checkpoint
from tests.conftest import hf_tiny_llama, random_ids

LLAMA3_SCALING = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 32}
CASES = {
    "gqa_llama3_scaling_untied": dict(rope_scaling=LLAMA3_SCALING),
    "tied_mha_plain_rope": dict(num_key_value_heads=6, tie_word_embeddings=True),
    "odd_sizes_mqa": dict(vocab_size=97, hidden_size=40, intermediate_size=72, num_attention_heads=5,
                          num_key_value_heads=1, head_dim=6, num_hidden_layers=2),
}


def _reference(model, ids, mask=None, positions=None):
    with torch.no_grad():
        kwargs = {}
        if mask is not None:
            kwargs = dict(attention_mask=torch.tensor(mask), position_ids=torch.tensor(positions))
        return model(torch.tensor(ids), **kwargs).logits.float().numpy()


@pytest.mark.parametrize("case", sorted(CASES))
def test_logits_match_transformers_after_from_hf_and_convert_cycle(tmp_path, case):
    hf_dir, hf_model = hf_tiny_llama(tmp_path, **CASES[case])
    vocab = hf_model.config.vocab_size
    ids = random_ids(1, (2, 70), vocab)  # longer than original context 32: exercises the scaled frequencies
    ref = _reference(hf_model, ids)
    direct = models.from_hf(hf_dir)
    ckpt = convert_hf_to_checkpoint(hf_dir, tmp_path / "ckpt")
    cycled = models.load_checkpoint(ckpt)
    for model in (direct, cycled):
        got, _ = model(jnp.asarray(ids))
        assert np.abs(np.asarray(got) - ref).max() <= 1e-4


def test_left_padded_batch_matches_unpadded_rows(tmp_path):
    hf_dir, hf_model = hf_tiny_llama(tmp_path, rope_scaling=LLAMA3_SCALING)
    ours = models.from_hf(hf_dir)
    lengths = [12, 5, 9]
    width = max(lengths)
    ids = np.zeros((3, width), np.int64)
    mask = np.zeros((3, width), np.int64)
    for row, n in enumerate(lengths):
        ids[row, width - n:] = random_ids(row, (n,), 301)
        mask[row, width - n:] = 1
    positions = np.maximum(np.cumsum(mask, -1) - 1, 0)
    got, _ = ours(jnp.asarray(ids), attention_mask_bt=jnp.asarray(mask))
    got = np.asarray(got)
    ref = _reference(hf_model, ids, mask, positions)
    for row, n in enumerate(lengths):
        alone = _reference(hf_model, ids[row:row + 1, width - n:])[0]
        assert np.abs(got[row, width - n:] - alone).max() <= 1e-4
        assert np.abs(got[row, width - n:] - ref[row, width - n:]).max() <= 1e-4


def test_kv_cache_prefill_then_steps_equals_full_forward(tmp_path):
    hf_dir, _ = hf_tiny_llama(tmp_path)
    model = models.from_hf(hf_dir)
    ids = jnp.asarray(random_ids(3, (2, 11), 301))
    full, _ = model(ids)
    cache = models.KVCache.init(model.config, 2, 16)
    first, cache = model(ids[:, :8], positions_bt=jnp.broadcast_to(jnp.arange(8), (2, 8)), cache=cache)
    rest, cache = model(ids[:, 8:], positions_bt=jnp.broadcast_to(jnp.arange(8, 11), (2, 3)), cache=cache)
    assert int(cache.index) == 11
    assert np.abs(np.asarray(jnp.concatenate([first, rest], 1)) - np.asarray(full)).max() <= 1e-5


def test_bf16_and_remat_forward_close_to_fp32(tmp_path):
    hf_dir, _ = hf_tiny_llama(tmp_path)
    ids = jnp.asarray(random_ids(4, (1, 20), 301))
    ref, _ = models.from_hf(hf_dir)(ids)
    low, _ = models.from_hf(hf_dir, dtype="bfloat16")(ids)
    cfg, params = models.convert.read_hf_params(hf_dir)
    remat = models.checkpoint.model_from_params(cfg.replace(remat="full"), params)
    again, _ = remat(ids)
    assert np.abs(np.asarray(again) - np.asarray(ref)).max() <= 1e-6
    assert np.abs(np.asarray(low) - np.asarray(ref)).max() <= 0.1  # bf16 activations, fp32 softmax/norm stats


def test_value_model_gives_one_value_per_token():
    cfg = models.LlamaConfig.preset("tiny")
    value = models.LlamaValueModel(cfg, rngs=__import__("flax").nnx.Rngs(0))
    out = value(jnp.ones((2, 7), jnp.int32))
    assert out.shape == (2, 7) and out.dtype == jnp.float32


def test_query_blocks_and_remat_leave_outputs_and_gradients_unchanged(tmp_path):
    import jax
    from flax import nnx

    hf_dir, _ = hf_tiny_llama(tmp_path)
    cfg, params = models.convert.read_hf_params(hf_dir)
    ids = jnp.asarray(random_ids(5, (2, 100), 301))  # 8 blocks of >= 32 positions: 3 (34, 34, 32 queries)
    mask = jnp.asarray([[0] * 40 + [1] * 60, [1] * 100])  # left padding: real rows must not change

    def logits_and_grads(**execution):
        model = models.checkpoint.model_from_params(cfg.replace(**execution), params)
        graphdef, state = nnx.split(model)

        def loss(state):
            logits, _ = nnx.merge(graphdef, state)(ids, attention_mask_bt=mask)
            return jnp.sum(jnp.where(mask[..., None] == 1, jnp.tanh(logits), 0.0)), logits

        (_, logits), grads = jax.value_and_grad(loss, has_aux=True)(state)
        return np.asarray(logits)[np.asarray(mask) == 1], jax.tree.leaves(grads)

    ref_logits, ref_grads = logits_and_grads(attention_query_blocks=1)
    for execution in (dict(attention_query_blocks=2), dict(attention_query_blocks=8, remat="full")):
        got_logits, got_grads = logits_and_grads(**execution)
        assert np.abs(got_logits - ref_logits).max() <= 1e-5, execution
        for got, ref in zip(got_grads, ref_grads):  # fp32 sums in another order: relative to the gradient's scale
            assert np.abs(np.asarray(got) - np.asarray(ref)).max() <= 1e-6 * max(1.0, np.abs(np.asarray(ref)).max())
