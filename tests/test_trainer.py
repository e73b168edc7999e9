"""The training loop: batching, exact micro-batching, the sharded step, learning on the toy task, SIGKILL resume,
and bad input."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import jax
import numpy as np
import pytest
from flax import nnx

from models.config import LlamaConfig
from models.llama import Llama, LlamaValueModel
from rljax import batching
from rljax.learner import Learner, LossConfig, OptimConfig
from rljax.ppo import clipped_policy_loss
from rljax.rollout import Trajectory
from rljax.run_config import validate
from tests.conftest import host_devices_env

REPO = Path(__file__).resolve().parents[1]


def synthetic_batch(b: int, length: int, vocab: int, turns: int = 2, seed: int = 0) -> dict[str, np.ndarray]:
    """A batch with every field the learner reads: prompts of varied length, two answers each, padding."""
    rng = np.random.RandomState(seed)
    lengths = rng.randint(length // 2, length + 1, b)
    valid = np.arange(length)[None] < lengths[:, None]
    sampled = (valid & (rng.rand(b, length) < 0.5)).astype(np.float32)
    sampled[:, 0] = 0
    turn = np.where(sampled > 0, (np.arange(length)[None] * turns // length), -1).astype(np.int32)
    return {"tokens": rng.randint(0, vocab, (b, length)).astype(np.int32), "valid": valid,
            "positions": np.tile(np.arange(length, dtype=np.int32), (b, 1)), "sampled": sampled,
            "old_logp": (-3.0 + 0.3 * rng.randn(b, length)).astype(np.float32),
            "ref_logp": (-3.0 + 0.3 * rng.randn(b, length)).astype(np.float32),
            "advantages": (rng.randn(b, length) * sampled).astype(np.float32),
            "weights": batching.aggregation_weights(sampled, "token_mean"),
            "value_index": np.stack([np.zeros(b), lengths // 2], 1).astype(np.int32),
            "turn_mask": np.ones((b, turns), np.float32),
            "turn_weights": batching.aggregation_weights(np.ones((b, turns)), "token_mean"),
            "old_values": rng.randn(b, turns).astype(np.float32), "returns": rng.randn(b, turns).astype(np.float32)}


def _trajectory(prompt, answers, conts, rewards, group=0):
    t = Trajectory("p", group)
    t.append(prompt, sampled=False)
    for k, answer in enumerate(answers):
        t.value_positions.append(len(t.tokens) - 1)
        t.append(answer, sampled=True, logprobs=[-1.0] * len(answer))
        t.rewards.append(rewards[k])
        t.statuses.append("retry")
        t.finish_reasons.append("length" if len(answer) >= 3 else "eos")
        if k < len(conts):
            t.append(conts[k], sampled=False)
    return t


def test_build_batch_layout_and_turn_sums():
    a = _trajectory([1, 2, 3], [[4, 5], [6]], [[7, 8]], [0.0, 1.0])
    b = _trajectory([1], [[9, 9, 9]], [], [-0.2], group=1)
    arrays = batching.build_batch([a, b], max_turns=3, length_bucket=4, pad_id=0)
    assert arrays["tokens"].shape == (2, 8)
    assert arrays["tokens"][0].tolist() == [1, 2, 3, 4, 5, 7, 8, 6]
    assert arrays["sampled"][0].tolist() == [0, 0, 0, 1, 1, 0, 0, 1]
    assert arrays["turn_of_token"][0].tolist() == [-1, -1, -1, 0, 0, -1, -1, 1]
    assert arrays["value_index"].tolist() == [[2, 6, 0], [0, 0, 0]]
    assert arrays["turn_mask"].tolist() == [[1, 1, 0], [1, 0, 0]]
    assert arrays["truncated"].tolist() == [[False, False, False], [True, False, False]]  # b's answer hit the budget
    assert arrays["valid"][1].tolist() == [True] * 4 + [False] * 4
    kl = np.arange(16, dtype=np.float64).reshape(2, 8)
    sums = batching.per_turn_sums(kl, arrays["turn_of_token"], arrays["sampled"], 3)
    assert sums.tolist() == [[3 + 4, 7, 0], [9 + 10 + 11, 0, 0]]  # feedback tokens (5, 6) are not summed
    spread = batching.spread_over_turns(np.asarray([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]), arrays["turn_of_token"])
    assert spread[0].tolist() == [0, 0, 0, 1, 1, 0, 0, 2]


def test_aggregation_weights_reproduce_the_aggregations():
    rng = np.random.RandomState(0)
    mask = (rng.rand(6, 10) < 0.4).astype(np.float32)
    mask[2] = 0  # a row with no tokens
    x = rng.randn(6, 10).astype(np.float32)
    from rljax.ppo import masked_aggregate
    for mode in ("token_mean", "sequence_mean"):
        w = batching.aggregation_weights(mask, mode)
        assert np.isclose((x * w).sum(), float(masked_aggregate(x, mask, mode)), atol=1e-6)
    with pytest.raises(ValueError, match="aggregation"):
        batching.aggregation_weights(mask, "sum")


@pytest.mark.parametrize("algorithm", ["ppo", "grpo"])
def test_micro_batches_give_the_full_batch_update(algorithm):
    cfg = LlamaConfig.preset("tiny", vocab_size=64)
    batch = {k: jax.numpy.asarray(v) for k, v in synthetic_batch(8, 20, 64).items()}
    results = []
    for micro in (1, 2, 4):
        value = LlamaValueModel(cfg, rngs=nnx.Rngs(1)) if algorithm == "ppo" else None
        learner = Learner(Llama(cfg, rngs=nnx.Rngs(0)), LossConfig(algorithm, kl_coef=0.1, kl_in_loss=True),
                          OptimConfig(1.0, 0, optimizer="sgd"), micro, value)
        metrics = learner.update_policy(batch)
        if value is not None:
            metrics.update(learner.update_value(batch))
        results.append((metrics, [np.asarray(x) for x in jax.tree.leaves(learner.policy_state.params)]))
    initial = [np.asarray(x) for x in jax.tree.leaves(nnx.state(Llama(cfg, rngs=nnx.Rngs(0))))]
    assert max(np.max(np.abs(a - b)) for a, b in zip(results[0][1], initial)) > 1e-3  # SGD at rate 1 moved
    for metrics, params in results[1:]:
        assert np.isclose(float(metrics["loss"]), float(results[0][0]["loss"]), atol=1e-6)
        assert max(np.max(np.abs(a - b)) for a, b in zip(params, results[0][1])) < 1e-5
        if algorithm == "ppo":
            assert np.isclose(float(metrics["value_loss"]), float(results[0][0]["value_loss"]), atol=1e-6)
    if algorithm == "ppo":  # and the loss is the documented full-batch PPO loss
        from rljax.learner import token_logprobs
        logp, _ = token_logprobs(Llama(cfg, rngs=nnx.Rngs(0)), batch, 1.0)
        reference, _ = clipped_policy_loss(logp, batch["old_logp"], batch["advantages"], batch["sampled"])
        assert np.isclose(float(results[0][0]["policy_loss"]), float(reference), atol=1e-6)


def test_a_learner_without_a_mesh_compiles_its_updates_once():
    """A fresh TrainState is committed to the params' device like the update's outputs, so the second update
    reuses the first one's program (before: uncommitted counters and moments compiled a second program)."""
    cfg = LlamaConfig.preset("tiny", vocab_size=64)
    batch = {k: jax.numpy.asarray(v) for k, v in synthetic_batch(4, 12, 64).items()}
    policy, value = Llama(cfg, rngs=nnx.Rngs(0)), LlamaValueModel(cfg, rngs=nnx.Rngs(1))
    for model in (policy, value):  # placed on the device, as a loaded checkpoint's weights are
        nnx.update(model, jax.device_put(nnx.state(model), jax.devices()[0]))
    learner = Learner(policy, LossConfig("ppo", kl_coef=0.1, kl_in_loss=True), OptimConfig(1e-3, 0), 1, value)
    for _ in range(3):
        learner.update_policy(batch)
        learner.update_value(batch)
    assert learner._update_policy._cache_size() == 1
    assert learner._update_value._cache_size() == 1


