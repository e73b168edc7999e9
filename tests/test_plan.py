"""The memory planner: topologies, exact parameter and cache shards, pod configs that fit, and the estimate
against XLA's own memory analysis of the compiled update step."""
import math

import jax
import pytest

from configs import grpo_tiny, rlef_llama3_1_70b, rlef_llama3_1_8b, rlef_smollm2, rlef_tiny, swerl_llama3_3_70b
from models.config import PRESETS
from models.kv_cache import KVCache
from rljax.cli import main
from rljax.plan import GIB, parse_topology, plan_memory, planned_update, xla_update_memory
from rljax.run_config import model_architecture


def test_topology_names():
    assert parse_topology("v5p-128").devices == 64 and parse_topology("v5p-128").hbm_bytes == 95 * GIB
    assert parse_topology("v4-32").devices == 16 and parse_topology("v4-32").hbm_bytes == 32 * GIB
    assert parse_topology("v5e-256").devices == 256 and parse_topology("h100-8").hbm_bytes == 80 * GIB
    assert parse_topology(devices=6, hbm_gib=24).devices == 6
    for bad in ("v9-8", "v5p", "tpu"):
        with pytest.raises(ValueError, match="topology"):
            parse_topology(bad)
    with pytest.raises(ValueError, match="both"):
        parse_topology(devices=8)


def test_parameter_and_cache_shards_are_exact():
    config = rlef_llama3_1_8b.get_config()
    arch = PRESETS["llama3_1_8b"]
    count = arch.vocab_size * arch.hidden_size * 2 + arch.hidden_size + arch.num_layers * (
        2 * arch.hidden_size + arch.hidden_size * arch.head_dim * (2 * arch.num_heads + 2 * arch.num_kv_heads)
        + 3 * arch.hidden_size * arch.intermediate_size)
    assert 8.0e9 < count < 8.1e9
    one = plan_memory(config, parse_topology(devices=1, hbm_gib=10000))
    assert one.components["policy params"] == count * 4  # float32 master weights (model.param_dtype)
    sharded = plan_memory(config, parse_topology("v5p-64"))
    # every matrix splits 32 ways over fsdp; only the norm vectors stay replicated
    replicated = (arch.num_layers * 2 + 1) * arch.hidden_size * 2
    assert sharded.components["policy params"] == (count * 4 - 2 * replicated) // 32 + 2 * replicated
    # the sampler's weights: whole on every fsdp shard (the per-layer copies and the head), or the layer stacks'
    # training-layout shard without rollout.replicate_weights; in the bf16 compute dtype, not as the float32
    # master weights are
    assert sharded.components["sampler per-layer weights"] == count * 2
    outside = arch.vocab_size * arch.hidden_size * 2 + arch.hidden_size
    config.rollout.replicate_weights = False
    layers = count - outside
    layer_norms = arch.num_layers * 2 * arch.hidden_size
    assert plan_memory(config, parse_topology("v5p-64")).components["sampler per-layer weights"] == (
        (layers - layer_norms) * 2 // 32 + layer_norms * 2)
    tiny = rlef_tiny.get_config()
    cache = jax.eval_shape(lambda: KVCache.init(model_architecture(tiny.model), 32, 128))
    cache_bytes = sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(cache) if x.ndim)  # not the index
    plan = plan_memory(tiny, parse_topology(devices=1, hbm_gib=1))
    assert plan.components["KV cache (all dialogs)"] == cache_bytes
    tiny.rollout.engine, tiny.rollout.slots = "slots", 8  # one cache of 8 slot rows (rljax.engine)
    slots = plan_memory(tiny, parse_topology(devices=1, hbm_gib=1))
    assert slots.components["KV cache (all dialogs)"] == cache_bytes // 4
    tiny.rollout.admit_rows = 2  # one admission prefills 2 of the 8 slots' prompts
    capped = plan_memory(tiny, parse_topology(devices=1, hbm_gib=1))
    assert capped.components["prefill attention (one chunk)"] * 4 == slots.components["prefill attention (one chunk)"]
    width = tiny.rollout.cache_capacity - tiny.rollout.max_new_tokens  # a prompt's widest prefill
    tiny.rollout.admit_width = tiny.rollout.length_bucket  # ... in rounds of length_bucket tokens
    rounds = plan_memory(tiny, parse_topology(devices=1, hbm_gib=1))
    assert rounds.components["prefill attention (one chunk)"] * width == (
        capped.components["prefill attention (one chunk)"] * tiny.rollout.length_bucket)


