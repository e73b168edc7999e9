"""LoRA: fresh adapters change nothing, the sampler's merged weights equal the adapter path, only adapters train
(and only they have optimizer state), the reference is the base model without a copy, PPO's critic shares the
frozen base, checkpoints refuse another model, bad settings fail in one line."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from models.config import LlamaConfig
from models.kv_cache import KVCache
from models.llama import Llama
from models.lora import LoraConfig, LoraParam, add_lora, lora_matmul, merge_lora
from rljax.learner import Learner, LossConfig, OptimConfig
from tests.test_trainer import synthetic_batch

REPO = Path(__file__).resolve().parents[1]
CFG = LlamaConfig.preset("tiny", vocab_size=64)


def _lora_model(targets=("all",), rank=4, seed=0) -> Llama:
    return add_lora(Llama(CFG, rngs=nnx.Rngs(seed)), LoraConfig(targets, rank, 8.0), seed=3)


def _randomise_adapters(model: Llama, scale: float = 0.05) -> None:
    for i, (path, param) in enumerate(nnx.iter_graph(model)):
        if isinstance(param, LoraParam) and path[-1].endswith("_b"):
            param[...] = scale * jax.random.normal(jax.random.key(i), param.shape)


def test_fresh_adapters_leave_the_logits_exactly_unchanged():
    tokens = jax.random.randint(jax.random.key(1), (2, 12), 0, 64)
    base, _ = Llama(CFG, rngs=nnx.Rngs(0))(tokens)
    adapted, _ = _lora_model()(tokens)
    assert np.array_equal(np.asarray(base), np.asarray(adapted))


def test_merged_weights_and_the_cache_path_equal_the_adapter_path():
    tokens = jax.random.randint(jax.random.key(1), (2, 12), 0, 64)
    positions = jnp.tile(jnp.arange(12)[None], (2, 1))
    model = _lora_model()
    _randomise_adapters(model)
    adapter_path, _ = model(tokens)
    base, _ = Llama(CFG, rngs=nnx.Rngs(0))(tokens)
    assert float(jnp.max(jnp.abs(adapter_path - base))) > 0.1  # the adapters do act
    cached, _ = model(tokens, positions, None, KVCache.init(CFG, 2, 16))  # the sampler's path: merged per call
    assert float(jnp.max(jnp.abs(cached - adapter_path))) < 1e-5
    merged, _ = merge_lora(model)(tokens)
    assert not jax.tree.leaves(nnx.state(model, LoraParam))
    assert float(jnp.max(jnp.abs(merged - adapter_path))) < 1e-5


def test_the_merged_lora_matmul_and_its_gradients_equal_autodiff_of_the_low_rank_path():
    keys = jax.random.split(jax.random.PRNGKey(3), 5)
    x, w = jax.random.normal(keys[0], (64, 24)), jax.random.normal(keys[1], (24, 40))
    a, b = jax.random.normal(keys[2], (24, 4)) / 5, jax.random.normal(keys[3], (4, 40)) / 2
    dy = jax.random.normal(keys[4], (64, 40))
    ours, ours_vjp = jax.vjp(lora_matmul, x, w, a, b)
    autodiff, autodiff_vjp = jax.vjp(lambda x, w, a, b: x @ w + (x @ a) @ b, x, w, a, b)
    np.testing.assert_allclose(ours, autodiff, rtol=1e-5, atol=1e-5)
    for name, got, want in zip(("x", "W", "A", "B"), ours_vjp(dy), autodiff_vjp(dy)):
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-4, err_msg=name)
    # bfloat16 compute with float32 weights: the output and dx in bfloat16, the weights' gradients in float32
    out, vjp = jax.vjp(lora_matmul, x.astype(jnp.bfloat16), w, a, b)
    assert out.dtype == jnp.bfloat16
    assert [g.dtype for g in vjp(dy.astype(jnp.bfloat16))] == [jnp.bfloat16, jnp.float32, jnp.float32, jnp.float32]


def test_only_adapters_train_and_carry_optimizer_state():
    model = _lora_model(("q", "v", "down"))
    base_before = [np.asarray(x) for x in jax.tree.leaves(nnx.state(model, nnx.Not(LoraParam)))]
    learner = Learner(model, LossConfig("grpo"), OptimConfig(1e-2, 0), 2)
    adapter_leaves = jax.tree.leaves(learner.policy_state.params)
    adapter_size = sum(x.size for x in adapter_leaves)
    assert adapter_size == sum(x.size for x in jax.tree.leaves(nnx.state(model, LoraParam)))
    moments = [x for x in jax.tree.leaves(learner.policy_state.opt_state) if x.ndim > 0]
    assert sum(x.size for x in moments) == 2 * adapter_size  # AdamW's two moments, for the adapters only
    batch = {k: jnp.asarray(v) for k, v in synthetic_batch(8, 20, 64).items()}
    before = [np.asarray(x) for x in adapter_leaves]
    metrics = learner.update_policy(batch)
    assert float(metrics["grad_norm"]) > 0
    after = [np.asarray(x) for x in jax.tree.leaves(learner.policy_state.params)]
    assert all(not np.array_equal(a, b) for a, b in zip(before, after))  # every adapter moved (A and B)
    frozen = [np.asarray(x) for x in jax.tree.leaves(learner.policy_frozen)]
    assert len(frozen) == len(base_before) and all(np.array_equal(a, b) for a, b in zip(frozen, base_before))


def test_reference_is_the_base_model_without_a_copy():
    model = _lora_model()
    _randomise_adapters(model)
    learner = Learner(model, LossConfig("grpo"), OptimConfig(1e-2, 0), 1)
    batch = {k: jnp.asarray(v) for k, v in synthetic_batch(4, 16, 64).items()}
    ref_logp, _ = learner.score(learner.reference_params(), batch)
    base = Learner(Llama(CFG, rngs=nnx.Rngs(0)), LossConfig("grpo"), OptimConfig(1e-2, 0), 1)
    base_logp, _ = base.score(base.policy_state.params, batch)
    assert np.array_equal(np.asarray(ref_logp), np.asarray(base_logp))
    policy_logp, _ = learner.score(learner.policy_state.params, batch)
    assert float(jnp.max(jnp.abs(policy_logp - base_logp))) > 1e-3
    ref_size = sum(x.size for x in jax.tree.leaves(learner.reference_params()))
    assert ref_size == sum(x.size for x in jax.tree.leaves(learner.policy_state.params))  # adapters only


@pytest.mark.parametrize("targets, rank, alpha, message", [
    (("qq",), 4, 8.0, "expected names from"), (("q",), 0, 8.0, "rank must be a positive integer"),
    (("q",), 4, 0.0, "alpha must be > 0")])
def test_bad_lora_settings_fail_clearly(targets, rank, alpha, message):
    with pytest.raises(ValueError, match=message):
        LoraConfig(targets, rank, alpha)


def _train(workdir: Path, steps: int, *overrides: str) -> subprocess.CompletedProcess:
    cmd = [sys.executable, "-m", "rljax.cli", "train", "--config", str(REPO / "configs/rlef_tiny.py"),
           f"--config.workdir={workdir}", f"--config.total_steps={steps}", "--config.log.progress=False",
           "--config.log.tensorboard=False", "--config.checkpoint.every=1", "--config.optim.warmup_steps=0",
           *overrides]
    return subprocess.run(cmd, cwd=REPO, env=dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu"),
                          capture_output=True, text=True, timeout=600)


def test_ppo_with_lora_shares_the_base_and_resumes_only_onto_its_model(tmp_path):
    """A PPO run with LoRA: KL to the base starts at exactly 0, the sampler's logprobs match the trainer's, the
    checkpoint holds adapters for its named base; a run with another model config refuses to resume it."""
    proc = _train(tmp_path, 2, "--config.model.lora.targets=q,v,gate", "--config.model.lora.rank=4")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["kl/ref_per_token"] == 0.0  # B = 0: the policy is the base model
    assert rows[1]["kl/ref_per_token"] != 0.0
    assert all(r["policy/sampler_logprob_max_diff"] < 1e-4 for r in rows)
    other = _train(tmp_path, 3, "--config.model.lora.targets=q,v", "--config.model.lora.rank=4")
    assert other.returncode != 0
    line = [x for x in other.stderr.strip().splitlines() if x][-1]
    assert "its weights are for model" in line and "'gate'" in line, line
    bad = _train(tmp_path / "bad", 1, "--config.model.lora.targets=q,attn")
    assert bad.returncode != 0 and "config.model.lora: LoRA targets ['q', 'attn']" in bad.stderr
    _export_matches_the_adapted_policy(tmp_path)


def _export_matches_the_adapted_policy(workdir: Path) -> None:
    """`rljax export --hf` of the trained run: transformers loads the merged weights and its logits equal the
    run's adapted policy (adapter path) to fp32 rounding; the adapters are not zero, so the merge matters."""
    import importlib

    import torch
    from transformers import LlamaForCausalLM

    from rljax.cli import main
    from rljax.trainer import Trainer

    flags = ["--config", str(REPO / "configs/rlef_tiny.py"), f"--config.workdir={workdir}",
             "--config.model.lora.targets=q,v,gate", "--config.model.lora.rank=4"]
    assert main(["export", *flags, "--out", str(workdir / "hf"), "--hf"]) == 0
    assert main(["export", *flags, "--out", str(workdir / "hf")]) == 1  # never over an existing directory
    config = importlib.import_module("configs.rlef_tiny").get_config()
    config.workdir, config.checkpoint.resume, config.log.tensorboard = str(workdir), "require", False
    config.model.lora.targets, config.model.lora.rank = "q,v,gate", 4
    trainer = Trainer(config)
    try:
        policy = trainer.learner.policy_model()
        assert any(float(jnp.abs(p[...]).max()) > 0 for path, p in nnx.iter_graph(policy)
                   if isinstance(p, LoraParam) and path[-1].endswith("_b"))
        tokens = np.random.RandomState(0).randint(0, 14, (2, 10))
        ours = np.asarray(policy(jnp.asarray(tokens))[0])
    finally:
        trainer.close()
    hf = LlamaForCausalLM.from_pretrained(workdir / "hf").eval()
    with torch.no_grad():
        theirs = hf(torch.tensor(tokens)).logits.numpy()
    np.testing.assert_allclose(theirs, ours, atol=1e-4, rtol=1e-4)


def test_ppo_critic_shares_the_policy_base_arrays():
    import importlib

    from rljax.trainer import Trainer

    config = importlib.import_module("configs.rlef_tiny").get_config()
    config.workdir = "/tmp/rljax-lora-share"
    config.checkpoint.resume = "never"
    config.log.tensorboard = False
    config.model.lora.targets = "all"
    trainer = Trainer(config)
    try:
        policy_base = jax.tree.leaves(trainer.learner.policy_frozen)
        value_base = jax.tree.leaves(trainer.learner.value_frozen)
        assert len(policy_base) == len(value_base)
        assert all(a is b for a, b in zip(policy_base, value_base))  # the same buffers, not copies
        names = {"/".join(map(str, path)) for path, _ in nnx.to_flat_state(trainer.learner.value_state.params)}
        assert any("value_head_d" in n for n in names) and all("lora" in n or "value_" in n for n in names)
    finally:
        trainer.close()
