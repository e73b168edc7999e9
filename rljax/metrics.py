"""Per-step metrics: one JSON object per line in WORKDIR/metrics.jsonl and the same scalars in TensorBoard."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

METRICS_FILE = "metrics.jsonl"


class MetricsWriter:
    """Writes on one process only (`enabled`): in a multi-host run every host has the same global metrics."""

    def __init__(self, workdir: str | Path, resume_step: int = 0, tensorboard: bool = True, enabled: bool = True):
        self.path = Path(workdir) / METRICS_FILE
        self.enabled = enabled
        self._tb = None
        if not enabled:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._truncate_after(resume_step)
        if tensorboard:
            from tensorboardX import SummaryWriter

            self._tb = SummaryWriter(str(Path(workdir) / "tensorboard"), purge_step=resume_step + 1)

    def _truncate_after(self, step: int) -> None:
        """On resume, drop the rows of steps after the restored checkpoint (they are computed again)."""
        if not self.path.exists():
            return
        kept = [line for line in self.path.read_text().splitlines()
                if line.strip() and json.loads(line).get("step", 0) <= step]
        self.path.write_text("".join(line + "\n" for line in kept))

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


def _plain(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    return float(value) if isinstance(value, float) else value


def read_metrics(workdir: str | Path) -> list[dict[str, Any]]:
    path = Path(workdir) / METRICS_FILE
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
