"""One GRPO policy update (forward + backward + AdamW) on SmolLM2-135M, batch 8 x 256 tokens: rljax's jitted
`Learner.update_policy` vs the same step written in torch on transformers' model, same weights, same threads;
and rljax's update with LoRA (rank 16 on every projection, only the adapters train) against its full update,
beside the floor any adapter method has here: the same update training only the layers' norm scales, so the
forward and the activation backward run through every layer and the LM head but no weight gradient is formed.

Both sides compute fp32 logits over the whole sequence, log_softmax at temperature 1, the clipped ratio loss
with a k3 KL term in the loss (token mean over the sampled tokens), global-norm clipping at 1.0 and AdamW.
Compile time (first call) is reported apart from the steady state (median of --repeats timed steps), and
the four steps take turns (full, LoRA, floor, torch, full, ...) so that a slow spell of this shared
machine falls on all of them rather than on whichever ran in it.
The last line is JSON: {"metric": "train_step_s", "ours", "baseline", "ratio": baseline / ours}.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any, Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import jax  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from flax import nnx  # noqa: E402

from models import checkpoint  # noqa: E402
from models.lora import LoraConfig, LoraParam, add_lora  # noqa: E402
from models.pretrained import GGUF_NAME, smollm2_checkpoint, smollm2_gguf_path  # noqa: E402
from rljax import batching  # noqa: E402
from rljax.learner import Learner, LossConfig, OptimConfig  # noqa: E402
from bench.timing import host_memory, interleaved  # noqa: E402

BATCH, LENGTH, CLIP, KL_COEF, LR = 8, 256, 0.2, 0.05, 1e-6


def make_batch(vocab: int) -> dict[str, np.ndarray]:
    rng = np.random.RandomState(0)
    sampled = np.zeros((BATCH, LENGTH), np.float32)
    sampled[:, LENGTH // 4:] = 1.0  # a 64-token prompt, then the answer
    return {"tokens": rng.randint(0, vocab, (BATCH, LENGTH)).astype(np.int32),
            "valid": np.ones((BATCH, LENGTH), bool), "positions": np.tile(np.arange(LENGTH, dtype=np.int32), (BATCH, 1)),
            "sampled": sampled, "old_logp": np.full((BATCH, LENGTH), -10.0, np.float32),
            "ref_logp": np.full((BATCH, LENGTH), -10.0, np.float32),
            "advantages": (rng.randn(BATCH, 1) * sampled).astype(np.float32),
            "weights": batching.aggregation_weights(sampled, "token_mean")}


def _train_only_norm_scales(model: nnx.Module) -> None:
    """Mark the decoder layers' norm scales [L, D] as the only trainable leaves (`split_trainable` trains
    `LoraParam`s and freezes the rest): their gradient needs the activation gradient at every layer."""
    for name, value in list(vars(model.layers).items()):
        if name.endswith("norm_d") and isinstance(value, nnx.Param):
            setattr(model.layers, name, LoraParam(value[...], **value.get_metadata()))


def grpo_learner(lora: LoraConfig | None = None, norms_only: bool = False) -> Learner:
    """The benchmark's Learner: SmolLM2-135M (with `lora` adapters, or training only its norm scales), GRPO with
    the clipped ratio and a k3 KL term in the loss, AdamW."""
    model = checkpoint.load_checkpoint(smollm2_checkpoint(None))
    if lora is not None:
        add_lora(model, lora)
    if norms_only:
        _train_only_norm_scales(model)
    return Learner(model, LossConfig("grpo", clip_eps=CLIP, kl_coef=KL_COEF, kl_in_loss=True),
                   OptimConfig(LR, warmup_steps=0, weight_decay=0.1), 1)


def our_step(batch: dict[str, np.ndarray], lora: LoraConfig | None = None,
             norms_only: bool = False) -> tuple[Callable[[], Any], int]:
    """(one blocking `Learner.update_policy` call on the batch, bytes of trainable parameters + optimizer
    state)."""
    learner = grpo_learner(lora, norms_only)
    state_bytes = sum(x.nbytes for x in jax.tree.leaves((learner.policy_state.params, learner.policy_state.opt_state)))
    placed = {k: jax.numpy.asarray(v) for k, v in batch.items()}
    return lambda: jax.block_until_ready(learner.update_policy(placed)), state_bytes


def their_step(batch: dict[str, np.ndarray]) -> Callable[[], None]:
    """One blocking torch update on the batch (its first call also allocates the optimizer state)."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(smollm2_gguf_path().parent, gguf_file=GGUF_NAME,
                                                 dtype=torch.float32).train()
    decay = [p for n, p in model.named_parameters() if p.ndim >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2]
    optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                                  lr=LR, betas=(0.9, 0.95), eps=1e-8)
    t = {k: torch.from_numpy(np.asarray(v)) for k, v in batch.items()}

    def step() -> None:
        logits = model(input_ids=t["tokens"].long(), attention_mask=t["valid"].long()).logits[:, :-1].float()
        logp_all = torch.log_softmax(logits, dim=-1)
        logp = torch.gather(logp_all, -1, t["tokens"][:, 1:, None].long())[..., 0]
        logp = torch.cat([torch.zeros_like(logp[:, :1]), logp], dim=1)
        ratio = torch.exp(logp - t["old_logp"])
        per_token = torch.maximum(-t["advantages"] * ratio, -t["advantages"] * ratio.clamp(1 - CLIP, 1 + CLIP))
        log_ratio = t["ref_logp"] - logp
        per_token = per_token + KL_COEF * (torch.exp(log_ratio) - log_ratio - 1)
        loss = (per_token * t["weights"]).sum()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    print(host_memory(), flush=True)
    threads = torch.get_num_threads()
    print(f"devices: {jax.devices()}, torch threads: {threads}, batch {BATCH} x {LENGTH} tokens, fp32")
    batch = make_batch(49152)
    full_step, full_bytes = our_step(batch)
    lora_step, lora_bytes = our_step(batch, LoraConfig(("all",), 16, 32.0))
    floor_step, floor_bytes = our_step(batch, norms_only=True)
    first, median = interleaved({"full": full_step, "lora": lora_step, "floor": floor_step,
                                 "torch": their_step(batch)}, args.repeats)
    ours, lora_s, floor_s, theirs = median["full"], median["lora"], median["floor"], median["torch"]
    compile_s, lora_compile_s, floor_compile_s = first["full"], first["lora"], first["floor"]
    mib = 2.0 ** 20
    print("| step | rljax s | torch s | ratio (torch / rljax) | rljax compile s | trainable + AdamW state MiB |")
    print("| --- | --- | --- | --- | --- | --- |")
    print(f"| GRPO update, SmolLM2-135M, full | {ours:.2f} | {theirs:.2f} | {theirs / ours:.2f} | {compile_s:.1f} "
          f"| {full_bytes / mib:.0f} |")
    print(f"| same, LoRA rank 16 on all projections | {lora_s:.2f} | | | {lora_compile_s:.1f} | "
          f"{lora_bytes / mib:.1f} |")
    print(f"| same, only the norm scales train (no weight gradients: LoRA's floor) | {floor_s:.2f} | | | "
          f"{floor_compile_s:.1f} | {floor_bytes / mib:.2f} |")
    print(f"LoRA / full update time: {lora_s / ours:.2f}; floor / full: {floor_s / ours:.2f}")
    print(json.dumps({"metric": "train_step_s", "ours": round(ours, 3), "baseline": round(theirs, 3),
                      "ratio": round(theirs / ours, 3), "lora_s": round(lora_s, 3),
                      "lora_over_full": round(lora_s / ours, 3),
                      "floor_over_full": round(floor_s / ours, 3)}))


if __name__ == "__main__":
    main()
