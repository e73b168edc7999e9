"""GRPO on the toy print-the-number task: groups of 8 one-turn answers per problem, a random tiny Llama
(rlef_tiny's model, task and limits). Used by the tests."""
from configs import rlef_tiny


def get_config():
    c = rlef_tiny.get_config()
    c.workdir = "runs/grpo_tiny"
    c.total_steps = 40
    c.env.max_turns = 1
    # One turn and no feedback to copy from: with RLEF's -1 for a wrong number, "no code" (-0.2) is the easy
    # optimum a random model finds first. A wrong number scores 0 here, so only the right one beats trying.
    c.env.rewards.failed = 0.0
    c.rollout.problems_per_step = 8
    c.rollout.samples_per_problem = 8
    c.rollout.cache_capacity = 16
    c.train.seq_bucket = 8
    c.algo.name = "grpo"
    c.algo.kl_placement = "loss"
    c.algo.kl_beta = 0.0
    c.optim.learning_rate = 1e-2
    return c
