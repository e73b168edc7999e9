"""Estimators against exact values and simulations; the evaluation run on the toy task."""
import math

import numpy as np
import pytest

from rljax.eval import DialogOutcome, bootstrap_ci, n_at_k, parse_n_at_k, pass_at_k
from rljax.evaluation import paired_difference, rlef_metrics


def _exact_pass_at_k(n, c, k):
    return 1.0 - math.comb(n - c, k) / math.comb(n, k)


def test_pass_at_k_exact_values_and_edges():
    assert pass_at_k(200, 7, 10) == pytest.approx(0.3055988, abs=1e-7)
    for n, c, k in [(200, 7, 10), (200, 100, 50), (10, 3, 1), (5, 2, 3), (200, 1, 199)]:
        assert pass_at_k(n, c, k) == pytest.approx(_exact_pass_at_k(n, c, k), rel=1e-12)
    assert pass_at_k(200, 0, 10) == 0.0
    assert pass_at_k(200, 200, 10) == 1.0
    assert pass_at_k(10, 8, 3) == 1.0  # n - c < k: every draw of 3 holds a correct one
    assert pass_at_k(10, 3, 1) == pytest.approx(0.3)
    with pytest.raises(ValueError, match="1 <= k <= n"):
        pass_at_k(5, 2, 6)


def test_n_at_k_on_constructed_pools():
    solved1, fail3 = DialogOutcome(1, True, True), DialogOutcome(3, False, False)
    # 1@3 over 3-turn dialogs = fraction of dialogs solved
    assert n_at_k([solved1, fail3, fail3, solved1], 1, 3) == pytest.approx(0.5, abs=0.03)
    # budget 3 with a 1-turn solved and a 3-turn failed dialog: solved only when the 1-turn one comes first
    assert n_at_k([solved1, fail3], 1, 3) == pytest.approx(0.5, abs=0.03)
    # a dialog that passed public but not private is a wasted submission slot at n = 1
    decoy = DialogOutcome(1, True, False)
    assert n_at_k([decoy, solved1], 1, 2) == pytest.approx(0.5, abs=0.03)
    assert n_at_k([decoy, solved1], 2, 2) == 1.0
    # answers that fail public tests are never submitted ahead of a public-passing one
    assert n_at_k([DialogOutcome(1, False, False)] * 3 + [solved1], 1, 4) == 1.0
    assert n_at_k([fail3] * 5, 10, 15) == 0.0
    assert n_at_k([solved1], 1, 3) == 1.0  # a pool smaller than the budget: every draw takes all of it
    # 1@3 is the first dialog's outcome: a solved dialog is never displaced by a later public-passing decoy
    assert n_at_k([solved1, decoy, fail3], 1, 3) == pytest.approx(1 / 3, abs=0.03)  # = fraction solved
    assert parse_n_at_k("10@100") == (10, 100)
    with pytest.raises(ValueError, match="expected 'n@k'"):
        parse_n_at_k("3@1")


def test_bootstrap_interval_covers_the_truth_about_95_percent_of_the_time():
    rng = np.random.default_rng(1)
    truth, covered, trials = 0.3, 0, 300
    for trial in range(trials):
        values = rng.random(60) < truth
        low, high = bootstrap_ci(values.astype(float), resamples=1000, seed=trial)
        covered += low <= truth <= high
    assert 0.90 <= covered / trials <= 0.99


def test_rlef_metrics_from_dialog_records():
    records = [{"problem": "a", "turns": 1, "statuses": ["solved"], "reward": 1.0, "solved": True,
                "passed_public": True},
               {"problem": "a", "turns": 3, "statuses": ["retry", "retry", "failed_public"], "reward": -1.0,
                "solved": False, "passed_public": False},
               {"problem": "b", "turns": 2, "statuses": ["retry", "solved"], "reward": 1.0, "solved": True,
                "passed_public": True},
               {"problem": "b", "turns": 2, "statuses": ["no_code", "solved"], "reward": 0.8, "solved": True,
                "passed_public": True}]
    m = rlef_metrics(records, ["1@3"], 3, resamples=200)
    assert m["problems"] == 2 and m["dialogs"] == 4
    assert m["1@3"]["value"] == pytest.approx((0.5 + 1.0) / 2, abs=0.03)
    assert m["solve_rate/turn_1"]["value"] == pytest.approx(0.25)  # a: 1/2, b: 0/2
    assert m["solve_rate/turn_2"]["value"] == pytest.approx(0.75)
    assert m["pass@1/first_answer"]["value"] == pytest.approx(0.25)
    assert m["status"] == {"solved": 3, "failed_public": 1}
    assert m["reward/mean"] == pytest.approx(0.45)
    assert m["per_problem"]["1@3"]["b"] == 1.0 and m["per_problem"]["1@3"]["a"] == pytest.approx(0.5, abs=0.05)
    with pytest.raises(ValueError, match="eval set is empty"):
        rlef_metrics([], ["1@3"], 3)


