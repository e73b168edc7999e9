"""The supervised warm-up (rljax.warmup): its loss is the answer tokens' NLL, it teaches the toy task's answers,
it runs once per run (resume keeps the warmed weights), and demonstrations of the shipped data are exact."""
import json

import jax
import numpy as np
import pytest

from rljax.evaluation import Evaluator
from rljax.trainer import Trainer
from rljax.warmup import SupervisedWarmup, demonstration_batch, demonstrations, schedule
from rljax.learner import OptimConfig
from tests.test_trainer import _config


def _toy_trainer(tmp_path, **overrides):
    return Trainer(_config("grpo_tiny", tmp_path, **overrides))


def test_warmup_loss_is_the_mean_nll_of_answer_tokens(tmp_path):
    trainer = _toy_trainer(tmp_path, **{"model.lora.targets": "all", "model.lora.rank": 4})
    demos = demonstrations(trainer.env, trainer.codec, trainer.rows, 8, 16)
    assert len(demos.trajectories) == len(trainer.rows) and not demos.skipped
    batch = trainer._place(demonstration_batch(demos.trajectories[:4], 8, trainer.pad_id))
    logp = np.asarray(trainer.learner.score(trainer.learner.policy_state.params, batch)[0])
    answer = np.asarray(batch["sampled"])
    assert answer.sum() == sum(sum(t.sampled) for t in demos.trajectories[:4])
    expected = -(logp * answer).sum() / answer.sum()  # the scorer's temperature is the rollout's: 1.0 here
    # train.share_prompts: the prompts run without the vocabulary projection; the answers' NLL is the same
    with pytest.raises(ValueError, match="laid out for 2 micro-batches; this update splits it into 1"):
        trainer.learner.score(trainer.learner.policy_state.params,
                              demonstration_batch(demos.trajectories[:4], 8, trainer.pad_id, 2, 8))
    shared = trainer._place(demonstration_batch(demos.trajectories[:4], 8, trainer.pad_id, 1, 8))
    logp_shared = np.asarray(trainer.learner.score(trainer.learner.policy_state.params, shared)[0])
    assert -(logp_shared * answer).sum() / answer.sum() == pytest.approx(float(expected), rel=1e-5)
    before = jax.tree.map(np.asarray, trainer.learner.policy_state.params)
    frozen = jax.tree.map(np.asarray, trainer.learner.policy_frozen)
    warmup = SupervisedWarmup(trainer.learner, OptimConfig(learning_rate=1e-2, warmup_steps=0))
    step = warmup.update(batch)
    assert step["nll"] == pytest.approx(float(expected), rel=1e-5)
    assert warmup.update(batch)["nll"] < step["nll"]
    warmup.finish()
    after = trainer.learner.policy_state
    assert int(after.step) == 0  # RL starts with a fresh optimizer state
    assert any(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(before), jax.tree.leaves(after.params)))
    assert all(np.array_equal(a, np.asarray(b)) for a, b in zip(jax.tree.leaves(frozen),
                                                               jax.tree.leaves(trainer.learner.policy_frozen)))
    trainer.close()


def test_warmup_teaches_the_toy_answers_and_runs_once(tmp_path):
    overrides = {"warmup.steps": 60, "warmup.batch": 8, "warmup.learning_rate": 1e-2, "eval.temperature": 0.0,
                 "rollout.max_new_tokens": 2,  # the digit and the end of turn, as demonstrated
                 "total_steps": 1}
    trainer = _toy_trainer(tmp_path, **overrides)
    evaluator = Evaluator(trainer.config, trainer.learner.policy_model(), trainer.tokenizer, trainer.mesh)
    solved = lambda: evaluator.run(trainer.learner.policy_model())["metrics"]["solve_rate/turn_1"]["value"]  # noqa
    before = solved()
    rows = trainer.warm_up()
    after = solved()
    print(f"toy greedy solve rate: before warm-up {before:.2f}, after {after:.2f}; nll {rows[0]['nll']:.3f} -> "
          f"{rows[-1]['nll']:.3f}")
    assert before <= 0.2 and after >= 0.8
    assert rows[-1]["nll"] < 0.2 * rows[0]["nll"]
    assert [json.loads(line)["warmup_step"] for line in (tmp_path / "warmup.jsonl").read_text().splitlines()] \
        == list(range(1, 61))
    warmed = jax.tree.map(np.asarray, trainer.learner.policy_state.params)
    trainer.checkpointer.wait()
    evaluator.close()
    trainer.close()
    again = _toy_trainer(tmp_path, **overrides)  # resumes from the warm-up's step-0 checkpoint
    assert again.step_count == 0 and again.warmed_up
    assert again.warm_up() == []
    assert all(np.array_equal(a, np.asarray(b)) for a, b in zip(jax.tree.leaves(warmed),
                                                               jax.tree.leaves(again.learner.policy_state.params)))
    again.close()


def test_rows_without_demonstrations_fail_in_one_line(tmp_path):
    trainer = _toy_trainer(tmp_path, **{"warmup.steps": 1})
    trainer.rows = [{k: v for k, v in row.items() if k != "demonstration"} for row in trainer.rows]
    with pytest.raises(ValueError, match=r"config.warmup: none of the 10 training rows .*no_demonstration"):
        trainer.warm_up()
    trainer.close()


def test_shipped_demonstrations_are_exact_and_counted():
    from models.checkpoint import load_tokenizer
    from models.pretrained import smollm2_checkpoint
    from rljax.data.bugfix_repo import shipped_instances
    from rljax.data.practice import practice_problems
    from rljax.dialog import ChatCodec
    from rljax.envs import RLEFEnv, SWERLEnv

    codec = ChatCodec(load_tokenizer(smollm2_checkpoint()))
    env = SWERLEnv("exact_match")
    rows = shipped_instances("train")
    demos = demonstrations(env, codec, rows, 256, 1408)
    assert len(demos.trajectories) == len(rows) == 32 and not demos.skipped
    for row, t in zip(rows, demos.trajectories):
        answer = [tok for tok, s in zip(t.tokens, t.sampled) if s]
        assert answer[-1] == codec.stop_ids[0]
        assert env.reset(row).step(codec.answer_text(answer)).reward == 1.0  # the ids say the oracle edits
    short = demonstrations(env, codec, rows, 90, 1408)  # answers of 78-125 tokens: most are over a 90 budget
    assert short.skipped == {"answer_over_budget": 32 - len(short.trajectories)} and short.trajectories
    practice = practice_problems("train")
    rlef = demonstrations(RLEFEnv(), codec, practice, 256, 1024)
    assert len(rlef.trajectories) == len(practice)
    assert codec.answer_text([x for x, s in zip(rlef.trajectories[0].tokens, rlef.trajectories[0].sampled) if s]) \
        == RLEFEnv().demonstration(practice[0])


def test_schedule_covers_every_demonstration_each_epoch():
    steps = schedule(10, 6, 4, seed=0)
    flat = [i for s in steps for i in s]
    assert len(steps) == 6 and all(len(s) == 4 for s in steps)
    assert sorted(flat[:10]) == list(range(10)) and sorted(flat[10:20]) == list(range(10))
    assert schedule(10, 6, 4, seed=0) == steps != schedule(10, 6, 4, seed=1)
