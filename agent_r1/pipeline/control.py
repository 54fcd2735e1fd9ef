"""The SFT-only control: SFT alone for RL's training time, from the SFT checkpoint (method
``sft_control``), the check that RL's gain is not just RL's extra training time."""

from __future__ import annotations

import logging
import time
from pathlib import Path

from agent_r1.config import RunConfig
from agent_r1.data.synthetic import load_split
from agent_r1.learner import Learner
from agent_r1.models import load_model
from agent_r1.pipeline.rl_driver import rl_seconds
from agent_r1.pipeline.state import checkpoint_dir, sft_learner_config
from agent_r1.progress import Progress
from agent_r1.run import Agent, make_tools, oracle_demonstrations
from agent_r1.sft import sft as sft_loop

log = logging.getLogger(__name__)


class _TimeUp(Exception):
    pass


def control(cfg: RunConfig, seconds: float | None = None, progress: Progress | None = None) -> Path:
    """SFT alone for ``seconds`` (default: :func:`rl_seconds`) more from the SFT checkpoint;
    writes ``checkpoints/sft_control``."""
    seconds = rl_seconds(cfg) if seconds is None else seconds
    log.info("control: SFT for %.0f s, RL's training time", seconds)
    data_dir = cfg.out / "data"
    model, tokenizer = load_model(checkpoint_dir(cfg, "sft"))
    agent = Agent(model, tokenizer, make_tools(cfg, data_dir), cfg)
    learner = Learner(model, sft_learner_config(cfg), precision=cfg.model.precision)
    demos = oracle_demonstrations(cfg, agent, agent.context(), load_split(data_dir, "train"))
    deadline, seed = time.perf_counter() + seconds, cfg.seed

    with (progress or Progress.null()).task("sft control", total=None) as report:
        def on_step(step: int, total: int, m: dict) -> None:
            report(f"loss {m['sft_loss']:.3f}")
            if time.perf_counter() >= deadline:
                raise _TimeUp

        try:
            while True:  # passes over the demonstrations at a tenth of the cold start's lr
                seed += 1
                sft_loop(learner, demos, tokenizer.pad_token_id, 1.0, cfg.sft.batch_size, cfg.sft.lr * 0.1, 0, seed,
                         on_step=on_step)
        except _TimeUp:
            pass
    return learner.save(checkpoint_dir(cfg, "sft_control"), tokenizer)
