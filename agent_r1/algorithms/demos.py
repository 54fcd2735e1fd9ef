"""Demonstrations inside RL: methods that use a task's demonstration in the RL loop, registered
by name (``rl.demos``) with their settings (``rl.demo_settings``: the keyword-only parameters of
the class's ``__init__``), like the advantage estimators.

- ``prefix`` (R³, Xi et al. 2024, arXiv:2402.05808; BREAD, Zhang et al. 2025, arXiv:2506.17211):
  a task whose sampled group got no success gets ``episodes`` more members that start from the
  first k steps of its demonstration (a one-step demonstration, or ``unit: tokens``: the first k
  tokens of its first action). The prefix is context (loss mask 0, not sampled); k shrinks
  (×``shrink``) each time a prefixed episode of the task (or of its ``share_by`` kind) succeeds,
  down to 0 (then the task is sampled as usual).
- ``member`` (LUFFY, Yan et al. 2025, arXiv:2504.14945): every group gets its task's
  demonstration as one more member, with the reward the environment gave it; the group's
  advantages include it, and its tokens are trained with LUFFY's shaped weight
  (:func:`~agent_r1.algorithms.losses.with_demonstrated_tokens`, γ: ``rl.learner.shaping_gamma``).
- ``relift`` (ReLIFT, Ma et al. 2025, arXiv:2506.07527): the demonstrations of tasks whose whole
  group failed go to an SFT buffer; after every ``sft_every`` RL updates, one SFT step on the
  oldest ``batch_size`` of them (removed from the buffer).

A method sees the loop through four hooks the RL driver calls: :meth:`DemoMethod.episodes` (more
episodes for this rank's groups), :meth:`DemoMethod.after_update` (before the weights reach the
engine), :meth:`DemoMethod.after_iteration` (every rank's episodes: the method's state moves here,
so it is the same on every rank) and :meth:`DemoMethod.state` / :meth:`DemoMethod.load` (the
resumable state). Demonstrations come from the environment's oracle
(:func:`agent_r1.sft.demonstration`), built once per task, for the tasks of the method's ``pool``
(``rl.demo_pool``; None: every task): a task outside it has none, and the share of an iteration's
tasks outside it is logged as ``demos/no_demo_share``. A method's time per iteration is logged as
``time/demos_*``.
"""

from __future__ import annotations

import inspect
import re
import time
from collections.abc import Callable
from dataclasses import replace
from typing import Any

import torch

from agent_r1.trajectory import Trajectory, collate, to_sequences

PREFIX, MEMBER = "prefix", "member"  # Trajectory.demo of a prefixed episode / of a demonstration in its group

# rollout(task_ids, group_ids, prefixes) -> trajectories: episodes of these tasks, each from its prefix
# (agent_r1.rollout.Prefix), in these groups
Rollout = Callable[[list[str], list[int], list], list[Trajectory]]

DEMO_METHODS: dict[str, type[DemoMethod]] = {}


def register_demo_method(name: str) -> Callable[[type], type]:
    """Register a :class:`DemoMethod` subclass as ``name`` (``rl.demos``); the keyword-only
    parameters of its ``__init__`` are its settings (``rl.demo_settings``)."""
    def decorator(cls: type) -> type:
        if name in DEMO_METHODS:
            raise ValueError(f"demonstration method {name!r} is already registered")
        cls.name = name
        DEMO_METHODS[name] = cls
        return cls

    return decorator


def registered_demo_method(spec: str) -> str:
    """The registered name ``spec`` stands for: ``spec`` itself, or, for an import path
    (``my_pkg.demos:MyMethod``, ``path/to/file.py:MyMethod``), the name the class it names was
    registered under (importing it registered it). ValueError (what a config validator reports)
    when the path does not import or names a class that was never registered."""
    from agent_r1.algorithms.registry import registered_in

    return registered_in(spec, "demonstration method", DEMO_METHODS, "register_demo_method")


def demo_settings(name: str) -> dict[str, Any]:
    """The settings of the method registered as ``name`` and their defaults."""
    return {p.name: p.default for p in inspect.signature(DEMO_METHODS[name].__init__).parameters.values()
            if p.kind is inspect.Parameter.KEYWORD_ONLY}


