"""Logical-axis sharding: one rules table maps logical axis names to mesh axes (data, fsdp, tensor).

Every parameter of the Llama module carries logical names in its `axes` metadata; activations are
constrained with `constrain(x, names)`, which is a no-op unless a mesh is active (`use_mesh`).
"""
from __future__ import annotations

import contextlib
import contextvars
import math
from typing import Any, Iterator, Sequence

import jax
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding, PartitionSpec

MESH_AXES = ("data", "fsdp", "tensor")

# logical axis -> mesh axis (or tuple of mesh axes, or None for replicated)
Rules = tuple[tuple[str, str | tuple[str, ...] | None], ...]
DEFAULT_RULES: Rules = (
    ("batch", ("data", "fsdp")),
    ("length", None),
    ("cache_length", None),
    ("layers", None),
    ("vocab", "tensor"),
    ("embed", "fsdp"),
    ("heads", "tensor"),
    ("kv_heads", "tensor"),
    ("head_dim", None),
    ("mlp", "tensor"),
    ("norm", None),
    ("act_embed", None),
    ("lora_rank", None),
)

_ACTIVE: contextvars.ContextVar[tuple[Mesh, Rules] | None] = contextvars.ContextVar("rljax_mesh", default=None)


def mesh_shape(data: int, fsdp: int, tensor: int, device_count: int) -> tuple[int, int, int]:
    """(data, fsdp, tensor) sizes for `device_count` devices; one axis may be -1 to take the remaining devices."""
    sizes = [data, fsdp, tensor]
    if sizes.count(-1) > 1:
        raise ValueError(f"mesh: at most one axis may be -1, got data={data} fsdp={fsdp} tensor={tensor}")
    known = math.prod(s for s in sizes if s != -1)
    if -1 in sizes:
        if device_count % known:
            raise ValueError(f"mesh: {device_count} devices do not divide into data*fsdp*tensor={sizes}")
        sizes[sizes.index(-1)] = device_count // known
    if math.prod(sizes) != device_count:
        raise ValueError(f"mesh: data*fsdp*tensor = {math.prod(sizes)} but {device_count} devices are available")
    return sizes[0], sizes[1], sizes[2]


def make_mesh(data: int = 1, fsdp: int = -1, tensor: int = 1, devices: Sequence[Any] | None = None) -> Mesh:
    """A (data, fsdp, tensor) mesh over `devices` (default: every device of every process)."""
    devices = list(devices if devices is not None else jax.devices())
    return Mesh(np.asarray(devices).reshape(mesh_shape(data, fsdp, tensor, len(devices))), MESH_AXES)


def mesh_axes_of(entry: str | Sequence[str] | None) -> tuple[str, ...]:
    """The mesh axis names of a rule's target or a PartitionSpec entry: None, one name, or a tuple of names."""
    return (entry,) if isinstance(entry, str) else tuple(entry or ())


def logical_to_spec(axes: Sequence[str | None], shape: Sequence[int], mesh: Mesh, rules: Rules = DEFAULT_RULES
                    ) -> PartitionSpec:
    """PartitionSpec for an array with logical `axes`; a dim the mesh axes do not divide stays replicated."""
    table = dict(rules)
    used: set[str] = set()
    spec: list[Any] = []
    for name, dim in zip(axes, shape):
        target = table.get(name) if name is not None else None
        names = tuple(n for n in mesh_axes_of(target) if n not in used and mesh.shape[n] > 1)
        if names and dim % math.prod(mesh.shape[n] for n in names) == 0:
            used.update(names)
            spec.append(names[0] if len(names) == 1 else names)
        else:
            spec.append(None)
    return PartitionSpec(*spec)


def is_variable(x: Any) -> bool:
    return isinstance(x, nnx.Variable)


def state_shardings(state: nnx.State, mesh: Mesh, rules: Rules = DEFAULT_RULES) -> Any:
    """NamedSharding for every variable of an nnx State, from its `axes` metadata (replicated if absent)."""

    def one(var: nnx.Variable) -> NamedSharding:
        axes = var.get_metadata().get("axes") or (None,) * len(var.get_value().shape)
        return NamedSharding(mesh, logical_to_spec(axes, var.get_value().shape, mesh, rules))

    return jax.tree.map(one, state, is_leaf=is_variable)


def shard_model(model: nnx.Module, mesh: Mesh, rules: Rules = DEFAULT_RULES) -> nnx.Module:
    """Place every parameter of `model` on `mesh` per the rules (in place) and return it."""
    state = nnx.state(model)
    shardings = state_shardings(state, mesh, rules)
    nnx.update(model, jax.device_put(state, shardings))
    return model


@contextlib.contextmanager
def use_mesh(mesh: Mesh, rules: Rules = DEFAULT_RULES) -> Iterator[Mesh]:
    """Activate `mesh` for activation constraints (and jax's own mesh context) inside the block."""
    token = _ACTIVE.set((mesh, rules))
    try:
        with jax.sharding.use_mesh(mesh) if hasattr(jax.sharding, "use_mesh") else mesh:
            yield mesh
    finally:
        _ACTIVE.reset(token)


def mesh_active() -> bool:
    """Whether a mesh is active (`use_mesh`): the code traced now is partitioned over it."""
    return _ACTIVE.get() is not None


def constrain(x: jax.Array, axes: Sequence[str | None]) -> jax.Array:
    """with_sharding_constraint by logical axis names; identity when no mesh is active."""
    active = _ACTIVE.get()
    if active is None:
        return x
    mesh, rules = active
    return jax.lax.with_sharding_constraint(x, NamedSharding(mesh, logical_to_spec(axes, x.shape, mesh, rules)))


def batch_sharding(mesh: Mesh, ndim: int, rules: Rules = DEFAULT_RULES, batch_size: int | None = None
                   ) -> NamedSharding:
    """Sharding for a [batch, ...] input array: batch over the data/fsdp axes, the rest replicated."""
    shape = (batch_size if batch_size is not None else math.prod(mesh.shape.values()),) + (1,) * (ndim - 1)
    return NamedSharding(mesh, logical_to_spec(("batch",) + (None,) * (ndim - 1), shape, mesh, rules))


def without_batch_axes(sharding: NamedSharding, rules: Rules = DEFAULT_RULES) -> NamedSharding:
    """`sharding` with the mesh axes of the "batch" rule (data, fsdp) dropped from its spec: each data/fsdp
    shard holds the whole array, still split over the other axes (tensor)."""
    drop = set(mesh_axes_of(dict(rules).get("batch")))

    def kept(entry: Any) -> Any:
        names = tuple(n for n in mesh_axes_of(entry) if n not in drop)
        return None if not names else names[0] if len(names) == 1 else names

    return NamedSharding(sharding.mesh, PartitionSpec(*(kept(e) for e in sharding.spec)))


def host_array(x: Any) -> np.ndarray:
    """The whole value of `x` as numpy on this host, gathering the shards other processes hold if needed."""
    if not isinstance(x, jax.Array) or x.is_fully_addressable or x.is_fully_replicated:
        return np.asarray(x)
    from jax.experimental import multihost_utils

    return np.asarray(multihost_utils.process_allgather(x, tiled=True))
