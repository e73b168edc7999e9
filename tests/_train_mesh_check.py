"""Run in a subprocess with 8 simulated CPU devices: one PPO, one GRPO, one GRPO-with-LoRA and one GRPO update
with shared prompts (rljax.batching.shared_prefixes) on the (data 2, fsdp 4) mesh must give the loss and
parameters of the same update on one device. Prints one JSON line."""
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from models.config import LlamaConfig
from models.llama import Llama, LlamaValueModel
from models.lora import LoraConfig, add_lora
from models.sharding import batch_sharding, make_mesh, shard_model, use_mesh
from rljax.learner import Learner, LossConfig, OptimConfig
from rljax import batching
from tests.test_shared_prefix import grouped_batch
from tests.test_trainer import synthetic_batch

assert jax.device_count() == 8, jax.device_count()


def shared_prompt_batch() -> dict[str, np.ndarray]:
    """Two groups of 4 rows, each group's prompt once per micro-batch (2 micro-batches)."""
    rows = grouped_batch(groups=2, size=4, length=40)
    order = batching.informative_first(np.ones(8, bool), 2, rows["group"])
    rows = {k: v[order] for k, v in rows.items()}
    return {**rows, **batching.shared_prefixes(rows, 2, 8, 8)}


def one_update(algorithm: str, mesh, lora: bool = False, shared: bool = False) -> tuple[float, list[np.ndarray]]:
    cfg = LlamaConfig.preset("tiny", vocab_size=64, num_heads=4, num_kv_heads=4)
    policy = Llama(cfg, rngs=nnx.Rngs(0))
    if lora:  # adapters on every projection; only they train
        add_lora(policy, LoraConfig(("all",), 4, 8.0), seed=1)
    policy = shard_model(policy, mesh)
    value = shard_model(LlamaValueModel(cfg, rngs=nnx.Rngs(1)), mesh) if algorithm == "ppo" else None
    # plain SGD at rate 1: the parameter change is the clipped gradient itself (AdamW's first step is ~lr * sign)
    learner = Learner(policy, LossConfig(algorithm, kl_coef=0.1, kl_in_loss=True),
                      OptimConfig(1.0, 0, optimizer="sgd"), 2, value)
    initial = [np.asarray(x) for x in jax.tree.leaves(learner.policy_state.params)]
    with use_mesh(mesh):
        batch = {k: jax.device_put(v, batch_sharding(mesh, v.ndim, batch_size=v.shape[0]))
                 for k, v in (shared_prompt_batch() if shared else synthetic_batch(8, 24, 64)).items()}
        metrics = learner.update_policy(batch)
        if value is not None:
            metrics.update(learner.update_value(batch))
    leaves = [np.asarray(x) for x in jax.tree.leaves(learner.policy_state.params)]
    assert max(float(np.max(np.abs(a - b))) for a, b in zip(leaves, initial)) > 1e-3  # the update moved
    return float(metrics["loss"]), leaves


out = {}
for name, algorithm, lora, shared in (("ppo", "ppo", False, False), ("grpo", "grpo", False, False),
                                      ("grpo_lora", "grpo", True, False), ("grpo_shared", "grpo", False, True)):
    single_loss, single = one_update(algorithm, make_mesh(devices=jax.devices()[:1]), lora, shared)
    mesh_loss, sharded = one_update(algorithm, make_mesh(data=2, fsdp=4), lora, shared)
    out[name] = {"loss_single": single_loss, "loss_mesh": mesh_loss,
                      "max_param_diff": max(float(np.max(np.abs(a - b))) for a, b in zip(single, sharded))}
print(json.dumps(out))
sys.stdout.flush()