def make_demo_method(name: str, demonstration: Callable[[str], Trajectory | None], settings: dict,
                     pool: set[str] | None = None, tasks: dict[str, dict] | None = None) -> DemoMethod:
    """The method ``name`` with ``settings``; ``demonstration(task_id)`` gives a task's
    demonstration (None: it has none), asked only for the tasks in ``pool`` (None: every task);
    ``tasks``: the RL tasks by id (what a method that reads their fields sees)."""
    if name not in DEMO_METHODS:
        raise KeyError(f"unknown demonstration method {name!r}; known: {', '.join(sorted(DEMO_METHODS))}")
    method = DEMO_METHODS[name](demonstration, **settings)
    method.pool = pool
    method.bind(tasks or {})
    return method


def sampled(trajs: list[Trajectory]) -> list[Trajectory]:
    """The episodes the policy sampled from their start (no demonstration in them)."""
    return [t for t in trajs if not t.demo]


def failed_tasks(trajs: list[Trajectory], success_reward: float) -> dict[int, str]:
    """Group id → task id of the groups none of whose sampled episodes reached ``success_reward``
    (episodes an environment error ended do not count)."""
    groups: dict[int, tuple[str, bool]] = {}
    for t in sampled(trajs):
        if t.stop_reason == "env_error":
            continue
        task, won = groups.get(t.group_id, (t.task_id, False))
        groups[t.group_id] = (task, won or t.final_reward >= success_reward)
    return {g: task for g, (task, won) in groups.items() if not won}


def mark_members(batch, trajs: list[Trajectory]) -> None:
    """Mark the tokens of the off-policy members of ``batch`` (packed from ``trajs``, a row's
    ``episode_ids`` its trajectory's index): ``batch.demo_mask`` on their action tokens, which
    leave the action mask (not sampled) and stay in the loss mask; nothing without a member."""
    member = torch.tensor([t.demo == MEMBER for t in trajs])[batch.episode_ids]
    if member.any():
        batch.demo_mask = batch.action_mask * member[:, None]
        batch.action_mask = batch.action_mask - batch.demo_mask


class DemoMethod:
    """A way of using demonstrations inside the RL loop: every hook does nothing here."""

    name = ""
    pool: set[str] | None = None  # the ids of the tasks that may have a demonstration; None: every task

    def __init__(self, demonstration: Callable[[str], Trajectory | None]):
        self._demonstration = demonstration
        self._demos: dict[str, Trajectory | None] = {}
        self.seconds: dict[str, float] = {}  # this iteration's time by part, logged as time/demos_<part>_s

    def demo(self, task_id: str) -> Trajectory | None:
        """The task's demonstration (built once, then kept; its build time counts as ``build``);
        None outside :attr:`pool`."""
        if self.pool is not None and task_id not in self.pool:
            return None
        if task_id not in self._demos:
            t0 = time.perf_counter()
            self._demos[task_id] = self._demonstration(task_id)
            self._spent("build", t0)
        return self._demos[task_id]

    def bind(self, tasks: dict[str, dict]) -> None:
        """Called once with the RL tasks by id, before the first iteration."""

    def _spent(self, part: str, t0: float) -> None:
        self.seconds[part] = self.seconds.get(part, 0.0) + time.perf_counter() - t0

    def episodes(self, trajs: list[Trajectory], rollout: Rollout) -> list[Trajectory]:
        """More episodes for this rank's groups of ``trajs`` (the sampled ones)."""
        return []

    def after_update(self, learner, iteration: int, pad_id: int) -> dict:
        """After RL update number ``iteration`` (from 1), before its weights reach the engine."""
        return {}

    def after_iteration(self, trajs: list[Trajectory]) -> dict:
        """Every rank's episodes of the iteration: move the method's state; its metrics, with its
        time (``time/demos_<part>_s``) and the share of its tasks outside :attr:`pool`
        (``demos/no_demo_share``)."""
        stats = {f"time/demos_{k}_s": v for k, v in self.seconds.items()}
        self.seconds = {}
        tasks = {t.task_id for t in sampled(trajs)}
        outside = len(tasks - self.pool) if self.pool is not None else 0
        return stats | {"demos/no_demo_share": outside / max(len(tasks), 1)}

    def state(self) -> dict:
        """What a resumed run needs."""
        return {}

    def load(self, state: dict) -> None:
        """Restore :meth:`state`."""


def metric_key(task_id: str) -> str:
    """A task id as a piece of an MLflow metric name."""
    return re.sub(r"[^A-Za-z0-9_.\-/ ]", "_", task_id)


