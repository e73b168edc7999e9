"""rljax.engine / models.slots: dialogs on refilled decode slots sample exactly what a dialog alone samples, in
any order the executor answers, with the chunked rollout's greedy tokens; context_full and bad input."""
import time

import jax
import numpy as np
import pytest
from flax import nnx

from executor.pool import ExecutorPool
from models import Llama, LlamaConfig
from models.sampler import Sampler, SamplingParams
from rljax import toy
from rljax.engine import SlotRolloutRunner
from rljax.envs.base import StepResult
from rljax.rollout import CONTEXT_FULL, RolloutRunner


class ScriptedEpisode:
    """Feedback "<turn><answer length>"; a dialog ends after `turns` answers. Scoring sleeps `delays[turn]`."""

    def __init__(self, number: int, turns: int, delays: tuple[float, ...]):
        self.messages = [{"role": "user", "content": str(number)}]
        self.turn, self.turns, self.delays = 0, turns, delays

    def step(self, answer: str) -> StepResult:
        time.sleep(self.delays[self.turn % len(self.delays)])
        self.turn += 1
        self.messages.append({"role": "assistant", "content": answer})
        done = self.turn >= self.turns
        feedback = None if done else f"{self.turn}{len(answer) % 10}"
        if feedback is not None:
            self.messages.append({"role": "user", "content": feedback})
        return StepResult(float(len(answer) % 3), done, feedback, "done" if done else "failed")

    def end_early(self, status: str) -> StepResult:
        return StepResult(-1.0, True, None, status)


class ScriptedEnv:
    max_turns = 3

    def __init__(self, turns: list[int], delays: list[tuple[float, ...]], numbers: list[int] | None = None):
        self.turns, self.delays = turns, delays
        self.numbers = numbers or [i * 37 % 1000 for i in range(len(turns))]

    def open(self, i: int) -> ScriptedEpisode:
        return ScriptedEpisode(self.numbers[i], self.turns[i], self.delays[i])


@pytest.fixture(scope="module")
def digit_model():
    config = LlamaConfig.preset("tiny", vocab_size=toy.VOCAB_SIZE)
    return Llama(config, rngs=nnx.Rngs(3))


def _run(runner_cls, model, env, count, sampling, capacity=256, **kwargs):
    pool = ExecutorPool(4)
    try:
        runner = runner_cls(Sampler(model, length_bucket=8, pad_id=toy.EOT), toy.DigitCodec(), env, pool, sampling,
                            capacity, **kwargs)
        trajectories, stats = runner.run([env.open(i) for i in range(count)], list(range(count)),
                                         [str(i) for i in range(count)], jax.random.key(5))
    finally:
        pool.close()
    return trajectories, stats


def test_refilled_slots_sample_each_dialog_as_alone_whatever_order_the_scores_come_in(digit_model):
    """7 dialogs of 1-3 turns on 3 slots: slots are refilled as dialogs end. With scoring delays that reverse the
    order results arrive in, every dialog's tokens and logprobs are unchanged, and a dialog run alone on one slot
    samples the same tokens (a key per dialog and position, not per slot)."""
    sampling = SamplingParams(max_new_tokens=12, temperature=1.0, stop_ids=(toy.EOT,))
    turns = [3, 1, 2, 3, 1, 2, 3]
    fast = ScriptedEnv(turns, [(0.0,)] * 7)
    slow_first = ScriptedEnv(turns, [(0.3 * (7 - i) / 7, 0.0, 0.2 * (i % 2)) for i in range(7)])
    a, stats = _run(SlotRolloutRunner, digit_model, fast, 7, sampling, num_slots=3, check_every=4)
    b, _ = _run(SlotRolloutRunner, digit_model, slow_first, 7, sampling, num_slots=3, check_every=3)
    assert [t.num_turns for t in a] == turns
    assert [t.tokens for t in a] == [t.tokens for t in b]
    for x, y in zip(a, b):
        assert x.sampled == y.sampled and x.value_positions == y.value_positions and x.rewards == y.rewards
        np.testing.assert_allclose(x.sampler_logprobs, y.sampler_logprobs, atol=1e-5)
    alone, _ = _run(SlotRolloutRunner, digit_model, ScriptedEnv(turns[4:5] * 7, [(0.0,)] * 7), 7, sampling,
                    num_slots=1)
    assert alone[4].tokens[:len(a[4].tokens)] == a[4].tokens
    assert stats.decode_slot_steps >= sum(sum(t.sampled) for t in a) - sum(t.num_turns for t in a)


