"""Run under XLA_FLAGS=--xla_force_host_platform_device_count=8: greedy tokens on 1 device vs a data=2 x fsdp=2 x
tensor=2 mesh, for a first turn and a continuation from the cache, and for decode slots (models.slots) admitted
at different times."""
import json
import sys

import jax
import numpy as np
from flax import nnx

import jax.numpy as jnp

from models import KVCache, Llama, LlamaConfig, make_mesh, shard_model
from models import slots
from models.sampler import Sampler, SamplingParams


def run(sampler, prompts):
    sampling = SamplingParams(max_new_tokens=12, temperature=0.0)
    first, state = sampler.generate(prompts, sampling, jax.random.key(0), cache_capacity=128)
    more, state = sampler.extend(state, [[5, 6]] * len(prompts), sampling, jax.random.key(1))
    return [c.token_ids for c in first], [c.token_ids for c in more], state


def run_slots(sampler, prompts):
    """Slots 0-4 admitted first, 4 decode steps of those rows alone, then slots 5-7 and all rows; greedy to 12
    tokens each."""
    sampling = SamplingParams(max_new_tokens=12, temperature=0.0)
    weights, static = sampler._weights(), sampler._static(sampling)
    state = slots.SlotState.init(sampler._place(KVCache.init(sampler.model.config, 8, 128)), 12)
    one = (jnp.float32(1.0), jnp.float32(1.0))

    def admit(state, rows):
        tokens = np.zeros((8, 16), np.int32)
        length, row, slot = np.zeros(8, np.int32), np.zeros(8, np.int32), np.full(8, 8, np.int32)
        for a, b in enumerate(rows):
            tokens[a, :len(prompts[b])], length[a], row[a], slot[a] = prompts[b], len(prompts[b]), b, b
        return slots.admit(*weights, state, jnp.asarray(tokens), jnp.asarray(length), jnp.asarray(row),
                           jnp.ones(8, bool), jnp.asarray(slot), jnp.arange(8), jnp.asarray(slot % 8),
                           jax.random.key(0), *one, static=static, mesh_rules=sampler._mesh_rules, window=128)

    def decode(state, rows, steps):
        return slots.decode(*weights, state, jnp.asarray(rows, jnp.int32), jax.random.key(0), *one, static=static,
                            mesh_rules=sampler._mesh_rules, window=128, steps=steps)

    state = decode(admit(state, range(5)), [0, 1, 2, 3, 4, 8], 4)  # only the live rows, one padding row
    state = decode(admit(state, range(5, 8)), range(8), 100)
    rows = slots.host_rows(state)
    return [np.asarray(state.tokens_bn)[b, :rows["count_b"][b]].tolist() for b in range(8)]


def main() -> None:
    assert jax.device_count() == 8, jax.device_count()
    cfg = LlamaConfig.preset("tiny")
    rng = np.random.RandomState(0)
    prompts = [rng.randint(1, cfg.vocab_size, n).tolist() for n in (3, 9, 5, 14, 7, 2, 11, 6)]
    single, single_more, _ = run(Sampler(Llama(cfg, rngs=nnx.Rngs(0))), prompts)
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    sharded_model = shard_model(Llama(cfg, rngs=nnx.Rngs(0)), mesh)
    sharded, sharded_more, state = run(Sampler(sharded_model, mesh=mesh), prompts)
    print(json.dumps({"devices": jax.device_count(), "cache_devices": len(state.cache.k_bkhs[0].sharding.device_set),
                      "cache_spec": str(state.cache.k_bkhs[0].sharding.spec), "single": single, "sharded": sharded,
                      "single_continued": single_more, "sharded_continued": sharded_more,
                      "single_slots": run_slots(Sampler(Llama(cfg, rngs=nnx.Rngs(0))), prompts),
                      "sharded_slots": run_slots(Sampler(sharded_model, mesh=mesh), prompts)}))


if __name__ == "__main__":
    sys.exit(main())
