"""Train-step time of the tiny GRPO config's policy update on 1, 2, 4 and 8 simulated CPU devices, the same
global batch on each (sharded over the fsdp axis). Each device count runs in its own subprocess (the device
count is fixed when JAX starts). Simulated devices share this machine's cores, so this measures the cost of
sharding (collectives, per-device overheads), not a speed-up: on a real slice each device has its own chip.

Prints a table; the last line is JSON {"metric": "scaling_8dev_over_1dev", "ours": t8, "baseline": t1,
"ratio": t8 / t1}.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEVICE_COUNTS = (1, 2, 4, 8)


def worker(batch: int, length: int, repeats: int) -> None:
    """In a subprocess: compile and time the tiny config's policy update on every visible device."""
    sys.path.insert(0, str(REPO))
    import jax
    import numpy as np

    from bench.timing import first_and_median, host_memory
    from configs import grpo_tiny
    from models.sharding import batch_sharding, make_mesh, shard_model, use_mesh
    from rljax.learner import Learner
    from rljax.plan import train_batch_shapes
    from rljax.run_config import build_policy, loss_config, optim_config

    host_memory()
    config = grpo_tiny.get_config()
    mesh = make_mesh(data=1, fsdp=-1, tensor=1)
    policy, _ = build_policy(config.model, mesh)
    shard_model(policy, mesh)
    learner = Learner(policy, loss_config(config), optim_config(config.optim), config.train.micro_batches)
    rng = np.random.RandomState(0)
    arrays = {}
    for key, spec in train_batch_shapes(batch, length, 1).items():
        if spec.dtype == np.int32:
            arrays[key] = rng.randint(0, 14, spec.shape).astype(np.int32)
        elif spec.dtype == bool:
            arrays[key] = np.ones(spec.shape, bool)
        else:
            arrays[key] = rng.rand(*spec.shape).astype(np.float32) / length
    arrays["positions"] = np.tile(np.arange(length, dtype=np.int32), (batch, 1))
    with use_mesh(mesh):
        placed = {k: jax.device_put(v, batch_sharding(mesh, v.ndim, batch_size=v.shape[0])) for k, v in arrays.items()}
        compile_s, step_s = first_and_median(lambda: jax.block_until_ready(learner.update_policy(placed)), repeats)
    print(json.dumps({"devices": jax.device_count(), "compile_s": compile_s, "step_s": step_s}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=64, help="global batch (dialogs)")
    parser.add_argument("--length", type=int, default=128, help="tokens per dialog")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.batch, args.length, args.repeats)
        return
    rows = []
    for count in DEVICE_COUNTS:
        env = dict(os.environ, XLA_FLAGS=f"--xla_force_host_platform_device_count={count}", JAX_PLATFORMS="cpu")
        proc = subprocess.run([sys.executable, __file__, "--worker", "--batch", str(args.batch), "--length",
                               str(args.length), "--repeats", str(args.repeats)], env=env, capture_output=True,
                              text=True, check=False)
        if proc.returncode:
            sys.exit(f"bench_scaling: the {count}-device run failed:\n{proc.stderr[-2000:]}")
        rows.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    base = rows[0]["step_s"]
    from bench.timing import host_memory

    print(host_memory())
    print(f"tiny GRPO policy update, global batch {args.batch} x {args.length} tokens, {os.cpu_count()} CPU cores")
    print(f"{'devices':>8} {'compile s':>10} {'step ms':>9} {'vs 1 device':>12}")
    for row in rows:
        print(f"{row['devices']:>8} {row['compile_s']:>10.2f} {row['step_s'] * 1e3:>9.2f} {row['step_s'] / base:>11.2f}x")
    last = rows[-1]["step_s"]
    print(json.dumps({"metric": "scaling_8dev_over_1dev", "ours": last, "baseline": base, "ratio": last / base}))


if __name__ == "__main__":
    main()
