"""Will a run config fit a pod slice? Per-chip memory of every resident copy and of each phase's peak.

Resident for the whole run: the policy (params + AdamW's two moments), the frozen reference policy (unless KL
is weighted 0; held in the compute dtype), and for PPO the value model (params + moments). With LoRA
(`model.lora`): the frozen base, the adapters and AdamW moments of the adapters only; no reference copy (the
reference is the base with the adapters off); a PPO value model that shares the base and adds its own adapters
and head. On top of that, at different times:
- rollout: the sampler's per-layer copies of the decoder weights (with `rollout.replicate_weights`, whole on
  every data/fsdp shard, with a copy of the head), the KV cache of every dialog of the step (each
  rollout chunk keeps its cache between turns) and the prefill's attention scores for one chunk;
- update: the gradients (plus an accumulator with several micro-batches), the training batch, the activations
  one micro-batch keeps for the backward pass under the model's remat policy, and one chunk of the chunked
  fp32 log-softmax over the vocabulary (with its fp32 accumulator of the output-embedding gradient).
Parameter shards are exact (the model's logical axes through the sharding rules on the configured mesh);
activations are a per-token count of what the Llama module saves. `xla_update_memory` compiles the real update
step and reads XLA's own memory analysis, the cross-check for configs small enough to compile here.
"""
from __future__ import annotations

import dataclasses
import math
import re
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from ml_collections import ConfigDict

from models.config import LlamaConfig
from models.llama import Llama, LlamaValueModel, query_block_count
from models.lora import LoraParam
from models.sharding import DEFAULT_RULES, MESH_AXES, is_variable, logical_to_spec, mesh_axes_of, mesh_shape
from rljax.run_config import lora_config, loss_config, model_architecture, optim_config

GIB = 2**30
# fp32 [chunk tokens, vocab] buffers live at once in one chunk of the chunked log-softmax and its gradient
# (models/logprobs.py: logits, probabilities, their gradient), measured from XLA's analysis of the update step
LOGIT_COPIES = 3.5
MOMENTS = {"adamw": 2, "sgd": 0}  # optimizer state copies of each trained parameter
FIT_FRACTION = 0.92  # of HBM; the rest is left to XLA's runtime, fragmentation and program code


@dataclasses.dataclass(frozen=True)
class Topology:
    name: str
    devices: int
    hbm_bytes: int  # per device (chip)


# name -> (devices per unit of the name's number, HBM GiB per device). TPU v4/v5p names count TensorCores (two
# per chip, one JAX device per chip); v5e/v6e names count chips; GPU names count GPUs.
_FAMILIES = {"v4": (0.5, 32), "v5p": (0.5, 95), "v5e": (1, 16), "v5litepod": (1, 16), "v6e": (1, 32),
             "a100": (1, 80), "h100": (1, 80), "h200": (1, 141)}


def parse_topology(name: str = "", devices: int = 0, hbm_gib: float = 0.0) -> Topology:
    """'v5p-128', 'v4-64', 'v5e-256', 'h100-8', ... or an explicit device count and HBM per device."""
    if devices or hbm_gib:
        if devices <= 0 or hbm_gib <= 0:
            raise ValueError(f"topology: give both a device count and HBM per device, got {devices}, {hbm_gib}")
        return Topology(name or f"{devices} devices x {hbm_gib:g} GiB", devices, int(hbm_gib * GIB))
    match = re.fullmatch(r"([a-z0-9]+)-(\d+)", name.strip().lower())
    if not match or match.group(1) not in _FAMILIES:
        raise ValueError(f"topology {name!r}: expected FAMILY-N with FAMILY one of {sorted(_FAMILIES)} "
                         "(e.g. v5p-128), or --devices and --hbm-gib")
    per_unit, gib = _FAMILIES[match.group(1)]
    count = int(int(match.group(2)) * per_unit)
    if count < 1:
        raise ValueError(f"topology {name!r}: fewer than one device")
    return Topology(name, count, int(gib * GIB))


def _itemsize(dtype: str) -> int:
    return jnp.dtype(dtype).itemsize


