"""RLEF with PPO on Llama 3.1 8B Instruct and CodeContests (Gehring et al. 2025), for a TPU pod slice.

Convert the weights first (`rljax convert --from-hf Llama-3.1-8B-Instruct --out ckpt/llama3_1_8b_instruct`)
and point data.path at the CodeContests train parquet shards (the Hugging Face dataset's data/ directory or a
glob such as data/train-*.parquet); problems without public or private tests are dropped and counted. Paper settings: 3 answers per dialog,
feedback from the public tests, beta 0.05, lr 2e-7 with 50 warm-up steps, weight decay 0.1. Batch sizes and
the mesh are our reading of the paper's scale for a v5p-64 slice (32 chips): 256 dialogs per step,
8 micro-batches (one dialog per chip each), full rematerialisation, parameters and optimizer state sharded over
every chip (fsdp). `rljax plan --config configs/rlef_llama3_1_8b.py --topology v5p-64` shows the memory.
"""
from rljax.run_config import base_config


def get_config():
    c = base_config()
    c.workdir = "runs/rlef_llama3_1_8b"
    c.total_steps = 12000
    c.model.checkpoint = "ckpt/llama3_1_8b_instruct"
    c.model.architecture = "llama3_1_8b"
    c.model.dtype = "bfloat16"  # compute; the weights and AdamW moments stay float32 (model.param_dtype)
    c.model.remat = "full"  # without it one micro-batch's activations need ~10x a chip's HBM (rljax plan)
    c.data.source = "code_contests"
    c.data.path = "data/code_contests/train-*.parquet"
    c.eval.source, c.eval.path = "code_contests", "data/code_contests/valid-*.parquet"
    c.eval.n_at_k = "1@3,10@100"
    c.rollout.problems_per_step = 256
    c.rollout.max_new_tokens = 1024
    c.rollout.cache_capacity = 8192
    c.rollout.length_bucket = 256
    c.rollout.num_chunks = 4
    # with --config.rollout.engine=slots: one chunk's prompts per admission (all 256 at once need 102 GB per chip)
    c.rollout.admit_rows = 64
    c.train.micro_batches = 8  # one 8k-token dialog per chip per micro-batch
    c.train.seq_bucket = 512
    c.mesh.data, c.mesh.fsdp, c.mesh.tensor = 1, -1, 1
    c.checkpoint.every = 100
    return c
