"""The training loop: problems -> rollouts (sampler + executor) -> rewards, KL, advantages -> PPO or GRPO
updates -> metrics and checkpoints. `train(config)` runs a whole run from an ml_collections config (see
configs/) and resumes from the workdir's latest checkpoint."""
from __future__ import annotations

import dataclasses
import json
import logging
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from ml_collections import ConfigDict

from executor.pool import ExecutorPool
from models.llama import LlamaValueModel
from models.lora import LoraParam, add_lora, lora_config_of
from models.sampler import FINISH_LENGTH, Sampler, SamplingParams
from models.sharding import batch_sharding, host_array, shard_model, use_mesh
from rljax import advantages as adv
from rljax import batching
from rljax import distributed
from rljax import shaping
from rljax.checkpointing import ResumeError, TrainCheckpointer
from rljax.engine import rollout_runner
from rljax.learner import Learner, OptimConfig
from rljax.metrics import WARMUP_FILE, MetricsWriter, SampleWriter
from rljax.ppo import explained_variance
from rljax.problems import ProblemStream, prompt_checked
from rljax.rollout import RolloutStats, Trajectory
from rljax.run_config import (base_model_name, build_codec, build_env, build_mesh, build_policy, load_rows,
                               loss_config, optim_config, validate)

log = logging.getLogger("rljax.trainer")


@dataclasses.dataclass
class StepOutput:
    metrics: dict[str, Any]
    trajectories: list[Trajectory]


