"""One process of a (possibly multi-host) GRPO run of configs/grpo_tiny.py, for tests/test_multihost.py.

Usage: _multihost_run.py WORKDIR STEPS ENGINE [PROCESS_ID NUM_PROCESSES PORT], ENGINE chunks | slots (the rollout
engine). The device count comes from XLA_FLAGS.
Process 0 prints one JSON line: the per-step metrics of this run (every host computes the same ones) and a
fingerprint of the final policy parameters.
"""
import json
import sys
import time

import jax
import jax.numpy as jnp

from configs import grpo_tiny
from rljax.trainer import Trainer


def _slow_scoring(env, seconds: float) -> None:
    """Every answer of `env`'s episodes takes `seconds` longer to score."""
    open_episode = env.open

    def open_slow(problem):
        episode = open_episode(problem)
        step = episode.step
        episode.step = lambda answer: (time.sleep(seconds), step(answer))[1]
        return episode

    env.open = open_slow


def main(argv: list[str]) -> None:
    workdir, steps, engine = argv[0], int(argv[1]), argv[2]
    c = grpo_tiny.get_config()
    c.workdir = workdir
    c.total_steps = steps
    c.rollout.problems_per_step = 4
    c.algo.kl_beta, c.algo.kl_placement = 0.05, "loss"  # so the hosts also agree on the reference pass and KL
    c.rollout.engine = engine
    if engine == "slots":  # dialogs of up to 3 turns, answers of up to 3 tokens, 4 slots refilled over 16 dialogs;
        # a cache row of 32 ends some dialogs as context_full
        c.env.max_turns, c.rollout.max_new_tokens, c.rollout.cache_capacity = 3, 3, 32
        c.rollout.problems_per_step = 2
        c.rollout.slots, c.rollout.check_every = 4, 2
    c.rollout.num_chunks = 1  # chunks are host-major; one chunk makes the global batch order the 1-host order
    c.checkpoint.every = 1
    c.checkpoint.keep = 5
    c.log.tensorboard = False
    c.log.progress = False
    if len(argv) > 3:
        process_id, count, port = (int(x) for x in argv[3:6])
        c.distributed.mode = "explicit"
        c.distributed.coordinator_address = f"127.0.0.1:{port}"
        c.distributed.num_processes = count
        c.distributed.process_id = process_id
        c.distributed.initialization_timeout_s = 120
    trainer = Trainer(c)
    if engine == "slots" and jax.process_index() == 1:  # its scores come back later than process 0's
        _slow_scoring(trainer.env, 0.05)
    history = trainer.run()
    leaves = jax.tree.leaves(trainer.learner.policy_state.params)
    fingerprint = float(sum(jnp.sum(jnp.abs(x.astype(jnp.float32))) for x in leaves))
    if jax.process_index() == 0:
        keys = ("reward/mean", "train/loss", "train/grad_norm", "train/clip_fraction", "kl/ref_per_token",
                "entropy/sampled", "turns/mean", "response_length/mean", "rollout/context_full")
        rows = [{"step": h["step"], "devices": jax.device_count(), "processes": jax.process_count(),
                 **{k: h[k] for k in keys}} for h in history]
        rows[-1]["params/abs_sum"] = fingerprint
        print("RESULT " + json.dumps(rows), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