@pytest.mark.parametrize("param_dtype", ["float32", "bfloat16"])
def test_bfloat16_compute_trains_float32_master_weights(param_dtype):
    """model.dtype bfloat16 computes in bfloat16 (the sampler's per-layer copies too) while the weights the
    optimizer moves stay float32 by default: one AdamW step at the RLEF paper's rate, 2e-7, moves every
    weight. Held in bfloat16 (a weight of 0.02 moves only in steps of ~1e-4: 8 significant bits) the same step
    rounds away on all but the few weights near zero."""
    from rljax.run_config import base_config, build_policy

    model_cfg = base_config().model
    model_cfg.update({"preset": "tiny", "overrides": {"vocab_size": 64}, "dtype": "bfloat16"})
    if param_dtype != "float32":
        model_cfg.param_dtype = param_dtype
    policy, _ = build_policy(model_cfg)
    assert (policy.config.dtype, policy.layers.q_dnh[...].dtype) == ("bfloat16", np.dtype(param_dtype))
    assert policy.layers.per_layer()[0]["q_dnh"].dtype == jax.numpy.bfloat16
    before = np.asarray(policy.layers.q_dnh[...], np.float32)
    learner = Learner(policy, LossConfig("grpo"), OptimConfig(2e-7, 0), 1)
    learner.update_policy({k: jax.numpy.asarray(v) for k, v in synthetic_batch(4, 12, 64).items()})
    after = np.asarray(learner.policy_model().layers.q_dnh[...], np.float32)
    moved = float(np.mean(after != before))
    assert moved > 0.99 if param_dtype == "float32" else moved < 0.02, moved