@pytest.mark.parametrize("module,topology", [(rlef_llama3_1_8b, "v5p-64"), (rlef_llama3_1_70b, "v5p-256"),
                                             (swerl_llama3_3_70b, "v5p-256")])
def test_shipped_pod_configs_fit_their_slices(module, topology):
    plan = plan_memory(module.get_config(), parse_topology(topology))
    assert plan.fits, plan.components
    assert plan.peak > 10 * GIB  # sized for the slice, not trivially small
    config = module.get_config()
    config.rollout.engine = "slots"  # every dialog on a slot, admitted rollout.admit_rows prompts at a time
    slots = plan_memory(config, parse_topology(topology))
    assert slots.fits, slots.components
    assert slots.components["prefill attention (one chunk)"] <= plan.components["prefill attention (one chunk)"]


def test_planner_refuses_what_does_not_fit(capsys):
    assert main(["plan", "--config", "configs/rlef_llama3_1_8b.py", "--topology", "v5e-8"]) == 2
    assert "DOES NOT FIT" in capsys.readouterr().out
    assert main(["plan", "--config", "configs/rlef_llama3_1_8b.py", "--topology", "v5p-64",
                 "--config.model.remat=none"]) == 2
    assert main(["plan", "--config", "configs/rlef_llama3_1_8b.py", "--topology", "v5p-64"]) == 0


@pytest.mark.parametrize("module,remat,lora", [(rlef_tiny, "", ""), (grpo_tiny, "", ""), (rlef_smollm2, "", ""),
                                               (rlef_smollm2, "full", ""), (grpo_tiny, "", "all"),
                                               (rlef_smollm2, "", "q,v")])
def test_estimate_within_25_percent_of_xla_memory_analysis(module, remat, lora):
    config = module.get_config()
    config.model.remat = remat
    config.model.lora.targets = lora
    measured = xla_update_memory(config)
    planned = planned_update(plan_memory(config, parse_topology(devices=1, hbm_gib=64)))
    for key, value in planned.items():
        assert 0.75 <= value / measured[key] <= 1.25, (key, value, measured[key])


def test_lora_plans_count_only_the_adapters_as_trained():
    full = rlef_llama3_1_8b.get_config()
    adapted = rlef_llama3_1_8b.get_config()
    adapted.model.lora.targets, adapted.model.lora.rank = "all", 16
    topology = parse_topology("v5p-64")
    a, b = plan_memory(full, topology).components, plan_memory(adapted, topology).components
    adapters = b["policy params"] - a["policy params"]
    # rank 16 on q,k,v,o,gate,up,down of 32 layers, float32. A [In, r] and B [r, Out] keep their weight's axes: an
    # "embed" axis is split over the 32 fsdp chips (A of q,k,v,gate,up; B of o,down), the others ("heads",
    # "mlp": tensor, 1 here) are replicated
    split, whole = 16 * 4096 * 7, 16 * (4096 + 14336 + 4096 + 2 * 1024 + 2 * 14336)
    assert adapters == 32 * (split // 32 + whole) * 4
    assert b["policy AdamW moments"] == 2 * adapters and "reference params" not in b
    # the value model shares the frozen base: its own adapters and scalar head only
    assert b["value params"] == adapters + a["value params"] - a["policy params"]
    assert b["value AdamW moments"] == 2 * b["value params"]
    assert b["gradients (accumulator + micro-batch)"] == 2 * b["value params"]  # PPO: the value update's, 2 micro