def test_a_group_sharing_a_prompt_is_prefilled_once_and_samples_as_one_slot_at_a_time(digit_model):
    """Dialogs 0-2 and 3-5 ask the same problem (GRPO groups): admitted together, each group's prompt is one
    prefill segment; every dialog samples what it samples on a single slot (where nothing is shared)."""
    sampling = SamplingParams(max_new_tokens=10, temperature=1.0, stop_ids=(toy.EOT,))
    env = ScriptedEnv([2, 1, 3, 2, 3, 1], [(0.0,)] * 6, numbers=[41, 41, 41, 907, 907, 907])
    shared, _ = _run(SlotRolloutRunner, digit_model, env, 6, sampling, num_slots=6)
    alone, _ = _run(SlotRolloutRunner, digit_model, env, 6, sampling, num_slots=1)
    assert [t.tokens for t in shared] == [t.tokens for t in alone]
    assert len({tuple(t.tokens) for t in shared}) == 6  # same prompt, different answers


def test_admissions_count_the_tokens_they_prefill_and_the_padded_token_slots_they_compute(digit_model):
    """One-answer dialogs of two groups on 6 slots: one admission of two prompt segments (each group's prompt
    once), padded to the longer prompt (19 tokens) rounded up to the length bucket (8): 24 columns, not 32."""
    sampling = SamplingParams(max_new_tokens=4, temperature=1.0, stop_ids=(toy.EOT,))
    env = ScriptedEnv([1] * 6, [(0.0,)] * 6, numbers=[41] * 3 + [1234567890123456] * 3)
    _, stats = _run(SlotRolloutRunner, digit_model, env, 6, sampling, num_slots=6)
    lengths = [len(toy.DigitCodec().prompt_ids(env.open(i).messages)) for i in (0, 3)]
    assert lengths == [5, 19]
    assert (stats.admit_tokens, stats.admit_token_slots) == (5 + 19, 2 * 24)
    assert 0 < stats.admit_s <= stats.generate_s  # the admission is part of the device time


def test_an_admission_prefills_at_most_admit_rows_segments_and_the_dialogs_sample_the_same(digit_model,
                                                                                          monkeypatch):
    """admit_rows 1 on 6 free slots: each admission prefills one segment (a group's shared prompt, or one
    dialog's next turn) and the rest wait for the next; every dialog samples what it samples uncapped."""
    sampling = SamplingParams(max_new_tokens=10, temperature=1.0, stop_ids=(toy.EOT,))
    env = ScriptedEnv([2, 1, 3, 2, 3, 1], [(0.0,)] * 6, numbers=[41, 41, 41, 907, 907, 907])
    segments: list[int] = []
    admit = SlotRolloutRunner._admit

    def counting(self, weights, state, admissions, *rest):
        segments.append(len({tuple(ids) if new else ("turn", b) for b, ids, new in admissions}))
        return admit(self, weights, state, admissions, *rest)

    monkeypatch.setattr(SlotRolloutRunner, "_admit", counting)
    free, _ = _run(SlotRolloutRunner, digit_model, env, 6, sampling, num_slots=6)
    assert segments[0] == 2  # both groups' prompts at once
    segments.clear()
    capped, _ = _run(SlotRolloutRunner, digit_model, env, 6, sampling, num_slots=6, admit_rows=1)
    assert set(segments) == {1} and len(segments) >= 2 + 6  # 2 prompts, 6 feedback turns
    assert [t.tokens for t in capped] == [t.tokens for t in free]
    assert [t.rewards for t in capped] == [t.rewards for t in free]


