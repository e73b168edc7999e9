"""bench/op_profile.py: XLA:CPU's per-op trace of one call, matched to the compiled HLO."""
from __future__ import annotations

import sys
from pathlib import Path

import jax
import jax.numpy as jnp

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.op_profile import op_times  # noqa: E402


def test_each_traced_op_is_named_by_its_source_op_and_shape_and_counted_per_call():
    weight = jnp.full((64, 48), 0.01, jnp.float32)
    step = lambda i, x: x + jnp.tanh(x @ weight).sum(axis=1, keepdims=True)  # noqa: E731
    x = jnp.ones((64, 64), jnp.float32)
    program = jax.jit(lambda x: jax.lax.fori_loop(0, 5, step, x)).lower(x).compile()
    ops, wall = op_times(program, x)
    named = {(o.op_name.split("/")[-1], o.shape): o for o in ops}
    assert named[("dot_general", "f32[64,48]{1,0}")].calls == 5, ops
    assert all(o.op_name.startswith("while/body") for (name, _), o in named.items() if name == "dot_general")
    assert sum(o.calls for o in ops if o.kind == "while") == 1
    assert 0 < sum(o.seconds for o in ops) and wall > 0
    assert [o.seconds for o in ops] == sorted((o.seconds for o in ops), reverse=True)
