"""Run under XLA_FLAGS=--xla_force_host_platform_device_count=8: logits on 1 device vs an fsdp=4 x tensor=2 mesh."""
import json
import sys

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from models import LlamaConfig, Llama, make_mesh, shard_model, use_mesh
from models.sharding import batch_sharding


def main() -> None:
    assert jax.device_count() == 8, jax.device_count()
    cfg = LlamaConfig.preset("tiny", num_heads=4, num_kv_heads=2, vocab_size=256)
    model = Llama(cfg, rngs=nnx.Rngs(0))
    ids = jnp.asarray(np.random.RandomState(0).randint(0, 256, (8, 24)))
    graphdef, state = nnx.split(model)

    @jax.jit
    def forward(state, ids):
        return nnx.merge(graphdef, state)(ids)[0]

    single = np.asarray(forward(state, ids))
    mesh = make_mesh(data=1, fsdp=4, tensor=2)
    sharded_model = shard_model(Llama(cfg, rngs=nnx.Rngs(0)), mesh)
    _, sharded_state = nnx.split(sharded_model)
    specs = {str(v.sharding.spec) for v in jax.tree.leaves(sharded_state)}
    with use_mesh(mesh):
        out = forward(sharded_state, jax.device_put(ids, batch_sharding(mesh, 2, batch_size=8)))
    print(json.dumps({"max_diff": float(np.abs(np.asarray(out) - single).max()),
                      "n_devices_used": len(out.sharding.device_set), "param_specs": sorted(specs)}))


if __name__ == "__main__":
    sys.exit(main())
