"""Figures of training metrics (matplotlib, no pyplot: no global state, safe in threads).
:mod:`agent_r1.tracking` logs them; this module knows nothing of MLflow."""

from __future__ import annotations

import math


def curves_figure(history: list[dict], keys: list[str]):
    """One figure with a subplot per key of ``history`` (a list of per-iteration metric dicts),
    or None when no key appears in any record.

    The x axis is each record's ``iteration`` (or its position, from 1); keys that appear in
    no record are left out.
    """
    from matplotlib.figure import Figure

    keys = [k for k in keys if any(k in h for h in history)]
    if not keys:
        return None
    ncols = min(3, len(keys))
    nrows = math.ceil(len(keys) / ncols)
    fig = Figure(figsize=(4 * ncols, 3 * nrows), layout="constrained")
    for i, key in enumerate(keys):
        ax = fig.add_subplot(nrows, ncols, i + 1)
        points = [(h.get("iteration", j + 1), h[key]) for j, h in enumerate(history) if key in h]
        ax.plot(*zip(*points), marker=".")
        ax.set_title(key)
        ax.set_xlabel("iteration")
        ax.grid(alpha=0.3)
    return fig
