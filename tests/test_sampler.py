"""models.sampler: greedy parity with transformers, a sampled distribution that matches the computed one,
logprobs equal to a teacher-forced pass, continuation from cache equal to re-prefill, stop handling, errors."""
import json
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

import models
from models import Llama, LlamaConfig
from models.sampler import Sampler, SamplingParams
from tests.conftest import REPO, hf_tiny_llama, host_devices_env, random_ids


class CharTokenizer:
    """Token i decodes to one letter, so stop strings can be placed exactly in a random model's output."""

    def decode(self, ids, skip_special=False):
        return "".join(chr(ord("a") + i % 26) for i in ids)


@pytest.fixture(scope="module")
def tiny():
    return Llama(LlamaConfig.preset("tiny"), rngs=nnx.Rngs(0))


def _prompts(seed, lengths, vocab):
    rng = np.random.RandomState(seed)
    return [rng.randint(1, vocab, n).tolist() for n in lengths]


def test_greedy_batch_with_mixed_prompt_lengths_matches_transformers(tmp_path):
    hf_dir, hf_model = hf_tiny_llama(tmp_path, vocab_size=301)
    model = models.from_hf(hf_dir)
    prompts = _prompts(0, (5, 17, 11, 2), 301)
    width = max(map(len, prompts))
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    with torch.no_grad():
        ref = hf_model.generate(ids, attention_mask=mask, do_sample=False, max_new_tokens=24, pad_token_id=0,
                                eos_token_id=None)[:, width:].tolist()
    completions, _ = Sampler(model).generate(prompts, SamplingParams(max_new_tokens=24, temperature=0.0),
                                             jax.random.key(0))
    assert [c.token_ids for c in completions] == ref
    assert all(c.finish_reason == "length" for c in completions)
    # an end-of-turn id taken from the middle of row 1's answer stops that row there, and only rows that emit it
    eos = ref[1][9]
    completions, _ = Sampler(model).generate(
        prompts, SamplingParams(max_new_tokens=24, temperature=0.0, stop_ids=(eos,)), jax.random.key(0))
    for row, completion in zip(ref, completions):
        expected = row[:row.index(eos) + 1] if eos in row else row
        assert completion.token_ids == expected
        assert completion.finish_reason == ("eos" if eos in row else "length")


def _expected_distribution(logits, temperature, top_p, top_k):
    """softmax(logits / T), cut to the top_k most likely, renormalised, then cut to the smallest most-probable
    set with mass >= top_p (HF's order of warpers), renormalised. Also returns the uncut softmax."""
    full = np.exp((logits - logits.max()) / temperature)
    full /= full.sum()
    order = np.argsort(-full, kind="stable")
    probs = full.copy()
    if top_k:
        probs[order[top_k:]] = 0
        probs /= probs.sum()
    mass_before = np.cumsum(probs[order]) - probs[order]
    keep = order[mass_before < top_p]
    out = np.zeros_like(probs)
    out[keep] = probs[keep]
    return out / out.sum(), full


def _chi_square_critical(df, z=3.09):  # Wilson-Hilferty approximation of the 0.999 quantile
    return df * (1 - 2 / (9 * df) + z * np.sqrt(2 / (9 * df))) ** 3


