"""Run under XLA_FLAGS=--xla_force_host_platform_device_count=8: greedy tokens on 1 device vs a data=2 x fsdp=2 x
tensor=2 mesh, for a first turn and a continuation from the cache."""
import json
import sys

import jax
import numpy as np
from flax import nnx

from models import Llama, LlamaConfig, make_mesh, shard_model
from models.sampler import Sampler, SamplingParams


def run(sampler, prompts):
    sampling = SamplingParams(max_new_tokens=12, temperature=0.0)
    first, state = sampler.generate(prompts, sampling, jax.random.key(0), cache_capacity=128)
    more, state = sampler.extend(state, [[5, 6]] * len(prompts), sampling, jax.random.key(1))
    return [c.token_ids for c in first], [c.token_ids for c in more], state


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
                      "single_continued": single_more, "sharded_continued": sharded_more}))


if __name__ == "__main__":
    sys.exit(main())
