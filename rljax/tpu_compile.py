"""Compile a run's device programs for a TPU slice on a host without TPUs (`rljax plan --tpu-compile`).

libtpu describes a slice's chips without the hardware (`jax.experimental.topologies.get_topology_desc`); a mesh
over those devices and `jit(...).lower(abstract arguments with their shardings).compile()` run the TPU compiler
here. Nothing is materialised: the model, optimizer state, KV cache and batch are ShapeDtypeStructs. Shardings
the code does not state (per-layer weight copies, the sampler state) are read from the compiled producer's
`output_shardings`, as the compiler lays them out in a real run; optimizer moments follow their parameters.

Phases compiled: the policy update, the value update (PPO), the scoring pass, the sampler's per-layer weight
copy, prefill and decode loop, or with `rollout.engine = "slots"` the engine's admit and decode programs
(`models.slots`; every slot's cache row lives in their arguments). For each, the compiler's memory analysis
(arguments, outputs, aliasing per chip), the HBM heap of temporaries of its buffer assignment (`_compile`) and
its cost analysis (flops, bytes accessed per chip) are reported; a roofline step time is
max(flops / peak, bytes / bandwidth) with the chip figures in `CHIPS`: an estimate (a lower bound on time, hence
upper bounds on tokens/s and MFU), not a measurement.
"""
from __future__ import annotations

import contextlib
import dataclasses
import glob
import importlib.util
import math
import os
import re
import tempfile
from typing import Any, Callable, Iterator

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import NamedSharding, PartitionSpec
from ml_collections import ConfigDict

from models.kv_cache import KVCache
from models.llama import Llama, LlamaValueModel
from models.lora import add_lora
from models.sharding import DEFAULT_RULES, batch_sharding, is_variable, make_mesh, state_shardings, use_mesh


@dataclasses.dataclass(frozen=True)
class ChipSpec:
    peak_bf16_flops: float  # dense bf16 FLOP/s per chip
    hbm_bytes_per_s: float
    source: str


# Google Cloud TPU documentation, "System architecture" pages of each version (per chip).
CHIPS = {
    "v4": ChipSpec(275e12, 1200e9, "https://cloud.google.com/tpu/docs/v4"),
    "v5e": ChipSpec(197e12, 819e9, "https://cloud.google.com/tpu/docs/v5e"),
    "v5litepod": ChipSpec(197e12, 819e9, "https://cloud.google.com/tpu/docs/v5e"),
    "v5p": ChipSpec(459e12, 2765e9, "https://cloud.google.com/tpu/docs/v5p"),
    "v6e": ChipSpec(918e12, 1640e9, "https://cloud.google.com/tpu/docs/v6e"),
}
# chips -> torus shape: v4 / v5p slices are 3-D (names count TensorCores, two per chip), v5e / v6e 2-D
_SHAPES_3D = {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4", 128: "4x4x8", 256: "4x8x8",
              512: "8x8x8", 1024: "8x8x16", 2048: "8x16x16", 4096: "16x16x16"}
_SHAPES_2D = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16", 256: "16x16"}


class TpuCompileError(ValueError):
    """The slice cannot be described or a program does not compile for it."""


def libtpu_topology(name: str) -> tuple[str, ChipSpec]:
    """'v5p-64' -> ('v5p:2x4x4', chip figures): the planner's slice names mapped to libtpu's topology names."""
    from rljax.plan import parse_topology

    family = name.strip().lower().split("-")[0]
    if family not in CHIPS:
        raise TpuCompileError(f"topology {name!r}: --tpu-compile needs a TPU slice ({', '.join(sorted(CHIPS))}), "
                              "e.g. v5p-64")
    chips = parse_topology(name).devices
    shapes = _SHAPES_3D if family in ("v4", "v5p") else _SHAPES_2D
    if chips not in shapes:
        raise TpuCompileError(f"topology {name!r}: {chips} chips is not a slice shape libtpu knows "
                              f"(chips: {sorted(shapes)})")
    return f"{'v5e' if family == 'v5litepod' else family}:{shapes[chips]}", CHIPS[family]


