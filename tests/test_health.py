"""The run watches its own health (agent_r1/pipeline/health.py): each alarm raised on a synthetic
history at its threshold and not below it, hung episodes counted from real episodes (a tool that
never answers), and a tiny RL run that raises an alarm into a real MLflow run. The Prefect flow's
"needs a look" state is checked in tests/test_flows.py."""

from __future__ import annotations

import itertools
import logging
import threading

import pytest

from agent_r1.config import ConfigError, HealthConfig, RLConfig, load_config
from agent_r1.context import ContextManager
from agent_r1.envs import ToolEnv
from agent_r1.learner import Learner, LearnerConfig
from agent_r1.pipeline.health import alarms, first_chances, hung_share, needs_a_look, raised
from agent_r1.pipeline.record import StageLog
from agent_r1.pipeline.rl_driver import RLFiles, RLTrainer
from agent_r1.rollout import HFEngine, SamplingParams, ScriptedEngine, run_episodes
from agent_r1.rollout.vllm_server import ROOT
from agent_r1.tools import tool
from agent_r1.tracking import Tracker
from tests.test_rl import TASKS, LetterEnv


def _history(**series) -> list[dict]:
    """One metrics dict per iteration from equally long series (reward_mean 0 unless given)."""
    n = len(next(iter(series.values())))
    return [{"reward_mean": 0.0} | {k: v[i] for k, v in series.items() if v[i] is not None} for i in range(n)]


# ------------------------------------------------------------------------------- each alarm


def test_format_errors_in_a_row_raise_their_alarm():
    cfg = HealthConfig(patience=3, format_error_rate=0.5)
    assert "format_errors" in alarms(_history(format_error_rate=[0.1, 0.6, 0.5, 0.9]), cfg)
    assert "format_errors" not in alarms(_history(format_error_rate=[0.6, 0.4, 0.9, 0.9]), cfg)  # not 3 in a row
    assert "format_errors" not in alarms(_history(format_error_rate=[0.9, 0.9]), cfg)  # fewer iterations than patience
    off = HealthConfig(patience=3, format_error_rate=None)
    assert not alarms(_history(format_error_rate=[1.0] * 4), off)
    why = alarms(_history(format_error_rate=[0.6, 0.5, 0.9]), cfg)["format_errors"]
    assert "50%" in why and "health.format_error_rate: 0.5" in why


def test_tool_use_falling_below_a_fraction_of_its_first_level_raises_tool_collapse():
    cfg = HealthConfig(patience=2, baseline_iterations=3, tool_use_drop=0.5)
    assert "tool_collapse" in alarms(_history(tool_calls=[2.0, 1.8, 2.2, 1.5, 0.9, 0.8]), cfg)
    assert "tool_collapse" not in alarms(_history(tool_calls=[2.0, 1.8, 2.2, 1.5, 1.0, 0.8]), cfg)  # 1.0 is not below
    assert "tool_collapse" not in alarms(_history(tool_calls=[2.0, 1.8, 2.2, 0.1]), cfg)  # one iteration only
    assert "tool_collapse" not in alarms(_history(tool_calls=[0.0] * 6), cfg)  # never used a tool: nothing collapses
    # fewer turns are no collapse: without tool calls (an environment without tools) it is not applicable
    assert "tool_collapse" not in alarms(_history(turns=[4.0, 4.0, 4.0, 3.0, 1.0, 1.0]), cfg)
    assert "tool_collapse" not in alarms(_history(tool_calls=[2.0, 2.0, 2.0, 0.5, 0.5]),
                                         cfg.model_copy(update={"tool_use_drop": None}))
    why = alarms(_history(tool_calls=[2.0, 2.0, 2.0, 0.5, 0.4]), cfg)["tool_collapse"]
    assert "tool calls per episode fell to 0.40" in why and "health.tool_use_drop: 0.5" in why


def test_training_and_held_out_reward_moving_apart_raise_reward_divergence():
    cfg = HealthConfig(reward_gap=0.2)
    train = [0.2, 0.3, 0.4, 0.6, 0.7, 0.8]
    falling = _history(reward_mean=train, **{"heldout/reward": [0.3, None, None, 0.25, None, 0.2]})
    assert "reward_divergence" in alarms(falling, cfg)
    # at the second held-out point: training 0.2 -> mean(0.3, 0.4, 0.6) = 0.43, held-out 0.3 -> 0.25: the gap grew 0.28
    assert "reward_divergence" in alarms(falling[:4], cfg)
    assert "reward_divergence" not in alarms(falling[:3], cfg)  # one held-out point: nothing to compare
    # the start model's held-out point (in the first iteration's metrics) is the first: training 0.2, held-out 0.3
    from_start = _history(reward_mean=[0.2, 0.5, 0.6], **{"heldout/start_reward": [0.3, None, None],
                                                           "heldout/reward": [None, None, 0.25]})
    assert "reward_divergence" in alarms(from_start, cfg)  # 0.2 - 0.3 -> mean(0.2, 0.5, 0.6) - 0.25: grew 0.28
    assert "reward_divergence" not in alarms(from_start[:2], cfg)
    together = _history(reward_mean=train, **{"heldout/reward": [0.3, None, None, 0.6, None, 0.85]})
    assert "reward_divergence" not in alarms(together, cfg)
    assert not alarms(_history(reward_mean=train), cfg)  # no held-out point at all
    assert not alarms(falling, cfg.model_copy(update={"reward_gap": None}))
    assert "held-out reward 0.300 → 0.200" in alarms(falling, cfg)["reward_divergence"]


