"""The metrics that measure the machine (its speed, the process's memory), not the run: left out
wherever two runs are compared for the same result."""

from __future__ import annotations

MACHINE = ("time", "wall_s", "_per_s", "memory/")


def of_the_run(metrics: dict, also: tuple[str, ...] = ()) -> dict:
    """``metrics`` without the machine's (and without any key containing one of ``also``)."""
    return {k: v for k, v in metrics.items() if not any(t in k for t in MACHINE + also)}
