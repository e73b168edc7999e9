"""SWE-RL end to end: instances mined from a real git history, GRPO training of configs/swerl_tiny.py whose logged
rewards equal the reward recomputed on the sampled texts, bit-exact resume, a scripted policy that writes the
oracle edits through the whole evaluation path, and bad rows skipped with their reason."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from executor.swe_reward import compute_reward
from models.sampler import FINISH_EOS, Completion
from rljax.data.bugfix_repo import build_bugfix_repo, shipped_instances
from rljax.envs.swerl import oracle_answer
from tests.test_trainer import _deterministic

REPO = Path(__file__).resolve().parents[1]


def _run(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO), JAX_PLATFORMS="cpu")
    proc = subprocess.run([sys.executable, "-m", "rljax.cli", *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc


def _train(workdir: Path, data: Path, steps: int) -> subprocess.CompletedProcess:
    return _run("train", "--config", str(REPO / "configs/swerl_tiny.py"), f"--config.workdir={workdir}",
                f"--config.total_steps={steps}", "--config.data.source=jsonl", f"--config.data.path={data}",
                "--config.rollout.cache_capacity=704",  # the mined prompts are at most 640 tokens
                "--config.log.progress=False", "--config.log.tensorboard=False")


def _read(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def test_mined_repository_trains_with_recomputable_rewards_and_resumes_bit_exactly(tmp_path, smollm2_ckpt):
    repo = build_bugfix_repo(tmp_path / "tallykit")
    train_file, test_file = tmp_path / "train.jsonl", tmp_path / "test.jsonl"
    mined = _run("mine", "--repo", str(repo.path), "--out", str(train_file), "--context-files", "1",
                 "--max-prompt-tokens", "640", "--tokenizer", str(smollm2_ckpt), "--split-date", repo.split_date,
                 "--test-out", str(test_file))
    assert "over_token_budget" in mined.stdout  # prompts of the changed file alone are 579-697 tokens
    train, test = _read(train_file), _read(test_file)
    assert train and test and all(r["created_at"][:10] < repo.split_date <= t["created_at"][:10]
                                  for r in train for t in test)
    # two bad rows that must be skipped and counted, never crash the run: no oracle, and a prompt over the cache
    rows = train[:2] + [dict(train[0], instance_id="no-oracle", oracle_new_content={}),
                    dict(train[0], instance_id="too-long", problem_statement="word " * 2000)]
    data = tmp_path / "rows.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))

    straight, resumed = tmp_path / "straight", tmp_path / "resumed"
    _train(straight, data, 2)
    shutil.copytree(straight, resumed)  # as if killed after step 1's checkpoint (every 1 step in swerl_tiny)
    shutil.rmtree(resumed / "checkpoints" / "2")
    again = _train(resumed, data, 2)
    assert "resumed from" in again.stderr
    metrics = _read(straight / "metrics.jsonl")
    assert [m["step"] for m in metrics] == [1, 2]
    assert _deterministic(_read(resumed / "metrics.jsonl")) == _deterministic(metrics)
    assert _read(resumed / "samples.jsonl") == _read(straight / "samples.jsonl")

    by_id = {r["instance_id"]: r for r in rows}
    samples = _read(straight / "samples.jsonl")
    assert len(samples) == 2 * 8  # swerl_tiny: 2 issues x 4 answers per step, all logged
    for step in (1, 2):
        rewards = []
        for s in (s for s in samples if s["step"] == step):
            instance = by_id[s["problem"]]
            assert s["problem"] not in ("no-oracle", "too-long")
            expected, _ = compute_reward(instance["code_context"], instance["oracle_new_content"], s["answers"][0])
            assert s["rewards"] == [expected]
            rewards.append(expected)
        assert metrics[step - 1]["reward/mean"] == pytest.approx(np.mean(rewards), abs=1e-12)
    assert metrics[-1]["data/skipped_problems"] >= 2  # 4 draws of 2 usable rows pass both bad rows at least once


class ScriptedSampler:
    """Stands in for the model: answers each prompt with the given text, tokenized as the model's own ids."""

    def __init__(self, tokenizer, answers_by_prompt: dict[tuple[int, ...], str]):
        self.tokenizer, self.answers, self.model = tokenizer, answers_by_prompt, None

    def generate(self, prompts, sampling, key, cache_capacity=None):
        out = []
        for prompt in prompts:
            ids = self.tokenizer.encode(self.answers[tuple(prompt)]) + [sampling.stop_ids[0]]
            out.append(Completion(ids, np.zeros(len(ids), np.float32), None, FINISH_EOS))
        return out, None