def test_hung_episodes_in_a_row_raise_their_alarm():
    cfg = HealthConfig(patience=2, hung_episode_rate=0.25)
    assert "hung_episodes" in alarms(_history(hung_episodes=[0.0, 0.25, 0.5]), cfg)
    assert "hung_episodes" not in alarms(_history(hung_episodes=[0.5, 0.2, 0.5]), cfg)
    assert "hung_episodes" not in alarms(_history(hung_episodes=[0.5, 0.5]),
                                         cfg.model_copy(update={"hung_episode_rate": None}))


@tool(timeout_s=0.2)
def stuck(query: str) -> str:
    """A tool that never answers.

    Args:
        query: Anything.
    """
    threading.Event().wait()
    return "never"


def test_an_episode_whose_tool_call_timed_out_counts_as_hung(tok):
    engine = ScriptedEngine(tok, [['<tool_call>{"name": "stuck", "arguments": {"query": "x"}}</tool_call>',
                                   "<answer>a</answer>"], "<answer>b</answer>"])
    trajs = run_episodes(engine, lambda: ToolEnv([stuck], max_turns=3), [{"id": "1", "prompt": "q"}, {"id": "2", "prompt": "q"}],
                         ContextManager(tok), SamplingParams())
    assert [t.metrics["timeouts"] for t in trajs] == [1, 0]
    assert hung_share(trajs) == 0.5
    trajs[1].stop_reason = "env_error"  # an environment that failed (e.g. a game engine that did not answer)
    assert hung_share(trajs) == 1.0


# ------------------------------------------------------------------------------- the config


def test_the_thresholds_are_checked_and_do_not_change_what_a_resume_compares():
    with pytest.raises(ConfigError, match="health.format_error_rate"):
        load_config("tiny", ROOT / "pipelines.yaml", {"health": {"format_error_rate": 2}})
    a = load_config("tiny", ROOT / "pipelines.yaml")
    b = load_config("tiny", ROOT / "pipelines.yaml", {"health": {"patience": 1, "reward_gap": None}})
    assert RLFiles.of(a).fingerprint == RLFiles.of(b).fingerprint


def test_the_docs_say_when_each_shipped_pipelines_alarms_can_be_raised():
    """docs/health.md's table: for every pipeline of pipelines.yaml, each alarm's first iteration or "no"
    (with why), as :func:`first_chances` computes it from the config."""
    import yaml

    rows = {}
    for line in (ROOT / "docs" / "health.md").read_text().split("## In the shipped pipelines")[1].splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if line.startswith("| `"):
            rows[cells[0].strip("`")] = cells[1:]
    names = yaml.safe_load((ROOT / "pipelines.yaml").read_text())["pipelines"]
    assert set(rows) == set(names)
    for name in names:
        cfg = load_config(name, ROOT / "pipelines.yaml")
        iterations, *cells = rows[name]
        assert int(iterations) == cfg.rl.iterations, name
        for cell, (alarm, first) in zip(cells, first_chances(cfg).items(), strict=True):
            assert (cell.startswith("no: ") if first is None else cell.split()[0] == str(first)), (name, alarm, cell)


# ------------------------------------------------------------------------------- a run


def test_a_run_raises_an_alarm_into_mlflow_once(tok, make_model, tmp_path, caplog):
    """The untrained model writes neither calls nor answers: every turn is a format error. With
    patience 2 the alarm is up from iteration 2 on: metric health/format_errors 0, 1, 1, a tag on
    the run, one warning, and the history keeps it."""
    tracker = Tracker(f"sqlite:///{tmp_path}/m.db", experiment="health")
    run = tracker.start_pipeline_run("health", {})
    learner = Learner(make_model(seed=0), LearnerConfig(), precision="fp32")
    trainer = RLTrainer(learner, HFEngine(learner.model, tok, precision="fp32"), LetterEnv, TASKS, ContextManager(tok),
                        RLConfig(group_size=2, tasks_per_iteration=2, iterations=3), max_new_tokens=4, seed=0,
                        stage_log=StageLog(tracker, run), health=HealthConfig(patience=2))
    with caplog.at_level(logging.WARNING, logger="agent_r1.pipeline.health"):
        trainer.run()
    assert [h["format_error_rate"] for h in trainer.history] == [1.0, 1.0, 1.0]
    assert [v for _, v in tracker.metric_history(run, "health/format_errors")] == [0, 1, 1]
    assert [v for _, v in tracker.metric_history(run, "health/hung_episodes")] == [0, 0, 0]
    assert tracker.run_info(run)["tags"]["health_alarms"] == "format_errors"
    warnings = [r.getMessage() for r in caplog.records if "health alarm" in r.getMessage()]
    assert len(warnings) == 1 and "format_errors at iteration 2" in warnings[0]
    assert raised(trainer.history) == ["format_errors"]
    assert needs_a_look({"grpo": raised(trainer.history), "ppo": []}) == "grpo: format_errors"


