"""SWE-RL with GRPO on Llama 3.3 70B Instruct (Wei et al. 2025), for a TPU pod slice.

Paper settings as we read them: 32 issues per step with G = 16 responses each (512 sequences), advantage
(r - mean) / std within each group, KL to the reference in the loss, lr 1e-6, up to 16k-token contexts,
one turn. Mined instances (`rljax mine`) go in data.path. Mesh for a v5p-256 slice: fsdp x tensor 4,
16 micro-batches (one 16k-token sequence per chip each), full rematerialisation (see `rljax plan`).
"""
from rljax.run_config import base_config


def get_config():
    c = base_config()
    c.workdir = "runs/swerl_llama3_3_70b"
    c.total_steps = 1600
    c.model.checkpoint = "ckpt/llama3_3_70b_instruct"
    c.model.architecture = "llama3_3_70b"
    c.model.dtype = "bfloat16"  # compute; the weights and AdamW moments stay float32 (model.param_dtype)
    c.model.remat = "full"
    c.data.path = "data/swerl_instances.jsonl"
    c.env.name = "swerl"
    c.env.max_turns = 1
    c.rollout.problems_per_step = 32
    c.rollout.samples_per_problem = 16
    c.rollout.max_new_tokens = 4096
    c.rollout.cache_capacity = 16384
    c.rollout.length_bucket = 512
    c.rollout.num_chunks = 4
    # with --config.rollout.engine=slots: all 32 prompts (x 16 answers) in one admission, one per fsdp shard (fewer
    # than the 32 shards would be prefilled whole on every chip)
    c.rollout.admit_rows = 32
    c.algo.name = "grpo"
    c.algo.kl_placement = "loss"
    c.algo.kl_estimator = "k3"
    c.algo.kl_beta = 0.05
    c.optim.learning_rate = 1e-6
    c.optim.warmup_steps = 20
    c.value_optim = c.optim.copy_and_resolve_references()
    c.train.micro_batches = 16
    c.train.seq_bucket = 1024
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, -1, 4
    c.checkpoint.every = 25
    return c