def test_the_reference_policy_is_held_in_the_compute_dtype_and_scores_as_the_master_weights():
    """Under bfloat16 compute with float32 master weights, KL's frozen reference is held in bfloat16: half the
    bytes, and exactly the logprobs the float32 weights give (every use casts a weight to the compute dtype). It
    is a copy: the policy's update (which donates the policy's buffers) leaves it readable and unchanged."""
    from rljax.run_config import base_config, build_policy

    model_cfg = base_config().model
    model_cfg.update({"preset": "tiny", "overrides": {"vocab_size": 64}, "dtype": "bfloat16"})
    policy, _ = build_policy(model_cfg)
    learner = Learner(policy, LossConfig("grpo"), OptimConfig(1e-3, 0), 1)
    reference = learner.reference_params()
    leaves, masters = jax.tree.leaves(reference), jax.tree.leaves(learner.policy_state.params)
    assert {x.dtype for x in leaves} == {jax.numpy.dtype("bfloat16")}
    assert sum(x.nbytes for x in leaves) * 2 == sum(x.nbytes for x in masters)
    batch = {k: jax.numpy.asarray(v) for k, v in synthetic_batch(4, 12, 64).items()}
    before = np.asarray(learner.score(learner.policy_state.params, batch)[0])
    np.testing.assert_array_equal(np.asarray(learner.score(reference, batch)[0]), before)
    learner.update_policy(batch)
    assert np.abs(np.asarray(learner.score(learner.policy_state.params, batch)[0]) - before).max() > 0
    np.testing.assert_array_equal(np.asarray(learner.score(reference, batch)[0]), before)
    # float32 compute: the reference is a float32 copy, not the policy's buffers
    model_cfg.dtype = "float32"
    policy32, _ = build_policy(model_cfg)
    learner32 = Learner(policy32, LossConfig("grpo"), OptimConfig(1e-3, 0), 1)
    reference32 = learner32.reference_params()
    assert all(r is not m and r.dtype == np.float32 for r, m in
               zip(jax.tree.leaves(reference32), jax.tree.leaves(learner32.policy_state.params)))