@pytest.mark.parametrize("vocab,scale,temperature,top_p,top_k", [
    (64, 8.0, 1.0, 1.0, 0),  # plain temperature sampling
    (64, 8.0, 0.7, 0.8, 0),  # nucleus found among the top candidates
    (64, 8.0, 1.0, 0.9, 10),  # top-k, then top-p of the renormalised rest
    (1024, 1.0, 1.0, 0.9, 0),  # a flat distribution: the top 256 hold < 0.9, the exact full search runs
])
def test_sampled_next_token_frequencies_match_the_computed_distribution(vocab, scale, temperature, top_p, top_k):
    cfg = LlamaConfig.preset("tiny", vocab_size=vocab)
    model = Llama(cfg, rngs=nnx.Rngs(1))
    model.lm_head_dv[...] = model.lm_head_dv[...] * scale  # scale 8: a peaked, non-uniform distribution
    prompt = [3, 9, 27, 17]
    logits = np.asarray(model(jnp.asarray([prompt]))[0][0, -1], np.float64)
    expected, full = _expected_distribution(logits, temperature, top_p, top_k)
    if vocab > 256:
        assert np.sort(full)[::-1][:256].sum() < top_p  # really exercises the full-vocabulary path
    n = 4096
    sampler = Sampler(model, length_bucket=4)
    sampling = SamplingParams(max_new_tokens=1, temperature=temperature, top_p=top_p, top_k=top_k)
    completions, _ = sampler.generate([prompt] * n, sampling, jax.random.key(7))
    tokens = np.array([c.token_ids[0] for c in completions])
    counts = np.bincount(tokens, minlength=cfg.vocab_size)
    assert counts[expected == 0].sum() == 0  # nothing outside the nucleus
    support = expected > 0
    assert support.sum() >= 5  # the test is not degenerate
    big = support & (expected * n >= 5)
    observed = np.append(counts[big], counts[support & ~big].sum())
    predicted = np.append(expected[big] * n, expected[support & ~big].sum() * n)
    observed, predicted = observed[predicted > 0], predicted[predicted > 0]
    chi2 = ((observed - predicted) ** 2 / predicted).sum()
    assert chi2 < _chi_square_critical(len(observed) - 1), (chi2, len(observed))
    # the reported logprob is log softmax(logits / T) over the full vocabulary, before the nucleus cut
    logprobs = np.array([c.logprobs[0] for c in completions])
    np.testing.assert_allclose(logprobs, np.log(full[tokens]), atol=1e-4)


def test_logprobs_and_entropies_equal_a_teacher_forced_pass_over_the_sampled_tokens(tiny):
    prompts = _prompts(1, (6, 13, 3), 512)
    temperature = 0.7
    sampling = SamplingParams(max_new_tokens=20, temperature=temperature, top_p=0.9, top_k=40)
    completions, _ = Sampler(tiny).generate(prompts, sampling, jax.random.key(3))
    for prompt, completion in zip(prompts, completions):
        full = prompt + completion.token_ids
        logits, _ = tiny(jnp.asarray([full]))
        logp = jax.nn.log_softmax(logits[0] / temperature, axis=-1)
        positions = np.arange(len(prompt) - 1, len(full) - 1)
        ref = np.asarray(logp[positions, np.asarray(completion.token_ids)])
        assert len(completion.token_ids) == 20
        np.testing.assert_allclose(completion.logprobs, ref, atol=1e-4)
        entropy = -np.sum(np.exp(np.asarray(logp[positions])) * np.asarray(logp[positions]), axis=-1)
        np.testing.assert_allclose(completion.entropies, entropy, atol=1e-4)  # of the unfiltered softmax(z / T)


def test_same_key_same_tokens_other_key_other_tokens(tiny):
    prompts = _prompts(2, (4, 9), 512)
    sampling = SamplingParams(max_new_tokens=12, temperature=1.0)
    sampler = Sampler(tiny)
    first = [c.token_ids for c in sampler.generate(prompts, sampling, jax.random.key(11))[0]]
    again = [c.token_ids for c in sampler.generate(prompts, sampling, jax.random.key(11))[0]]
    other = [c.token_ids for c in sampler.generate(prompts, sampling, jax.random.key(12))[0]]
    assert first == again and first != other


def test_a_large_reserved_cache_gives_the_same_tokens_and_logprobs(tiny):
    """Decode attends to a window that grows with the filled cache (models.sampler.attention_window); a cache
    of 1024 slots crosses windows 128 -> 256 here and must sample what an exactly sized cache samples."""
    prompts = _prompts(7, (5, 11, 2), 512)
    sampling = SamplingParams(max_new_tokens=90, temperature=1.0)
    small, _ = Sampler(tiny).generate(prompts, sampling, jax.random.key(4))
    large, state = Sampler(tiny).generate(prompts, sampling, jax.random.key(4), cache_capacity=1024)
    assert int(state.cache.index) > 128  # the decode crossed a window boundary
    assert [c.token_ids for c in small] == [c.token_ids for c in large]
    for a, b in zip(small, large):
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
    greedy = SamplingParams(max_new_tokens=90, temperature=0.0)
    assert ([c.token_ids for c in Sampler(tiny).generate(prompts, greedy, jax.random.key(0))[0]]
            == [c.token_ids for c in Sampler(tiny).generate(prompts, greedy, jax.random.key(0), 1024)[0]])


