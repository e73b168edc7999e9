"""Where a compiled XLA:CPU program spends its time, op by op: one call traced under `jax.profiler`, each traced
op matched to its instruction in the compiled HLO (the source op in its metadata and its output shape).

Times are the ops' own thread time: XLA:CPU runs independent ops on two threads at once, so the column can add
up to more than the call's wall time, and a library op (a YNNPACK matmul or reduction) counts the time of the
thread that called it (its helper thread's share is not added). Group rows by what they compute, not by kind:
"ynn_fusion" is every YNNPACK matmul and reduction alike. A while or cond row is that op's own time, not its
body's: the body's ops have rows of their own.
A plain "dot" row (a matmul XLA:CPU hands to Eigen rather than YNNPACK: in the update, the weight gradients
x^T dy) shows only its dispatch: the update's [576, 1536] weight gradients, 3.6 GFLOP each, read 0.18 ms a call
(2026-12-07). Their compute most likely runs beside the next ops and lengthens their rows (the backward's
YNNPACK matmuls read ~105 GFLOP/s there, against 170-180 for the same matmul alone), so read an update's
backward matmuls as a whole, not row by row.

Cases (SmolLM2-135M, fp32; the README's "where the time goes" figures):
  decode  one slots-engine decode call: --rows live rows x --steps steps at a --window-column attention window
          (random keys and values filled to --fill columns; --window 1024 = the whole cache: the rows in place)
  update  bench_train's full GRPO update (8 x 256 tokens), `--lora` for its LoRA rank-16 update
Usage: python bench/op_profile.py decode --window 1024 --fill 900
"""
from __future__ import annotations

import argparse
import collections
import dataclasses
import glob
import gzip
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

_INSTRUCTION = re.compile(r"^\s*(?:ROOT )?%(\S+) = (\S+) .*$", re.M)
_OP_NAME = re.compile(r'op_name="([^"]*)"')


@dataclasses.dataclass(frozen=True)
class OpTime:
    kind: str  # the HLO instruction's name without its number: "ynn_fusion", "broadcast_add_fusion", "copy", ...
    op_name: str  # the source op of its metadata, without the jit(...) prefix ("while/body/dot_general")
    shape: str  # its output shape, e.g. "f32[32,1536]{1,0}"
    calls: int
    seconds: float


def _instructions(hlo_text: str) -> dict[str, tuple[str, str]]:
    """{instruction name: (source op name, output shape)} of a compiled module's text."""
    out = {}
    for line in _INSTRUCTION.finditer(hlo_text):
        op_name = _OP_NAME.search(line.group(0))
        out[line.group(1)] = (re.sub(r"^jit\([^)]*\)/", "", op_name.group(1) if op_name else ""), line.group(2))
    return out


def op_times(compiled: Any, *args: Any) -> tuple[list[OpTime], float]:
    """Run `compiled(*args)` (an AOT-compiled `jax.stages.Compiled`) once under the profiler; returns its ops'
    thread time grouped by (kind, source op, shape), largest first, and the call's wall seconds. Raises
    RuntimeError when the trace holds no per-op events (a backend or jaxlib that does not record them)."""
    import jax

    instructions = _instructions(compiled.as_text())
    with tempfile.TemporaryDirectory(prefix="op-profile-") as folder:
        jax.profiler.start_trace(folder, create_perfetto_trace=True)
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        wall = time.perf_counter() - start
        jax.profiler.stop_trace()
        traces = glob.glob(os.path.join(folder, "plugins", "profile", "*", "perfetto_trace.json.gz"))
        events: Any = {}
        if traces:
            with gzip.open(traces[0]) as trace:
                events = json.load(trace)
    events = events.get("traceEvents", []) if isinstance(events, dict) else events
    seconds: collections.Counter = collections.Counter()
    calls: collections.Counter = collections.Counter()
    for event in events:
        op = event.get("args", {}).get("hlo_op")
        if event.get("ph") != "X" or op is None or event["name"].startswith("end:"):
            continue
        key = (op.split(".")[0],) + instructions.get(op, ("", ""))
        seconds[key] += event["dur"] * 1e-6
        calls[key] += 1
    if not seconds:
        raise RuntimeError(f"op_profile: the trace of one call holds no per-op events (backend {jax.default_backend()})")
    return [OpTime(*key, calls[key], s) for key, s in seconds.most_common()], wall