def test_paired_difference_pairs_problems_and_ignores_unshared_ones():
    def report(values):
        return {"metrics": {"per_problem": {"1@3": values}}}

    before = report({"a": 0.0, "b": 0.5, "c": 1.0, "only_before": 1.0})
    after = report({"a": 1.0, "b": 0.5, "c": 1.0, "only_after": 0.0})
    diff = paired_difference(before, after, resamples=500)
    assert diff["value"] == pytest.approx(1 / 3) and diff["problems"] == 3
    # resampling (a, b, c) with replacement: the mean difference is k/3 for k ones drawn, from 0 to 1
    assert 0.0 <= diff["ci95_low"] < diff["value"] < diff["ci95_high"] <= 1.0
    same = paired_difference(before, before)
    assert same == {"value": 0.0, "ci95_low": 0.0, "ci95_high": 0.0, "problems": 4}
    with pytest.raises(ValueError, match="share no problem"):
        paired_difference(report({"x": 1.0}), report({"y": 1.0}))


def test_eval_run_and_plots_on_the_toy_task(tmp_path, capsys):
    from configs import rlef_tiny
    from rljax.cli import main
    from rljax.evaluation import Evaluator, format_table, write_report
    from rljax.plots import plot_run
    from rljax.trainer import Trainer

    config = rlef_tiny.get_config()
    config.workdir = str(tmp_path / "run")
    config.total_steps = 2
    config.rollout.problems_per_step = 8
    config.log.progress = config.log.tensorboard = False
    config.eval.samples_per_problem = 3
    config.eval.n_at_k = "1@3,2@6"
    config.eval.max_problems = 6
    trainer = Trainer(config)
    evaluator = Evaluator(config, trainer.learner.policy_model(), trainer.tokenizer, trainer.mesh)
    trainer.run()
    report = evaluator.run(trainer.learner.policy_model())
    evaluator.close()
    m = report["metrics"]
    assert m["problems"] == 6 and m["dialogs"] == 18 and len(report["dialogs"]) == 18
    by_problem = {}
    for d in report["dialogs"]:
        by_problem.setdefault(d["problem"], []).append(DialogOutcome(d["turns"], d["passed_public"], d["solved"]))
    assert m["1@3"]["value"] == pytest.approx(np.mean([n_at_k(ds, 1, 3) for ds in by_problem.values()]))
    per_problem_solved = [np.mean([o.solved for o in ds]) for ds in by_problem.values()]
    assert m["1@3"]["value"] == pytest.approx(np.mean(per_problem_solved), abs=0.03)  # 1@3 = fraction solved
    assert m["1@3"]["ci95_low"] <= m["1@3"]["value"] <= m["1@3"]["ci95_high"]
    assert 0.0 <= m["2@6"]["value"] <= 1.0 and sum(m["status"].values()) == 18
    assert "1@3" in format_table(report)
    write_report(report, tmp_path / "run" / "eval" / "step0002_eval.json")
    names = sorted(p.name for p in plot_run(tmp_path / "run"))
    assert names == ["answer_length.png", "answer_shares.png", "eval.png", "kl_entropy.png", "reward.png",
                     "solve_rate.png", "solve_rate_by_turn.png", "turn_histogram.png"]
    assert all((tmp_path / "run" / "plots" / n).stat().st_size > 1000 for n in names)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["plot", str(empty)]) == 1
    assert "no metrics.jsonl" in capsys.readouterr().err


def test_eval_rows_the_environment_refuses_are_counted_not_fatal():
    from rljax.data import bundled_problems
    from rljax.envs import RLEFEnv
    from rljax.evaluation import usable_rows

    rows = bundled_problems()[:3]
    bad = dict(rows[0], name="no-private-tests", private_tests={"input": [], "output": []})
    env = RLEFEnv()
    kept, skipped = usable_rows(rows + [bad], env.parse)
    assert [row for row, _ in kept] == rows and list(skipped) == ["no-private-tests"]
    assert [problem for _, problem in kept] == [env.parse(row) for row in rows]
    with pytest.raises(ValueError, match="none of the 1 eval problems is usable"):
        usable_rows([bad], env.parse)
