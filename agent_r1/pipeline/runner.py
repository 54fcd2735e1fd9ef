"""How the stage sequence calls each stage and each phase of an RL iteration.

:data:`DIRECT` calls them in this process, one after the other (``agent-r1 train``, ``agent-r1
stage``, ``dvc repro``). The Prefect flows pass a subclass that runs each as a Prefect task; the
sequence (:func:`agent_r1.pipeline.stages.run_pipeline`) and the RL loop
(:meth:`agent_r1.pipeline.rl_driver.RLTrainer.run`) are the same code for both.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class Runner:
    """Calls stages and RL phases; override a method to wrap one (e.g. as a Prefect task)."""

    def stage(self, name: str, fn: Callable, *args, **kwargs) -> Any:
        """Run the stage ``name`` (``fn(*args, **kwargs)``)."""
        return fn(*args, **kwargs)

    def rl_setup(self, open_trainer: Callable, cfg, stage_log, tracker):
        """Build the RL trainer of one method (loads models; resumes from a saved state)."""
        return open_trainer(cfg, stage_log, tracker)

    def rollout(self, trainer) -> list:
        return trainer.rollout()

    def annotate(self, trainer, trajs: list) -> dict:
        return trainer.annotate(trajs)

    def update(self, trainer, batch: dict) -> dict:
        return trainer.update(batch)

    def end_iteration(self, trainer, trajs: list, stats: dict) -> dict:
        return trainer.end_iteration(trajs, stats)

    def rl_finish(self, trainer):
        return trainer.finish()


DIRECT = Runner()