def print_table(ops: list[OpTime], wall: float, top: int) -> None:
    """The `top` largest rows with their share of all ops' thread time."""
    total = sum(o.seconds for o in ops)
    print(f"one call: {wall:.3f} s wall, {total:.3f} s of op thread time over {len(ops)} (kind, op, shape) groups")
    print("ms | share | calls | kind | op | shape")
    for o in ops[:top]:
        print(f"{o.seconds * 1e3:.1f} | {o.seconds / total:.3f} | {o.calls} | {o.kind} | {o.op_name} | {o.shape}")


def _decode_case(args: argparse.Namespace) -> tuple[Any, tuple[Any, ...], int]:
    """A slots-engine decode call of SmolLM2 on a random cache, compiled; its arguments; the index of the one it
    donates (the state: call with a copy)."""
    import jax
    import jax.numpy as jnp
    import numpy as np

    from configs.rlef_smollm2 import get_config
    from models.kv_cache import KVCache
    from models.sampler import Sampler, SamplingParams
    from models.slots import SlotState, decode
    from rljax.run_config import build_policy

    model, tokenizer = build_policy(get_config().model)
    sampler = Sampler(model, tokenizer, length_bucket=64, pad_id=tokenizer.pad_id)
    weights = sampler.weights()
    sampling = SamplingParams(max_new_tokens=256, temperature=0.7)
    temperature, top_p = sampler.scalars(sampling)
    rng = np.random.default_rng(0)
    cache = KVCache.init(model.config, args.rows, args.capacity, sampler.cache_dtype)
    cache = cache.replace(
        k_bkchw=tuple(jnp.asarray(rng.normal(size=k.shape) * 0.5, k.dtype) for k in cache.k_bkchw),
        v_bksh=tuple(jnp.asarray(rng.normal(size=v.shape) * 0.5, v.dtype) for v in cache.v_bksh),
        valid_bs=cache.valid_bs.at[:, :args.fill].set(True))
    state = SlotState.init(cache, sampling.max_new_tokens).replace(
        fill_b=jnp.full((args.rows,), args.fill, jnp.int32), position_b=jnp.full((args.rows,), args.fill, jnp.int32),
        live_b=jnp.ones((args.rows,), bool), last_b=jnp.asarray(rng.integers(0, 40000, args.rows), jnp.int32),
        sequence_b=jnp.arange(args.rows, dtype=jnp.int32))
    rows = None if args.window == args.capacity else jnp.arange(args.rows, dtype=jnp.int32)
    key = jax.random.key(0)
    compiled = decode.lower(*weights, state, rows, key, temperature, top_p,
                            static=sampler.draw_static(sampling), mesh_rules=None, window=args.window,
                            steps=args.steps).compile()
    return compiled, (*weights[1:], state, rows, key, temperature, top_p), len(weights) - 1


def _update_case(args: argparse.Namespace) -> tuple[Any, tuple[Any, ...], int]:
    """bench_train's GRPO update of SmolLM2 (full, or LoRA rank 16 on every projection), compiled; its arguments;
    the index of the one it donates (the train state: call with a copy)."""
    import jax

    from bench.bench_train import grpo_learner, make_batch
    from models.lora import LoraConfig

    learner = grpo_learner(LoraConfig(("all",), 16, 32.0) if args.lora else None)
    batch = {k: jax.numpy.asarray(v) for k, v in make_batch(learner.policy_model().config.vocab_size).items()}
    return learner.compiled_update(batch), (learner.policy_state, learner.policy_frozen, batch), 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("case", choices=("decode", "update"))
    parser.add_argument("--rows", type=int, default=32)
    parser.add_argument("--steps", type=int, default=16)
    parser.add_argument("--capacity", type=int, default=1024)
    parser.add_argument("--window", type=int, default=1024)
    parser.add_argument("--fill", type=int, default=900)
    parser.add_argument("--lora", action="store_true")
    parser.add_argument("--top", type=int, default=30)
    args = parser.parse_args()
    if not 0 < args.fill < args.window <= args.capacity:
        parser.error(f"expected 0 < --fill < --window <= --capacity, got {args.fill}, {args.window}, {args.capacity}")
    from bench.timing import host_memory

    print(host_memory())
    import jax
    import jax.numpy as jnp

    compiled, call_args, donated = (_decode_case if args.case == "decode" else _update_case)(args)

    def fresh() -> tuple[Any, ...]:
        return call_args[:donated] + (jax.tree.map(jnp.copy, call_args[donated]),) + call_args[donated + 1:]

    first, traced = fresh(), fresh()  # both copies made before either run: the traced run reuses the first's memory
    jax.block_until_ready(compiled(*first))  # a first run: its allocations are not the steady state's
    del first
    ops, wall = op_times(compiled, *traced)
    print_table(ops, wall, args.top)


if __name__ == "__main__":
    main()