class Trainer:
    """Builds every part from the config; `run()` trains to `total_steps`, `step()` does one step."""

    def __init__(self, config: ConfigDict):
        validate(config)
        distributed.initialize(config.distributed)
        self.config = config
        distributed.local_share(config.rollout.problems_per_step)  # refuse a batch the hosts cannot share
        self.workdir = Path(config.workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.mesh = build_mesh(config.mesh)
        policy, self.tokenizer = build_policy(config.model, self.mesh)
        shard_model(policy, self.mesh)
        lora = lora_config_of(policy)
        value_model = None
        if config.algo.name == "ppo":
            value_model = LlamaValueModel(policy.config, rngs=nnx.Rngs(config.seed + 1))
            if lora is None:  # a critic of its own, initialised from the policy
                nnx.update(value_model.backbone, jax.tree.map(jnp.copy, nnx.state(policy)))
            else:  # the policy's frozen base arrays themselves (shared memory) with adapters of its own
                nnx.update(value_model.backbone, nnx.state(policy, nnx.Not(LoraParam)))
                add_lora(value_model.backbone, lora, seed=config.seed + 1)
            shard_model(value_model, self.mesh)
        self.learner = Learner(policy, loss_config(config), optim_config(config.optim), config.train.micro_batches,
                               value_model, optim_config(config.value_optim))
        # the frozen reference only matters when KL is weighted in (kl_beta 0: no copy, no scoring pass)
        self.ref_params = self.learner.reference_params() if config.algo.kl_beta else None
        self.model_record = {"base": base_model_name(config.model), "lora": None if lora is None else lora.as_dict()}
        self.codec = build_codec(config, self.tokenizer)
        self.rows = rows = load_rows(config.data)
        self.env = build_env(config.env, rows, data_source=config.data.source)
        r = config.rollout
        self.stream = ProblemStream(rows, prompt_checked(self.env, self.codec, r.cache_capacity, r.max_new_tokens),
                                    config.seed)
        self.sampling = SamplingParams(max_new_tokens=r.max_new_tokens, temperature=r.temperature, top_p=r.top_p,
                                       top_k=r.top_k, stop_ids=tuple(self.codec.stop_ids))
        pad_id = self.tokenizer.pad_id if self.tokenizer is not None else int(self.codec.stop_ids[0])
        self.pad_id = pad_id
        self.sampler = Sampler(self.learner.policy_model(), self.tokenizer, mesh=self.mesh,
                               length_bucket=r.length_bucket, pad_id=pad_id,
                               replicate_weights=r.replicate_weights)
        batch = r.problems_per_step * r.samples_per_problem
        self.pool = ExecutorPool(r.executor_workers or None, max_pending=2 * batch + 8)
        self.rollouts = rollout_runner(config, self.sampler, self.codec, self.env, self.pool, self.sampling, batch)
        c = config.checkpoint
        self.checkpointer = TrainCheckpointer(self.workdir, c.every, c.keep, c.async_save)
        self.step_count = 0
        self.warmed_up = False  # the supervised warm-up ran, or the restored weights already had it
        self.reference_saved = False  # after a warm-up, KL's reference is the warmed policy: checkpointed
        self._resume(c.resume)
        self.metrics = MetricsWriter(self.workdir, self.step_count, config.log.tensorboard,
                                     enabled=distributed.is_primary())
        self.samples = SampleWriter(self.workdir, config.log.get("samples_per_step", 0), self.step_count,
                                    enabled=distributed.is_primary())

    # ---- checkpoints ---------------------------------------------------------------------------------------------
    def _states(self) -> dict[str, Any]:
        states = {"policy": self.learner.policy_state, "value": self.learner.value_state}
        if self.reference_saved:
            states["reference"] = self.ref_params
        return states

    def _resume(self, mode: str) -> None:
        latest = self.checkpointer.latest_step() if mode != "never" else None
        if latest is None:
            if mode == "require":
                raise ResumeError(f"{self.checkpointer.directory}: no checkpoint to resume from "
                                  "(checkpoint.resume='require')")
            return
        saved = self.checkpointer.read_meta(latest)
        found = saved.get("model")
        self.reference_saved = bool(saved.get("reference")) and self.ref_params is not None
        if found is not None and found != self.model_record:
            raise ResumeError(f"{self.checkpointer.directory}/{latest}: its weights are for model {found}, this run's "
                              f"model is {self.model_record}; use another workdir or the same model config")
        states, meta = self.checkpointer.restore(latest, self._states())
        self.learner.policy_state, self.learner.value_state = states["policy"], states["value"]
        if self.reference_saved:
            self.ref_params = states["reference"]
        self.stream.set_state(meta["data"])
        self.step_count = int(meta["step"])
        self.warmed_up = True
        log.info("resumed from %s at step %d", self.checkpointer.directory, self.step_count)

    def _save(self, force: bool = False) -> None:
        meta = {"step": self.step_count, "data": self.stream.get_state(), "model": self.model_record,
                "reference": self.reference_saved}
        self.checkpointer.save(self.step_count, self._states(), meta, force=force)

    # ---- supervised warm-up ----------------------------------------------------------------------------------
    def warm_up(self) -> list[dict[str, float]]:
        """`config.warmup.steps` cross-entropy steps on the training rows' demonstrations (rljax.warmup), once,
        before RL step 1 of a run that starts from scratch; saved as step 0. Rows go to WORKDIR/warmup.jsonl."""
        w = self.config.warmup
        if self.warmed_up or not w.steps:
            return []
        from rljax.warmup import SupervisedWarmup, demonstration_batch, demonstrations, schedule

        r = self.config.rollout
        demos = demonstrations(self.env, self.codec, self.rows, r.max_new_tokens, r.cache_capacity)
        if demos.skipped:
            log.warning("warm-up: skipped rows %s", demos.skipped)
        if not demos.trajectories:
            raise ValueError(f"config.warmup: none of the {len(self.rows)} training rows has a usable "
                             f"demonstration (skipped: {demos.skipped})")
        warmup = SupervisedWarmup(self.learner, OptimConfig(learning_rate=w.learning_rate, warmup_steps=0,
                                                           weight_decay=0.0), w.micro_batches,
                                  self.config.train.vocab_chunk)
        rows = []
        with use_mesh(self.mesh):
            for i, picked in enumerate(schedule(len(demos.trajectories), w.steps, w.batch, self.config.seed)):
                batch = demonstration_batch([demos.trajectories[j] for j in picked], self.config.train.seq_bucket,
                                            self.pad_id, w.micro_batches if self.config.train.share_prompts else 0,
                                            r.length_bucket)
                rows.append({"warmup_step": i + 1, **warmup.update(self._place(batch)),
                             "demonstrations": len(demos.trajectories), **{f"skipped/{k}": v for k, v in
                                                                          demos.skipped.items()}})
                log.info("warm-up step %d/%d: nll %.4f", i + 1, w.steps, rows[-1]["nll"])
        warmup.finish()
        if self.ref_params is not None:  # KL to the warmed policy (as RLHF's reference is the SFT model)
            self.ref_params = self.learner.reference_params(keep_adapters=True)
            self.reference_saved = True
        if distributed.is_primary():
            (self.workdir / WARMUP_FILE).write_text("".join(json.dumps(row) + "\n" for row in rows))
        self.warmed_up = True
        self._save(force=True)
        return rows

    # ---- one step ------------------------------------------------------------------------------------------------
    def _place(self, arrays: dict[str, np.ndarray]) -> dict[str, jax.Array]:
        return {k: jax.device_put(v, batch_sharding(self.mesh, v.ndim, batch_size=v.shape[0]))
                for k, v in arrays.items()}

    def _rollout_round(self, round_index: int) -> tuple[list[Trajectory], RolloutStats]:
        """Draw `problems_per_step` problems, sample `samples_per_problem` dialogs each and score them; every host
        returns the whole batch's trajectories."""
        cfg = self.config
        share = distributed.local_share(cfg.rollout.problems_per_step)
        batch = self.stream.next_batch(cfg.rollout.problems_per_step)[share]
        samples = cfg.rollout.samples_per_problem
        episodes = [self.env.open(problem) for _, problem in batch for _ in range(samples)]
        groups = [share.start + i // samples for i in range(len(episodes))]
        names = [str(row.get("name") or row.get("instance_id")) for row, _ in batch for _ in range(samples)]
        key = jax.random.fold_in(jax.random.key(cfg.seed), self.step_count)
        if round_index:
            key = jax.random.fold_in(key, round_index)
        trajectories, stats = self.rollouts.run(episodes, groups, names, key)
        if jax.process_count() > 1:  # every host computes the advantages of the whole batch and counts its dialogs
            parts = distributed.allgather_objects((trajectories, stats.context_full, stats.executor_errors))
            trajectories = [t for part, _, _ in parts for t in part]
            stats.context_full, stats.executor_errors = (sum(p[k] for p in parts) for k in (1, 2))
        return trajectories, stats

    def _dynamic_sampling(self, trajectories: list[Trajectory], stats: RolloutStats
                          ) -> tuple[list[Trajectory], dict[str, Any]]:
        """DAPO's dynamic sampling: a group whose dialogs all scored the same carries no GRPO signal; draw more
        problems (up to `dynamic_sampling_rounds` more rounds) until `problems_per_step` groups differ. The batch
        keeps its size: informative groups first, topped up with uninformative ones when the rounds run out."""
        cfg = self.config
        size, wanted = cfg.rollout.samples_per_problem, cfg.rollout.problems_per_step
        informative, spare = split_informative_groups(trajectories, size)
        rounds = 1
        while len(informative) < wanted and rounds <= cfg.algo.dynamic_sampling_rounds:
            more, more_stats = self._rollout_round(rounds)
            stats.add(more_stats)
            rounds += 1
            found, rest = split_informative_groups(more, size)
            informative += found
            spare += rest
        chosen = (informative + spare)[:wanted]
        batch = [t for group in chosen for t in group]
        for i, t in enumerate(batch):
            t.group = i // size
        return batch, {"rollout/rounds": rounds, "rollout/informative_groups": min(len(informative), wanted)}

    def step(self) -> StepOutput:
        cfg = self.config
        started = time.perf_counter()
        self.sampler.model = self.learner.policy_model()
        extra: dict[str, Any] = {}
        with use_mesh(self.mesh):
            trajectories, rstats = self._rollout_round(0)
            if cfg.algo.dynamic_sampling_rounds:
                trajectories, extra = self._dynamic_sampling(trajectories, rstats)
            train_started = time.perf_counter()
            metrics = self._learn(trajectories)
        metrics.update(extra)
        metrics.update(rollout_metrics(trajectories, rstats, self.env.max_turns))
        metrics["data/skipped_problems"] = self.stream.skipped
        test_runs = getattr(self.env, "test_runs", None)
        if test_runs is not None:  # cumulative; perf/: a resumed run starts with an empty cache
            metrics["perf/test_cache_hits"], metrics["perf/test_cache_misses"] = test_runs.hits, test_runs.misses
        now = time.perf_counter()
        metrics.update({"time/step_s": now - started, "time/rollout_s": rstats.total_s,
                        "time/train_s": now - train_started,
                        "perf/device_wait_share": rstats.score_wait_s / max(now - started, 1e-9),
                        "perf/tokens_per_s": sum(sum(t.sampled) for t in trajectories) / max(rstats.generate_s, 1e-9)})
        if rstats.admit_token_slots:  # the slots engine: seconds of the rollout spent prefilling admissions
            metrics["time/admit_s"] = rstats.admit_s
        self.step_count += 1
        return StepOutput(metrics, trajectories)

    def _learn(self, trajectories: list[Trajectory]) -> dict[str, Any]:
        cfg, algo = self.config, self.config.algo
        arrays = batching.build_batch(trajectories, self.env.max_turns, cfg.train.seq_bucket, self.pad_id)
        metrics: dict[str, Any] = {}
        if algo.overlong_buffer:  # DAPO's soft overlong punishment, added to each answer's task reward
            lengths = batching.per_turn_sums(arrays["sampled"], arrays["turn_of_token"], np.ones_like(arrays["sampled"]),
                                             self.env.max_turns)
            penalty = shaping.overlong_penalty(lengths, cfg.rollout.max_new_tokens, algo.overlong_buffer,
                                               algo.overlong_penalty) * arrays["turn_mask"]
            arrays["task_reward"] = (arrays["task_reward"] + penalty).astype(np.float32)
            metrics["reward/overlong_penalty_mean"] = float(penalty.sum(axis=1).mean())
        if algo.mask_truncated:  # DAPO's overlong filtering: answers cut at the budget carry no loss
            arrays["sampled"] = shaping.mask_turns(arrays["sampled"], arrays["turn_of_token"], arrays["truncated"])
            metrics["answers/masked_truncated"] = int((arrays["truncated"] & (arrays["turn_mask"] > 0)).sum())
        sampled = arrays["sampled"]
        episode_budget = cfg.rollout.max_new_tokens * self.env.max_turns  # Dr.GRPO's constant normaliser
        extra: dict[str, np.ndarray] = {"weights": batching.aggregation_weights(sampled, algo.aggregation,
                                                                                episode_budget)}
        # one update per rollout and no reference policy: the update scores the batch itself (ratio 1, see
        # rljax.learner), so there is no scoring pass; the shaping and the loss see zero KL
        on_policy = algo.epochs == 1 and self.ref_params is None
        placed = self._place(arrays) if algo.name == "ppo" or not on_policy else {}
        if on_policy:
            kl_tok = np.zeros_like(sampled)
        else:
            old_logp = host_array(self.learner.score(self.learner.policy_state.params, placed)[0])
            ref_logp = old_logp if self.ref_params is None else host_array(self.learner.score(self.ref_params,
                                                                                                placed)[0])
            kl_tok = (old_logp - ref_logp) * sampled
            metrics["policy/sampler_logprob_max_diff"] = float(np.max(np.abs(old_logp - arrays["sampler_logp"])
                                                                      * sampled))
            extra.update(old_logp=old_logp, ref_logp=ref_logp)
            if self.ref_params is not None:
                metrics["kl/ref_per_token"] = float(kl_tok.sum() / max(sampled.sum(), 1.0))
        if algo.name == "ppo":
            old_values = host_array(self.learner.values(placed))
            kl_turn = batching.per_turn_sums(kl_tok, arrays["turn_of_token"], sampled, self.env.max_turns)
            shaped = adv.kl_shaped_turn_rewards(arrays["task_reward"], kl_turn, arrays["turn_mask"], algo.kl_beta)
            advantages, returns = adv.gae_over_turns(shaped, old_values, arrays["turn_mask"], algo.gamma, algo.lam)
            if algo.normalize_advantages:
                advantages = whiten(advantages, arrays["turn_mask"])
            extra.update(advantages=batching.spread_over_turns(advantages, arrays["turn_of_token"]),
                         old_values=old_values.astype(np.float32), returns=returns.astype(np.float32),
                         turn_weights=batching.aggregation_weights(arrays["turn_mask"], "token_mean"))
            metrics["value/explained_variance"] = float(explained_variance(
                jnp.asarray(old_values), jnp.asarray(returns, jnp.float32), jnp.asarray(arrays["turn_mask"])))
            metrics["reward/shaped_mean"] = float((shaped * arrays["turn_mask"]).sum(axis=1).mean())
        else:
            rewards = (arrays["task_reward"] * arrays["turn_mask"]).sum(axis=1)
            if algo.kl_placement == "reward":
                rewards = rewards - algo.kl_beta * kl_tok.sum(axis=1)
            group_adv = adv.group_advantages(rewards, cfg.rollout.samples_per_problem, algo.group_eps,
                                             algo.scale_by_std, algo.group_baseline)
            extra["advantages"] = (group_adv[:, None] * sampled).astype(np.float32)
        extra = {k: np.asarray(v, np.float32) for k, v in extra.items()}
        num_micro, share = cfg.train.micro_batches, cfg.train.share_prompts
        order = None
        if (self.learner.skips_zero_advantage or share) and num_micro > 1:
            # all-zero micro-batches are skipped; shared prompts want each group's rows in one micro-batch
            informative = np.any(extra["advantages"] != 0, axis=1) if self.learner.skips_zero_advantage \
                else np.ones(len(sampled), bool)
            if share:  # a group's zero-advantage rows stay with it (their loss is 0 either way)
                informative = np.isin(arrays["group"], arrays["group"][informative])
            order = batching.informative_first(informative, num_micro, arrays["group"] if share else None)
        if order is None or np.array_equal(order, np.arange(len(order))):  # rows stay: reuse what is placed
            batch = {**(placed or self._place(arrays)), **self._place(extra)}
            ordered = arrays
        else:
            ordered = {k: v[order] for k, v in arrays.items()}
            batch = self._place({**ordered, **{k: v[order] for k, v in extra.items()}})
        if share:
            batch.update(self._place(batching.shared_prefixes(ordered, num_micro, cfg.train.seq_bucket,
                                                                   cfg.rollout.length_bucket)))
        for _ in range(algo.epochs):
            policy_metrics = self.learner.update_policy(batch)
            if algo.name == "ppo":
                policy_metrics.update(self.learner.update_value(batch))
        trained = {k: float(v) for k, v in policy_metrics.items()}
        diff = trained.pop("max_sampler_logprob_diff", None)
        if on_policy and trained.get("micro_batches_computed"):  # over the rows the update computed
            metrics["policy/sampler_logprob_max_diff"] = diff
        metrics.update({f"train/{k}": v for k, v in trained.items()})
        return metrics

    # ---- the run -------------------------------------------------------------------------------------------------
    def run(self) -> list[dict[str, Any]]:
        from tqdm import tqdm

        self.warm_up()
        history = []
        bar = tqdm(total=self.config.total_steps, initial=self.step_count, desc="train",
                   disable=not (self.config.log.progress and distributed.is_primary()), dynamic_ncols=True)
        try:
            while self.step_count < self.config.total_steps:
                out = self.step()
                self.metrics.write(self.step_count, out.metrics)
                self.samples.write(self.step_count, out.trajectories)
                history.append({"step": self.step_count, **out.metrics})
                self._save(force=self.step_count == self.config.total_steps)
                bar.update(1)
                bar.set_postfix(reward=f"{out.metrics['reward/mean']:+.3f}",
                                solved=f"{out.metrics['solve_rate/final']:.2f}")
        finally:
            bar.close()
            self.close()
        return history

    def close(self) -> None:
        self.checkpointer.wait()
        self.checkpointer.close()
        self.metrics.close()
        self.pool.close()


def whiten(values: np.ndarray, mask: np.ndarray) -> np.ndarray:
    """(x - mean) / std over the masked entries (masked-out entries stay 0)."""
    m = mask.astype(bool)
    if m.sum() < 2:
        return values * mask
    mean, std = values[m].mean(), values[m].std()
    return (values - mean) / (std + 1e-8) * mask


def split_informative_groups(trajectories: list[Trajectory], size: int
                             ) -> tuple[list[list[Trajectory]], list[list[Trajectory]]]:
    """Consecutive groups of `size` dialogs, split into those whose total rewards differ and those all equal."""
    groups = [trajectories[i:i + size] for i in range(0, len(trajectories), size)]
    differ = [len({round(sum(t.rewards), 9) for t in g}) > 1 for g in groups]
    return [g for g, d in zip(groups, differ) if d], [g for g, d in zip(groups, differ) if not d]


def rollout_metrics(trajectories: list[Trajectory], stats: RolloutStats, max_turns: int) -> dict[str, Any]:
    """Reward mean, final status counts, solve rate by turn, turns and answer lengths, executor problems."""
    totals = np.asarray([sum(t.rewards) for t in trajectories])
    out: dict[str, Any] = {"reward/mean": float(totals.mean()), "reward/std": float(totals.std())}
    for status in sorted({t.statuses[-1] for t in trajectories if t.statuses}):
        out[f"status/{status}"] = sum(1 for t in trajectories if t.statuses and t.statuses[-1] == status)
    for turn in range(1, max_turns + 1):
        out[f"solve_rate/turn_{turn}"] = float(np.mean([t.solved and t.num_turns <= turn for t in trajectories]))
    out["solve_rate/final"] = float(np.mean([t.solved for t in trajectories]))
    out["turns/mean"] = float(np.mean([t.num_turns for t in trajectories]))
    lengths = [sum(1 for k in t.turn_of_token if k == turn) for t in trajectories for turn in range(t.num_turns)]
    out["response_length/mean"] = float(np.mean(lengths)) if lengths else 0.0
    sampled_tokens = sum(sum(t.sampled) for t in trajectories)
    if sampled_tokens:  # the policy's entropy where it sampled (softmax(logits / T), the sampler's own)
        out["entropy/sampled"] = sum(t.sampled_entropy for t in trajectories) / sampled_tokens
    answers = [(status, reason) for t in trajectories for status, reason in zip(t.statuses, t.finish_reasons)]
    if answers:  # what explains a reward change: answers without code, answers cut at the token budget
        out["answers/no_code_share"] = float(np.mean([status == "no_code" for status, _ in answers]))
        out["answers/truncated_share"] = float(np.mean([reason == FINISH_LENGTH for _, reason in answers]))
        if any(status.startswith("malformed") or status in ("edited", "exact") for status, _ in answers):  # SWE-RL
            out["answers/malformed_share"] = float(np.mean([status.startswith("malformed") for status, _ in answers]))
    out["rollout/executor_errors"] = stats.executor_errors
    out["rollout/context_full"] = stats.context_full
    out["rollout/dialogs"] = len(trajectories)
    if stats.decode_slot_steps:  # the slots engine: the share of computed decode rows x steps with a kept token
        decoded = sum(sum(t.sampled) for t in trajectories) - sum(len(t.finish_reasons) for t in trajectories)
        out["perf/decode_slot_use"] = decoded / stats.decode_slot_steps
    if stats.admit_token_slots:  # the slots engine: the share of the admissions' computed token slots not padding
        out["perf/admit_token_use"] = stats.admit_tokens / stats.admit_token_slots
    return out


def train(config: ConfigDict) -> list[dict[str, Any]]:
    """Run (or resume) the training run that `config` describes; returns this process's metrics rows."""
    return Trainer(config).run()
