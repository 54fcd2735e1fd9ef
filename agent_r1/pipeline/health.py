"""The run watches its own health: signals measured every RL iteration, raised as alarms.

:func:`watch` runs at the end of every RL iteration (:func:`~agent_r1.pipeline.rl_driver.end_iteration`).
It adds to the iteration's metrics the share of hung episodes and, for each alarm, ``health/<name>``:
1 while the alarm is up, else 0. An alarm is decided from the iteration history alone (so a resumed
run decides as the uninterrupted one), and its threshold is a setting of the config's ``health``
section (null turns it off):

- ``format_errors``: invalid tool calls in a row, ``format_error_rate`` ≥ ``health.format_error_rate``
  for ``health.patience`` iterations;
- ``tool_collapse``: tool calls per episode below ``health.tool_use_drop`` × their level over the
  first ``health.baseline_iterations`` iterations, for ``health.patience`` iterations; not
  applicable (never raised) where the episodes call no tools then (an environment without tools:
  TextWorld's commands are no tool calls);
- ``reward_divergence``: the training reward minus the held-out reward (``heldout/reward``, where the
  iteration has one) grown by more than ``health.reward_gap`` since the first held-out point: the
  start model's (``heldout/start_reward`` in the first iteration's metrics, paired with that
  iteration's training reward, sampled from the same model);
- ``hung_episodes``: the share of episodes stopped by a timeout or an environment error ≥
  ``health.hung_episode_rate`` for ``health.patience`` iterations.

An alarm raised for the first time is logged as a warning naming its setting, and the run's MLflow
tag ``health_alarms`` lists every alarm raised so far; :func:`raised` reads them back from a history
(the pipeline's result, which the Prefect flow turns into its "needs a look" state).
:func:`first_chances` says at which iteration each alarm can first be raised in a run of a config.
"""

from __future__ import annotations

import logging
import statistics

from agent_r1.config import HealthConfig, RunConfig
from agent_r1.envs.registry import tool_specs
from agent_r1.learner.distributed import is_main
from agent_r1.pipeline.record import StageLog
from agent_r1.trajectory import Trajectory

log = logging.getLogger(__name__)

HELDOUT_REWARD = "heldout/reward"  # the held-out reward of the iterations that evaluate it
HELDOUT_START = "heldout/start_reward"  # the start model's held-out reward, in the first iteration's metrics
TAG = "health_alarms"  # the MLflow tag: the alarms raised so far, comma-separated


def hung_share(trajs: list[Trajectory]) -> float:
    """The share of episodes that hung: a tool call stopped by its timeout, or an environment error
    (a game engine that did not answer in time, a server that died) that ended the episode."""
    hung = [t.metrics.get("timeouts", 0) > 0 or t.stop_reason == "env_error" for t in trajs]
    return sum(hung) / max(len(hung), 1)


def _in_a_row(history: list[dict], key: str, threshold: float | None, patience: int) -> list[float] | None:
    """The last ``patience`` values of ``key`` when every one is ≥ ``threshold``, else None."""
    last = [h.get(key, 0.0) for h in history[-patience:]]
    return last if threshold is not None and len(history) >= patience and min(last) >= threshold else None


def _format_errors(history: list[dict], cfg: HealthConfig) -> str | None:
    if (last := _in_a_row(history, "format_error_rate", cfg.format_error_rate, cfg.patience)) is None:
        return None
    return (f"{min(last):.0%} or more of the turns were invalid tool calls (format errors) for {cfg.patience} "
            f"iterations in a row (health.format_error_rate: {cfg.format_error_rate:g})")


def _tool_collapse(history: list[dict], cfg: HealthConfig) -> str | None:
    drop, n = cfg.tool_use_drop, cfg.baseline_iterations
    if drop is None or len(history) < n + cfg.patience:
        return None
    level = statistics.fmean(h.get("tool_calls", 0.0) for h in history[:n])
    last = [h.get("tool_calls", 0.0) for h in history[-cfg.patience:]]
    if not level > 0 or max(last) >= drop * level:  # no tools called (none to call): not applicable
        return None
    return (f"tool calls per episode fell to {last[-1]:.2f}, below {drop:g} × {level:.2f} (their level in "
            f"the first {n} iterations) for {cfg.patience} iterations in a row (health.tool_use_drop: {drop:g})")