def topology_devices(name: str) -> tuple[list[Any], ChipSpec]:
    """The slice's devices as the TPU compiler sees them (no hardware needed); needs the libtpu wheel."""
    libtpu_name, chip = libtpu_topology(name)
    if importlib.util.find_spec("libtpu") is None:
        raise TpuCompileError("the TPU compiler (libtpu) is not installed: pip install -e '.[tpu-compile]'")
    from jax.experimental import topologies

    try:
        description = topologies.get_topology_desc(platform="tpu", topology_name=libtpu_name)
    except Exception as err:  # libtpu raises RuntimeError/XlaRuntimeError with long texts
        raise TpuCompileError(f"libtpu cannot describe {libtpu_name}: {_first_line(err)}") from None
    return list(description.devices), chip


def _first_line(err: Exception) -> str:
    lines = [line.strip() for line in str(err).splitlines() if line.strip()]
    return (lines[0] if lines else type(err).__name__)[:300]


@dataclasses.dataclass
class Phase:
    """One compiled program's figures per chip. `temporaries` is the HBM heap of its buffer assignment (see
    `_compile`); libtpu's `temp_size_in_bytes` is kept as `temp_reported`, and used only where no buffer
    assignment was dumped."""
    name: str
    arguments: int  # bytes per chip
    outputs: int
    aliased: int
    temporaries: int
    temp_reported: int
    flops: float  # per chip
    bytes_accessed: float

    @property
    def total(self) -> int:
        """Bytes the program needs at once on a chip: its arguments, outputs not written over a donated
        argument, and its heap of temporaries."""
        return self.arguments + self.outputs - self.aliased + self.temporaries

    def roofline_s(self, chip: ChipSpec) -> float:
        return max(self.flops / chip.peak_bf16_flops, self.bytes_accessed / chip.hbm_bytes_per_s)


_HEAP = re.compile(r"^allocation \d+: size (\d+), preallocated-temp:", re.MULTILINE)  # no color: HBM


@dataclasses.dataclass(frozen=True)
class _Program:
    compiled: Any
    heap: int | None  # HBM bytes of the buffer assignment's preallocated temporaries; None if not dumped


@contextlib.contextmanager
def _without_persistent_cache() -> Iterator[None]:
    """JAX's persistent compilation cache off, then as it was: a cache hit would skip the compile and so the
    dump (`xla_dump_to` is not part of the cache key), and a program compiled for a topology without chips
    cannot be read back from the cache anyway (it would only fill the folder)."""
    from jax.experimental.compilation_cache import compilation_cache

    enabled = jax.config.jax_enable_compilation_cache
    jax.config.update("jax_enable_compilation_cache", False)
    compilation_cache.reset_cache()  # JAX decides once per process whether the cache is used
    try:
        yield
    finally:
        jax.config.update("jax_enable_compilation_cache", enabled)
        compilation_cache.reset_cache()


def _compile(lowered: Any) -> _Program:
    """Compile with the buffer assignment dumped to a scratch folder, and read the HBM heap of temporaries
    that the runtime reserves for the program (its `preallocated-temp` allocation in the default memory space).

    That heap, not libtpu's `memory_analysis().temp_size_in_bytes`, is the program's temporary memory: set
    beside the dump, temp_size_in_bytes is larger on every update program (rlef_llama3_1_8b on v5p-64: 15.07 GiB
    against an 11.67 GiB heap; the aligned tiny config on v5e-4: 172.3 MB against 153.0 MB) and 0 for a prefill
    whose heap is 1.4 MB, and its `peak_memory_in_bytes` also counts values held in on-chip VMEM."""
    with tempfile.TemporaryDirectory(prefix="rljax-tpu-dump-") as folder, _without_persistent_cache():
        compiled = lowered.compile(compiler_options={"xla_dump_to": folder})
        reports = glob.glob(os.path.join(folder, "*after_optimizations-buffer-assignment.txt"))
        heaps = [sum(int(size) for size in _HEAP.findall(open(path).read())) for path in reports]
    return _Program(compiled, sum(heaps) if heaps else None)


