"""Evaluation runs: many dialogs per problem with the configured decoding, judged by the real environment, and
the papers' metrics with bootstrap 95% intervals over problems.

RLEF: n@k for each configured spec (every turn is one of the k answers), solve rate by turn, pass@1 of the first
answer, final status counts. SWE-RL: mean reward, malformed fraction, exact-match rate. `rljax eval` prints a
table and writes the report (with every dialog's outcome) as JSON.
"""
from __future__ import annotations

import collections
import json
import logging
import time
from pathlib import Path
from typing import Any, Callable, Sequence

import jax
import numpy as np
from ml_collections import ConfigDict

from executor.pool import ExecutorPool
from models.sampler import Sampler, SamplingParams
from models.sharding import use_mesh
from rljax import eval as estimators
from rljax.engine import rollout_runner
from rljax.envs.base import ProblemError
from rljax.problems import prompt_checked
from rljax.rollout import Trajectory

log = logging.getLogger("rljax.evaluation")

PASSED_PUBLIC = ("solved", "failed_private")  # RLEF final statuses whose answer passed the public tests


def dialog_record(t: Trajectory) -> dict[str, Any]:
    final = t.statuses[-1] if t.statuses else ""
    return {"problem": t.problem, "turns": t.num_turns, "statuses": list(t.statuses),
            "reward": float(sum(t.rewards)), "solved": t.solved, "passed_public": final in PASSED_PUBLIC,
            "final_answer": t.answers[-1] if t.answers else ""}


def rlef_metrics(records: Sequence[dict[str, Any]], specs: Sequence[str], max_turns: int, resamples: int = 2000,
                 seed: int = 0) -> dict[str, Any]:
    """n@k per spec, solve rate per turn and pass@1 of the first answer, each with a bootstrap 95% CI."""
    by_problem: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for r in records:
        by_problem[r["problem"]].append(r)
    if not by_problem:
        raise ValueError("evaluation: no dialogs to score (the eval set is empty)")
    out: dict[str, Any] = {"problems": len(by_problem), "dialogs": len(records)}
    per_problem_values: dict[str, dict[str, float]] = {}
    for spec in specs:
        n, k = estimators.parse_n_at_k(spec)
        per_problem = [estimators.n_at_k([estimators.DialogOutcome(d["turns"], d["passed_public"], d["solved"])
                                          for d in dialogs], n, k, seed=seed) for dialogs in by_problem.values()]
        out[f"{n}@{k}"] = estimators.estimate(per_problem, resamples, seed).as_dict()
        per_problem_values[f"{n}@{k}"] = dict(zip(by_problem, per_problem))
    for turn in range(1, max_turns + 1):
        per_problem = [float(np.mean([d["solved"] and d["turns"] <= turn for d in ds])) for ds in by_problem.values()]
        out[f"solve_rate/turn_{turn}"] = estimators.estimate(per_problem, resamples, seed).as_dict()
    first = [float(np.mean([d["solved"] and d["turns"] == 1 for d in ds])) for ds in by_problem.values()]
    out["pass@1/first_answer"] = estimators.estimate(first, resamples, seed).as_dict()
    out["reward/mean"] = float(np.mean([r["reward"] for r in records]))
    out["status"] = dict(collections.Counter(r["statuses"][-1] if r["statuses"] else "none" for r in records))
    out["per_problem"] = per_problem_values  # for paired comparisons of two runs on the same problems
    return out


def paired_difference(before: dict[str, Any], after: dict[str, Any], metric: str = "1@3", resamples: int = 2000,
                      seed: int = 0) -> dict[str, float]:
    """after - before of a per-problem metric (an n@k, or SWE-RL's reward/mean) over the problems both reports scored, with a bootstrap 95% interval
    that resamples problems (each keeps its own pair), so problem difficulty cancels out of the interval."""
    first, second = before["metrics"]["per_problem"][metric], after["metrics"]["per_problem"][metric]
    common = [p for p in first if p in second]
    if not common:
        raise ValueError(f"paired_difference: the two reports share no problem for {metric}")
    return estimators.estimate([second[p] - first[p] for p in common], resamples, seed).as_dict()


def swerl_metrics(records: Sequence[dict[str, Any]], resamples: int = 2000, seed: int = 0) -> dict[str, Any]:
    if not records:
        raise ValueError("evaluation: no responses to score (the eval set is empty)")
    by_problem: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for r in records:
        by_problem[r["problem"]].append(r)

    measures = {"reward/mean": lambda d: d["reward"],
                "malformed_fraction": lambda d: d["statuses"][-1].startswith("malformed"),
                "exact_match_rate": lambda d: d["statuses"][-1] == "exact"}
    out: dict[str, Any] = {"problems": len(by_problem), "dialogs": len(records)}
    per_problem_values: dict[str, dict[str, float]] = {}
    for name, measure in measures.items():
        values = {p: float(np.mean([measure(d) for d in ds])) for p, ds in by_problem.items()}
        out[name] = estimators.estimate(list(values.values()), resamples, seed).as_dict()
        per_problem_values[name] = values
    out["status"] = dict(collections.Counter(r["statuses"][-1] if r["statuses"] else "none" for r in records))
    out["per_problem"] = per_problem_values  # for paired comparisons of two runs on the same problems
    return out


