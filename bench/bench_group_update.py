"""The GRPO update of one SWE-RL step as configs/swerl_smollm2.py sets it (SmolLM2-135M with LoRA rank 16 on
every projection, `problems_per_step` groups of `samples_per_problem` answers of `max_new_tokens` tokens after
prompts of the shipped instances' lengths, every answer informative), with each answer's prompt computed in its
own micro-batch (`train.share_prompts` off) against each group's prompt computed once per micro-batch
(`train.share_prompts`, rljax.batching.shared_prefixes), in the same run.

Prints a table (compile s, median update s, ratio to the unshared update) and, last, one JSON line:
{"metric": "grpo_group_update_s", "ours": shared, "baseline": unshared, "ratio": baseline / ours}.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from bench.timing import first_and_median, host_memory  # noqa: E402
from configs import swerl_smollm2  # noqa: E402
from models import checkpoint  # noqa: E402
from models.lora import LoraConfig, add_lora  # noqa: E402
from models.pretrained import smollm2_checkpoint  # noqa: E402
from rljax import batching  # noqa: E402
from rljax.learner import Learner, LossConfig, OptimConfig  # noqa: E402
from rljax.rollout import Trajectory  # noqa: E402

PROMPT_TOKENS = (1115, 870)  # the longest shipped SWE-RL practice prompt and a middle one (614-1115)


def make_trajectories(groups: int, size: int, answer_tokens: int, vocab: int) -> list[Trajectory]:
    rng = np.random.RandomState(0)
    out = []
    for g in range(groups):
        prompt = rng.randint(0, vocab, PROMPT_TOKENS[g % len(PROMPT_TOKENS)]).tolist()
        for _ in range(size):
            t = Trajectory(f"issue{g}", g)
            t.append(prompt, sampled=False)
            t.value_positions.append(len(t.tokens) - 1)
            t.append(rng.randint(0, vocab, answer_tokens).tolist(), sampled=True)
            t.rewards.append(float(rng.rand()))
            t.finish_reasons.append("eos")
            out.append(t)
    return out


def time_update(batch: dict[str, np.ndarray], num_micro: int, lora: LoraConfig, lr: float, repeats: int
                ) -> tuple[float, float]:
    model = checkpoint.load_checkpoint(smollm2_checkpoint(None))
    add_lora(model, lora)
    learner = Learner(model, LossConfig("grpo"), OptimConfig(lr, warmup_steps=0, weight_decay=0.0), num_micro)
    placed = {k: jax.numpy.asarray(v) for k, v in batch.items()}
    return first_and_median(lambda: jax.block_until_ready(learner.update_policy(placed)), repeats)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--shared-micro-batches", default="2,4", help="micro-batch counts to time with sharing")
    args = parser.parse_args()
    print(host_memory(), flush=True)
    c = swerl_smollm2.get_config()
    groups, size = c.rollout.problems_per_step, c.rollout.samples_per_problem
    lora = LoraConfig(tuple(c.model.lora.targets.split(",")), c.model.lora.rank, c.model.lora.alpha)
    vocab = checkpoint.load_checkpoint(smollm2_checkpoint(None)).config.vocab_size
    arrays = batching.build_batch(make_trajectories(groups, size, c.rollout.max_new_tokens, vocab), 1,
                                  c.train.seq_bucket, 0)
    rewards = arrays["task_reward"][:, 0]
    sampled = arrays["sampled"]
    arrays.update(weights=batching.aggregation_weights(sampled, "token_mean"),
                  advantages=((rewards - rewards.mean())[:, None] * sampled).astype(np.float32))
    rows = [("per answer (share_prompts off)", c.train.micro_batches, None)]
    rows += [(f"shared prompt, {m} micro-batches", m, m) for m in map(int, args.shared_micro_batches.split(","))]
    print(f"GRPO update, SmolLM2-135M + LoRA r{lora.rank}: {groups} groups x {size} answers of "
          f"{c.rollout.max_new_tokens} tokens after prompts of {PROMPT_TOKENS[:groups]} tokens, batch "
          f"{arrays['tokens'].shape}")
    results = []
    for name, num_micro, share in rows:
        batch = dict(arrays)
        if share:
            order = batching.informative_first(np.ones(len(sampled), bool), num_micro, arrays["group"])
            batch = {k: v[order] for k, v in arrays.items()}
            batch.update(batching.shared_prefixes(batch, num_micro, c.train.seq_bucket, c.rollout.length_bucket))
        compile_s, step_s = time_update(batch, num_micro, lora, c.optim.learning_rate, args.repeats)
        results.append((name, num_micro, compile_s, step_s))
    base = results[0][3]
    print(f"{'update':36s} {'micro':>5s} {'compile s':>10s} {'step s':>8s} {'speed-up':>9s}")
    for name, num_micro, compile_s, step_s in results:
        print(f"{name:36s} {num_micro:5d} {compile_s:10.1f} {step_s:8.2f} {base / step_s:8.2f}x")
    best = min(r[3] for r in results[1:])
    print(json.dumps({"metric": "grpo_group_update_s", "ours": round(best, 3), "baseline": round(base, 3),
                      "ratio": round(base / best, 3)}))


if __name__ == "__main__":
    main()
