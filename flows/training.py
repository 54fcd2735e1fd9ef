"""The training flow: the pipeline's stages as Prefect tasks, one task per piece of an RL iteration.

::

    prepare ─► sft ─► rl-setup ─► [rollout ─► annotate ─► update ─► end-iteration] × rl.iterations
            ─► rl-finish ─► (control) ─► evaluate ─► register

Each task calls a stage function of :mod:`agent_r1.pipeline.stages` and nothing else. The RL
trainer (model, optimizer, DeepSpeed engine) lives in this process: the per-iteration tasks
share it, and their results are never persisted or cached by Prefect. MLflow gets one
pipeline run (through :class:`~agent_r1.pipeline.record.Recorder`) with a nested run per
stage; tasks receive the run ids explicitly (in a ``StageLog``), never through MLflow's
thread-local active run.

Resume: the stages save resumable state under ``<output_dir>/state/`` and the Recorder keeps
the open MLflow run id there, so running the flow again after a crash or a kill continues the
RL iterations from the last saved state, into the same MLflow run.

Run it once, locally (an ephemeral Prefect server unless ``PREFECT_API_URL`` is set)::

    python -m flows.training -p default -s rl.iterations=5
"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import flows  # noqa: F401  (contained, offline settings before Prefect is imported)
from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact, create_progress_artifact, update_progress_artifact
from prefect.cache_policies import NO_CACHE
from prefect.utilities.annotations import opaque
from pydantic import BaseModel, Field

from agent_r1.config import RunConfig, load_config, parse_overrides
from agent_r1.pipeline import stages
from agent_r1.pipeline.dvc_lock import record_in_dvc_lock
from agent_r1.pipeline.record import Recorder, StageLog
from agent_r1.progress import Progress
from agent_r1.tracking import Tracker

# Models, trajectories and tensors stay in this process: no result persistence, no caching
# (a cache key would hash the trainer; a persisted result would pickle a model).
IN_PROCESS = {"cache_policy": NO_CACHE, "persist_result": False}


# ------------------------------------------------------------------------------ parameters
class PipelineParams(BaseModel):
    """Which pipeline to run: a named pipeline of the config file plus overrides."""

    pipeline: str = Field("default", description="a pipeline named in the config file")
    config_file: str = Field("pipelines.yaml", description="the pipelines file (relative to the working directory)")
    overrides: list[str] = Field(
        default_factory=list,
        description="config overrides as on the command line (-s), one per item: rl.iterations=20, env.top_k=2",
    )

    def config(self) -> RunConfig:
        """The validated config (a bad key or value raises ConfigError naming it)."""
        return load_config(self.pipeline, self.config_file, parse_overrides(self.overrides))


class TrainingParams(PipelineParams):
    with_control: bool = Field(False, description="also train the SFT-only control for RL's wall time")
    # not `register`: that name would shadow ABCMeta.register of pydantic models
    register_agent: bool = Field(True, description="register the trained agent in MLflow (challenger / champion)")


# ------------------------------------------------------------------------------ tasks
def _per_iteration(label: str):
    """Task run names like ``rollout-grpo-3`` (method, 1-based iteration)."""

    def name(parameters: dict) -> str:
        trainer = parameters["trainer"]
        return f"{label}-{trainer.method}-{trainer.iteration + 1}"

    return name


@task(name="prepare", retries=2, retry_delay_seconds=5, **IN_PROCESS)
def prepare(cfg: RunConfig, slog: StageLog) -> dict:
    """Versioned data preparation: writes the parquet files, returns their content hash."""
    return stages.prepare(cfg, slog)


@task(name="sft", **IN_PROCESS)
def sft(cfg: RunConfig, slog: StageLog) -> Path:
    return stages.sft(cfg, slog, Progress())


@task(name="rl-setup", **IN_PROCESS)
def start_rl(cfg: RunConfig, slog: StageLog, tracker: Tracker) -> stages.RLTrainer:
    """Load the start model (resuming from ``state/`` when a saved state matches the config)."""
    return stages.RLTrainer(cfg, slog, tracker)


@task(name="rollout", task_run_name=_per_iteration("rollout"), **IN_PROCESS)
def rollout(trainer: stages.RLTrainer) -> list:
    return trainer.rollout()


@task(name="annotate", task_run_name=_per_iteration("annotate"), **IN_PROCESS)
def annotate(trainer: stages.RLTrainer, trajs: list) -> dict:
    """Reward annotation: rewards, advantages, loss masks, sampling and reference log-probs."""
    return trainer.annotate(trajs)


# No retries: a DeepSpeed step that failed half-way has already moved the optimizer state.
@task(name="update", task_run_name=_per_iteration("update"), **IN_PROCESS)
def update(trainer: stages.RLTrainer, batch: dict) -> dict:
    return trainer.update(batch)


@task(name="end-iteration", task_run_name=_per_iteration("end-iteration"), **IN_PROCESS)
def end_iteration(trainer: stages.RLTrainer, trajs: list, stats: dict) -> dict:
    """Log the iteration's metrics; save a resumable state every ``rl.checkpoint_every``."""
    return trainer.end_iteration(trajs, stats)