def usable_rows(rows: Sequence[dict[str, Any]], parse: Callable[[dict[str, Any]], Any]
                ) -> tuple[list[tuple[dict[str, Any], Any]], dict[str, str]]:
    """(row, parsed problem) for each row the environment accepts, and {problem: reason} for each it refuses
    (counted in the report and logged, never dropped silently); an eval set with no usable row is an error."""
    kept, skipped = [], {}
    for i, row in enumerate(rows):
        try:
            kept.append((row, parse(row)))
        except ProblemError as err:
            skipped[str(row.get("name") or row.get("instance_id") or f"row {i}")] = str(err)
    if skipped:
        log.warning("evaluation: skipped %d of %d problems the environment refuses (first: %s)", len(skipped),
                    len(rows), next(iter(skipped.values())))
    if not kept:
        raise ValueError(f"evaluation: none of the {len(rows)} eval problems is usable "
                         f"(first: {next(iter(skipped.values()))})")
    return kept, skipped


class Evaluator:
    """Samples `eval.samples_per_problem` dialogs per problem of the eval set with the eval decoding."""

    def __init__(self, config: ConfigDict, policy: Any, tokenizer: Any, mesh: Any, pool: ExecutorPool | None = None):
        from rljax.run_config import build_codec, build_env, eval_rows

        self.config, self.mesh = config, mesh
        e = config.eval
        rows = eval_rows(config)
        env = config.env.copy_and_resolve_references()
        env.max_turns = e.max_turns or env.max_turns
        self.env = build_env(env, rows, data_source=e.source or config.data.source)
        self.codec = build_codec(config, tokenizer)
        self.sampling = SamplingParams(max_new_tokens=e.max_new_tokens or config.rollout.max_new_tokens,
                                       temperature=e.temperature, top_p=e.top_p,
                                       stop_ids=tuple(self.codec.stop_ids))
        self.rows, self.skipped = usable_rows(rows, prompt_checked(self.env, self.codec, config.rollout.cache_capacity,
                                                                   self.sampling.max_new_tokens))
        pad_id = tokenizer.pad_id if tokenizer is not None else int(self.codec.stop_ids[0])
        self.sampler = Sampler(policy, tokenizer, mesh=mesh, length_bucket=config.rollout.length_bucket,
                               pad_id=pad_id, replicate_weights=config.rollout.replicate_weights)
        self._own_pool = pool is None
        self.pool = pool or ExecutorPool(config.rollout.executor_workers or None)
        self.runner = rollout_runner(config, self.sampler, self.codec, self.env, self.pool, self.sampling,
                                     e.batch_dialogs)

    def run(self, policy: Any = None, progress: bool = False) -> dict[str, Any]:
        """Evaluate (the given policy, else the one it was built with); the report with every dialog."""
        from tqdm import tqdm

        if policy is not None:
            self.sampler.model = policy
        e = self.config.eval
        episodes = [(row, problem) for row, problem in self.rows for _ in range(e.samples_per_problem)]
        records: list[dict[str, Any]] = []
        started = time.perf_counter()
        bar = tqdm(total=len(episodes), desc="eval", disable=not progress, dynamic_ncols=True)
        per_call = len(episodes) if self.runner.refills_slots else e.batch_dialogs
        for start in range(0, len(episodes), per_call):
            chunk = episodes[start:start + per_call]
            names = [str(row.get("name") or row.get("instance_id")) for row, _ in chunk]
            key = jax.random.fold_in(jax.random.key(e.seed), start)
            with use_mesh(self.mesh):
                trajectories, _ = self.runner.run([self.env.open(problem) for _, problem in chunk],
                                                  list(range(len(chunk))), names, key)
            records += [dialog_record(t) for t in trajectories]
            bar.update(len(chunk))
        bar.close()
        if self.config.env.name == "swerl":
            metrics = swerl_metrics(records, e.bootstrap_resamples, e.seed)
        else:
            specs = [s for s in e.n_at_k.split(",") if s.strip()]
            metrics = rlef_metrics(records, specs, self.env.max_turns, e.bootstrap_resamples, e.seed)
        decoding = {"temperature": e.temperature, "top_p": e.top_p, "max_new_tokens": self.sampling.max_new_tokens,
                    "samples_per_problem": e.samples_per_problem}
        return {"metrics": metrics, "decoding": decoding, "seconds": time.perf_counter() - started,
                "skipped_problems": self.skipped, "dialogs": records}

    def close(self) -> None:
        if self._own_pool:
            self.pool.close()


def format_table(report: dict[str, Any]) -> str:
    """The report's estimates as an aligned console table."""
    rows = [("metric", "value", "95% CI", "problems")]
    for name, value in report["metrics"].items():
        if isinstance(value, dict) and "value" in value:
            rows.append((name, f"{value['value']:.3f}", f"[{value['ci95_low']:.3f}, {value['ci95_high']:.3f}]",
                         str(value["problems"])))
        elif isinstance(value, float):
            rows.append((name, f"{value:+.3f}", "", ""))
    widths = [max(len(r[i]) for r in rows) for i in range(4)]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(r, widths)).rstrip() for r in rows]
    status = report["metrics"].get("status")
    if status:
        lines.append("final status: " + ", ".join(f"{k} {v}" for k, v in sorted(status.items())))
    return "\n".join(lines)


def write_report(report: dict[str, Any], path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(report, indent=1))
    return path