def test_admissions_in_rounds_of_admit_width_tokens_sample_what_whole_admissions_sample(digit_model, monkeypatch):
    """admit_width 8 (the length bucket): the first admission prefills the two groups' prompts (5 and 19 tokens)
    in 3 rounds of 8 columns, a segment per group and round (the 19-token prompt's later chunks continue its
    group's rows; only its last round samples); every dialog of 1-3 turns samples the tokens it samples with
    whole admissions, its logprobs within 1e-5."""
    import rljax.engine as engine

    sampling = SamplingParams(max_new_tokens=10, temperature=1.0, stop_ids=(toy.EOT,))
    env = ScriptedEnv([2, 1, 3, 2, 3, 1], [(0.0,)] * 6, numbers=[41] * 3 + [1234567890123456] * 3)
    whole, whole_stats = _run(SlotRolloutRunner, digit_model, env, 6, sampling, num_slots=6)
    calls: list[tuple[tuple[int, int], list[bool] | None]] = []
    real = engine.admit

    def recording(*args, final_a=None, **kwargs):
        calls.append((args[4].shape, None if final_a is None else np.asarray(final_a).tolist()))
        return real(*args, final_a=final_a, **kwargs)

    monkeypatch.setattr(engine, "admit", recording)
    rounds, stats = _run(SlotRolloutRunner, digit_model, env, 6, sampling, num_slots=6, admit_width=8)
    # round 1: both prompts' first 8 tokens (the 5-token group starts sampling); rounds 2-3: the long prompt
    assert [shape for shape, _ in calls[:3]] == [(2, 8), (1, 8), (1, 8)]
    assert calls[0][1] == [True] * 3 + [False] * 3  # slots 3-5 take the long prompt's first chunk, wait
    assert calls[1][1][:3] == [False] * 3 and calls[2][1][:3] == [True] * 3  # (the 4th start: padding)
    assert max(shape[1] for shape, _ in calls) == 8
    assert [t.tokens for t in rounds] == [t.tokens for t in whole]
    assert [t.rewards for t in rounds] == [t.rewards for t in whole]
    for x, y in zip(rounds, whole):
        np.testing.assert_allclose(x.sampler_logprobs, y.sampler_logprobs, atol=1e-5)
    assert stats.admit_tokens == whole_stats.admit_tokens


def test_logprobs_equal_a_teacher_forced_pass_over_the_whole_dialog(digit_model):
    import jax.numpy as jnp

    sampling = SamplingParams(max_new_tokens=10, temperature=0.8, stop_ids=(toy.EOT,))
    trajectories, _ = _run(SlotRolloutRunner, digit_model, ScriptedEnv([3, 2, 3, 1], [(0.0,)] * 4), 4, sampling,
                           num_slots=2, check_every=5)
    for t in trajectories:
        logits, _ = digit_model(jnp.asarray([t.tokens]))
        logp = np.asarray(jax.nn.log_softmax(logits[0] / 0.8, axis=-1))
        where = np.flatnonzero(t.sampled)
        np.testing.assert_allclose(np.asarray(t.sampler_logprobs)[where], logp[where - 1, np.asarray(t.tokens)[where]],
                                   atol=1e-4)