def _phase(name: str, program: _Program) -> Phase:
    memory = program.compiled.memory_analysis()
    cost = program.compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) else cost
    reported = int(memory.temp_size_in_bytes)
    return Phase(name, int(memory.argument_size_in_bytes), int(memory.output_size_in_bytes),
                 int(memory.alias_size_in_bytes), reported if program.heap is None else program.heap, reported,
                 float(cost.get("flops", 0.0)), float(cost.get("bytes accessed", 0.0)))


def _sharded(tree: Any, shardings: Any) -> Any:
    return jax.tree.map(lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings)


def _abstract_model(model_fn: Callable[[], nnx.Module], mesh: Any) -> nnx.Module:
    """An abstract model whose parameters carry their rule shardings on `mesh`."""
    model = nnx.eval_shape(model_fn)
    state = nnx.state(model)
    shardings = state_shardings(state, mesh, DEFAULT_RULES)
    nnx.update(model, jax.tree.map(lambda var, s: var.replace(jax.ShapeDtypeStruct(
        var.get_value().shape, var.get_value().dtype, sharding=s)), state, shardings, is_leaf=is_variable))
    return model


def compile_run(config: ConfigDict, topology: str) -> tuple[list[Phase], ChipSpec, Any]:
    """Compile the run's programs for `topology`; (phases, chip figures, mesh). Raises TpuCompileError."""
    from models.sampler import head_in_compute_dtype, per_layer_weights, sampling_shardings
    from models.token_draw import DrawStatic
    from rljax.learner import Learner, TrainState, split_trainable
    from rljax.plan import train_batch_shapes
    from rljax.run_config import lora_config, loss_config, model_architecture, optim_config

    devices, chip = topology_devices(topology)
    m = config.mesh
    mesh = make_mesh(m.data, m.fsdp, m.tensor, devices=devices)
    arch = model_architecture(config.model)
    lora = lora_config(config.model)
    policy = _abstract_model(lambda: Llama(arch, rngs=nnx.Rngs(0)) if lora is None else
                             add_lora(Llama(arch, rngs=nnx.Rngs(0)), lora), mesh)
    ppo = config.algo.name == "ppo"
    value = None
    if ppo:
        value = _abstract_model(lambda: LlamaValueModel(arch, rngs=nnx.Rngs(1)) if lora is None else
                                _value_with_lora(arch, lora), mesh)
    learner = Learner(policy, loss_config(config), optim_config(config.optim), config.train.micro_batches, value,
                      optim_config(config.value_optim))

    def state_of(params: Any, tx: Any) -> Any:
        """The TrainState of `params`: optimizer moments sharded like the params (as `tx.init` on placed arrays
        leaves them in a real run), counters replicated."""
        shapes = jax.eval_shape(lambda p: TrainState(jnp.zeros((), jnp.int32), p, tx.init(p)), params)
        structure = jax.tree.structure(params)
        like = jax.tree.map(lambda x: x.sharding, params)
        replicated = NamedSharding(mesh, PartitionSpec())
        shardings = jax.tree.map(lambda node: like if jax.tree.structure(node) == structure else replicated,
                                 shapes, is_leaf=lambda node: jax.tree.structure(node) == structure)
        return _sharded(shapes, shardings)

    r = config.rollout
    dialogs = r.problems_per_step * r.samples_per_problem
    batch = {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=batch_sharding(mesh, len(v.shape),
                                                                                batch_size=v.shape[0]))
             for k, v in train_batch_shapes(dialogs, r.cache_capacity, config.env.max_turns).items()}
    phases = []
    try:
        with use_mesh(mesh):
            # the learner's own abstract states come from eval_shape, without shardings: rebuild them from the
            # sharded models' trainable parts
            learner.policy_state = state_of(split_trainable(policy)[2], learner.policy_tx)
            phases.append(_phase("policy update", _compile(learner._update_policy.lower(
                learner.policy_state, learner.policy_frozen, batch))))
            phases.append(_phase("scoring pass", _compile(learner._score.lower(
                learner.policy_state.params, learner.policy_frozen, batch))))
            if ppo:
                learner.value_state = state_of(split_trainable(value)[2], learner.value_tx)
                phases.append(_phase("value update", _compile(learner._update_value.lower(
                    learner.value_state, learner.value_frozen, batch))))
            graphdef, params = nnx.split(learner.policy_model())
            copy = _compile(jax.jit(per_layer_weights, static_argnames=("graphdef",)).lower(graphdef, params))
            phases.append(_phase("sampler per-layer weights", copy))
            layers = _sharded(jax.eval_shape(lambda p: per_layer_weights(graphdef, p), params),
                              copy.compiled.output_shardings)
            params = _sharded(jax.eval_shape(lambda p: head_in_compute_dtype(p, arch), params),  # as the Sampler
                              jax.tree.map(lambda x: x.sharding, params))
            # with replicate_weights the Sampler then reshards the copies and the head (array by array) whole
            # onto each data/fsdp shard: the prefill and decode read them so
            if r.replicate_weights:
                params_in, layers_in = sampling_shardings(params, layers, DEFAULT_RULES)
                params, layers = _sharded(params, params_in), _sharded(layers, layers_in)
            width = min(r.cache_capacity - r.max_new_tokens, 2048)
            rows = lambda shape, dtype: jax.ShapeDtypeStruct(  # noqa: E731
                shape, dtype, sharding=batch_sharding(mesh, len(shape), batch_size=shape[0]))
            one = NamedSharding(mesh, PartitionSpec())
            key = jax.ShapeDtypeStruct((), jax.random.key(0).dtype, sharding=one)
            scalar = jax.ShapeDtypeStruct((), jnp.float32, sharding=one)
            static = DrawStatic(greedy=False, top_k=r.top_k, use_top_p=r.top_p < 1.0, stop_ids=(0,),
                                max_new=r.max_new_tokens)
            phases_of = _engine_phases if r.engine == "slots" else _chunk_phases
            phases += phases_of(arch, mesh, r, dialogs, width, (graphdef, params, layers), (key, scalar, scalar),
                                static, (mesh, DEFAULT_RULES), rows)
    except Exception as err:  # the TPU compiler's reasons (out of memory, unsupported op) come as many types
        done = phases[-1].name if phases else "nothing"
        raise TpuCompileError(f"does not compile for {topology} (after {done}): {_first_line(err)}") from None
    return phases, chip, mesh