@task(name="rl-finish", **IN_PROCESS)
def finish_rl(trainer: stages.RLTrainer) -> Path:
    return trainer.finish()


@task(name="control", **IN_PROCESS)
def control(cfg: RunConfig) -> Path:
    return stages.control(cfg)


@task(name="evaluate", retries=1, retry_delay_seconds=5, **IN_PROCESS)
def evaluate(cfg: RunConfig, slog: StageLog, checkpoints: dict[str, str] | None = None,
             tracker: Tracker | None = None, merge: bool = False) -> dict:
    return stages.evaluate(cfg, slog, Progress(), checkpoints=checkpoints, tracker=tracker, merge=merge)


@task(name="register", retries=1, retry_delay_seconds=5, **IN_PROCESS)
def register(cfg: RunConfig, tracker: Tracker, run_id: str, champion_score: float | None = None,
             method: str | None = None) -> dict:
    return stages.register(cfg, tracker, run_id, champion_score=champion_score, method=method)


# ------------------------------------------------------------------------------ pieces shared by the flows
def train_rl(cfg: RunConfig, slog: StageLog, tracker: Tracker) -> dict[str, Path]:
    """Every RL method of the pipeline, one task per piece of each iteration; a progress
    artifact follows the iterations. Returns ``{method: checkpoint folder}``."""
    logger = get_run_logger()
    methods = stages.rl_methods(cfg)
    out = {}
    for method in methods:
        mlog = slog if len(methods) == 1 else slog.child(method)  # a comparison: a run per method
        trainer = start_rl(stages.for_method(cfg, method), mlog, tracker)
        total = trainer.cfg.rl.iterations
        if trainer.iteration:
            logger.info("RL %s: resuming after iteration %d of %d", method, trainer.iteration, total)
        progress = create_progress_artifact(_percent(trainer), key=artifact_key(cfg.name, method, "rl-progress"),
                                            description=f"RL {method}: iteration {trainer.iteration}/{total}")
        while not trainer.done:
            trajs = rollout(trainer)
            # opaque: link the tasks without Prefect walking every token id of every trajectory
            batch = annotate(trainer, opaque(trajs))
            stats = update(trainer, opaque(batch))
            stats = end_iteration(trainer, opaque(trajs), stats)
            update_progress_artifact(
                progress, _percent(trainer),
                description=f"RL {method}: iteration {trainer.iteration}/{total}, reward {stats['reward_mean']:.3f}, "
                            f"EM {stats['em']:.3f}, tool calls {stats['tool_calls']:.2f}")
        out[method] = finish_rl(trainer)
        if mlog is not slog:
            mlog.end()
    return out


def _percent(trainer: stages.RLTrainer) -> float:
    total = trainer.cfg.rl.iterations
    return 100.0 * trainer.iteration / total if total else 100.0


def artifact_key(*parts: str) -> str:
    """A Prefect artifact key (lowercase letters, digits and dashes only)."""
    return re.sub(r"[^a-z0-9-]+", "-", "-".join(parts).lower()).strip("-")