def test_slots_with_keys_in_tiles_sample_what_one_tile_samples(digit_model, monkeypatch):
    """The engine's admissions and decode calls with the keys in tiles of 16 (`models.kv_cache`) and in one tile:
    the same tokens, logprobs within 1e-5."""
    import models.kv_cache as kv_cache

    sampling = SamplingParams(max_new_tokens=12, temperature=1.0, stop_ids=(toy.EOT,))
    runs = []
    for tile in (16, 1 << 30):
        monkeypatch.setattr(kv_cache, "KEY_TILE_CPU", tile)
        runs.append(_run(SlotRolloutRunner, digit_model, ScriptedEnv([3, 1, 2, 3], [(0.0,)] * 4), 4, sampling,
                         num_slots=2, check_every=4)[0])
    tiled, whole = runs
    assert [t.tokens for t in tiled] == [t.tokens for t in whole]
    for x, y in zip(tiled, whole):
        np.testing.assert_allclose(x.sampler_logprobs, y.sampler_logprobs, atol=1e-5)


def test_greedy_slots_equal_the_chunked_rollout(digit_model, monkeypatch):
    """Also at a cache of 128 columns, where every window is the whole cache and a call with both slots live
    decodes every slot in place instead of naming them (rljax.engine). Which later calls have both slots live
    depends on when the scores come back; the first call's does not (both dialogs' first tokens are not the stop
    id for these problems), so the in-place path is taken in every run."""
    import rljax.engine

    sampling = SamplingParams(max_new_tokens=8, temperature=0.0, stop_ids=(toy.EOT,))
    turns = [2, 3, 1, 3, 2]
    env = ScriptedEnv(turns, [(0.0,)] * 5, numbers=[74, 111, 148, 185, 222])
    calls = []  # (in place, window, slots live) per decode call
    decode = rljax.engine.decode
    monkeypatch.setattr(rljax.engine, "decode", lambda *args, **kwargs: calls.append(
        (args[4] is None, kwargs["window"], int(np.sum(args[3].live_b)))) or decode(*args, **kwargs))
    chunks, _ = _run(RolloutRunner, digit_model, env, 5, sampling, num_chunks=2)
    for capacity in (256, 128):
        calls.clear()
        slots, _ = _run(SlotRolloutRunner, digit_model, env, 5, sampling, capacity, num_slots=2, check_every=4)
        assert [t.tokens for t in slots] == [t.tokens for t in chunks]
        assert [t.value_positions for t in slots] == [t.value_positions for t in chunks]
        assert {window for _, window, _ in calls} == {128}
        assert calls[0][2] == 2
        assert [every for every, _, _ in calls] == [capacity == 128 and live == 2 for _, _, live in calls]


def test_a_turn_that_does_not_fit_ends_as_context_full_and_a_prompt_that_does_not_fit_fails_at_start(digit_model):
    sampling = SamplingParams(max_new_tokens=12, temperature=1.0, stop_ids=(toy.EOT,))
    trajectories, stats = _run(SlotRolloutRunner, digit_model, ScriptedEnv([3] * 3, [(0.0,)] * 3), 3, sampling,
                               capacity=24, num_slots=2)
    assert stats.context_full == 3 and all(t.statuses[-1] == CONTEXT_FULL for t in trajectories)
    with pytest.raises(ValueError, match=r"rollout.cache_capacity \(10\) is too small"):
        _run(SlotRolloutRunner, digit_model, ScriptedEnv([1], [(0.0,)]), 1, sampling, capacity=10, num_slots=1)
    with pytest.raises(ValueError, match="stop strings"):
        _run(SlotRolloutRunner, digit_model, ScriptedEnv([1], [(0.0,)]), 1,
             SamplingParams(max_new_tokens=4, stop_strings=("x",)), num_slots=1)