def _scripted_eval(smollm2_ckpt, answer_for) -> dict:
    from configs import swerl_tiny
    from models.sharding import make_mesh
    from rljax.evaluation import Evaluator
    from rljax.run_config import build_policy

    config = swerl_tiny.get_config()
    config.model.tokenizer = str(smollm2_ckpt)
    model, tokenizer = build_policy(config.model)
    evaluator = Evaluator(config, model, tokenizer, make_mesh(data=1, fsdp=1, tensor=1))
    answers = {tuple(evaluator.codec.prompt_ids(evaluator.env.open(problem).messages)): answer_for(row)
               for row, problem in evaluator.rows}
    evaluator.runner.sampler = ScriptedSampler(tokenizer, answers)
    try:
        return evaluator.run()
    finally:
        evaluator.close()


def test_a_policy_that_writes_the_oracle_edits_scores_one_and_malformed_scores_minus_one(smollm2_ckpt):
    report = _scripted_eval(smollm2_ckpt, oracle_answer)
    metrics = report["metrics"]
    assert metrics["problems"] == 4 and {d["reward"] for d in report["dialogs"]} == {1.0}
    assert metrics["exact_match_rate"]["value"] == 1.0 and metrics["reward/mean"]["value"] == 1.0
    assert metrics["malformed_fraction"]["value"] == 0.0
    report = _scripted_eval(smollm2_ckpt, lambda row: oracle_answer(row).replace("</think>", ""))
    assert {d["reward"] for d in report["dialogs"]} == {-1.0}
    assert report["metrics"]["malformed_fraction"]["value"] == 1.0


def test_every_shipped_instance_is_solvable_and_splits_are_disjoint_in_time():
    train, test = shipped_instances("train"), shipped_instances("test")
    assert (len(train), len(test)) == (32, 16)
    assert max(r["created_at"] for r in train) < min(r["created_at"] for r in test)
    assert not {r["instance_id"] for r in train} & {r["instance_id"] for r in test}
    for row in train + test:
        answer = oracle_answer(row)
        assert compute_reward(row["code_context"], row["oracle_new_content"], answer)[0] == 1.0


def test_shipped_instances_are_reproduced_by_the_generator(smollm2_ckpt):
    from models.checkpoint import load_tokenizer
    from rljax.data.bugfix_repo import CONTEXT_FILES, PROMPT_BUDGET, bugfix_instances
    from rljax.dialog import ChatCodec
    from rljax.envs.swerl import prompt_token_counter

    count = prompt_token_counter(ChatCodec(load_tokenizer(smollm2_ckpt)))
    rows, report, _ = bugfix_instances(count, PROMPT_BUDGET, CONTEXT_FILES)
    assert rows == shipped_instances("train") + shipped_instances("test")
    assert report.kept == 48 and report.skipped["not_a_fix"] == 11 and report.skipped["bot"] == 1


def test_bad_rows_are_counted_skips_with_their_reason(smollm2_ckpt):
    from models.checkpoint import load_tokenizer
    from rljax.dialog import ChatCodec
    from rljax.envs import SWERLEnv
    from rljax.evaluation import usable_rows
    from rljax.problems import ProblemStream, prompt_checked

    good = shipped_instances("test")[:2]
    bad = [dict(good[0], instance_id="no-oracle", oracle_new_content={}),
           {k: v for k, v in good[0].items() if k != "oracle_new_content"} | {"instance_id": "missing"},
           dict(good[0], instance_id="not-utf8", code_context={"tallykit/stats.py": "x = '\udcff'\n"}),
           dict(good[0], instance_id="too-long", problem_statement="word " * 2000)]
    parse = prompt_checked(SWERLEnv(), ChatCodec(load_tokenizer(smollm2_ckpt)), 1408, 256)
    kept, skipped = usable_rows(good + bad, parse)
    assert [row["instance_id"] for row, _ in kept] == [g["instance_id"] for g in good]
    assert "changes no file" in skipped["no-oracle"] and "missing field" in skipped["missing"]
    assert "not valid UTF-8" in skipped["not-utf8"] and "does not fit rollout.cache_capacity" in skipped["too-long"]
    stream = ProblemStream(good + bad, parse, seed=0)
    drawn = [row["instance_id"] for _ in range(3) for row, _ in stream.next_batch(2)]
    assert set(drawn) <= {g["instance_id"] for g in good} and stream.skipped >= 4  # every bad row, each pass
