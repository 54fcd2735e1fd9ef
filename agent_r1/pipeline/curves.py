"""The held-out learning curves of a run (``eval.every``): each method's points (written by the RL
driver and the SFT-only control under ``metrics/heldout/``), their area and final point, and the
figure of every method and baseline on the same axes."""

from __future__ import annotations

import json
from pathlib import Path

CURVE_METRICS = ("won", "em", "reward")  # the first one the points have is the curve's metric


def read_curves(folder: Path, methods: list[str]) -> dict[str, list[dict]]:
    """The points of each of ``methods`` that has a curve in ``folder`` (``<method>.json``)."""
    out = {}
    for m in methods:
        path = folder / f"{m}.json"
        if path.exists() and (points := json.loads(path.read_text())):
            out[m] = points
    return out


def curve_metric(curves: dict[str, list[dict]]) -> str:
    first = next(iter(curves.values()))[0]
    return next(k for k in CURVE_METRICS if k in first)


def area(points: list[dict], metric: str, x: str = "episodes") -> float:
    """The curve's normalised area: the trapezoid integral of ``metric`` over ``x``, divided by the
    x range (the mean height; a single point's value)."""
    pts = sorted(points, key=lambda p: p[x])
    span = pts[-1][x] - pts[0][x]
    if span <= 0:
        return float(pts[-1][metric])
    return sum((b[x] - a[x]) * (a[metric] + b[metric]) / 2 for a, b in zip(pts, pts[1:])) / span


def summary(curves: dict[str, list[dict]], baselines: dict[str, float], metric: str, n: int) -> dict[str, dict]:
    """eval.json's curve rows: each method's area under its curve and final point (a baseline,
    a line, has both equal to its score)."""
    rows = {m: {f"{metric}_auc": round(area(p, metric), 4), f"{metric}_final": round(float(p[-1][metric]), 4),
                "points": len(p), "n": n} for m, p in curves.items()}
    return rows | {b: {f"{metric}_auc": v, f"{metric}_final": v, "points": 0, "n": n} for b, v in baselines.items()}


def draw(curves: dict[str, list[dict]], baselines: dict[str, float], metric: str, title: str, path: Path) -> Path:
    """One PNG of two panels, the held-out ``metric`` against episodes seen and against training
    wall time: a line per method, a dashed horizontal line per baseline."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4), sharey=True)
    for ax, x, label in ((axes[0], "episodes", "episodes seen"), (axes[1], "wall_s", "training wall time (s)")):
        for m, points in curves.items():
            ax.plot([p[x] for p in points], [p[metric] for p in points], marker="o", label=m)
        for i, (b, v) in enumerate(baselines.items()):
            ax.axhline(v, linestyle="--", linewidth=1, color=f"C{len(curves) + i}", label=b)
        ax.set_xlabel(label)
        ax.grid(alpha=0.3)
    axes[0].set_ylabel(f"held-out {metric}")
    axes[1].legend(loc="best", fontsize=8)
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path