def test_training_on_slots_logs_slot_use_and_resumes_bit_exactly(tmp_path):
    """rlef_tiny (PPO, 3-turn dialogs with sandbox feedback) on 4 slots for 12 dialogs: the trainer runs the
    engine, logs the share of decode slot-steps that kept a token, and a run resumed from its step-1 checkpoint
    repeats step 2: the same tokens, rewards, losses and updates (tokens do not depend on when the executor
    answered); only the sampler's entropy and logprob figures move in the 8th digit with the attended window."""
    import json
    import shutil

    from rljax.trainer import train
    from tests.test_trainer import _config, _deterministic

    def run(workdir):
        config = _config("rlef_tiny", workdir, total_steps=2, **{"rollout.engine": "slots", "rollout.slots": 4,
                                                                   "rollout.problems_per_step": 12,
                                                                   "rollout.max_new_tokens": 3,
                                                                   "checkpoint.every": 1})
        train(config)
        return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]

    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    rows = run(straight)
    assert 0 < rows[0]["perf/decode_slot_use"] <= 1 and rows[0]["turns/mean"] > 1
    assert 0 < rows[0]["perf/admit_token_use"] <= 1
    assert 0 < rows[0]["time/admit_s"] < rows[0]["time/rollout_s"]
    shutil.copytree(straight, resumed)
    shutil.rmtree(resumed / "checkpoints" / "2")
    again = _deterministic(run(resumed))
    # the sampler's own float figures follow the attended window, which follows the other slots: ~1e-8 apart
    sampler_floats = ("entropy/sampled", "policy/sampler_logprob_max_diff")
    for x, y in zip(again, _deterministic(rows)):
        assert {k: v for k, v in x.items() if k not in sampler_floats} == \
            {k: v for k, v in y.items() if k not in sampler_floats}
        assert all(abs(x[k] - y[k]) < 1e-6 for k in sampler_floats)


def _moves(hlo: str, ops: str) -> list[tuple[int, str]]:
    """(elements of the result, op) of every instruction of the compiled `hlo` whose op matches `ops` (a regex
    alternation such as "copy|gather")."""
    import re

    return [(int(np.prod([int(d) for d in shape.split(",") if d] or [1])), op)
            for shape, op in re.findall(rf"= \w+\[([\d,]*)\]\S* ({ops})\(", hlo)]


def test_slot_decode_computes_only_the_named_rows_and_writes_each_layer_cache_in_place():
    """The compiled slot decode loop for 2 of 4 slots at a 512-column window of a 1024-column cache: it gathers
    those rows' window once per layer buffer, writes each layer's keys and values inside the loop with a scatter
    at the rows' own columns, and puts back only the new columns into the full buffers (in place: one scatter
    each, no copy). Nothing copies or slices a whole buffer or a whole window of every row."""
    import collections

    import jax.numpy as jnp

    from models import KVCache
    from models.slots import SlotState, decode

    model = Llama(LlamaConfig.preset("tiny"), rngs=nnx.Rngs(0))
    sampler = Sampler(model)
    sampling = SamplingParams(max_new_tokens=8, temperature=1.0)
    state = SlotState.init(KVCache.init(model.config, 4, 1024), 8)
    hlo = decode.lower(*sampler.weights(), state, jnp.array([1, 3], jnp.int32), jax.random.key(0),
                       jnp.float32(1.0), jnp.float32(1.0), static=sampler.draw_static(sampling), mesh_rules=None,
                       window=512, steps=4).compile().as_text()
    full, rows = int(np.prod(state.cache.k_bkchw[0].shape)), int(np.prod(state.cache.k_bkchw[0].shape)) // 4
    sizes = collections.Counter(_moves(hlo, "copy|slice|dynamic-slice|scatter|gather"))
    layers = model.config.num_layers
    assert [(size, op) for size, op in sizes if size >= rows and op not in ("scatter", "gather")] == []
    assert sizes[(rows, "gather")] == 2 * layers  # each layer's K and V rows, read once per call
    assert sizes[(rows, "scatter")] == 2 * layers  # the loop's writes
    assert sizes[(full, "scatter")] == 2 * layers  # the new columns put back


