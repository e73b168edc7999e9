"""Run under XLA_FLAGS=--xla_force_host_platform_device_count=8: greedy tokens on 1 device vs a data=2 x fsdp=2 x
tensor=2 mesh, for a first turn and a continuation from the cache (with the sampler's weights replicated over
data/fsdp, and in the training layout), and for decode slots (models.slots) admitted at different times; the
weight-sized all-gathers in the compiled decode loop of each layout and in the slots' decode."""
import json
import math
import re
import sys

import jax
import numpy as np
from flax import nnx

import jax.numpy as jnp

from models import KVCache, Llama, LlamaConfig, make_mesh, shard_model
from models import slots
from models.sampler import Sampler, SamplingParams, _decode


def run(sampler, prompts):
    sampling = SamplingParams(max_new_tokens=12, temperature=0.0)
    first, state = sampler.generate(prompts, sampling, jax.random.key(0), cache_capacity=128)
    more, state = sampler.extend(state, [[5, 6]] * len(prompts), sampling, jax.random.key(1))
    return [c.token_ids for c in first], [c.token_ids for c in more], state


def run_slots(sampler, prompts, compact=True):
    """Slots 0-4 admitted first, 4 decode steps of those rows alone (`compact`: the decode computes those rows
    only; else every slot, as the engine does on a mesh that splits them), then slots 5-7 and all rows; greedy
    to 12 tokens each. Also the compiled decode of the first call."""
    sampling = SamplingParams(max_new_tokens=12, temperature=0.0)
    weights, static = sampler.weights(), sampler.draw_static(sampling)
    state = slots.SlotState.init(sampler._place(KVCache.init(sampler.model.config, 8, 128)), 12)
    one = (jnp.float32(1.0), jnp.float32(1.0))

    def admit(state, rows):
        tokens = np.zeros((8, 16), np.int32)
        length, row, slot = np.zeros(8, np.int32), np.zeros(8, np.int32), np.full(8, 8, np.int32)
        for a, b in enumerate(rows):
            tokens[a, :len(prompts[b])], length[a], row[a], slot[a] = prompts[b], len(prompts[b]), b, b
        return slots.admit(*weights, state, jnp.asarray(tokens), jnp.asarray(length), jnp.asarray(row),
                           jnp.ones(8, bool), jnp.asarray(slot), jnp.arange(8), jnp.asarray(slot % 8),
                           jax.random.key(0), *one, static=static, mesh_rules=sampler._mesh_rules, window=128,
                           fresh=True)

    def decode(state, rows, steps, run=True):
        call = slots.decode if run else slots.decode.lower
        return call(*weights, state, None if rows is None else jnp.asarray(rows, jnp.int32), jax.random.key(0),
                    *one, static=static, mesh_rules=sampler._mesh_rules, window=128, steps=steps)

    state = admit(state, range(5))
    first_rows = [0, 1, 2, 3, 4, 8] if compact else None  # only the live rows and one padding row, or all
    hlo = decode(jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state),
                 first_rows, 4, run=False).compile().as_text()
    state = decode(state, first_rows, 4)
    state = decode(admit(state, range(5, 8)), range(8) if compact else None, 100)
    rows = slots.host_rows(state)
    tokens = [np.asarray(state.tokens_bn)[b, :rows["count_b"][b]].tolist() for b in range(8)]
    return tokens, large_gathers(hlo, "gather|all-gather")


def run_engine_admissions(sampler, prompts):
    """The engine's admissions (`rljax.engine.SlotRolloutRunner._admit`: on a mesh that splits the slots, each
    block of slots gets its own segments): new dialogs on slots 0-4, then 5-7 with 0-4 decoding, then feedback
    turns continuing slots 1 and 6 (two blocks) from their rows; greedy, every slot decoded (as on a mesh).
    Returns every turn's tokens and the floating-point all-gathers (keys, values, logits) of >= 1024 elements in
    the compiled admissions (an admission still gathers its [A, width, 2] scatter indices)."""
    from rljax.engine import SlotRolloutRunner

    sampling = SamplingParams(max_new_tokens=12, temperature=0.0)
    weights, static = sampler.weights(), sampler.draw_static(sampling)
    state = slots.SlotState.init(sampler._place(KVCache.init(sampler.model.config, 8, 128)), 12)
    one = (jnp.float32(1.0), jnp.float32(1.0))
    runner = type("Runner", (), {"sampler": sampler, "cache_capacity": 128, "admit_width": 0,
                                 "_admit_round": SlotRolloutRunner._admit_round})()
    owner, gathers = list(range(8)), []

    def admit(state, admissions):
        captured = {}
        real = slots.admit

        def capture(*args, **kwargs):
            captured["hlo"] = real.lower(*args, **kwargs).compile().as_text()
            return real(*args, **kwargs)

        import rljax.engine as engine
        engine.admit = capture
        try:
            state = SlotRolloutRunner._admit(runner, weights, state, admissions, owner, slots.host_rows(state),
                                             jax.random.key(0), *one, static)
        finally:
            engine.admit = real
        gathers.append(large_gathers(captured["hlo"], dtypes="f|bf"))
        return state

    def decode(state, steps):
        return slots.decode(*weights, state, None, jax.random.key(0), *one, static=static,
                            mesh_rules=sampler._mesh_rules, window=128, steps=steps)

    def turn_tokens(state, rows):
        count = slots.host_rows(state)["count_b"]
        return [np.asarray(state.tokens_bn)[b, :count[b]].tolist() for b in rows]

    state = decode(admit(state, [(b, prompts[b], True) for b in range(5)]), 4)
    state = decode(admit(state, [(b, prompts[b], True) for b in range(5, 8)]), 100)
    first = turn_tokens(state, range(8))
    last = slots.host_rows(state)["last_b"]
    state = decode(admit(state, [(b, [int(last[b]), 5, 6], False) for b in (1, 6)]), 100)
    return first + turn_tokens(state, (1, 6)), gathers