def _chunk_phases(arch: Any, mesh: Any, r: ConfigDict, dialogs: int, width: int, weights: tuple, sampling: tuple,
                  static: Any, mesh_rules: Any, rows: Callable) -> list[Phase]:
    """The chunked rollout's prefill of one chunk's prompts (`width` tokens) and its decode loop."""
    from models.sampler import _decode, _prefill, attention_window, cache_shardings

    chunk = math.ceil(dialogs / r.num_chunks)
    # the TPU's key layout: one tile of every column
    cache = jax.eval_shape(lambda: KVCache.init(arch, chunk, r.cache_capacity, key_tile=r.cache_capacity))
    cache = _sharded(cache, cache_shardings(cache, mesh))
    prefill_args = (*weights, cache, rows((chunk, width), jnp.int32), rows((chunk, width), jnp.bool_),
                    rows((chunk,), jnp.int32), rows((chunk,), jnp.bool_), rows((chunk,), jnp.int32), *sampling)
    window = attention_window(width, r.cache_capacity)
    prefill = _compile(_prefill.lower(*prefill_args, static=static, mesh_rules=mesh_rules, window=window))
    state = _sharded(jax.eval_shape(lambda *a: _prefill(*a, static=static, mesh_rules=mesh_rules, window=window),
                                    *prefill_args), prefill.compiled.output_shardings)
    step_limit = jax.ShapeDtypeStruct((), jnp.int32, sharding=NamedSharding(mesh, PartitionSpec()))
    decode = _compile(_decode.lower(*weights, state, step_limit, *sampling, static=static, mesh_rules=mesh_rules,
                                    window=r.cache_capacity))
    return [_phase(f"prefill ({chunk} dialogs x {width} tokens)", prefill),
            _phase(f"decode loop ({chunk} dialogs, {r.cache_capacity}-slot window)", decode)]


