"""SWE-RL with GRPO on a random tiny Llama that reads SmolLM2's tokenizer: the whole path (mined instances,
the paper's prompt through the chat template, sampling, the patch-similarity reward, GRPO, checkpoints) in
seconds per step on a CPU. Used by the tests; a random model's answers are malformed (reward -1)."""
from rljax.run_config import base_config


def get_config():
    c = base_config()
    c.workdir = "runs/swerl_tiny"
    c.total_steps = 4
    c.model.preset = "tiny"
    c.model.overrides = {"vocab_size": 49152, "max_position_embeddings": 2048}
    c.model.tokenizer = "smollm2"
    c.data.source = "swerl_practice"
    c.env.name = "swerl"
    c.env.max_turns = 1
    c.algo.name = "grpo"
    c.algo.kl_beta = 0.05
    c.algo.kl_placement = "loss"
    c.rollout.problems_per_step = 2
    c.rollout.samples_per_problem = 4
    c.rollout.max_new_tokens = 16
    c.rollout.temperature = 1.0
    c.rollout.cache_capacity = 1152
    c.rollout.length_bucket = 64
    c.rollout.num_chunks = 1
    c.train.seq_bucket = 64
    c.optim.learning_rate = 1e-3
    c.optim.warmup_steps = 0
    c.checkpoint.every = 1
    c.log.samples_per_step = 8
    c.eval.source = "swerl_practice_heldout"
    c.eval.max_problems = 4
    return c
