"""RLEF with PPO on Llama 3.1 70B Instruct and CodeContests (Gehring et al. 2025), for a TPU pod slice.

As rlef_llama3_1_8b.py, scaled for a v5p-256 slice (128 chips): weights sharded fsdp x tensor (tensor 4 keeps
attention heads and MLP columns within a chip group), 8 micro-batches, 256 dialogs per step.
"""
from rljax.run_config import base_config


def get_config():
    c = base_config()
    c.workdir = "runs/rlef_llama3_1_70b"
    c.total_steps = 12000
    c.model.checkpoint = "ckpt/llama3_1_70b_instruct"
    c.model.dtype = "bfloat16"
    c.data.path = "data/code_contests_train.jsonl"
    c.rollout.problems_per_step = 256
    c.rollout.max_new_tokens = 1024
    c.rollout.cache_capacity = 8192
    c.rollout.length_bucket = 256
    c.rollout.num_chunks = 4
    c.train.micro_batches = 8
    c.train.seq_bucket = 512
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, -1, 4
    c.checkpoint.every = 50
    return c