def _engine_phases(arch: Any, mesh: Any, r: ConfigDict, dialogs: int, width: int, weights: tuple, sampling: tuple,
                   static: Any, mesh_rules: Any, rows: Callable) -> list[Phase]:
    """The slots engine's two programs (`models.slots`) for its first admission of a step: every slot takes a
    new dialog, the G dialogs of a problem sharing one prompt segment of `width` tokens (padded as the engine pads,
    `rljax.engine.segment_width`), then the decode loop over all slots at the full window."""
    from models.sampler import attention_window, cache_shardings
    from models.slots import SlotState, admit, decode, decodes_every_slot, slot_order, slot_shards
    from rljax.engine import RoundEntry, admission_layout, segment_width

    slots = r.slots or dialogs
    cache = jax.eval_shape(lambda: KVCache.init(arch, slots, r.cache_capacity, key_tile=r.cache_capacity))  # one tile
    state = jax.eval_shape(lambda c: SlotState.init(c, r.max_new_tokens), cache)
    rows_of = jax.tree.map(lambda x: batch_sharding(mesh, len(x.shape), batch_size=x.shape[0]),
                           state.replace(cache=None))  # every other field is [slots, ...]
    state = _sharded(state, rows_of.replace(cache=cache_shardings(state.cache, mesh)))
    prompts = min(math.ceil(slots / r.samples_per_problem), r.admit_rows or slots)
    # as rljax.engine lays them out: dialog i on slot order[i] (models.slots.slot_order), each block of slots its
    # own segments (a prompt once per block that holds some of its group), counts padded to powers of two per block
    shards, group = slot_shards(mesh_rules, slots), r.samples_per_problem
    order = slot_order(slots, shards, group)
    started = [RoundEntry(order[i], [i // group], True, (i // group,), True, 0)  # ids, share: the prompt's group
               for i in range(min(slots, prompts * group))]
    segments = admission_layout(started, slots, shards)[2] * shards
    width = min(segment_width(width, r.length_bucket), r.cache_capacity)
    window = attention_window(width, r.cache_capacity)
    # in rounds of admit_width tokens, the prompts' last round: admit_width new tokens onto rows of the prompts'
    # earlier rounds (gathered), attending to the whole window
    fresh = not r.admit_width or width <= r.admit_width
    width = width if fresh else r.admit_width
    args = (rows((segments, width), jnp.int32), rows((segments,), jnp.int32), rows((segments,), jnp.int32),
            rows((segments,), jnp.bool_), rows((slots,), jnp.int32), rows((slots,), jnp.int32),
            rows((slots,), jnp.int32))
    admitted = _compile(admit.lower(*weights, state, *args, *sampling, static=static, mesh_rules=mesh_rules,
                                    window=window, fresh=fresh, shards=shards))
    state = _sharded(jax.eval_shape(lambda *a: admit(*a, static=static, mesh_rules=mesh_rules, window=window,
                                                     fresh=fresh, shards=shards),
                                    *weights, state, *args, *sampling), admitted.compiled.output_shardings)
    named = None if decodes_every_slot(mesh_rules, slots) else rows((slots,), jnp.int32)  # as rljax.engine
    decoded = _compile(decode.lower(*weights, state, named, *sampling, static=static, mesh_rules=mesh_rules,
                                    window=r.cache_capacity, steps=r.check_every))
    rounds = "" if fresh else f" (the last round of {r.admit_width} tokens, {window}-slot window)"
    return [_phase(f"engine admit ({segments} prompt segments x {width} tokens -> {slots} slots{rounds})", admitted),
            _phase(f"engine decode ({slots} slots, {r.cache_capacity}-slot window)", decoded)]


def _value_with_lora(arch: Any, lora: Any) -> LlamaValueModel:
    value = LlamaValueModel(arch, rngs=nnx.Rngs(1))
    add_lora(value.backbone, lora)
    return value


@dataclasses.dataclass
class CompileReport:
    topology: str
    libtpu_name: str
    chip: ChipSpec
    mesh: dict[str, int]
    phases: list[Phase]
    planned: dict[str, tuple[int, int]]  # comparison -> (planner bytes, compiler bytes) per chip
    peak: int  # per chip, from the compiler's figures plus the resident state the program does not hold
    hbm_bytes: int
    update_tokens: int  # tokens in one policy update (all dialogs at the full context)
    model_flops: float  # 6 * params * tokens of one policy update (the useful flops, whole slice)
    update_flops_per_chip: float  # analytic: with the backward, remat recompute and causal attention
    decode_rows: int
    decode_bytes_per_chip: float  # analytic lower bound of one decode step: the weights and the chunk's KV cache

    @property
    def fits(self) -> bool:
        from rljax.plan import FIT_FRACTION

        return self.peak <= FIT_FRACTION * self.hbm_bytes

    def phase(self, prefix: str) -> Phase:
        return next(p for p in self.phases if p.name.startswith(prefix))


def compile_report(config: ConfigDict, topology: str) -> CompileReport:
    """Compile the run for `topology` and set the compiler's per-chip figures beside the planner's."""
    from models.convert import param_count
    from rljax.plan import parse_topology, plan_memory, planned_update
    from rljax.run_config import model_architecture

    phases, chip, mesh = compile_run(config, topology)
    plan = plan_memory(config, parse_topology(topology))
    c = plan.components
    by = {p.name.split(" (")[0]: p for p in phases}
    update = by["policy update"]
    plan_update = planned_update(plan)
    engine = "engine admit" in by  # the slots engine: one cache of every slot's row, in its programs' arguments
    chunks = 1 if engine else config.rollout.num_chunks
    prefill, decode = (by["engine admit"], by["engine decode"]) if engine else (by["prefill"], by["decode loop"])
    planned = {
        "update arguments": (plan_update["arguments"], update.arguments),
        "update temporaries": (plan_update["temporaries"], update.temporaries),
        ("engine admit (weights, per-layer copy, every slot's cache, attention)" if engine else
         "prefill (weights, per-layer copy, one chunk's cache, attention)"): (
            c["policy params"] + c["sampler per-layer weights"] + c["KV cache (all dialogs)"] // chunks
            + c["prefill attention (one chunk)"], prefill.total),
    }
    outside_update = plan.resident - c["policy params"] - c["policy AdamW moments"]
    outside_rollout = plan.resident - c["policy params"] + c["KV cache (all dialogs)"] * (chunks - 1) // chunks
    peak = max(update.total + outside_update, prefill.total + outside_rollout, decode.total + outside_rollout)
    arch = model_architecture(config.model)
    arch_params = param_count(arch)
    r = config.rollout
    dialogs = r.problems_per_step * r.samples_per_problem
    tokens = dialogs * r.cache_capacity
    # a token's training flops: forward 2 N, backward 4 N, a forward again under full remat; causal attention
    # over T keys averages T / 2 keys: 2 matmuls x 2 flops x T / 2 x heads x head_dim per layer, forward
    passes = 3 + (arch.remat == "full")
    attention = arch.num_layers * 2 * r.cache_capacity * arch.num_heads * arch.head_dim * passes
    update_flops = tokens * (2 * passes * arch_params + attention)
    chunk = (config.rollout.slots or dialogs) if engine else math.ceil(dialogs / chunks)  # rows per decode step
    kv_bytes = chunk * r.cache_capacity * arch.num_layers * 2 * arch.num_kv_heads * arch.head_dim * jnp.dtype(
        arch.dtype).itemsize
    return CompileReport(topology, libtpu_topology(topology)[0], chip, dict(mesh.shape), phases, planned, peak,
                         plan.topology.hbm_bytes, tokens, 6.0 * arch_params * tokens, update_flops / mesh.size,
                         chunk, (c["sampler per-layer weights" if r.replicate_weights else "policy params"] * 1.0
                                 + kv_bytes / mesh.size))


def format_report(report: CompileReport) -> str:
    gib, chip = 2.0**30, report.chip
    mesh = " ".join(f"{k}={v}" for k, v in report.mesh.items())
    lines = [f"TPU compiler, {report.topology} ({report.libtpu_name}), mesh {mesh}, per chip:",
             f"  {'program':<52} {'args GiB':>9} {'out GiB':>8} {'temp GiB':>9} {'total GiB':>10} "
             f"{'temp_size GiB':>14} {'TFLOP':>8} {'GB read+written':>16} {'roofline ms':>12}"]
    for p in report.phases:
        lines.append(f"  {p.name:<52} {p.arguments / gib:9.2f} {p.outputs / gib:8.2f} {p.temporaries / gib:9.2f} "
                     f"{p.total / gib:10.2f} {p.temp_reported / gib:14.2f} {p.flops / 1e12:8.3f} "
                     f"{p.bytes_accessed / 1e9:16.2f} {1e3 * p.roofline_s(chip):12.2f}")
    lines.append("  (temp: the HBM heap of temporaries in the compiler's buffer assignment; temp_size: libtpu's "
                 "memory_analysis().temp_size_in_bytes, which disagrees with that heap; not used)")
    lines.append("  planner vs compiler (per chip):")
    for name, (planned, compiled) in report.planned.items():
        lines.append(f"    {name:<66} {planned / gib:8.2f} vs {compiled / gib:8.2f} GiB "
                     f"(ratio {planned / max(compiled, 1):.2f})")
    verdict = "fits" if report.fits else "DOES NOT FIT"
    lines.append(f"  {verdict}: peak {report.peak / gib:.2f} GiB of {report.hbm_bytes / gib:g} GiB HBM (the larger "
                 "program's total plus the resident state it does not hold)")
    decode = next(p for p in report.phases if p.name.startswith(("decode loop", "engine decode")))
    chips = math.prod(report.mesh.values())
    step = report.update_flops_per_chip / chip.peak_bf16_flops
    lines.append(f"  roofline estimate ({chip.peak_bf16_flops / 1e12:g} TFLOP/s bf16, {chip.hbm_bytes_per_s / 1e9:g} "
                 f"GB/s HBM per chip; {chip.source}):")
    lines.append(f"    policy update (analytic {report.update_flops_per_chip / 1e12:,.2f} TFLOP per chip; the "
                 "compiler's cost analysis above counts each scanned body once: micro-batch, layer, vocab chunk)")
    lines.append(f"      >= {step:.2f} s for {report.update_tokens:,} tokens: <= {report.update_tokens / step:,.0f} "
                 f"tokens/s on {chips} chips, MFU <= {report.model_flops / (chips * step * chip.peak_bf16_flops):.0%}")
    compiled_step = decode.roofline_s(chip)
    floor = report.decode_bytes_per_chip / chip.hbm_bytes_per_s
    lines.append(f"    decode step (the loop body: one step, {report.decode_rows} dialogs): compiler "
                 f"{decode.bytes_accessed / 1e9:.2f} GB per chip -> >= {1e3 * compiled_step:.2f} ms, <= "
                 f"{report.decode_rows / compiled_step:,.0f} tokens/s; reading only the weights and KV cache "
                 f"({report.decode_bytes_per_chip / 1e9:.2f} GB) -> >= {1e3 * floor:.2f} ms, <= "
                 f"{report.decode_rows / floor:,.0f} tokens/s")
    return "\n".join(lines)
