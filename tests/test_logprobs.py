"""Chunked token log-probabilities and entropies (models/logprobs.py) against the plain [B, T, V] log-softmax:
values and gradients, tied and untied output embeddings, temperatures, chunks that do not divide T; and the
whole model's values against transformers' logits."""
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

from models import LlamaConfig
from models.checkpoint import convert_hf_to_checkpoint, load_checkpoint
from models.llama import Llama
from models.logprobs import token_logprobs_and_entropy
from rljax.learner import token_logprobs
from tests.conftest import hf_tiny_llama, random_ids


def _plain(h, head, targets, vocab_axis, temperature):
    logits = jnp.einsum("btd,vd->btv" if vocab_axis == 0 else "btd,dv->btv", h, head) / temperature
    logp_all = jax.nn.log_softmax(logits, axis=-1)
    logp = jnp.take_along_axis(logp_all, targets[..., None], axis=-1)[..., 0]
    return logp, -jnp.sum(jnp.exp(logp_all) * logp_all, axis=-1)


@pytest.mark.parametrize("vocab_axis", [0, 1])
@pytest.mark.parametrize("temperature,chunk", [(1.0, 4), (0.7, 5), (1.3, 13), (1.0, 1)])
def test_values_and_gradients_match_the_plain_log_softmax(vocab_axis, temperature, chunk):
    keys = jax.random.split(jax.random.PRNGKey(vocab_axis), 5)
    b, t, d, v = 3, 13, 16, 50
    h = jax.random.normal(keys[0], (b, t, d))
    head = jax.random.normal(keys[1], (v, d) if vocab_axis == 0 else (d, v)) * 0.5
    targets = jax.random.randint(keys[2], (b, t), 0, v)
    g_logp, g_entropy = jax.random.normal(keys[3], (b, t)), jax.random.normal(keys[4], (b, t))

    def loss(fn):
        def f(h, head):
            logp, entropy = fn(h, head)
            return jnp.sum(logp * g_logp) + jnp.sum(entropy * g_entropy)
        return f

    ours = lambda h, head: token_logprobs_and_entropy(h, head, targets, vocab_axis, temperature, chunk)  # noqa: E731
    plain = lambda h, head: _plain(h, head, targets, vocab_axis, temperature)  # noqa: E731
    for got, want in zip(jax.jit(ours)(h, head), plain(h, head)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    got_grads = jax.jit(jax.grad(loss(ours), argnums=(0, 1)))(h, head)
    want_grads = jax.grad(loss(plain), argnums=(0, 1))(h, head)
    for got, want in zip(got_grads, want_grads):
        assert float(jnp.max(jnp.abs(want))) > 0.1  # a real gradient, not zeros on both sides
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("vocab_axis", [0, 1])
def test_chunks_that_no_loss_term_weights_are_skipped_with_the_same_gradients(vocab_axis):
    """A prompt common to every row (positions 0-7: two whole chunks of 4 with zero cotangents) and a longer
    prompt on row 0 (8-9: a chunk only partly weighted): the skipped chunks' gradients are exactly zero and
    the rest equal the plain log-softmax's."""
    keys = jax.random.split(jax.random.PRNGKey(7), 5)
    b, t, d, v = 3, 14, 16, 50
    h = jax.random.normal(keys[0], (b, t, d))
    head = jax.random.normal(keys[1], (v, d) if vocab_axis == 0 else (d, v)) * 0.5
    targets = jax.random.randint(keys[2], (b, t), 0, v)
    weighted = np.ones((b, t), np.float32)
    weighted[:, :8] = 0.0
    weighted[0, 8:10] = 0.0
    g_logp = jax.random.normal(keys[3], (b, t)) * weighted
    g_entropy = jax.random.normal(keys[4], (b, t)) * weighted

    def loss(fn):
        def f(h, head):
            logp, entropy = fn(h, head)
            return jnp.sum(logp * g_logp) + jnp.sum(entropy * g_entropy)
        return f

    ours = lambda h, head: token_logprobs_and_entropy(h, head, targets, vocab_axis, 1.0, 4)  # noqa: E731
    plain = lambda h, head: _plain(h, head, targets, vocab_axis, 1.0)  # noqa: E731
    got = jax.jit(jax.grad(loss(ours), argnums=(0, 1)))(h, head)
    want = jax.grad(loss(plain), argnums=(0, 1))(h, head)
    assert not np.any(np.asarray(got[0])[:, :8]) and not np.any(np.asarray(got[0])[0, 8:10])
    for g, w in zip(got, want):
        assert float(jnp.max(jnp.abs(w))) > 0.1
        np.testing.assert_allclose(g, w, rtol=1e-4, atol=1e-5)


def test_entropy_without_gradient_leaves_the_logprob_gradient_alone():
    keys = jax.random.split(jax.random.PRNGKey(3), 3)
    h, head = jax.random.normal(keys[0], (2, 7, 8)), jax.random.normal(keys[1], (30, 8))
    targets = jax.random.randint(keys[2], (2, 7), 0, 30)

    def loss(h, stop):
        logp, entropy = token_logprobs_and_entropy(h, head, targets, 0, 1.0, 3)
        entropy = jax.lax.stop_gradient(entropy) if stop else entropy
        return jnp.sum(logp) + 0.0 * jnp.sum(entropy)

    np.testing.assert_allclose(jax.grad(loss)(h, True), jax.grad(loss)(h, False), rtol=1e-6, atol=1e-7)
    plain = jax.grad(lambda h: jnp.sum(_plain(h, head, targets, 0, 1.0)[0]))(h)
    np.testing.assert_allclose(jax.grad(loss)(h, True), plain, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("tied", [True, False])
def test_model_token_logprobs_match_transformers_log_softmax(tmp_path, tied):
    hf_dir, hf = hf_tiny_llama(tmp_path, tie_word_embeddings=tied)
    model = load_checkpoint(convert_hf_to_checkpoint(hf_dir, tmp_path / "ckpt"))
    ids = random_ids(5, (2, 21), 301)
    with torch.no_grad():
        logits = hf(torch.tensor(ids)).logits.float() / 0.8
    logp_all = torch.log_softmax(logits[:, :-1], dim=-1)
    want = torch.gather(logp_all, -1, torch.tensor(ids)[:, 1:, None].long())[..., 0].numpy()
    want_entropy = (-(logp_all.exp() * logp_all).sum(-1)).numpy()
    batch = {"tokens": jnp.asarray(ids), "positions": jnp.tile(jnp.arange(21), (2, 1)),
             "valid": jnp.ones((2, 21), bool)}
    logp, entropy = token_logprobs(model, batch, 0.8, vocab_chunk=6)
    np.testing.assert_allclose(np.asarray(logp[:, 1:]), want, atol=1e-4)
    np.testing.assert_allclose(np.asarray(entropy[:, 1:]), want_entropy, atol=1e-4)
    assert np.all(np.asarray(logp[:, 0]) == 0)


def test_chunk_longer_than_the_sequence_is_one_chunk():
    cfg = LlamaConfig(vocab_size=40, hidden_size=16, intermediate_size=32, num_layers=1, num_heads=2,
                      num_kv_heads=1, head_dim=8, tie_word_embeddings=True)
    model = Llama(cfg, rngs=nnx.Rngs(0))
    h = jax.random.normal(jax.random.PRNGKey(0), (2, 5, 16))
    targets = jnp.zeros((2, 5), jnp.int32)
    np.testing.assert_allclose(model.token_logprobs(h, targets, 1.0, 1000)[0],
                               model.token_logprobs(h, targets, 1.0, 2)[0], rtol=1e-6)
