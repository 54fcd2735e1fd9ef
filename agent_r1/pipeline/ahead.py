"""Rollouts that run ahead of the learner (``rl.max_staleness`` = η ≥ 1).

:class:`RolloutsAhead` is a thread that samples iteration j's episodes on the vLLM server as soon as
the server's policy is at least version j − η (a version counts the updates the weights have
seen), while the main thread builds batches and updates the learner. After each update the main
thread writes the new weights to a folder and hands it over (:meth:`RolloutsAhead.publish`); the
thread loads the newest weights handed over between two batches, never during one, so every
episode of a batch comes from one version, recorded on its trajectories (``policy_version``).
An update j then trains on episodes at most η versions old, and the loss corrects for them
(``rl.learner.off_policy_correction``).

Iteration j's tasks and sampling seeds come from a generator of its own, seeded from the run's
seed and j: they do not depend on when the thread runs or on what the learner draws meanwhile, and
a resumed run samples iteration j from the same tasks and seeds (with the weights it has then).

The design follows AReaL's bounded staleness (``max_head_offpolicyness``) with one rollout worker
and weights that change only between batches (as verl's one-step off-policy trainer does), which
is what a single server on one machine allows.
"""

from __future__ import annotations

import logging
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from agent_r1.rollout import EngineDied
from agent_r1.trajectory import Trajectory

log = logging.getLogger(__name__)


@dataclass
class Sampled:
    """One iteration's episodes, as the thread sampled them."""

    trajs: list[Trajectory]
    tasks: list[dict]
    version: int  # the policy version that sampled them
    rollout_s: float  # the seconds sampling took
    engine_stats: dict


def iteration_generator(seed: int, j: int) -> torch.Generator:
    """Iteration ``j``'s own generator in a run seeded ``seed``: its tasks are drawn from it (by every
    method of the run alike, whatever their updates draw), and, ahead of the learner, its sampling
    seeds."""
    return torch.Generator().manual_seed(seed * 1_000_003 + j)


class RolloutsAhead:
    """Samples iterations ``start``, ``start + 1``, ... ``stop - 1`` ahead of the learner with
    ``sample(j, generator) -> (trajs, tasks)`` on ``engine`` (a :class:`~agent_r1.rollout.vllm_engine.VLLMEngine`
    whose weights are version ``start``), at most ``max_staleness`` versions ahead. ``seed`` seeds
    each iteration's generator."""

    def __init__(self, engine, sample: Callable[[int, torch.Generator], tuple[list[Trajectory], list[dict]]],
                 start: int, stop: int, max_staleness: int, seed: int):
        self.engine, self.sample, self.eta, self.seed = engine, sample, max_staleness, seed
        self.version, self.stop = start, stop
        self._cond = threading.Condition()
        self._ready: dict[int, Sampled] = {}
        self._pending: tuple[Path, int] | None = None  # weights handed over, not loaded yet
        self._error: BaseException | None = None
        self._closing = False
        self._thread = threading.Thread(target=self._run, args=(start,), name="rollouts-ahead", daemon=True)
        self._thread.start()

    # ----------------------------------------------------------------------- the main thread
    def take(self, j: int) -> Sampled:
        """Iteration ``j``'s episodes, once sampled (waits for them); the thread's error if it failed."""
        with self._cond:
            self._cond.wait_for(lambda: j in self._ready or self._error is not None or self._closing)
            if j in self._ready:
                return self._ready.pop(j)
            raise RuntimeError(f"the rollouts running ahead of the learner failed: {self._error!r}") from self._error

    def publish(self, path: Path, version: int) -> None:
        """New weights (an HF folder from the engine's ``new_weights_path``), ``version`` updates old,
        for the thread to load before its next batch. Weights handed over earlier and not loaded yet
        are dropped (the thread takes the newest)."""
        with self._cond:
            dropped, self._pending = self._pending, (path, version)
            self._cond.notify_all()
        if dropped is not None:
            shutil.rmtree(dropped[0].parent, ignore_errors=True)

    def close(self) -> None:
        """Stop the thread: its requests in flight are aborted and it is waited for; weights handed
        over and not loaded are deleted."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        t0 = time.monotonic()
        while self._thread.is_alive() and time.monotonic() - t0 < 60:
            self.engine.abort()  # again and again: the thread may be between two turns' requests
            self._thread.join(timeout=0.2)
        if self._thread.is_alive():
            log.warning("the rollout thread did not stop within 60 s")
        if self._pending is not None:
            shutil.rmtree(self._pending[0].parent, ignore_errors=True)
            self._pending = None

    # ----------------------------------------------------------------------- the thread
    def _run(self, j: int) -> None:
        try:
            while j < self.stop and self._next_weights(j):
                t0 = time.perf_counter()
                trajs, tasks = self._with_one_restart(j)
                for t in trajs:
                    t.policy_version = self.version
                done = Sampled(trajs, tasks, self.version, time.perf_counter() - t0, self.engine.stats())
                with self._cond:
                    self._ready[j] = done
                    self._cond.notify_all()
                j += 1
        except BaseException as e:  # noqa: BLE001 - handed to the main thread by take()
            with self._cond:
                if not self._closing:
                    self._error = e
                self._cond.notify_all()

    def _next_weights(self, j: int) -> bool:
        """Wait until iteration ``j`` may be sampled (weights of version ≥ j − η loaded or handed over)
        and load the newest weights handed over; False when closing."""
        with self._cond:
            self._cond.wait_for(lambda: self._closing or max(self.version, self._pending_version()) >= j - self.eta)
            if self._closing:
                return False
            pending, self._pending = self._pending, None
        if pending is not None:
            self.engine.load_weights(pending[0])
            self.version = pending[1]
        return True

    def _pending_version(self) -> int:
        return self._pending[1] if self._pending is not None else -1

    def _with_one_restart(self, j: int) -> tuple[list[Trajectory], list[dict]]:
        """Iteration ``j``'s sample; when the server dies it is restarted (from the weights it had)
        once and the batch sampled again from the same seeds."""
        try:
            return self.sample(j, iteration_generator(self.seed, j))
        except EngineDied as e:
            if self._closing:
                raise
            log.warning("the rollout engine died sampling iteration %d (%s); restarting it and retrying", j + 1, e)
        self.engine.restart()
        return self.sample(j, iteration_generator(self.seed, j))