def large_gathers(hlo: str, ops: str = "all-gather", dtypes: str = "[a-z]") -> int:
    """`ops` (all-gathers; or gathers too) of at least 1024 elements in a compiled program: the tiny model's
    smallest weight, [64, 16], and a cache layer's rows are larger; per-row bookkeeping such as [8] flags,
    [8, 12] tokens or one token's [8, 1, 1, 16] query is not. `dtypes`: the element types counted (the start of
    their names, a regex)."""
    shapes = re.findall(rf"= (?:{dtypes})[a-z0-9]*\[([0-9,]*)\][^=]* (?:{ops})(?:-start)?\(", hlo)
    return sum(math.prod(int(d) for d in shape.split(",") if d) >= 1024 for shape in shapes)


def decode_weight_gathers(sampler, state) -> int:
    """All-gathers of at least 1024 elements (the tiny model's smallest weight, [64, 16]) in the compiled decode
    loop of `state`: a weight split over fsdp is gathered on every step. The loop's per-row bookkeeping (done
    flags, counts: [8] and [8, 2]) is gathered in both layouts."""
    weights = sampler.weights()
    abstract = jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), state)
    sampling = SamplingParams(max_new_tokens=12, temperature=0.0)
    return large_gathers(_decode.lower(*weights, abstract, jnp.int32(12), jax.random.key(0), jnp.float32(1.0),
                                       jnp.float32(1.0), static=sampler.draw_static(sampling),
                                       mesh_rules=sampler._mesh_rules, window=128).compile().as_text())


def main() -> None:
    assert jax.device_count() == 8, jax.device_count()
    cfg = LlamaConfig.preset("tiny")
    rng = np.random.RandomState(0)
    prompts = [rng.randint(1, cfg.vocab_size, n).tolist() for n in (3, 9, 5, 14, 7, 2, 11, 6)]
    single, single_more, _ = run(Sampler(Llama(cfg, rngs=nnx.Rngs(0))), prompts)
    mesh = make_mesh(data=2, fsdp=2, tensor=2)
    sharded_model = shard_model(Llama(cfg, rngs=nnx.Rngs(0)), mesh)
    sharded, sharded_more, state = run(Sampler(sharded_model, mesh=mesh), prompts)
    training_layout = Sampler(sharded_model, mesh=mesh, replicate_weights=False)
    gathered, gathered_more, _ = run(training_layout, prompts)
    print(json.dumps({"devices": jax.device_count(), "cache_devices": len(state.cache.k_bkchw[0].sharding.device_set),
                      "cache_spec": str(state.cache.k_bkchw[0].sharding.spec), "single": single, "sharded": sharded,
                      "single_continued": single_more, "sharded_continued": sharded_more,
                      "gathered": gathered, "gathered_continued": gathered_more,
                      "decode_weight_gathers": decode_weight_gathers(Sampler(sharded_model, mesh=mesh), state),
                      "decode_weight_gathers_training_layout": decode_weight_gathers(training_layout, state),
                      "single_slots": run_slots(Sampler(Llama(cfg, rngs=nnx.Rngs(0))), prompts),
                      "sharded_slots": run_slots(Sampler(sharded_model, mesh=mesh), prompts, compact=False),
                      "sharded_slots_compact": run_slots(Sampler(sharded_model, mesh=mesh), prompts),
                      "single_engine": run_engine_admissions(Sampler(Llama(cfg, rngs=nnx.Rngs(0))), prompts),
                      "sharded_engine": run_engine_admissions(Sampler(sharded_model, mesh=mesh), prompts)}))


if __name__ == "__main__":
    sys.exit(main())