def _reward_divergence(history: list[dict], cfg: HealthConfig) -> str | None:
    points, since = [], []  # (training reward since the previous held-out point, held-out reward)
    for h in history:
        since.append(h["reward_mean"])
        if HELDOUT_START in h:  # the start model: its training reward is this iteration's, sampled from it
            points.append((h["reward_mean"], h[HELDOUT_START]))
        if HELDOUT_REWARD in h:
            points.append((statistics.fmean(since), h[HELDOUT_REWARD]))
            since = []
    if cfg.reward_gap is None or len(points) < 2:
        return None
    (train0, held0), (train1, held1) = points[0], points[-1]
    grown = (train1 - held1) - (train0 - held0)
    if not grown > cfg.reward_gap:
        return None
    return (f"training reward {train0:.3f} → {train1:.3f} while held-out reward {held0:.3f} → {held1:.3f}: the gap "
            f"grew by {grown:.3f} (health.reward_gap: {cfg.reward_gap:g})")


def _hung_episodes(history: list[dict], cfg: HealthConfig) -> str | None:
    if (last := _in_a_row(history, "hung_episodes", cfg.hung_episode_rate, cfg.patience)) is None:
        return None
    return (f"{min(last):.0%} or more of the episodes hung (a tool call stopped by its timeout, or an environment "
            f"error) for {cfg.patience} iterations in a row (health.hung_episode_rate: {cfg.hung_episode_rate:g})")


CHECKS = {"format_errors": _format_errors, "tool_collapse": _tool_collapse, "reward_divergence": _reward_divergence,
          "hung_episodes": _hung_episodes}


def first_chances(cfg: RunConfig) -> dict[str, int | None]:
    """For each alarm, the first iteration at which a run of ``cfg`` can raise it, or None when it cannot
    within ``rl.iterations``: its threshold is off, the run is shorter than the iterations it needs, it
    has no held-out curve (``reward_divergence``), or its environment has no tools (``tool_collapse``)."""
    h, every = cfg.health, cfg.curve_every
    tools = tool_specs(cfg.env)
    first = {"format_errors": h.patience if h.format_error_rate is not None else None,
             "tool_collapse": h.baseline_iterations + h.patience if h.tool_use_drop is not None and tools else None,
             "reward_divergence": min(every, cfg.rl.iterations) if h.reward_gap is not None and every else None,
             "hung_episodes": h.patience if h.hung_episode_rate is not None else None}
    return {name: it if it is not None and it <= cfg.rl.iterations else None for name, it in first.items()}


def alarms(history: list[dict], cfg: HealthConfig) -> dict[str, str]:
    """The alarms up after the last iteration of ``history`` (its metrics, oldest first): name → why."""
    return {name: why for name, check in CHECKS.items() if (why := check(history, cfg))}


def raised(history: list[dict]) -> list[str]:
    """The alarms that were up at any iteration of ``history``, in :data:`CHECKS` order."""
    return [name for name in CHECKS if any(h.get(f"health/{name}") for h in history)]


def watch(history: list[dict], stats: dict, trajs: list[Trajectory], cfg: HealthConfig,
          stage_log: StageLog) -> dict:
    """``stats``, the metrics of the iteration after ``history``, with ``hung_episodes`` (of its
    episodes ``trajs``) and ``health/<name>`` (1: up, 0: not) for each alarm. An alarm up for the
    first time in the run is logged as a warning and added to the run's tag ``health_alarms``."""
    stats = stats | {"hung_episodes": hung_share(trajs)}
    up = alarms(history + [stats], cfg)
    before = raised(history)
    new = [name for name in up if name not in before]
    for name in new:
        if is_main():
            log.warning("health alarm %s at iteration %d: %s", name, len(history) + 1, up[name])
    if new:
        stage_log.tags({TAG: ",".join(name for name in CHECKS if name in before or name in up)})
    return stats | {f"health/{name}": int(name in up) for name in CHECKS}


def needs_a_look(alarms: dict[str, list[str]]) -> str:
    """``{method: alarms raised}`` in one line (``grpo: format_errors, tool_collapse``); "" when none."""
    return "; ".join(f"{method}: {', '.join(names)}" for method, names in alarms.items() if names)