def _shard_bytes(state: Any, sizes: dict[str, int]) -> int:
    """Bytes one device holds of an abstract nnx State sharded by its logical axes on a mesh of `sizes`."""
    mesh = jax.sharding.AbstractMesh(tuple(sizes[a] for a in MESH_AXES), MESH_AXES)
    total = 0
    for var in jax.tree.leaves(state, is_leaf=is_variable):
        value = var.get_value()
        axes = var.get_metadata().get("axes") or (None,) * len(value.shape)
        spec = logical_to_spec(axes, value.shape, mesh, DEFAULT_RULES)
        shard = [dim // math.prod(sizes[a] for a in mesh_axes_of(entry)) for dim, entry in zip(value.shape, spec)]
        total += math.prod(shard) * value.dtype.itemsize
    return total


def _split(n: int, ways: int) -> int:
    """Per-device share of a dim of n split `ways` ways (the sharding rules replicate a dim that does not divide)."""
    return n // ways if ways > 1 and n % ways == 0 else n


@dataclasses.dataclass
class MemoryPlan:
    """Per-device bytes of each component; `peak` is the resident state plus the larger phase."""

    topology: Topology
    mesh: dict[str, int]
    components: dict[str, int]
    rollout: list[str]
    update: list[str]
    assumptions: list[str]

    @property
    def resident(self) -> int:
        return sum(v for k, v in self.components.items() if k not in self.rollout + self.update)

    @property
    def rollout_peak(self) -> int:
        return self.resident + sum(self.components[k] for k in self.rollout)

    @property
    def update_peak(self) -> int:
        return self.resident + sum(self.components[k] for k in self.update)

    @property
    def peak(self) -> int:
        return max(self.rollout_peak, self.update_peak)

    @property
    def fits(self) -> bool:
        return self.peak <= FIT_FRACTION * self.topology.hbm_bytes


def activation_bytes_per_token(arch: LlamaConfig, tensor: int, context: int, remat: str | None = None) -> int:
    """What one token of one sequence keeps per layer for the backward pass under `remat` (default: the
    model's policy); with remat "none" this is also one layer's working set while its backward runs."""
    remat = arch.remat if remat is None else remat
    a = _itemsize(arch.dtype)
    d, f = arch.hidden_size, _split(arch.intermediate_size, tensor)
    heads, kv = _split(arch.num_heads, tensor), _split(arch.num_kv_heads, tensor)
    hd = arch.head_dim
    qkv = (heads + 2 * kv) * hd
    if remat == "full":  # only the layer input; a layer's own activations are recomputed one at a time
        return a * d
    if remat == "dots_saveable":  # matmul outputs without batch dims: projections and MLP, not attention
        return a * (qkv + heads * hd + 3 * d + 2 * f)
    # norms' inputs and outputs, q/k/v before and after RoPE, attention scores (fp32) and probabilities over
    # the keys of the query's block (models.llama._blocked_self_attention), attention output and projection,
    # MLP gate/up/activation and output
    blocks = query_block_count(arch, context)
    keys = context * (blocks + 1) / (2 * blocks)
    return a * (4 * d + 2 * qkv + heads * hd + d + 3 * f + d) + int(heads * keys * (4 + a))


def plan_memory(config: ConfigDict, topology: Topology, prefill_tokens: int = 0) -> MemoryPlan:
    """Per-device memory of a run config on `topology` (see the module doc for what is counted)."""
    arch = model_architecture(config.model)
    sizes = dict(zip(MESH_AXES, mesh_shape(config.mesh.data, config.mesh.fsdp, config.mesh.tensor,
                                           topology.devices)))
    batch_ways, tensor = sizes["data"] * sizes["fsdp"], sizes["tensor"]
    r = config.rollout
    dialogs = r.problems_per_step * r.samples_per_problem
    ppo = config.algo.name == "ppo"

    moments = MOMENTS[config.optim.get("optimizer", "adamw")]
    value_moments = MOMENTS[config.value_optim.get("optimizer", "adamw")]
    lora = lora_config(config.model)
    abstract_policy = nnx.eval_shape(lambda: Llama(arch, rngs=nnx.Rngs(0)))
    policy = _shard_bytes(nnx.state(abstract_policy), sizes)
    in_compute = _itemsize(arch.dtype) / _itemsize(arch.param_dtype)  # a copy in the compute dtype, per byte
    value = _shard_bytes(nnx.state(nnx.eval_shape(lambda: LlamaValueModel(arch, rngs=nnx.Rngs(0)))), sizes)
    if lora is None:
        trained, value_trained = policy, value
        comp = {"policy params": policy, "policy AdamW moments": moments * policy}
        if config.algo.kl_beta:  # no reference copy when KL is weighted 0; else one in the compute dtype
            comp["reference params"] = int(policy * in_compute)
        if ppo:
            comp.update({"value params": value, "value AdamW moments": value_moments * value})
    else:
        from models.lora import add_lora

        adapters = _shard_bytes(nnx.state(nnx.eval_shape(lambda: add_lora(Llama(arch, rngs=nnx.Rngs(0)), lora)),
                                          LoraParam), sizes)
        head = value - policy  # the value model's scalar head (and anything else it adds to the backbone)
        trained, value_trained = adapters, adapters + head
        comp = {"policy params": policy + adapters, "policy AdamW moments": moments * adapters}
        if ppo:  # the value model's own adapters and head on the policy's frozen base arrays
            comp.update({"value params": value_trained, "value AdamW moments": value_moments * value_trained})

    # the sampler reads per-layer copies of the decoder weights (LoRA merged in), made once per rollout call;
    # with rollout.replicate_weights they and a copy of the head are whole on every data/fsdp shard; the
    # copies are in the compute dtype (half the float32 master weights' bytes under bfloat16 compute)
    if r.replicate_weights:
        comp["sampler per-layer weights"] = int(_shard_bytes(nnx.state(abstract_policy), dict(sizes, data=1, fsdp=1))
                                                * in_compute)
    else:
        comp["sampler per-layer weights"] = int(_shard_bytes(nnx.state(abstract_policy.layers), sizes) * in_compute)
    a = _itemsize(arch.dtype)
    kv_dev = _split(arch.num_kv_heads, tensor)
    slots = r.engine == "slots"  # one cache of `slots` rows (rljax.engine), else one row per dialog
    cache_rows = min(r.slots or dialogs, dialogs) if slots else dialogs
    comp["KV cache (all dialogs)"] = _split(cache_rows, batch_ways) * r.cache_capacity * (
        2 * arch.num_layers * kv_dev * arch.head_dim * a + 1)
    prefill_rows = min(cache_rows, r.admit_rows or cache_rows) if slots else math.ceil(dialogs / r.num_chunks)
    chunk_dev = _split(prefill_rows, batch_ways)
    width = prefill_tokens or min(r.cache_capacity - r.max_new_tokens, 2048)
    if slots and r.admit_width:  # the engine prefills at most admit_width tokens of a segment per call
        width = min(width, r.admit_width)
    heads_dev = _split(arch.num_heads, tensor)
    comp["prefill attention (one chunk)"] = chunk_dev * (
        heads_dev * width * r.cache_capacity * (4 + a) + 2 * width * arch.hidden_size * a)

    rows_dev = _split(dialogs // config.train.micro_batches, batch_ways)
    length = r.cache_capacity
    grads = value_trained if ppo else trained
    comp["gradients (accumulator + micro-batch)"] = grads * (1 if config.train.micro_batches == 1 else 2)
    batch = train_batch_shapes(dialogs, length, config.env.max_turns)
    comp["training batch"] = sum(x.size * x.dtype.itemsize for x in batch.values()) // (
        batch_ways if dialogs % batch_ways == 0 else 1)
    saved = activation_bytes_per_token(arch, tensor, length)
    working = activation_bytes_per_token(arch, tensor, length, remat="none")  # the layer whose backward runs
    comp["activations (one micro-batch)"] = rows_dev * length * (arch.num_layers * saved + working)
    chunk_tokens = rows_dev * min(config.train.vocab_chunk, length)
    head_fp32 = _split(arch.vocab_size, tensor) * _split(arch.hidden_size, sizes["fsdp"]) * 4
    comp["log-softmax chunk + fp32 head gradient"] = (
        chunk_tokens * LOGIT_COPIES * _split(arch.vocab_size, tensor) * 4 + head_fp32)
    assumptions = [
        f"mesh data={sizes['data']} fsdp={sizes['fsdp']} tensor={sizes['tensor']} on {topology.devices} devices",
        f"{dialogs} dialogs per step, cache {r.cache_capacity} tokens each, "
        + (f"{cache_rows} rollout slots" if slots else f"{r.num_chunks} rollout chunks"),
        f"prefill of {prefill_rows} rows x {width} new tokens against the full cache",
        "sampler weights " + ("replicated over data/fsdp (rollout.replicate_weights)" if r.replicate_weights
                              else "in the training layout (gathered per decode step)"),
        f"update: {config.train.micro_batches} micro-batches of {dialogs // config.train.micro_batches} dialogs "
        f"at the full {length}-token context, remat={arch.remat}, params {arch.param_dtype}, compute {arch.dtype}",
        f"fits when the peak is at most {FIT_FRACTION:.0%} of {topology.hbm_bytes / GIB:g} GiB"]
    if lora is not None:
        assumptions.append(f"LoRA rank {lora.rank} on {', '.join(lora.targets)}: only the adapters "
                           f"({trained / GIB:.3f} GiB per device) train; no reference copy")
    return MemoryPlan(topology, sizes, comp, ["sampler per-layer weights", "KV cache (all dialogs)",
                                              "prefill attention (one chunk)"],
                      ["gradients (accumulator + micro-batch)", "training batch", "activations (one micro-batch)",
                       "log-softmax chunk + fp32 head gradient"],
                      assumptions)


def format_plan(plan: MemoryPlan, title: str = "") -> str:
    lines = [f"{title} on {plan.topology.name}" if title else plan.topology.name]
    lines += [f"  {k:<40} {v / GIB:10.2f} GiB" for k, v in plan.components.items()]
    lines += [f"  {'resident':<40} {plan.resident / GIB:10.2f} GiB",
              f"  {'peak in rollout':<40} {plan.rollout_peak / GIB:10.2f} GiB",
              f"  {'peak in update':<40} {plan.update_peak / GIB:10.2f} GiB",
              f"  {'HBM per device':<40} {plan.topology.hbm_bytes / GIB:10.2f} GiB",
              f"  {'fits' if plan.fits else 'DOES NOT FIT'}: peak {plan.peak / GIB:.2f} GiB = "
              f"{plan.peak / plan.topology.hbm_bytes:.0%} of HBM"]
    lines += ["  assumptions:"] + [f"    - {x}" for x in plan.assumptions]
    return "\n".join(lines)


def xla_update_memory(config: ConfigDict) -> dict[str, int]:
    """XLA's memory analysis of the policy update step (one device, full context, compiled, never run); with
    LoRA its arguments are the adapters, their moments and the frozen base."""
    from rljax.learner import Learner

    from models.lora import add_lora

    arch = model_architecture(config.model)
    lora = lora_config(config.model)
    policy = nnx.eval_shape(lambda: Llama(arch, rngs=nnx.Rngs(0)) if lora is None else
                            add_lora(Llama(arch, rngs=nnx.Rngs(0)), lora))
    value = nnx.eval_shape(lambda: LlamaValueModel(arch, rngs=nnx.Rngs(0))) if config.algo.name == "ppo" else None
    learner = Learner(policy, loss_config(config), optim_config(config.optim), config.train.micro_batches, value)
    r = config.rollout
    batch = train_batch_shapes(r.problems_per_step * r.samples_per_problem, r.cache_capacity, config.env.max_turns)
    compiled = learner.compiled_update(batch)
    stats = compiled.memory_analysis()
    return {"arguments": int(stats.argument_size_in_bytes), "outputs": int(stats.output_size_in_bytes),
            "aliased": int(stats.alias_size_in_bytes), "temporaries": int(stats.temp_size_in_bytes)}


def planned_update(plan: MemoryPlan) -> dict[str, int]:
    """The plan's figures for the same things XLA's analysis of the update step counts."""
    c = plan.components
    return {"arguments": c["policy params"] + c["policy AdamW moments"] + c["training batch"],
            "temporaries": c["gradients (accumulator + micro-batch)"] + c["activations (one micro-batch)"]
            + c["log-softmax chunk + fp32 head gradient"]}


def train_batch_shapes(dialogs: int, length: int, turns: int) -> dict[str, jax.ShapeDtypeStruct]:
    """Shapes and dtypes of the trainer's training batch (rljax.batching plus the learner's extra fields)."""
    def s(shape: tuple[int, ...], dtype: Any) -> jax.ShapeDtypeStruct:
        return jax.ShapeDtypeStruct(shape, np.dtype(dtype))

    bl, bt = (dialogs, length), (dialogs, turns)
    out = {k: s(bl, np.int32) for k in ("tokens", "positions", "turn_of_token")}
    out["valid"] = s(bl, bool)
    out.update({k: s(bl, np.float32) for k in ("sampled", "sampler_logp", "old_logp", "ref_logp", "weights",
                                               "advantages")})
    out.update({k: s(bt, np.float32) for k in ("old_values", "returns", "turn_weights")})  # PPO's value targets
    out.update({"value_index": s(bt, np.int32), "turn_mask": s(bt, np.float32), "task_reward": s(bt, np.float32),
                "group": s((dialogs,), np.int32), "trainable": s((dialogs,), np.float32)})
    return out
