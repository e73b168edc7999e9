"""PNG plots of a run: what a researcher looks at first (`rljax plot WORKDIR`).

From WORKDIR/metrics.jsonl: reward and solve rate over steps, solve rate by turn, KL to the reference and
entropy, the shares of answers without code (RLEF) or malformed (SWE-RL) and of answers cut at the token budget,
answer length; the supervised warm-up's NLL (WORKDIR/warmup.jsonl). From
WORKDIR/eval/*.json (evaluation reports): the turn-count histogram of the dialogs and the eval
estimates with their 95% intervals, one bar group per report.
"""
from __future__ import annotations

import collections
import json
from pathlib import Path
from typing import Any, Sequence

from rljax.metrics import METRICS_FILE, WARMUP_FILE, read_metrics

EVAL_DIR = "eval"


def _figure():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt, plt.subplots(figsize=(6.4, 4.0))


def _save(plt: Any, fig: Any, ax: Any, path: Path) -> Path:
    """Legend, layout, write the PNG and free the figure."""
    ax.legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _line_plot(rows: Sequence[dict[str, Any]], keys: Sequence[str], title: str, path: Path) -> Path | None:
    present = [k for k in keys if any(k in r for r in rows)]
    if not present:
        return None
    plt, (fig, ax) = _figure()
    for key in present:
        points = [(r["step"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
        ax.plot([p[0] for p in points], [p[1] for p in points], marker="." if len(points) < 50 else None,
                label=key)
    ax.set_xlabel("step")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    return _save(plt, fig, ax, path)


def eval_reports(workdir: str | Path) -> list[tuple[str, dict[str, Any]]]:
    directory = Path(workdir) / EVAL_DIR
    return [(p.stem, json.loads(p.read_text())) for p in sorted(directory.glob("*.json"))]


def _turn_histogram(reports: Sequence[tuple[str, dict[str, Any]]], path: Path) -> Path | None:
    if not reports:
        return None
    plt, (fig, ax) = _figure()
    width = 0.8 / len(reports)
    for i, (name, report) in enumerate(reports):
        counts = collections.Counter(d["turns"] for d in report["dialogs"])
        turns = sorted(counts)
        ax.bar([t + i * width for t in turns], [counts[t] for t in turns], width, label=name)
    ax.set_xlabel("answers in the dialog")
    ax.set_ylabel("dialogs")
    ax.set_title("turn count")
    return _save(plt, fig, ax, path)


def _eval_estimates(reports: Sequence[tuple[str, dict[str, Any]]], path: Path) -> Path | None:
    if not reports:
        return None
    names = [k for k, v in reports[0][1]["metrics"].items() if isinstance(v, dict) and "value" in v]
    if not names:
        return None
    plt, (fig, ax) = _figure()
    width = 0.8 / len(reports)
    for i, (label, report) in enumerate(reports):
        values = [report["metrics"].get(n, {}) for n in names]
        mids = [v.get("value", 0.0) for v in values]
        errors = [[m - v.get("ci95_low", m) for m, v in zip(mids, values)],
                  [v.get("ci95_high", m) - m for m, v in zip(mids, values)]]
        ax.bar([j + i * width for j in range(len(names))], mids, width, yerr=errors, capsize=3, label=label)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(names))], names, rotation=20, fontsize="small")
    ax.set_title("evaluation (95% bootstrap CI)")
    return _save(plt, fig, ax, path)


def plot_run(workdir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Write the run's PNGs (to WORKDIR/plots unless `out_dir`); returns the files written."""
    workdir = Path(workdir)
    metrics_path = workdir / METRICS_FILE
    reports = eval_reports(workdir)
    if not metrics_path.is_file() and not reports:
        raise FileNotFoundError(f"{workdir}: no {METRICS_FILE} and no {EVAL_DIR}/*.json to plot")
    out = Path(out_dir) if out_dir else workdir / "plots"
    out.mkdir(parents=True, exist_ok=True)
    rows = read_metrics(workdir) if metrics_path.is_file() else []
    turn_keys = sorted({k for r in rows for k in r if k.startswith("solve_rate/turn_")})
    warmup_path = workdir / WARMUP_FILE
    warmup_rows = [{"step": r["warmup_step"], **r} for r in map(json.loads, warmup_path.read_text().splitlines())
                   ] if warmup_path.is_file() else []
    written = [
        _line_plot(rows, ["reward/mean", "reward/shaped_mean"], "reward", out / "reward.png"),
        _line_plot(rows, ["solve_rate/final"], "solve rate", out / "solve_rate.png"),
        _line_plot(rows, turn_keys, "solve rate by turn", out / "solve_rate_by_turn.png"),
        _line_plot(rows, ["kl/ref_per_token", "entropy/sampled"], "KL to reference and entropy (per token)",
                   out / "kl_entropy.png"),
        _line_plot(rows, ["answers/no_code_share", "answers/malformed_share", "answers/truncated_share"],
                   "share of answers without valid code (RLEF) or malformed (SWE-RL) / cut at the budget",
                   out / "answer_shares.png"),
        _line_plot(rows, ["response_length/mean"], "answer length (tokens)", out / "answer_length.png"),
        _line_plot(warmup_rows, ["nll"], "supervised warm-up: NLL per answer token", out / "warmup_nll.png"),
        _turn_histogram(reports, out / "turn_histogram.png"),
        _eval_estimates(reports, out / "eval.png"),
    ]
    return [p for p in written if p is not None]
