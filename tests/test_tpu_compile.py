"""The TPU compiler on this CPU host (`rljax plan --tpu-compile`): the update step and the sampler (or the slots
engine) compile for a v5e 2x2 slice from abstract state, the compiler's memory figures set beside the planner's, clear one-line errors.
Needs libtpu (the tpu-compile extra); skipped with the reason when it is absent."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

from configs import grpo_tiny
from rljax.cli import main

# libtpu admits one process per host (its lockfile, held until the process ends), so these run in `make test`'s
# serial part, not beside another pytest-xdist worker
pytestmark = [pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                 reason="libtpu is not installed: pip install -e '.[tpu-compile]'"),
              pytest.mark.serial]


def _aligned_tiny():
    """grpo_tiny with dimensions that fill TPU tiles (last dim a multiple of 128): with the toy's 14-token
    vocabulary and 64-wide layers, tile padding (8 x 128 per 32-bit tile) would dominate every buffer."""
    config = grpo_tiny.get_config()
    config.model.overrides = {"vocab_size": 512, "hidden_size": 256, "intermediate_size": 512, "num_heads": 2,
                              "num_kv_heads": 2, "head_dim": 128, "max_position_embeddings": 512}
    config.rollout.cache_capacity, config.rollout.max_new_tokens = 256, 128
    return config


def test_temporaries_are_the_buffer_assignments_hbm_heap():
    """A program whose one intermediate, f32[8192, 8192] (256 MiB per chip, replicated), cannot live in v5e's
    128 MiB of on-chip VMEM: the phase's temporaries come from the dumped buffer assignment's HBM heap, which
    must hold that intermediate and, for its gradient, little more than the three 256 MiB values it needs."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from rljax.tpu_compile import _compile, _phase, topology_devices

    devices, _ = topology_devices("v5e-4")
    replicated = NamedSharding(Mesh(np.array(devices), ("data",)), PartitionSpec())
    square = jax.ShapeDtypeStruct((8192, 8192), jnp.float32, sharding=replicated)
    loss = lambda x, w1, w2: jnp.sum(jnp.tanh(jnp.tanh(x @ w1) @ w2) ** 2)  # noqa: E731
    cache = Path(jax.config.jax_compilation_cache_dir)  # the suite's (tests/conftest.py): TPU programs stay out
    entries = sorted(cache.iterdir()) if cache.is_dir() else []
    min_time = jax.config.jax_persistent_cache_min_compile_time_secs
    jax.config.update("jax_persistent_cache_min_compile_time_secs", 0.0)
    try:
        program = _compile(jax.jit(jax.grad(loss, argnums=(1, 2))).lower(square, square, square))
    finally:
        jax.config.update("jax_persistent_cache_min_compile_time_secs", min_time)
    assert (sorted(cache.iterdir()) if cache.is_dir() else []) == entries
    phase = _phase("gradient", program)
    mib = 2**20
    assert program.heap is not None and phase.temporaries == program.heap
    assert 256 * mib <= phase.temporaries <= 3 * 256 * mib, phase.temporaries / mib
    assert (phase.arguments, phase.outputs // mib) == (3 * 256 * mib, 2 * 256)


def test_update_and_sampler_compile_for_v5e_2x2_and_match_the_planner():
    from rljax.tpu_compile import compile_report, format_report

    report = compile_report(_aligned_tiny(), "v5e-4")
    assert report.libtpu_name == "v5e:2x2" and report.mesh == {"data": 1, "fsdp": 4, "tensor": 1}
    names = [p.name.split(" (")[0] for p in report.phases]
    assert names == ["policy update", "scoring pass", "sampler per-layer weights", "prefill", "decode loop"]
    update = report.phase("policy update")
    assert update.aliased > 0 and update.flops > 0 and update.bytes_accessed > 0  # the state is donated
    planned, compiled = report.planned["update arguments"]  # params, AdamW moments and batch, sharded over 4
    assert 0.75 <= planned / compiled <= 1.25, (planned, compiled)
    # the planner's activation and attention terms are calibrated on XLA:CPU; the TPU compiler fuses more of a
    # layer's intermediates (and never materialises the prefill's attention scores), so the planner is high
    for name in ("update temporaries", "prefill (weights, per-layer copy, one chunk's cache, attention)"):
        planned, compiled = report.planned[name]
        assert 1.0 <= planned / compiled <= 2.0, (name, planned, compiled)
    text = format_report(report)
    assert "fits: peak" in text and "roofline estimate" in text and "https://cloud.google.com/tpu/docs/v5e" in text


@pytest.mark.parametrize("admit_width", [0, 64])
def test_slots_engine_programs_compile_for_v5e_2x2(admit_width):
    """With `rollout.engine = "slots"` the engine's admit and decode are compiled instead of the chunked prefill
    and decode: one cache of every slot's row in their (donated) state, compared with the planner's slot cache.
    On fsdp 2 x tensor 2 the cache's rows are split over fsdp and its kv heads over tensor, as the attention
    reads them: a cache whole on each tensor shard held twice the bytes and could not be written in place.
    admit_width 64 (128-token prompts in two rounds): the admission compiled is the prompts' last round, 64 new
    tokens onto the rows of the first."""
    from models.config import LlamaConfig
    from rljax.tpu_compile import compile_report, format_report

    config = _aligned_tiny()
    config.rollout.engine, config.rollout.admit_width = "slots", admit_width
    config.mesh.fsdp, config.mesh.tensor = 2, 2
    report = compile_report(config, "v5e-4")
    names = [p.name.split(" (")[0] for p in report.phases]
    assert names == ["policy update", "scoring pass", "sampler per-layer weights", "engine admit", "engine decode"]
    slots = config.rollout.problems_per_step * config.rollout.samples_per_problem  # rollout.slots 0: every dialog
    admit, decode = report.phase("engine admit"), report.phase("engine decode")
    assert f"-> {slots} slots" in admit.name and admit.aliased > 0 and decode.aliased > 0  # the state is donated
    assert ("x 64 tokens" in admit.name and "the last round of 64 tokens" in admit.name) == (admit_width == 64)
    arch = LlamaConfig.preset("tiny", **config.model.overrides)
    kv_bytes = slots * config.rollout.cache_capacity * arch.num_layers * 2 * arch.num_kv_heads * arch.head_dim * 4
    kv_per_chip = kv_bytes / 4  # fp32 keys and values, slots over fsdp 2, kv heads over tensor 2
    weights = report.phase("sampler per-layer weights").arguments * 3  # the params, the copy, the head: an upper bound
    for program in (admit, decode):
        assert kv_per_chip <= program.arguments <= kv_per_chip + weights, (program.name, program.arguments)
        assert program.aliased >= kv_per_chip  # the new cache written over the donated one
    planned, compiled = report.planned["engine admit (weights, per-layer copy, every slot's cache, attention)"]
    assert 1.0 <= planned / compiled <= 2.0, (planned, compiled)
    assert f"decode step (the loop body: one step, {slots} dialogs)" in format_report(report)


def test_plan_tpu_compile_cli_and_bad_input(capsys, monkeypatch):
    flags = ["--config", "configs/grpo_tiny.py"]
    assert main(["plan", *flags, "--topology", "v5e-4", "--tpu-compile"]) == 0
    assert "TPU compiler, v5e-4 (v5e:2x2)" in capsys.readouterr().out
    assert main(["plan", *flags, "--topology", "v9z-8", "--tpu-compile"]) == 1
    assert "topology 'v9z-8': expected FAMILY-N" in capsys.readouterr().err
    assert main(["plan", *flags, "--topology", "h100-8", "--tpu-compile"]) == 1
    assert "--tpu-compile needs a TPU slice" in capsys.readouterr().err
    assert main(["plan", *flags, "--topology", "v5e-4", "--tpu-compile", "--config.mesh.fsdp=3"]) == 1
    assert "mesh:" in capsys.readouterr().err
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "libtpu" else object())
    assert main(["plan", *flags, "--topology", "v5e-4", "--tpu-compile"]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["rljax plan: error: the TPU compiler (libtpu) is not installed: pip install -e '.[tpu-compile]'"]
