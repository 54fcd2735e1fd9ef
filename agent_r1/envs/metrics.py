"""Typed episode metrics: what an environment declares, reports, and how batches aggregate them.

An environment declares its per-episode metrics in the class attribute ``METRICS``
(``{name: Metric}``); a subclass declares only its own, the declarations of its base classes
are inherited (:meth:`ToolEnv.declared_metrics`). ``ToolEnv`` itself declares the counters it
keeps (turns, tool calls, errors). An episode reports its values in ``final_reward``'s second
return value; every value must be a declared name with a real number (a bool counts as 0/1): an
undeclared name or a value that is not a number raises :class:`MetricError`, which the rollout
loop does not contain (it is a bug in the environment, not in what the model did).

Each declared metric reaches, with no edit elsewhere: the trajectory (``Trajectory.metrics``),
the RL iteration's metrics (``rollout_stats``: the training history, MLflow), and the
evaluation summary (``metrics/eval.json`` and MLflow), aggregated over the episodes as the
declaration says. An episode without a value (one an environment error ended) counts as 0.
"""

from __future__ import annotations

import numbers
import statistics
from dataclasses import dataclass
from typing import Literal

AGGREGATIONS = ("mean", "sum", "max", "min")


class MetricError(TypeError):
    """An environment reported a metric it did not declare, or a value that is not a number."""


@dataclass(frozen=True)
class Metric:
    """One number per episode. ``agg`` says how a batch of episodes is summarised: ``mean``
    (a rate or a per-episode average), ``sum`` (a total over the batch), ``max`` or ``min``."""

    description: str
    agg: Literal["mean", "sum", "max", "min"] = "mean"

    def __post_init__(self):
        if self.agg not in AGGREGATIONS:
            raise ValueError(f"Metric.agg must be one of {AGGREGATIONS}, got {self.agg!r}")


def check_metrics(env_cls: type, values: dict) -> dict[str, float]:
    """``values`` as floats, or :class:`MetricError` naming the environment and the problem."""
    declared = env_cls.declared_metrics()
    out = {}
    for name, value in values.items():
        if name not in declared:
            raise MetricError(f"{env_cls.__name__} reported the metric {name!r}, which it does not declare; "
                              f"add it to {env_cls.__name__}.METRICS (declared: {', '.join(sorted(declared))})")
        if not isinstance(value, numbers.Real):  # bool, int, float, numpy scalars
            raise MetricError(f"{env_cls.__name__} reported {name}={value!r}: a metric must be a number")
        out[name] = float(value)
    return out


_AGG = {"mean": statistics.fmean, "sum": sum, "max": max, "min": min}


def aggregate(trajs: list) -> dict[str, float]:
    """The batch value of every metric the trajectories' environments declare
    (``Trajectory.metric_aggs``: name -> aggregation), in declaration order; empty for none."""
    aggs: dict[str, str] = {}
    for t in trajs:
        aggs |= {k: v for k, v in t.metric_aggs.items() if k not in aggs}
    return {name: float(_AGG[agg]([float(t.metrics.get(name, 0.0)) for t in trajs])) for name, agg in aggs.items()}