# ------------------------------------------------------------------------------- each alarm in a run


def _run(tok, make_model, make_env, health: HealthConfig, iterations: int, engine=None, max_new_tokens=4,
         **kw) -> RLTrainer:
    """A tiny real RL run (GRPO, 2 tasks x 2 episodes an iteration) with ``health``'s thresholds."""
    learner = Learner(make_model(seed=0), LearnerConfig(), precision="fp32")
    engine = engine(learner.model) if engine else HFEngine(learner.model, tok, precision="fp32")
    trainer = RLTrainer(learner, engine, make_env, TASKS, ContextManager(tok),
                        RLConfig(group_size=2, tasks_per_iteration=2, iterations=iterations),
                        max_new_tokens=max_new_tokens, max_context_tokens=256, seed=0, health=health, **kw)
    trainer.run()
    return trainer


def _up(trainer: RLTrainer, name: str) -> list[int]:
    return [h[f"health/{name}"] for h in trainer.history]


@tool(thread_safe=True)
def lookup(key: str) -> str:
    """Look a key up.

    Args:
        key: The key.
    """
    return "found"


def test_a_run_whose_episodes_stop_calling_tools_raises_tool_collapse(tok, make_model):
    """Three iterations of episodes that call a tool, then two that answer at once: with a baseline of 3
    iterations and patience 2, the alarm is up at iteration 5."""
    call = '<tool_call>{"name": "lookup", "arguments": {"key": "x"}}</tool_call>'
    script = [call, "<answer>a</answer>"] * 3 + ["<answer>a</answer>"] * 2
    trainer = _run(tok, make_model, lambda: ToolEnv([lookup], max_turns=3),
                   HealthConfig(patience=2, baseline_iterations=3, tool_use_drop=0.5), 5,
                   engine=lambda model: ScriptedEngine(tok, script, model), max_new_tokens=64)
    assert [h["tool_calls"] for h in trainer.history] == [1.0, 1.0, 1.0, 0.0, 0.0]
    assert _up(trainer, "tool_collapse") == [0, 0, 0, 0, 1]


def test_a_run_whose_held_out_reward_falls_behind_raises_reward_divergence_against_the_start(tok, make_model):
    """A held-out point at the start and at the end (iteration 2, as textworld's eval.every of its 4
    iterations): the start model's point is the first the alarm compares with. The training reward
    rises (episode k of the run scores k / 8), the held-out one stays 0: the gap grows by 0.25."""
    serials = itertools.count(1)

    class Rising(ToolEnv):
        def __init__(self):
            super().__init__([], max_turns=1)
            self.serial = next(serials)

        def final_reward(self, answer, action_text):
            return self.serial / 8, {}

    def heldout(progress, label):  # greedy episodes on unseen tasks, which pay nothing
        trajs = run_episodes(trainer_engine[0], lambda: ToolEnv([], max_turns=1), [{"id": "u", "prompt": "new"}],
                             ContextManager(tok), SamplingParams(temperature=0.0, max_new_tokens=4))
        return {"reward": trajs[0].total_reward}

    trainer_engine = []

    def engine(model):
        trainer_engine.append(HFEngine(model, tok, precision="fp32"))
        return trainer_engine[0]

    trainer = _run(tok, make_model, Rising, HealthConfig(reward_gap=0.2), 2, engine=engine, heldout=heldout, every=2)
    assert [p["iteration"] for p in trainer.curve] == [0, 2]
    assert trainer.history[0]["heldout/start_reward"] == 0.0 and "heldout/reward" in trainer.history[1]
    assert [h["reward_mean"] for h in trainer.history] == [2.5 / 8, 6.5 / 8]
    assert _up(trainer, "reward_divergence") == [0, 1]


class Broken(LetterEnv):
    """Task "b"'s game engine fails at its first step: half the episodes end with an environment error."""

    def step(self, action_text, context_tokens=None):
        if self.task["id"] == "b":
            raise RuntimeError("the game engine did not answer")
        return super().step(action_text, context_tokens)


def test_a_run_whose_episodes_hang_raises_hung_episodes(tok, make_model):
    trainer = _run(tok, make_model, Broken, HealthConfig(patience=2, hung_episode_rate=0.5), 2)
    assert [h["hung_episodes"] for h in trainer.history] == [0.5, 0.5]
    assert _up(trainer, "hung_episodes") == [0, 1]
