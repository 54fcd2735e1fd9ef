"""The adaptive task curriculum (``rl.curriculum``): tasks whose recent episodes all succeeded or all
failed (saturated: a group of them has no group-relative signal) are drawn less often.

Tasks are drawn without replacement, a saturated one with weight ``saturated_weight`` and the others
with weight 1, from the iteration's own generator (:func:`~agent_r1.pipeline.ahead.iteration_generator`):
the draws depend on the seed and the results alone. Its
state (the outcomes of each task's last draws) is part of the resumable state, so a resumed run draws
what the uninterrupted one would.
"""

from __future__ import annotations

import torch

from agent_r1.config import CurriculumConfig
from agent_r1.trajectory import Trajectory


class Curriculum:
    """Per task (an index into the trainer's tasks): whether each of its last ``cfg.window`` draws'
    episodes all succeeded (1), all failed (0) or were mixed (-1)."""

    def __init__(self, n_tasks: int, cfg: CurriculumConfig):
        self.n, self.cfg = n_tasks, cfg
        self.recent: dict[int, list[int]] = {}
        self.drawn: list[int] = []  # the last draw

    def saturated(self, task: int) -> bool:
        """Its last ``window`` draws' episodes all succeeded, or all failed."""
        r = self.recent.get(task, [])
        return len(r) == self.cfg.window and r[0] != -1 and all(x == r[0] for x in r)

    def draw(self, k: int, generator: torch.Generator) -> list[int]:
        """``k`` task indices, without replacement, saturated tasks weighted ``saturated_weight``."""
        w = torch.tensor([self.cfg.saturated_weight if self.saturated(i) else 1.0 for i in range(self.n)],
                         dtype=torch.float64)
        self.drawn = torch.multinomial(w, min(k, self.n), replacement=False, generator=generator).tolist()
        return self.drawn

    def update(self, trajs: list[Trajectory]) -> dict:
        """Record the outcomes of the last draw's episodes (``group_id`` = its position in the draw);
        returns ``curriculum/saturated_drawn``, the share of the drawn tasks that were saturated when
        drawn, and ``curriculum/saturated_tasks``, the share of all tasks saturated now."""
        before = sum(self.saturated(i) for i in self.drawn) / max(len(self.drawn), 1)
        wins: dict[int, list[bool]] = {}
        for t in trajs:
            if t.stop_reason != "env_error":
                wins.setdefault(self.drawn[t.group_id], []).append(t.final_reward >= self.cfg.success_reward)
        for task, w in wins.items():
            outcome = 1 if all(w) else 0 if not any(w) else -1
            self.recent[task] = (self.recent.get(task, []) + [outcome])[-self.cfg.window:]
        return {"curriculum/saturated_drawn": before,
                "curriculum/saturated_tasks": sum(map(self.saturated, self.recent)) / self.n}

    def state(self) -> dict:
        return {"recent": {str(k): v for k, v in self.recent.items()}, "drawn": list(self.drawn)}

    def load(self, state: dict) -> None:
        self.recent = {int(k): list(v) for k, v in state["recent"].items()}
        self.drawn = list(state["drawn"])