def test_warmup_schedule_and_no_warmup_moves_from_the_first_update():
    from rljax.learner import learning_rate_schedule

    warm = learning_rate_schedule(OptimConfig(1e-3, 4))
    assert [float(warm(s)) for s in range(6)] == pytest.approx([0.0, 2.5e-4, 5e-4, 7.5e-4, 1e-3, 1e-3])
    assert [float(learning_rate_schedule(OptimConfig(1e-3, 0))(s)) for s in range(3)] == pytest.approx([1e-3] * 3)


def test_informative_first_fills_the_first_micro_batches():
    informative = np.array([0, 1, 0, 0, 1, 0, 1, 0], bool)
    order = batching.informative_first(informative, 4)
    assert sorted(order.tolist()) == list(range(8))
    micro = [order[i::4].tolist() for i in range(4)]  # micro-batch i = positions i, i+4 (rljax.learner._micro)
    assert micro == [[1, 4], [6, 0], [2, 3], [5, 7]]
    with pytest.raises(ValueError, match="does not split into 3 micro-batches"):
        batching.informative_first(informative, 3)


def test_on_policy_update_skips_zero_advantage_micro_batches_exactly():
    """No old_logp (ratio 1 at the current weights) and all-zero micro-batches skipped give the same update as
    scoring first and computing every micro-batch; only the informative micro-batch is computed."""
    cfg = LlamaConfig.preset("tiny", vocab_size=64)
    batch = synthetic_batch(8, 20, 64)
    batch["advantages"][np.arange(8) % 4 != 1] = 0.0  # only micro-batch 1 (rows 1 and 5) carries signal
    batch["sampler_logp"] = np.full_like(batch["old_logp"], -1.0)
    scorer = Learner(Llama(cfg, rngs=nnx.Rngs(0)), LossConfig("grpo"), OptimConfig(1e-3, 0), 4)
    old_logp, _ = scorer.score(scorer.policy_state.params, {k: jax.numpy.asarray(v) for k, v in batch.items()})
    scored = {**batch, "old_logp": np.asarray(old_logp), "ref_logp": np.asarray(old_logp)}
    on_policy = {k: v for k, v in batch.items() if k not in ("old_logp", "ref_logp")}
    results = []
    for rows, micro, entropy_coef in ((scored, 1, 0.0), (on_policy, 4, 0.0), (on_policy, 4, 1e-9)):
        learner = Learner(Llama(cfg, rngs=nnx.Rngs(0)), LossConfig("grpo", entropy_coef=entropy_coef),
                          OptimConfig(1.0, 0, optimizer="sgd"), micro)
        metrics = learner.update_policy({k: jax.numpy.asarray(v) for k, v in rows.items()})
        results.append((metrics, [np.asarray(x) for x in jax.tree.leaves(learner.policy_state.params)]))
    (full, full_params), (skipped, skipped_params), (every, _) = results
    assert float(skipped["micro_batches_computed"]) == 1.0  # the three all-zero micro-batches were not computed
    assert float(every["micro_batches_computed"]) == 4.0  # an entropy bonus makes every row count
    assert np.isclose(float(skipped["loss"]), float(full["loss"]), atol=1e-7)
    initial = [np.asarray(x) for x in jax.tree.leaves(nnx.state(Llama(cfg, rngs=nnx.Rngs(0))))]
    assert max(np.max(np.abs(a - b)) for a, b in zip(full_params, initial)) > 1e-3  # SGD at rate 1 moved
    assert max(np.max(np.abs(a - b)) for a, b in zip(skipped_params, full_params)) < 1e-5
    assert float(skipped["grad_norm"]) > 0
    sampled = batch["sampled"][[1, 5]]
    expected = np.max(np.abs(np.asarray(old_logp)[[1, 5]] + 1.0) * sampled)
    assert np.isclose(float(skipped["max_sampler_logprob_diff"]), expected, atol=1e-5)