@register_demo_method(PREFIX)
class PrefixMethod(DemoMethod):
    """R³ / BREAD: failed groups get episodes that start from their demonstration's first k steps.

    k counts steps of a demonstration of several steps and tokens of a one-step one (``unit:
    auto``), or, with ``unit: tokens``, the tokens of the first action of any demonstration (the
    policy finishes that action and plays the rest of the episode). It starts at all but the last
    unit, and each iteration whose prefixed episodes include a success (final reward ≥
    ``success_reward``) sets it to ``int(k * shrink)``. At k = 0 the task gets no prefixed episodes
    any more. ``share_by`` (a task field, e.g. ``qtype``) gives the tasks with one value of it one k
    (capped at each task's own units less one): a kind's k then shrinks with any of its tasks'
    successes, where a task drawn only once or twice would keep its own k. Logged:
    ``demos/prefix_episodes`` (how many this iteration), ``demos/prefix_success`` (their share that
    succeeded), ``demos/prefix_k_mean`` (the mean k they started from), ``demos/prefix_k/<key>``
    (each prefixed task's, or kind's, k after the iteration) and ``demos/prefix_tasks_done`` (keys
    whose k reached 0)."""

    def __init__(self, demonstration, *, episodes: int = 2, shrink: float = 0.5, success_reward: float = 1.0,
                 unit: str = "auto", share_by: str = ""):
        super().__init__(demonstration)
        if episodes < 1 or not 0 <= shrink < 1 or unit not in ("auto", "tokens"):
            raise ValueError(f"rl.demo_settings: prefix needs episodes >= 1, 0 <= shrink < 1 and unit auto or tokens, "
                             f"got episodes={episodes}, shrink={shrink}, unit={unit!r}")
        self.n, self.shrink, self.success_reward = episodes, shrink, success_reward
        self.tokens, self.share_by = unit == "tokens", share_by
        self.k: dict[str, int] = {}  # key (task id, or its share_by value) -> the k its next prefixed episodes start from
        self.keys: dict[str, str] = {}  # task id -> its key, with share_by

    def bind(self, tasks):
        if not self.share_by:
            return
        missing = [task_id for task_id, task in tasks.items() if self.share_by not in task]
        if missing:
            raise ValueError(f"rl.demo_settings: prefix share_by={self.share_by!r}: {len(missing)} task(s) have no such "
                             f"field, e.g. {missing[0]!r} (its fields: {sorted(tasks[missing[0]])})")
        self.keys = {task_id: str(task[self.share_by]) for task_id, task in tasks.items()}

    def key(self, task_id: str) -> str:
        return self.keys.get(task_id, task_id)

    def _by_steps(self, demo: Trajectory) -> bool:
        """k counts ``demo``'s steps (else the action tokens of its first step)."""
        return len(demo.steps) > 1 and not self.tokens

    def units(self, demo: Trajectory) -> int:
        """How many units k counts in ``demo``: its steps, or the action tokens of its first step."""
        return len(demo.steps) if self._by_steps(demo) else len(demo.steps[0].action_ids)

    def start_k(self, task_id: str) -> int:
        demo = self.demo(task_id)
        if demo is None or not demo.steps:
            return 0
        top = self.units(demo) - 1
        return min(self.k.get(self.key(task_id), top), top)

    def prefix(self, demo: Trajectory, k: int):
        """The :class:`~agent_r1.rollout.Prefix` of a demonstration's first ``k`` units."""
        from agent_r1.rollout.loop import Prefix

        if self._by_steps(demo):
            return Prefix(turns=[(s.action_ids, s.action_text) for s in demo.steps[:k]])
        return Prefix(tokens=demo.steps[0].action_ids[:k])

    def episodes(self, trajs, rollout):
        todo = [(g, task, k) for g, task in failed_tasks(trajs, self.success_reward).items()
                if (k := self.start_k(task)) > 0]
        if not todo:
            return []
        t0 = time.perf_counter()
        tasks = [task for _, task, _ in todo for _ in range(self.n)]
        out = rollout(tasks, [g for g, _, _ in todo for _ in range(self.n)],
                      [self.prefix(self.demo(task), k) for _, task, k in todo for _ in range(self.n)])
        for t, k in zip(out, [k for _, _, k in todo for _ in range(self.n)]):
            t.demo, t.demo_prefix = PREFIX, k
        self._spent("rollout", t0)
        return out

    def after_iteration(self, trajs):
        prefixed = [t for t in trajs if t.demo == PREFIX]
        stats = super().after_iteration(trajs)
        if not prefixed:
            return stats | {"demos/prefix_episodes": 0}
        won: dict[str, bool] = {}
        started: dict[str, int] = {}  # key -> the largest k its prefixed episodes started from
        for t in prefixed:
            key = self.key(t.task_id)
            won[key] = won.get(key, False) or t.final_reward >= self.success_reward
            started[key] = max(started.get(key, 0), t.demo_prefix)
        for key, k in started.items():
            self.k[key] = int(k * self.shrink) if won[key] else k
        return stats | {"demos/prefix_episodes": len(prefixed),
                        "demos/prefix_success": sum(t.final_reward >= self.success_reward for t in prefixed) / len(prefixed),
                        "demos/prefix_k_mean": sum(t.demo_prefix for t in prefixed) / len(prefixed),
                        "demos/prefix_tasks_done": sum(k == 0 for k in self.k.values()),
                        **{f"demos/prefix_k/{metric_key(key)}": self.k[key] for key in won}}

    def state(self):
        return {"k": dict(self.k)}

    def load(self, state):
        self.k = dict(state.get("k", {}))


