"""RLEF with PPO on the toy print-the-number task: a random tiny Llama, 3-turn dialogs with real feedback from
the sandbox, seconds per step on a CPU. Used by the tests."""
from rljax.run_config import base_config


def get_config():
    c = base_config()
    c.workdir = "runs/rlef_tiny"
    c.total_steps = 60
    c.codec = "digits"
    c.model.preset = "tiny"
    # initializer_range ~ 1/sqrt(hidden 64): at HF's 0.02 the tied embeddings cap every logit near 1.3, which
    # full fine-tuning grows out of but LoRA (frozen embeddings and norms) cannot: its runs stayed near p = 0.2
    c.model.overrides = {"vocab_size": 14, "max_position_embeddings": 256, "initializer_range": 0.1}
    c.data.source = "toy"
    c.env.code_builder = "digits"
    c.env.prompt = "{description}"
    c.env.time_limit_s = 2.0
    c.env.memory_limit_mb = 256
    c.rollout.problems_per_step = 32
    c.rollout.max_new_tokens = 1
    c.rollout.cache_capacity = 128
    c.rollout.length_bucket = 8
    c.train.seq_bucket = 16
    c.optim.learning_rate = 3e-3
    c.optim.warmup_steps = 5
    c.optim.weight_decay = 0.0
    c.value_optim = c.optim.copy_and_resolve_references()
    c.algo.normalize_advantages = True
    c.checkpoint.every = 10
    return c
