"""RLEF with PPO on Llama 3.1 70B Instruct and CodeContests (Gehring et al. 2025), for a TPU pod slice.

rlef_llama3_1_8b.py scaled for a v5p-256 slice (128 chips): weights sharded fsdp x tensor (tensor 4 keeps
attention heads and MLP columns within a chip group), 8 micro-batches (one dialog per chip group each),
256 dialogs per step, full rematerialisation (from the 8B config).
"""
from configs import rlef_llama3_1_8b


def get_config():
    c = rlef_llama3_1_8b.get_config()
    c.workdir = "runs/rlef_llama3_1_70b"
    c.model.checkpoint = "ckpt/llama3_1_70b_instruct"
    c.model.architecture = "llama3_1_70b"
    c.train.micro_batches = 8
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, -1, 4
    c.checkpoint.every = 50
    return c