@register_demo_method(MEMBER)
class MemberMethod(DemoMethod):
    """LUFFY: each group gets its task's demonstration as one more member (off-policy), with the
    reward the environment gave it. Logged: ``demos/members`` (how many joined) and
    ``demos/member_reward`` (their mean reward)."""

    def episodes(self, trajs, rollout):
        groups = {t.group_id: t.task_id for t in sampled(trajs)}
        return [replace(d, group_id=g, steps=list(d.steps), demo=MEMBER) for g, task in groups.items()
                if (d := self.demo(task)) is not None]

    def after_iteration(self, trajs):
        members = [t for t in trajs if t.demo == MEMBER]
        stats = super().after_iteration(trajs) | {"demos/members": len(members)}
        if members:
            stats["demos/member_reward"] = sum(t.total_reward for t in members) / len(members)
        return stats


@register_demo_method("relift")
class ReliftMethod(DemoMethod):
    """ReLIFT: the demonstrations of tasks whose whole group failed (no sampled episode reached
    ``success_reward``) join an SFT buffer (once each); after every ``sft_every``-th RL update, one
    SFT step (plain NLL on the demonstrated action tokens, at the RL learning rate) trains on the
    ``batch_size`` oldest of them, which leave the buffer. Logged: ``demos/buffer`` (its size after
    the iteration), ``demos/routed`` (tasks sent to it this iteration), ``demos/sft_steps`` and
    ``demos/sft_loss``."""

    def __init__(self, demonstration, *, sft_every: int = 1, batch_size: int = 8, success_reward: float = 1.0):
        super().__init__(demonstration)
        if sft_every < 1 or batch_size < 1:
            raise ValueError(f"rl.demo_settings: relift needs sft_every >= 1 and batch_size >= 1, got sft_every={sft_every}, "
                             f"batch_size={batch_size}")
        self.every, self.batch_size, self.success_reward = sft_every, batch_size, success_reward
        self.buffer: list[str] = []  # task ids, oldest first
        self._step: dict = {}

    def after_update(self, learner, iteration, pad_id):
        if iteration % self.every or not self.buffer:
            return {}
        t0 = time.perf_counter()
        take, self.buffer = self.buffer[: self.batch_size], self.buffer[self.batch_size:]
        demos = [d for task in take if (d := self.demo(task)) is not None]
        stats = learner.sft_step(collate([s for i, d in enumerate(demos) for s in to_sequences(d, i)], pad_id))
        self._spent("sft", t0)
        self._step = {"demos/sft_steps": 1, "demos/sft_loss": stats["sft_loss"], "demos/sft_demos": len(demos)}
        return {}

    def after_iteration(self, trajs):
        routed = [task for task in dict.fromkeys(failed_tasks(trajs, self.success_reward).values())
                  if task not in self.buffer and self.demo(task) is not None]
        self.buffer += routed
        stats = super().after_iteration(trajs) | {"demos/sft_steps": 0} | self._step
        self._step = {}
        return stats | {"demos/routed": len(routed), "demos/buffer": len(self.buffer)}

    def state(self):
        return {"buffer": list(self.buffer)}

    def load(self, state):
        self.buffer = list(state.get("buffer", []))
