"""Shared prompts in the update (`train.share_prompts`): each distinct prompt of a micro-batch is computed once,
and logprobs, losses and updates equal the full pass over every row."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from models.config import LlamaConfig
from models.llama import Llama
from models.lora import LoraConfig, add_lora
from rljax import batching
from rljax.learner import Learner, LossConfig, OptimConfig

CFG = LlamaConfig.preset("tiny", vocab_size=64, attention_query_blocks=2)


def grouped_batch(groups: int = 3, size: int = 4, length: int = 48, seed: int = 0) -> dict[str, np.ndarray]:
    """GRPO-like rows: group g's rows share a prompt of its own length, then answer 0 (sampled, turn 0), a
    feedback turn (not sampled) and answer 1 (turn 1), of random lengths; groups interleaved (row r in group
    r % groups)."""
    rng = np.random.RandomState(seed)
    prompts = [rng.randint(0, 64, n) for n in rng.randint(3, 16, groups)]
    b = groups * size
    out = {"tokens": np.zeros((b, length), np.int32), "valid": np.zeros((b, length), bool),
           "positions": np.tile(np.arange(length, dtype=np.int32), (b, 1)),
           "sampled": np.zeros((b, length), np.float32), "turn_of_token": np.full((b, length), -1, np.int32),
           "group": np.arange(b, dtype=np.int32) % groups}
    for row in range(b):
        prompt = prompts[row % groups]
        parts = [(prompt, -1), (rng.randint(0, 64, rng.randint(1, 8)), 0), (rng.randint(0, 64, rng.randint(1, 6)), -1),
                 (rng.randint(0, 64, rng.randint(1, 8)), 1)]
        column = 0
        for ids, turn in parts:
            out["tokens"][row, column:column + len(ids)] = ids
            out["turn_of_token"][row, column:column + len(ids)] = turn
            out["sampled"][row, column:column + len(ids)] = float(turn >= 0)
            column += len(ids)
        out["valid"][row, :column] = True
    rewards = rng.randn(b).astype(np.float32)
    out["advantages"] = (rewards[:, None] * out["sampled"]).astype(np.float32)
    out["weights"] = batching.aggregation_weights(out["sampled"], "token_mean")
    out["sampler_logp"] = np.full((b, length), -4.0, np.float32)
    return out


def test_shared_prefixes_layout():
    """Rows 0 and 2 share a prompt, row 1 has its own; with 2 micro-batches (rows 0, 2 | rows 1, 3) micro-batch
    0 holds one prefix and micro-batch 1 two, at rows u * m + i."""
    tokens = np.array([[5, 6, 7, 1, 2, 0], [5, 6, 8, 8, 3, 0], [5, 6, 7, 4, 0, 0], [9, 3, 3, 3, 3, 3]], np.int32)
    valid = np.array([[1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 1, 0], [1, 1, 1, 1, 0, 0], [1] * 6], bool)
    turn = np.where(np.array([[0, 0, 0, 1, 1, 0], [0, 0, 0, 0, 1, 0], [0, 0, 0, 1, 0, 0], [0, 1, 1, 1, 1, 1]])
                    & valid, 0, -1)
    arrays = {"tokens": tokens, "valid": valid, "turn_of_token": turn,
              "positions": np.tile(np.arange(6, dtype=np.int32), (4, 1))}
    out = batching.shared_prefixes(arrays, 2, 4, 8)
    # splits (the position before the first answer token): 2, 3, 2, 0
    assert out["prefix_row"].tolist() == [0, 0, 0, 1]
    assert out["prefix_tokens"].tolist() == [[5, 6, 0, 0], [5, 6, 8, 0], [0, 0, 0, 0], [0, 0, 0, 0]]
    assert out["prefix_valid"].sum(axis=1).tolist() == [2, 3, 0, 0]
    # the longest suffix (row 3: 6 tokens) rounded up to the suffix bucket, 8; the prefixes to 4
    assert out["suffix_columns"].tolist() == [list(range(s, s + 8)) for s in (2, 3, 2, 0)]


def test_shared_prompt_update_equals_the_full_update():
    """Scoring and one SGD update (rate 1) of a LoRA policy with each group's prompt computed once per
    micro-batch equal the full pass over every row: logprobs at the sampled tokens within 1e-5, loss within
    1e-6, parameters 1e-5 (full fine-tuning: the trainer test below and the 8-device check)."""
    batch = grouped_batch()
    num_micro = 3
    order = batching.informative_first(np.ones(len(batch["group"]), bool), num_micro, batch["group"])
    ordered = {k: v[order] for k, v in batch.items()}
    shared = {**ordered, **batching.shared_prefixes(ordered, num_micro, 8, 8)}
    assert shared["prefix_tokens"].shape[0] == num_micro  # one group, so one prompt, per micro-batch
    results = []
    for rows in (ordered, shared):
        policy = add_lora(Llama(CFG, rngs=nnx.Rngs(0)), LoraConfig(("all",), 4, 8.0), seed=1)
        nnx.update(policy, jax.tree.map(lambda x: x + 0.05, nnx.state(policy, nnx.Param)))  # B != 0
        learner = Learner(policy, LossConfig("grpo"), OptimConfig(1.0, 0, optimizer="sgd"), num_micro)
        arrays = {k: jnp.asarray(v) for k, v in rows.items()}
        logp, _ = learner.score(learner.policy_state.params, arrays)
        metrics = learner.update_policy(arrays)
        params = [np.asarray(x) for x in jax.tree.leaves(learner.policy_state.params)]
        results.append((np.asarray(logp), metrics, params))
    (logp_full, full, params_full), (logp_shared, sharing, params_shared) = results
    sampled = ordered["sampled"] > 0
    assert np.max(np.abs(logp_full - logp_shared)[sampled]) < 1e-5
    # one micro-batch of interleaved groups: three prefixes, each row scored after its own
    interleaved = {k: jnp.asarray(v) for k, v in {**batch, **batching.shared_prefixes(batch, 1, 8, 8)}.items()}
    assert interleaved["prefix_row"].tolist() == [0, 1, 2] * 4
    learner = Learner(Llama(CFG, rngs=nnx.Rngs(0)), LossConfig("grpo"), OptimConfig(1.0, 0, optimizer="sgd"))
    logp, _ = learner.score(learner.policy_state.params, interleaved)
    full_logp, _ = learner.score(learner.policy_state.params, {k: jnp.asarray(v) for k, v in batch.items()})
    assert np.max(np.abs(np.asarray(logp) - np.asarray(full_logp))[batch["sampled"] > 0]) < 1e-5
    first_answer = np.argmax(ordered["turn_of_token"] >= 0, axis=1)
    assert np.all(logp_shared[np.arange(logp_shared.shape[1])[None] < first_answer[:, None]] == 0)  # the prompts
    assert float(full["loss"]) != 0 and np.isclose(float(sharing["loss"]), float(full["loss"]), atol=1e-6)
    assert np.isclose(float(sharing["grad_norm"]), float(full["grad_norm"]), rtol=1e-5)
    assert max(np.max(np.abs(a - b)) for a, b in zip(params_full, params_shared)) < 1e-5


def test_shared_prompt_rows_of_a_group_go_to_one_micro_batch():
    """informative_first with groups packs a group's rows into consecutive micro-batch positions even when the
    groups are interleaved in the batch, informative groups first."""
    group = np.array([0, 1, 2, 0, 1, 2, 0, 1, 2, 0, 1, 2])
    informative = np.isin(group, [1, 2])
    order = batching.informative_first(informative, 3, group)
    micro = [sorted(group[order[i::3]].tolist()) for i in range(3)]
    assert micro == [[1, 1, 1, 1], [2, 2, 2, 2], [0, 0, 0, 0]]


def test_trainer_step_with_shared_prompts_equals_the_unshared_step(tmp_path):
    """The same GRPO step (same rollout) with `train.share_prompts` gives the unshared step's loss and weights."""
    from configs import grpo_tiny
    from rljax.trainer import Trainer

    results = []
    for share in (False, True):
        config = grpo_tiny.get_config()
        config.workdir = str(tmp_path / str(share))
        config.total_steps = 1
        config.log.progress = config.log.tensorboard = False
        config.train.micro_batches = 8
        config.train.share_prompts = share
        # plain SGD at rate 1 from the first update: the weights move by the gradient itself (AdamW's first step
        # is ~lr * sign(g), which magnifies float noise in near-zero gradients)
        config.optim.update(optimizer="sgd", learning_rate=1.0, warmup_steps=0)
        trainer = Trainer(config)
        initial = [np.asarray(x) for x in jax.tree.leaves(trainer.learner.policy_state.params)]
        metrics = trainer.step().metrics
        params = [np.asarray(x) for x in jax.tree.leaves(trainer.learner.policy_state.params)]
        trainer.close()
        results.append((metrics, params))
    (plain, params_plain), (shared, params_shared) = results
    assert plain["reward/mean"] == shared["reward/mean"]
    assert plain["train/micro_batches_computed"] == shared["train/micro_batches_computed"] > 0
    assert np.isclose(plain["train/loss"], shared["train/loss"], atol=1e-6)
    assert max(np.max(np.abs(a - b)) for a, b in zip(params_plain, initial)) > 1e-3
    assert max(np.max(np.abs(a - b)) for a, b in zip(params_plain, params_shared)) < 1e-6