def test_sharded_train_step_matches_one_device():
    env = host_devices_env(8, PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "tests/_train_mesh_check.py"], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    result = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(result) == {"ppo", "grpo", "grpo_lora", "grpo_shared"}
    for algorithm, r in result.items():
        assert abs(r["loss_single"] - r["loss_mesh"]) < 1e-5, (algorithm, r)
        assert r["max_param_diff"] < 1e-5, (algorithm, r)


def _config(name: str, workdir: Path, **overrides):
    import importlib

    config = importlib.import_module(f"configs.{name}").get_config()
    config.workdir = str(workdir)
    config.log.progress = False
    config.log.tensorboard = False
    for key, value in overrides.items():
        node = config
        *parents, last = key.split(".")
        for part in parents:
            node = node[part]
        node[last] = value
    return config


def _rise(history, n=5):
    rewards = [row["reward/mean"] for row in history]
    return float(np.mean(rewards[:n])), float(np.mean(rewards[-n:]))


def _train_in_subprocess(name: str, workdir: Path, steps: int, *overrides: str) -> list[dict]:
    """`rljax train` in a fresh process (a long pytest process's heap makes Python's GC slow the host-side
    rollout down about 2x); the run's metrics.jsonl rows."""
    cmd = [sys.executable, "-m", "rljax.cli", "train", "--config", str(REPO / f"configs/{name}.py"),
           f"--config.workdir={workdir}", f"--config.total_steps={steps}", "--config.log.progress=False",
           "--config.log.tensorboard=False", *overrides]
    proc = subprocess.run(cmd, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu"),
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]


# LoRA rank 8 on every projection (the PPO value model adapts the same frozen base), at learning rate 3e-3:
# grpo_tiny's 1e-2 made the adapters' reward rise and collapse (0.25 at step 12, 0.0 at step 25, measured)
LORA = ("--config.model.lora.targets=all", "--config.model.lora.rank=8", "--config.optim.learning_rate=3e-3")
POLICIES = {"full": (), "lora": LORA}


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_ppo_learns_the_toy_task_with_feedback_turns(tmp_path, policy):
    history = _train_in_subprocess("rlef_tiny", tmp_path, 25, *POLICIES[policy])
    start, end = _rise(history)
    print(f"PPO (RLEF, 3 turns, {policy}) reward: first 5 steps {start:+.3f}, last 5 steps {end:+.3f}")
    assert end > start + 0.5
    assert max(row["turns/mean"] for row in history) > 1.5  # the feedback turns were used
    assert history[-1]["solve_rate/turn_3"] > history[-1]["solve_rate/turn_1"] > 0
    assert all(abs(row["policy/sampler_logprob_max_diff"]) < 1e-4 for row in history)
    assert [r["step"] for r in history] == list(range(1, 26))
    for key in ("reward/mean", "kl/ref_per_token", "train/clip_fraction", "train/value_loss",
                "value/explained_variance", "response_length/mean", "perf/tokens_per_s", "perf/device_wait_share"):
        assert key in history[-1], key


@pytest.mark.parametrize("policy", sorted(POLICIES))
def test_grpo_learns_the_toy_task(tmp_path, policy):
    history = _train_in_subprocess("grpo_tiny", tmp_path, 20, *POLICIES[policy])
    start, end = _rise(history)
    print(f"GRPO (G=8, {policy}) reward: first 5 steps {start:+.3f}, last 5 steps {end:+.3f}")
    assert end > start + 0.25
    assert "kl/ref_per_token" not in history[-1]  # grpo_tiny weighs KL 0: no reference pass, nothing logged


