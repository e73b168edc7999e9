"""GRPO on the toy print-the-number task: groups of 8 one-turn answers per problem, a random tiny Llama.
Used by the tests."""
from rljax.run_config import base_config


def get_config():
    c = base_config()
    c.workdir = "runs/grpo_tiny"
    c.total_steps = 40
    c.codec = "digits"
    c.model.preset = "tiny"
    c.model.overrides = {"vocab_size": 14, "max_position_embeddings": 256}
    c.data.source = "toy"
    c.env.code_builder = "digits"
    c.env.prompt = "{description}"
    c.env.max_turns = 1
    # One turn and no feedback to copy from: with RLEF's -1 for a wrong number, "no code" (-0.2) is the easy
    # optimum a random model finds first. A wrong number scores 0 here, so only the right one beats trying.
    c.env.rewards.failed = 0.0
    c.env.time_limit_s = 2.0
    c.env.memory_limit_mb = 256
    c.rollout.problems_per_step = 8
    c.rollout.samples_per_problem = 8
    c.rollout.max_new_tokens = 1
    c.rollout.cache_capacity = 16
    c.rollout.length_bucket = 8
    c.train.seq_bucket = 8
    c.algo.name = "grpo"
    c.algo.kl_placement = "loss"
    c.algo.kl_beta = 0.0
    c.optim.learning_rate = 1e-2
    c.optim.warmup_steps = 5
    c.optim.weight_decay = 0.0
    c.checkpoint.every = 10
    return c