def test_attention_window_grows_in_powers_of_two_up_to_the_capacity():
    from models.sampler import attention_window

    assert [attention_window(n, 1024) for n in (1, 128, 129, 300, 513, 1024)] == [128, 128, 256, 512, 1024, 1024]
    assert attention_window(200, 192) == 192


def test_decode_step_copies_no_weight_stack_and_no_cache_buffer(tiny):
    """The compiled decode loop reads per-layer weights sliced once outside it and updates each layer's window
    buffer in place: its body has no copy, slice or dynamic-slice as large as a weight matrix or a window
    buffer, and the whole program none as large as a full cache buffer (the window goes out and back once)."""
    import re

    from models.sampler import _decode

    sampler = Sampler(tiny)
    sampling = SamplingParams(max_new_tokens=4, temperature=1.0)
    _, state = sampler.generate([[1, 2, 3], [4, 5]], sampling, jax.random.key(0), cache_capacity=1024)
    graphdef, params, layers = sampler.weights()
    hlo = _decode.lower(graphdef, params, layers, state, jnp.int32(4), jax.random.key(1), jnp.float32(1.0),
                        jnp.float32(1.0), static=sampler.draw_static(sampling), mesh_rules=None,
                        window=128).compile().as_text()

    def moved(text: str, at_least: int) -> list[tuple[str, str]]:
        ops = re.findall(r"= (\w+\[[\d,]*\])\S* (copy|slice|dynamic-slice)\(", text)
        return [(shape, op) for shape, op in ops
                if int(np.prod([int(d) for d in shape.split("[")[1][:-1].split(",") if d] or [1])) >= at_least]

    bodies = [re.search(rf"\n%?{re.escape(name)} .*?\n}}", hlo, re.S).group(0)
              for name in re.findall(r"while\(.*?body=%?([\w.\-]+)", hlo)]
    body = max(bodies, key=lambda text: text.count("dynamic-update-slice"))  # the decode loop's (not the RNG's)
    buffer = int(np.prod(state.cache.k_bkchw[0].shape))
    smallest_weight = min(int(np.prod(w.shape)) for w in layers[0].values() if w.ndim >= 2)
    assert moved(body, min(smallest_weight, buffer * 128 // 1024)) == []
    assert moved(hlo, buffer) == []
    assert len(re.findall(r"dynamic-update-slice", body)) >= 2 * tiny.config.num_layers  # in place, per layer


def test_the_draw_and_argmax_equal_jax_random_categorical_and_jnp_argmax_exactly():
    """The sampler's Gumbel-max draw (`first_argmax` instead of jnp.argmax's slow reduction on CPU) picks what
    jax.random.categorical picks for the same key, and first_argmax breaks ties at the first index."""
    from models.token_draw import categorical, first_argmax

    key = jax.random.key(3)
    logits = jax.random.normal(key, (64, 4099)) * 3
    logits = logits.at[:, ::7].set(-jnp.inf)  # masked tokens, as top-p leaves them
    for i in range(20):
        k = jax.random.fold_in(key, i)
        np.testing.assert_array_equal(categorical(k, logits), jax.random.categorical(k, logits, axis=-1))
    ties = jnp.array([[1.0, 3.0, 3.0, -jnp.inf], [-jnp.inf, 0.0, 0.0, 0.0], [2.0, 2.0, 2.0, 2.0]])
    np.testing.assert_array_equal(first_argmax(ties), jnp.argmax(ties, axis=-1))
    np.testing.assert_array_equal(first_argmax(logits), jnp.argmax(logits, axis=-1))


def test_top_k_one_is_greedy(tiny):
    prompts = _prompts(3, (5, 8), 512)
    greedy = Sampler(tiny).generate(prompts, SamplingParams(max_new_tokens=10, temperature=0.0), jax.random.key(0))
    top1 = Sampler(tiny).generate(prompts, SamplingParams(max_new_tokens=10, temperature=1.3, top_k=1),
                                  jax.random.key(5))
    assert [c.token_ids for c in greedy[0]] == [c.token_ids for c in top1[0]]


def test_continuing_from_the_cache_equals_reprefilling_the_dialog(tiny):
    prompts = _prompts(4, (7, 3, 12), 512)
    sampler = Sampler(tiny, length_bucket=8)
    turn = SamplingParams(max_new_tokens=10, temperature=0.0)
    first, state = sampler.generate(prompts, turn, jax.random.key(0), cache_capacity=96)
    eos = first[0].token_ids[4]  # turn 2 stops on this id: rows that emit it end early, keeping it pending
    feedback = [[5, 6, 7], None, [9]]
    second, state = sampler.extend(state, feedback, SamplingParams(max_new_tokens=8, temperature=0.0,
                                                                   stop_ids=(eos,)), jax.random.key(1))
    assert second[1] is None
    third, _ = sampler.extend(state, [[21], [22, 23], [24, 25, 26, 27]], turn, jax.random.key(2))
    dialogs = [list(p) for p in prompts]
    for b in range(3):
        dialogs[b] += first[b].token_ids
        if feedback[b] is not None:
            dialogs[b] += feedback[b] + second[b].token_ids
    dialogs = [d + extra for d, extra in zip(dialogs, [[21], [22, 23], [24, 25, 26, 27]])]
    fresh, _ = Sampler(tiny, length_bucket=8).generate(dialogs, turn, jax.random.key(0))
    assert [c.token_ids for c in third] == [c.token_ids for c in fresh]
    assert second[0].finish_reason == "eos" and second[0].token_ids[-1] == eos


def test_shared_prompts_are_prefilled_once_and_sample_what_separate_rows_sample(tiny):
    """A first turn whose prompts repeat (GRPO's group) computes each distinct prompt once and copies its K/V
    into every row that shares it. Against the unshared pass over the same cache (every row prefilled against
    the cache): the same tokens for the same key, logprobs within 1e-5, and a continuation from the shared
    cache equal to re-prefilling each dialog."""
    a, b = _prompts(8, (9, 4), 512)
    prompts = [a, b, a, a, b]
    sampling = SamplingParams(max_new_tokens=12, temperature=1.0)
    sampler = Sampler(tiny, length_bucket=8)
    shared, state = sampler.generate(prompts, sampling, jax.random.key(6), cache_capacity=64)
    weights = sampler.weights()
    cache = models.KVCache.init(tiny.config, len(prompts), 64)
    zeros = np.zeros(len(prompts), np.int32)
    unshared_state = sampler._prefill(weights, cache, prompts, 16, zeros, [True] * len(prompts), zeros, sampling,
                                      jax.random.key(6))
    unshared, _ = sampler._run(weights, unshared_state, sampling, jax.random.key(6))
    assert [c.token_ids for c in shared] == [c.token_ids for c in unshared]
    assert len({tuple(c.token_ids) for c in shared}) == len(prompts)  # rows that share a prompt still differ
    for x, y in zip(shared, unshared):
        np.testing.assert_allclose(x.logprobs, y.logprobs, atol=1e-5)
    greedy = SamplingParams(max_new_tokens=6, temperature=0.0)
    feedback = [[3, 4], [5], [6, 7, 8], [9], [10, 11]]
    continued, _ = sampler.extend(state, feedback, greedy, jax.random.key(7))
    dialogs = [p + c.token_ids + f for p, c, f in zip(prompts, shared, feedback)]
    again, _ = Sampler(tiny, length_bucket=8).generate(dialogs, greedy, jax.random.key(0))
    assert [c.token_ids for c in continued] == [c.token_ids for c in again]


def test_stop_string_cuts_at_the_completing_token_and_continuation_forgets_the_rest(tiny):
    prompts = _prompts(5, (6, 9), 512)
    tok = CharTokenizer()
    sampler = Sampler(tiny, tok, length_bucket=8)
    plain, _ = sampler.generate(prompts, SamplingParams(max_new_tokens=30, temperature=0.0), jax.random.key(0))
    stop = plain[0].text[12:15]  # completes at token 14 of row 0 (or earlier, if it occurs before)
    first_end = plain[0].text.find(stop) + len(stop)
    sampling = SamplingParams(max_new_tokens=30, temperature=0.0, stop_strings=(stop,), stop_check_every=4)
    cut, state = sampler.generate(prompts, sampling, jax.random.key(0), cache_capacity=80)
    assert cut[0].token_ids == plain[0].token_ids[:first_end] and cut[0].finish_reason == "stop"
    assert cut[0].text.endswith(stop) and len(cut[0].logprobs) == first_end
    row1_end = plain[1].text.find(stop)
    expected_row1 = plain[1].token_ids if row1_end < 0 else plain[1].token_ids[:row1_end + len(stop)]
    assert cut[1].token_ids == expected_row1
    more, _ = sampler.extend(state, [[1, 2], [3]], SamplingParams(max_new_tokens=6, temperature=0.0),
                             jax.random.key(0))
    dialogs = [prompts[0] + cut[0].token_ids + [1, 2], prompts[1] + cut[1].token_ids + [3]]
    fresh, _ = Sampler(tiny, length_bucket=8).generate(dialogs, SamplingParams(max_new_tokens=6, temperature=0.0),
                                                       jax.random.key(0))
    assert [c.token_ids for c in more] == [c.token_ids for c in fresh]


@pytest.mark.parametrize("make,message", [
    (lambda: SamplingParams(max_new_tokens=0), "max_new_tokens must be a positive int"),
    (lambda: SamplingParams(max_new_tokens=-3), "max_new_tokens must be a positive int"),
    (lambda: SamplingParams(max_new_tokens=4, top_p=0.0), r"top_p must be in \(0, 1\]"),
    (lambda: SamplingParams(max_new_tokens=4, top_p=1.5), r"top_p must be in \(0, 1\]"),
    (lambda: SamplingParams(max_new_tokens=4, temperature=-1.0), "temperature must be >= 0"),
    (lambda: SamplingParams(max_new_tokens=4, top_k=-1), "top_k must be an int >= 0"),
])
def test_bad_sampling_params_fail_with_one_clear_line(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_bad_prompts_fail_with_one_clear_line(tiny):
    sampler = Sampler(tiny)
    sampling = SamplingParams(max_new_tokens=8)
    key = jax.random.key(0)
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        sampler.generate([[1, 2], []], sampling, key)
    with pytest.raises(ValueError, match="no prompts given"):
        sampler.generate([], sampling, key)
    with pytest.raises(ValueError, match=r"needs 108 cache slots, but the cache holds 64"):
        sampler.generate([list(range(1, 101))], sampling, key, cache_capacity=64)
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 512\)"):
        sampler.generate([[1, 600]], sampling, key)
    _, state = sampler.generate([[1, 2, 3]], sampling, key, cache_capacity=72)
    with pytest.raises(ValueError, match="pass a larger cache_capacity"):
        sampler.extend(state, [list(range(1, 70))], sampling, key)


def test_eight_device_mesh_gives_the_same_greedy_tokens():
    env = host_devices_env(8, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, str(REPO / "tests" / "_sampler_mesh_check.py")], env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert result["devices"] == 8 and result["cache_devices"] == 8
    assert result["cache_spec"] == "P(('data', 'fsdp'), 'tensor')"  # rows over data/fsdp, kv heads over tensor
    assert result["single"] == result["sharded"]
    assert result["single_continued"] == result["sharded_continued"]
    assert result["single"] == result["gathered"] and result["single_continued"] == result["gathered_continued"]
    # the sampler's weights whole on each data/fsdp shard: the decode loop gathers none of them per step (the
    # training layout splits every weight's embed axis over fsdp, and XLA gathers each one)
    assert result["decode_weight_gathers"] == 0 < result["decode_weight_gathers_training_layout"], result
    # slots admitted at two times; on the mesh, decoding every slot (as the engine does where the mesh splits
    # them) gathers no cache row or weight, while decoding named rows gathers cache rows (which the TPU
    # partitioner compiles to an all-gather of every shard's cache onto each chip)
    assert result["single_slots"][0] == result["sharded_slots"][0] == result["sharded_slots_compact"][0]
    assert result["single_slots"][0] == result["single"]
    assert result["sharded_slots"][1] == 0 < result["sharded_slots_compact"][1], result
    # the engine's admissions (new dialogs at two times, then feedback turns continuing slots of two blocks):
    # the same tokens on the mesh, every key and value computed and written on its slot's chips (one block of
    # segments per block of slots): no all-gather of cache rows or segments in any admission
    assert result["single_engine"][0] == result["sharded_engine"][0], result
    assert result["single_engine"][0][:8] == result["single"]
    assert result["sharded_engine"][1] == [0, 0, 0], result


def test_float32_master_weights_sample_what_their_bfloat16_compute_model_samples():
    """With float32 weights and bfloat16 compute the sampler reads bfloat16 copies (per-layer weights and the
    head): the same tokens and logprobs, bit for bit, as the same weights held in bfloat16."""
    master = Llama(LlamaConfig.preset("tiny", vocab_size=128, dtype="bfloat16"), rngs=nnx.Rngs(3))
    held = Llama(LlamaConfig.preset("tiny", vocab_size=128, dtype="bfloat16", param_dtype="bfloat16"),
                 rngs=nnx.Rngs(0))
    nnx.update(held, jax.tree.map(lambda x: x.astype(jnp.bfloat16), nnx.state(master)))
    assert master.embed_vd[...].dtype == jnp.float32 and held.embed_vd[...].dtype == jnp.bfloat16
    _, params, layers = Sampler(master).weights()  # what a decode step reads
    assert params["embed_vd"].get_value().dtype == layers[0]["q_dnh"].dtype == jnp.bfloat16
    prompts = [random_ids(1, 9, 128).tolist(), random_ids(2, 5, 128).tolist()]
    sampling = SamplingParams(max_new_tokens=12, temperature=0.8)
    ours, theirs = (Sampler(m).generate(prompts, sampling, jax.random.key(4))[0] for m in (master, held))
    for a, b in zip(ours, theirs):
        assert a.token_ids == b.token_ids
        np.testing.assert_array_equal(a.logprobs, b.logprobs)


def test_many_new_tokens_attend_to_the_cache_in_query_blocks_with_the_values_of_one_block():
    from models.llama import CACHED_QUERY_BLOCK, _attend_cache, _attend_cache_block
    rng = np.random.RandomState(0)
    b, t, n, kv, h, s, w = 2, 2 * CACHED_QUERY_BLOCK + 5, 6, 2, 16, 320, 32
    q = jnp.asarray(rng.randn(b, t, n, h), jnp.float32)
    k, v = jnp.asarray(rng.randn(b, kv, s // w, h, w), jnp.float32), jnp.asarray(rng.randn(b, kv, s, h), jnp.float32)
    fill = np.array([40, 90])  # each row's history; new token i sees its row's history and itself and before
    allowed = jnp.asarray(np.arange(s)[None, None, :] <= fill[:, None, None] + np.arange(t)[None, :, None])
    compiled = jax.jit(_attend_cache).lower(q, k, v, allowed).compile()
    assert compiled.as_text().count(" dot(") == 2 * 3  # scores and values of 3 query blocks
    np.testing.assert_allclose(compiled(q, k, v, allowed), jax.jit(_attend_cache_block)(q, k, v, allowed),
                               rtol=1e-6, atol=1e-6)


def test_a_long_feedback_turn_continues_the_cache_as_reprefilling_the_dialog(tiny):
    prompts = _prompts(5, (9, 20), 512)
    sampler = Sampler(tiny, length_bucket=8)
    turn = SamplingParams(max_new_tokens=6, temperature=0.0)
    first, state = sampler.generate(prompts, turn, jax.random.key(0), cache_capacity=400)
    feedback = _prompts(6, (150, 90), 512)  # more new tokens than one query block
    second, _ = sampler.extend(state, feedback, turn, jax.random.key(1))
    dialogs = [p + c.token_ids + f for p, c, f in zip(prompts, first, feedback)]
    fresh, _ = Sampler(tiny, length_bucket=8).generate(dialogs, turn, jax.random.key(0))
    assert [c.token_ids for c in second] == [c.token_ids for c in fresh]
    np.testing.assert_allclose(np.concatenate([c.logprobs for c in second]),
                               np.concatenate([c.logprobs for c in fresh]), atol=1e-5)
