"""The SFT-only control: SFT alone for RL's training time, from the SFT checkpoint (method
``sft_control``), the check that RL's gain is not just RL's extra training time. With the held-out
curve on (``eval.every``) it gets points on the same tasks at the fractions of its training time
where RL's curve has them."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from agent_r1.config import RunConfig
from agent_r1.data.synthetic import load_split
from agent_r1.learner import Learner
from agent_r1.models import load_model
from agent_r1.pipeline.rl_driver import curve_path, matched_method, rl_seconds
from agent_r1.pipeline.state import checkpoint_dir, record_settings, sft_learner_config, trained_with, write_json
from agent_r1.progress import Progress
from agent_r1.run import Agent, curve_agent, curve_tasks, heldout_point, make_tools, oracle_demonstrations
from agent_r1.sft import sft as sft_loop

log = logging.getLogger(__name__)


class _TimeUp(Exception):
    pass


def _start_point(cfg: RunConfig, rl_curve: list[dict], agent: Agent, tasks: list[dict], progress) -> list[dict]:
    """The control curve's first point: RL's iteration 0, which is this model too, unless RL started
    from another model (``rl.init_from``): then the control's own start, scored on ``tasks``."""
    if not (rl_curve and cfg.rl.init_from):
        return rl_curve[:1]
    start = heldout_point(agent, tasks, progress, "heldout sft_control @ 0%")
    return [{"iteration": 0, "episodes": 0, "wall_s": 0.0, **start}]


def control(cfg: RunConfig, seconds: float | None = None, progress: Progress | None = None) -> Path:
    """SFT alone for ``seconds`` (default: :func:`rl_seconds`) more from the SFT checkpoint;
    writes ``checkpoints/sft_control``. With RL's held-out curve (``eval.every``), the control's
    curve (``metrics/heldout/sft_control.json``): RL's point at iteration 0 when RL started from the
    same SFT checkpoint, else (``rl.init_from``) one of its own start, then a point on the same tasks
    wherever its training time (the curve's own left out) reaches the share of ``seconds`` at which
    RL's curve has one, at x = that time and the same share of RL's episodes."""
    if seconds is None:
        seconds = rl_seconds(cfg)
        log.info("control: SFT for %.0f s, the training time of %s", seconds, matched_method(cfg))
    else:
        log.info("control: SFT for %.0f s", seconds)
    data_dir = cfg.out / "data"
    model, tokenizer = load_model(checkpoint_dir(cfg, "sft"))
    agent = Agent(model, tokenizer, make_tools(cfg, data_dir), cfg)
    learner = Learner(model, sft_learner_config(cfg), precision=cfg.model.precision)
    demos = oracle_demonstrations(cfg, agent, agent.context(), load_split(data_dir, "train"))
    rl_curve = _rl_curve(cfg)
    due = rl_curve[1:]
    rl_wall = max((p["wall_s"] for p in rl_curve), default=0.0) or 1.0
    rl_episodes = max((p["episodes"] for p in rl_curve), default=0)  # x: the same share of RL's episodes
    tasks, held_agent = (curve_tasks(cfg), curve_agent(agent, cfg)) if rl_curve else ([], agent)
    curve = _start_point(cfg, rl_curve, held_agent, tasks, progress)
    seed, t0, held_s = cfg.seed, time.perf_counter(), 0.0

    def trained_s() -> float:  # training time so far, the curve's evaluations left out
        return time.perf_counter() - t0 - held_s

    def point(share: float, rl_point: dict) -> None:  # at the share of its time where RL's curve has rl_point
        nonlocal held_s
        metrics = heldout_point(held_agent, tasks, progress, f"heldout sft_control @ {share:.0%}")
        held_s += metrics["eval_s"]
        curve.append({"iteration": rl_point["iteration"], "episodes": round(share * rl_episodes), "wall_s": share * seconds,
                      **metrics})

    with (progress or Progress.null()).task("sft control", total=None) as report:
        def on_step(step: int, total: int, m: dict) -> None:
            report(f"loss {m['sft_loss']:.3f}")
            while due and trained_s() >= due[0]["wall_s"] / rl_wall * seconds:
                p = due.pop(0)
                point(p["wall_s"] / rl_wall, p)
            if trained_s() >= seconds:
                raise _TimeUp

        try:
            while True:  # passes over the demonstrations at a tenth of the cold start's lr
                seed += 1
                sft_loop(learner, demos, tokenizer.pad_token_id, 1.0, cfg.sft.batch_size, cfg.sft.lr * 0.1, 0, seed,
                         on_step=on_step)
        except _TimeUp:
            pass
        for p in due:  # the last point(s): at the end of its time
            point(p["wall_s"] / rl_wall, p)
    if rl_curve:
        write_json(curve_path(cfg, "sft_control"), curve)
    out = learner.save(checkpoint_dir(cfg, "sft_control"), tokenizer)
    record_settings(out, trained_with(cfg))
    return out


def _rl_curve(cfg: RunConfig) -> list[dict]:
    """The held-out points of :func:`matched_method`, whose times the control's match."""
    path = curve_path(cfg, matched_method(cfg))
    return json.loads(path.read_text()) if cfg.curve_every and path.exists() else []