def eval_markdown(results: dict, split: str) -> str:
    """The held-out evaluation as a markdown table: the overall split, then by number of hops."""
    rows = ["| split | method | EM | F1 | reward | n | tool calls | format err | turns |", "|---|---|---|---|---|---|---|---|---|"]
    for name in [split] + sorted(s for s in results if s != split and s.startswith(split)):
        for method, m in results.get(name, {}).items():
            rows.append(f"| {name} | {method} | {m['em']:.3f} | {m['f1']:.3f} | {m.get('reward', float('nan')):.3f} | "
                        f"{m['n']} | {m['tool_calls']:.2f} | {m['format_error_rate']:.3f} | {m['turns']:.2f} |")
    return "\n".join(rows)


def register_markdown(reg: dict | None) -> str:
    if reg is None:
        return "Not registered (`register_agent: false`)."
    return f"Registered **{reg['model']}** version {reg['version']} as **{reg['alias']}**: {reg['reason']}."


# ------------------------------------------------------------------------------ the flow
@flow(name="training", persist_result=False)
def training_flow(params: TrainingParams = TrainingParams()) -> dict[str, Any]:
    """Train one pipeline end to end: data → SFT → RL → held-out evaluation → registry."""
    cfg = params.config()
    tracker = Tracker()
    rec = Recorder(cfg, tracker)
    run_id = rec.open()
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    with rec.timed_stage("prepare", timings) as slog:
        data = prepare(cfg, slog)
    with rec.timed_stage("sft", timings) as slog:
        sft(cfg, slog)
    with rec.timed_stage("train", timings) as slog:
        train_rl(cfg, slog, tracker)
    checkpoints = None
    if params.with_control:
        t1 = time.perf_counter()
        control(cfg)
        timings["control_s"] = time.perf_counter() - t1
        checkpoints = stages.default_methods(cfg) | {"sft_control": str(stages.checkpoint_dir(cfg, "sft_control"))}
    with rec.timed_stage("evaluate", timings) as slog:
        results = evaluate(cfg, slog, checkpoints)
    reg = None
    if params.register_agent:
        with rec.timed_stage("register", timings):
            reg = register(cfg, tracker, run_id)
    timings["total_s"] = time.perf_counter() - t0
    rec.close()
    record_in_dvc_lock(cfg, params.config_file, params.overrides, "register" if params.register_agent else "evaluate")
    create_markdown_artifact(
        f"# Training: pipeline `{cfg.name}`\n\n"
        f"Data version `{data['data_version']}`; MLflow run `{run_id}`; outputs `{cfg.out}`.\n\n"
        f"## Held-out evaluation\n\n{eval_markdown(results, cfg.eval.split)}\n\n"
        f"## Registry\n\n{register_markdown(reg)}\n",
        key=artifact_key(cfg.name, "training"), description=f"training of pipeline {cfg.name}")
    return {"mlflow_run_id": run_id, "data_version": data["data_version"], "eval": results,
            "register": reg, "timings": timings}


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(prog="python -m flows.training", description=training_flow.__doc__)
    ap.add_argument("-p", "--pipeline", default="default")
    ap.add_argument("--config", default="pipelines.yaml")
    ap.add_argument("-s", "--set", dest="overrides", action="append", default=[], help="key.path=value")
    ap.add_argument("--control", action="store_true")
    ap.add_argument("--no-register", action="store_true")
    a = ap.parse_args()
    out = training_flow(TrainingParams(pipeline=a.pipeline, config_file=a.config, overrides=a.overrides,
                                       with_control=a.control, register_agent=not a.no_register))
    cfg = TrainingParams(pipeline=a.pipeline, config_file=a.config, overrides=a.overrides).config()
    print(f"\nHeld-out evaluation ({cfg.out / 'metrics' / 'eval.json'}):\n")
    print(eval_markdown(out["eval"], cfg.eval.split))
    print(f"\n{register_markdown(out['register'])}")
    print(f"MLflow run {out['mlflow_run_id']} (agent-r1 mlflow-ui); data version {out['data_version']}")
    print("wall time: " + ", ".join(f"{k[:-2]} {v:.0f}s" for k, v in out["timings"].items()))
