"""Solve-rate estimators: unbiased pass@k, RLEF's n@k over multi-turn dialogs, bootstrap confidence intervals.

pass@k (Chen et al. 2021): from n independent samples of which c are correct, 1 - C(n-c, k) / C(n, k), computed as
a product so that n = 200 does not overflow.

n@k (RLEF, after AlphaCode): a budget of k *answers* per problem, where every turn of a dialog is one answer.
Dialogs are drawn from the problem's pool in random order while their turns fit the budget; the final answers of
the drawn dialogs that pass the public tests are the candidates, the first n of them (in the order they were
sampled) are submitted, and the problem counts as solved when one submission passes all tests. A dialog stops
early only when its answer passes the public tests, so 1@3 with 3-turn dialogs is exactly the fraction of
dialogs solved. When the pool holds fewer than k answers, each draw uses the whole pool. The expectation over
draws is estimated by Monte-Carlo with a fixed seed.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Sequence

import numpy as np


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples with c correct (needs 0 <= c <= n and 1 <= k <= n)."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass_at_k: need 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:
        return 1.0
    return 1.0 - float(np.prod(1.0 - k / np.arange(n - c + 1, n + 1, dtype=np.float64)))


@dataclasses.dataclass(frozen=True)
class DialogOutcome:
    """What n@k needs of one dialog: how many answers it used, and how its final answer was judged."""

    turns: int
    passed_public: bool
    solved: bool


def parse_n_at_k(spec: str) -> tuple[int, int]:
    """'10@100' -> (10, 100)."""
    match = re.fullmatch(r"\s*(\d+)@(\d+)\s*", spec)
    if not match or int(match.group(1)) < 1 or int(match.group(2)) < int(match.group(1)):
        raise ValueError(f"n@k spec {spec!r}: expected 'n@k' with 1 <= n <= k, e.g. '1@3' or '10@100'")
    return int(match.group(1)), int(match.group(2))


def n_at_k(dialogs: Sequence[DialogOutcome], n: int, k: int, draws: int = 2000, seed: int = 0) -> float:
    """Expected n@k of one problem from its pool of dialogs (Monte-Carlo over `draws` random orders)."""
    if not dialogs:
        raise ValueError("n_at_k: the problem has no dialogs")
    turns = np.asarray([d.turns for d in dialogs])
    if turns.min() < 1:
        raise ValueError("n_at_k: every dialog needs at least one answer")
    public = np.asarray([d.passed_public for d in dialogs])
    solved = np.asarray([d.solved for d in dialogs])
    if not solved.any():
        return 0.0
    rng = np.random.default_rng(seed)
    hits = 0
    for _ in range(draws):
        order = rng.permutation(len(dialogs))
        taken = order[np.cumsum(turns[order]) <= k]
        candidates = taken[public[taken]][:n]
        hits += bool(solved[candidates].any())
    return hits / draws


def bootstrap_ci(values: Sequence[float], confidence: float = 0.95, resamples: int = 2000, seed: int = 0
                 ) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of per-problem values (problems resampled with replacement)."""
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        raise ValueError("bootstrap_ci: no values")
    rng = np.random.default_rng(seed)
    means = x[rng.integers(0, x.size, size=(resamples, x.size))].mean(axis=1)
    tail = (1.0 - confidence) / 2.0
    low, high = np.quantile(means, [tail, 1.0 - tail])
    return float(low), float(high)


@dataclasses.dataclass(frozen=True)
class Estimate:
    value: float
    low: float
    high: float
    problems: int

    def as_dict(self) -> dict[str, float]:
        return {"value": self.value, "ci95_low": self.low, "ci95_high": self.high, "problems": self.problems}


def estimate(per_problem: Sequence[float], resamples: int = 2000, seed: int = 0) -> Estimate:
    """Mean over problems with its bootstrap 95% interval."""
    low, high = bootstrap_ci(per_problem, 0.95, resamples, seed)
    return Estimate(float(np.mean(per_problem)), low, high, len(per_problem))