def _cli(workdir: Path, steps: int) -> list[str]:
    """A LoRA policy (the frozen base rebuilt, the adapters restored) after a 2-step supervised warm-up (saved as
    step 0) with KL to the warmed policy (its adapters checkpointed); full fine-tuning resumes bit-exactly in
    tests/test_swerl_e2e.py and tests/test_multihost.py."""
    return [sys.executable, "-m", "rljax.cli", "train", "--config", str(REPO / "configs/grpo_tiny.py"),
            f"--config.workdir={workdir}", f"--config.total_steps={steps}", "--config.checkpoint.every=2",
            "--config.rollout.problems_per_step=4", "--config.rollout.samples_per_problem=4",
            "--config.model.lora.targets=all", "--config.model.lora.rank=4", "--config.warmup.steps=2",
            "--config.rollout.max_new_tokens=2", "--config.algo.kl_beta=0.05", "--config.log.progress=False"]


def _deterministic(rows):
    return [{k: v for k, v in r.items() if not k.startswith(("time/", "perf/"))} for r in rows]


def test_sigkill_between_checkpoints_then_resume_is_bit_exact(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    # the uninterrupted run beside the one to kill (separate workdirs; the runs are deterministic)
    uninterrupted = subprocess.Popen(_cli(straight, 7), cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)
    proc = subprocess.Popen(_cli(killed, 7), cwd=REPO, env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    metrics = killed / "metrics.jsonl"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and proc.poll() is None:
        if metrics.exists() and len(metrics.read_text().splitlines()) >= 5:  # step 5 done, checkpoint 4 saved
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    _, err = uninterrupted.communicate(timeout=600)
    assert uninterrupted.returncode == 0, err[-2000:]
    resumed = subprocess.run(_cli(killed, 7), cwd=REPO, env=env, capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resumed from" in resumed.stderr
    read = lambda d: [json.loads(x) for x in (d / "metrics.jsonl").read_text().splitlines()]  # noqa: E731
    assert [r["step"] for r in read(killed)] == list(range(1, 8))
    assert _deterministic(read(killed)) == _deterministic(read(straight))
    assert (killed / "warmup.jsonl").read_text() == (straight / "warmup.jsonl").read_text()


def test_resume_required_without_checkpoint_fails_clearly(tmp_path):
    from rljax.checkpointing import ResumeError
    from rljax.trainer import Trainer

    with pytest.raises(ResumeError, match="no checkpoint to resume from"):
        Trainer(_config("grpo_tiny", tmp_path, **{"checkpoint.resume": "require"}))


def test_bad_problems_are_counted_and_skipped(tmp_path):
    from rljax.toy import toy_problems
    from rljax.trainer import Trainer

    rows = toy_problems(6)
    rows[1]["private_tests"] = {"input": [], "output": []}
    del rows[3]["public_tests"]
    path = tmp_path / "problems.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    trainer = Trainer(_config("grpo_tiny", tmp_path / "run", total_steps=1, **{
        "data.source": "jsonl", "data.path": str(path), "rollout.problems_per_step": 4,
        "rollout.samples_per_problem": 2}))
    out = trainer.step()
    trainer.close()
    assert out.metrics["rollout/dialogs"] == 8
    assert out.metrics["data/skipped_problems"] >= 1
    assert all(t.problem not in (rows[1]["name"], rows[3]["name"]) for t in out.trajectories)


