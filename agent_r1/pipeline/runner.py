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
    """Calls stages and RL phases; a subclass wraps them (e.g. as Prefect tasks)."""

    def stage(self, name: str, fn: Callable, *args, **kwargs) -> Any:
        """Run the stage ``name`` (``fn(*args, **kwargs)``)."""
        return fn(*args, **kwargs)

    def phase(self, trainer, fn: Callable, *args) -> Any:
        """Run ``fn(*args)``, a phase of ``trainer``'s current RL iteration
        (:mod:`agent_r1.pipeline.rl_driver`)."""
        return fn(*args)


DIRECT = Runner()