def test_at_a_window_of_the_whole_cache_decoding_every_slot_equals_naming_them_and_copies_no_buffer():
    """The engine decodes every slot (rows_c None) instead of naming as many rows as there are slots when the
    window is the whole cache: the same tokens, logprobs and cache as the named rows (3 live slots and one idle,
    which stays as it was), and its compiled call gathers, copies and slices no whole layer buffer."""
    import jax.numpy as jnp

    from models import KVCache
    from models.slots import SlotState, decode

    model = Llama(LlamaConfig.preset("tiny"), rngs=nnx.Rngs(0))
    sampler = Sampler(model)
    sampling = SamplingParams(max_new_tokens=8, temperature=1.0)
    capacity, slots, fill = 64, 4, np.array([20, 33, 7, 41], np.int32)

    def state() -> SlotState:  # rows holding random keys and values up to their fill (the same on every call)
        rng = np.random.default_rng(0)
        cache = KVCache.init(model.config, slots, capacity)
        cache = cache.replace(k_bkchw=tuple(jnp.asarray(rng.normal(size=k.shape), k.dtype) for k in cache.k_bkchw),
                              v_bksh=tuple(jnp.asarray(rng.normal(size=v.shape), v.dtype) for v in cache.v_bksh),
                              valid_bs=jnp.asarray(np.arange(capacity)[None] < fill[:, None]))
        return SlotState.init(cache, 8).replace(
            fill_b=jnp.asarray(fill), position_b=jnp.asarray(fill), last_b=jnp.asarray([5, 9, 11, 2], jnp.int32),
            sequence_b=jnp.arange(slots, dtype=jnp.int32), live_b=jnp.asarray([True, True, False, True]))

    outs = []
    for rows_c in (jnp.asarray([0, 1, 3, slots], jnp.int32), None):
        outs.append(decode(*sampler.weights(), state(), rows_c, jax.random.key(1), jnp.float32(1.0),
                           jnp.float32(1.0), static=sampler.draw_static(sampling), mesh_rules=None, window=capacity,
                           steps=6))
    named, every = outs
    np.testing.assert_array_equal(named.tokens_bn, every.tokens_bn)
    np.testing.assert_allclose(named.logprobs_bn, every.logprobs_bn, atol=1e-6)
    for field in ("fill_b", "position_b", "live_b", "count_b", "last_b"):
        np.testing.assert_array_equal(getattr(named, field), getattr(every, field))
    assert every.fill_b.tolist()[2] == 7 and int(every.count_b[0]) == 6  # the idle slot stayed, the live ran
    for a, b in zip(named.cache.k_bkchw + named.cache.v_bksh, every.cache.k_bkchw + every.cache.v_bksh):
        np.testing.assert_allclose(a, b, atol=1e-6)
    np.testing.assert_array_equal(named.cache.valid_bs, every.cache.valid_bs)
    hlo = decode.lower(*sampler.weights(), state(), None, jax.random.key(1), jnp.float32(1.0), jnp.float32(1.0),
                       static=sampler.draw_static(sampling), mesh_rules=None, window=capacity, steps=6
                       ).compile().as_text()
    buffer = int(np.prod(named.cache.k_bkchw[0].shape))
    assert [op for size, op in _moves(hlo, "copy|slice|dynamic-slice|gather") if size >= buffer] == []


def test_a_decode_call_computes_the_live_slots_rounded_up_to_one_of_decode_sizes_batch_sizes():
    """32 slots, decode_sizes 4: calls of 8, 16, 24 or 32 rows, the live slots first, padding past the batch (a
    row index of 32, which the decode drops); with decode_sizes 1 every call computes 32 rows."""
    import types

    runner = types.SimpleNamespace(sampler=types.SimpleNamespace(_mesh_rules=None), decode_sizes=4)
    def rows(live, slots=32):
        return SlotRolloutRunner._decode_rows(np.asarray(live), slots,
                                              SlotRolloutRunner._decode_granule(runner, slots)).tolist()

    assert rows([5]) == [5] + [32] * 7
    assert rows(list(range(3, 12))) == list(range(3, 12)) + [32] * 7
    assert rows(list(range(32))) == list(range(32))
    assert rows([0, 2], slots=3) == [0, 2]
    runner.decode_sizes = 1
    assert rows([5]) == [5] + [32] * 31