def test_empty_answers_are_scored_and_trained_not_dropped(tmp_path):
    """An answer that is only end-of-turn (empty text) gets the no-code reward, and a batch of them trains."""
    from rljax import toy
    from rljax.envs import RLEFEnv
    from rljax.trainer import Trainer

    result = RLEFEnv(max_turns=1, code_extractor=toy.digits_program).reset(toy.toy_problems(1)[0]).step("")
    assert (result.reward, result.status) == (-0.2, "no_code")
    trainer = Trainer(_config("grpo_tiny", tmp_path, total_steps=1))
    trajectories = [_trajectory([toy.USER, 3, toy.EOT, toy.ASSISTANT], [[toy.EOT]], [], [-0.2], group=i // 8)
                    for i in range(64)]
    metrics = trainer._learn(trajectories)
    trainer.close()
    assert np.isfinite(metrics["train/loss"]) and metrics["train/grad_norm"] == 0.0  # all ties: no advantage


@pytest.mark.parametrize("key, value, message", [
    ("algo.name", "dpo", "config.algo.name: 'dpo' is not one of"),
    ("rollout.problems_per_step", 0, "config.rollout.problems_per_step: expected a positive integer"),
    ("train.micro_batches", 3, "does not divide the rollout batch"),
    ("warmup.micro_batches", 3, "config.warmup.micro_batches: 3 does not divide warmup.batch"),
    ("warmup.steps", -1, "config.warmup.steps: expected an integer >= 0"),
    ("env.max_turns", 3, None),
    ("rollout.engine", "paged", "config.rollout.engine: 'paged' is not one of"),
    ("rollout.check_every", 0, "config.rollout.check_every: expected a positive integer"),
    ("rollout.slots", -2, "config.rollout.slots: expected an integer >= 0"),
    ("rollout.admit_width", 12, r"config.rollout.admit_width: 12 is not a multiple of rollout.length_bucket \(8\)"),
    ("env.test_cache_mb", -1, "config.env.test_cache_mb: expected an integer >= 0"),
])
def test_bad_config_values_fail_at_start(tmp_path, key, value, message):
    config = _config("grpo_tiny", tmp_path, **{key: value})
    if message is None:
        validate(config)
        return
    with pytest.raises(ValueError, match=message):
        validate(config)


@pytest.mark.parametrize("path", sorted((REPO / "configs").glob("[a-z]*.py")), ids=lambda p: p.stem)
def test_every_shipped_config_loads_and_validates(path):
    from rljax.cli import parse_run_config

    config = parse_run_config(["--config", str(path), "--config.seed=7"])
    validate(config)
    assert config.seed == 7 and config.total_steps > 0 and config.workdir


def test_compiling_commands_keep_programs_in_the_persistent_cache(tmp_path, monkeypatch):
    """train/eval/demo/generate/export point JAX's compilation cache at $RLJAX_CACHE/xla; plan does not (its TPU
    programs must compile to be dumped); a JAX_COMPILATION_CACHE_DIR the user set is left to JAX."""
    import models.pretrained
    from rljax.cli import use_compilation_cache

    before = jax.config.jax_compilation_cache_dir
    monkeypatch.setattr(models.pretrained, "DEFAULT_CACHE", tmp_path)
    monkeypatch.delenv("JAX_COMPILATION_CACHE_DIR", raising=False)
    try:
        use_compilation_cache("plan")
        assert jax.config.jax_compilation_cache_dir == before
        use_compilation_cache("train")
        assert jax.config.jax_compilation_cache_dir == str(tmp_path / "xla")
        jax.config.update("jax_compilation_cache_dir", before)
        monkeypatch.setenv("JAX_COMPILATION_CACHE_DIR", "")
        use_compilation_cache("eval")
        assert jax.config.jax_compilation_cache_dir == before
    finally:
        jax.config.update("jax_compilation_cache_dir", before)


def test_cli_bad_config_is_one_line(tmp_path):
    env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")
    for extra, message in (["--config.rollout.nope=1"], "the config has no key 'nope'"), \
            (["--config.algo.name=dpo"], "config.algo.name: 'dpo' is not one of"):
        proc = subprocess.run([sys.executable, "-m", "rljax.cli", "train", "--config",
                               str(REPO / "configs/grpo_tiny.py"), f"--config.workdir={tmp_path}"] + extra,
                              cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 1
        assert proc.stderr.strip().splitlines() == [f"rljax train: error: {proc.stderr.split('error: ', 1)[1].strip()}"]
        assert message in proc.stderr
