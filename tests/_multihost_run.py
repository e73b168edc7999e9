"""One process of a (possibly multi-host) GRPO run of configs/grpo_tiny.py, for tests/test_multihost.py.

Usage: _multihost_run.py WORKDIR STEPS [PROCESS_ID NUM_PROCESSES PORT]. The device count comes from XLA_FLAGS.
Process 0 prints one JSON line: the per-step metrics of this run (every host computes the same ones) and a
fingerprint of the final policy parameters.
"""
import json
import sys

import jax
import jax.numpy as jnp

from configs import grpo_tiny
from rljax.trainer import Trainer


def main(argv: list[str]) -> None:
    workdir, steps = argv[0], int(argv[1])
    c = grpo_tiny.get_config()
    c.workdir = workdir
    c.total_steps = steps
    c.rollout.problems_per_step = 4
    c.algo.kl_beta, c.algo.kl_placement = 0.05, "loss"  # so the hosts also agree on the reference pass and KL
    c.rollout.num_chunks = 1  # chunks are host-major; one chunk makes the global batch order the 1-host order
    c.checkpoint.every = 1
    c.checkpoint.keep = 5
    c.log.tensorboard = False
    c.log.progress = False
    if len(argv) > 2:
        process_id, count, port = (int(x) for x in argv[2:5])
        c.distributed.mode = "explicit"
        c.distributed.coordinator_address = f"127.0.0.1:{port}"
        c.distributed.num_processes = count
        c.distributed.process_id = process_id
        c.distributed.initialization_timeout_s = 120
    trainer = Trainer(c)
    history = trainer.run()
    leaves = jax.tree.leaves(trainer.learner.policy_state.params)
    fingerprint = float(sum(jnp.sum(jnp.abs(x.astype(jnp.float32))) for x in leaves))
    if jax.process_index() == 0:
        keys = ("reward/mean", "train/loss", "train/grad_norm", "train/clip_fraction", "kl/ref_per_token",
                "entropy/sampled")
        rows = [{"step": h["step"], "devices": jax.device_count(), "processes": jax.process_count(),
                 **{k: h[k] for k in keys}} for h in history]
        rows[-1]["params/abs_sum"] = fingerprint
        print("RESULT " + json.dumps(rows), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
