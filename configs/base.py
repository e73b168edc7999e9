"""Every key a run config has, with RLEF's defaults; each configs/NAME.py starts from `base_config()`."""
from ml_collections import ConfigDict


def base_config() -> ConfigDict:
    c = ConfigDict()
    c.workdir = "runs/default"
    c.seed = 0
    c.total_steps = 100
    c.codec = "chat"  # chat (the tokenizer's chat template) | digits (the toy task's 14-token vocabulary)

    c.model = ConfigDict({"preset": "", "overrides": {}, "init_seed": 0, "checkpoint": "", "pretrained": "",
                          "dtype": ""})
    c.data = ConfigDict({"source": "jsonl", "path": "", "toy_count": 10, "toy_digits": 1})
    c.env = ConfigDict({
        "name": "rlef", "max_turns": 3, "feedback_mode": "full", "code_builder": "python_block", "prompt": "",
        "rewards": {"solved": 1.0, "failed": -1.0, "no_code": -0.2, "intermediate": 0.0},
        "time_limit_s": 10.0, "memory_limit_mb": 1024, "use_problem_limits": True, "reward_variant": "similarity"})
    c.rollout = ConfigDict({
        "problems_per_step": 8, "samples_per_problem": 1, "max_new_tokens": 512, "temperature": 1.0, "top_p": 1.0,
        "top_k": 0, "cache_capacity": 4096, "length_bucket": 64, "num_chunks": 2, "executor_workers": 0})
    c.algo = ConfigDict({
        "name": "ppo", "kl_beta": 0.05, "gamma": 1.0, "lam": 0.95, "normalize_advantages": False,
        "clip_eps": 0.2, "value_clip": 0.2, "entropy_coef": 0.0, "aggregation": "token_mean", "epochs": 1,
        "kl_placement": "reward", "kl_estimator": "k3", "group_eps": 1e-6, "scale_by_std": True})
    c.optim = ConfigDict({"learning_rate": 2e-7, "warmup_steps": 50, "weight_decay": 0.1, "b1": 0.9, "b2": 0.95,
                          "eps": 1e-8, "max_grad_norm": 1.0})
    c.value_optim = ConfigDict(c.optim.to_dict())
    c.train = ConfigDict({"micro_batches": 1, "seq_bucket": 64})
    c.mesh = ConfigDict({"data": 1, "fsdp": -1, "tensor": 1})
    c.checkpoint = ConfigDict({"every": 50, "keep": 3, "async_save": True, "resume": "auto"})
    c.log = ConfigDict({"tensorboard": True, "progress": True})
    return c
