"""Per-step metrics: one JSON object per line in WORKDIR/metrics.jsonl and the same scalars in TensorBoard; and
sampled dialogs (answers, rewards, statuses) in WORKDIR/samples.jsonl, to read what the policy writes."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.jsonl"
WARMUP_FILE = "warmup.jsonl"  # the supervised warm-up's rows (rljax.warmup), one per warm-up step
SAMPLES_FILE = "samples.jsonl"


def _truncate_after(path: Path, step: int) -> None:
    """On resume, drop the rows of steps after the restored checkpoint (they are computed again)."""
    if not path.exists():
        return
    kept = [line for line in path.read_text().splitlines() if line.strip() and json.loads(line).get("step", 0) <= step]
    path.write_text("".join(line + "\n" for line in kept))


class MetricsWriter:
    """Writes on one process only (`enabled`): in a multi-host run every host has the same global metrics."""

    def __init__(self, workdir: str | Path, resume_step: int = 0, tensorboard: bool = True, enabled: bool = True):
        self.path = Path(workdir) / METRICS_FILE
        self.enabled = enabled
        self._tb = None
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        _truncate_after(self.path, resume_step)
        if tensorboard:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(str(Path(workdir) / "tensorboard"), purge_step=resume_step + 1)

    def write(self, step: int, metrics: dict[str, Any]) -> None:
        if not self.enabled:
            return
        row = {"step": step, **{k: _plain(v) for k, v in sorted(metrics.items())}}
        with self.path.open("a") as f:
            f.write(json.dumps(row) + "\n")
        if self._tb is not None:
            for key, value in row.items():
                if key != "step" and isinstance(value, (int, float)) and math.isfinite(value):
                    self._tb.add_scalar(key, value, step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


class SampleWriter:
    """The first `per_step` dialogs of each step, one JSON object each: step, problem, group, the answers'
    texts, per-answer rewards, statuses and finish reasons (0: writes nothing)."""

    def __init__(self, workdir: str | Path, per_step: int, resume_step: int = 0, enabled: bool = True):
        self.path = Path(workdir) / SAMPLES_FILE
        self.per_step = per_step if enabled else 0
        if self.per_step:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            _truncate_after(self.path, resume_step)

    def write(self, step: int, trajectories: Any) -> None:
        if not self.per_step:
            return
        with self.path.open("a") as f:
            for t in trajectories[:self.per_step]:
                f.write(json.dumps({"step": step, "problem": t.problem, "group": t.group, "answers": t.answers,
                                    "rewards": t.rewards, "statuses": t.statuses,
                                    "finish_reasons": t.finish_reasons}) + "\n")


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    return float(value) if isinstance(value, float) else value


def read_metrics(workdir: str | Path) -> list[dict[str, Any]]:
    path = Path(workdir) / METRICS_FILE
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
