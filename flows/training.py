"""The training flow: the pipeline's stages as Prefect tasks, one task per piece of an RL iteration.

::

    prepare ─► sft ─► rl-setup ─► [sample_episodes ─► build_train_batch ─► update_policy
            ─► end_iteration] × rl.iterations ─► rl-finish ─► (control) ─► evaluate ─► register

The sequence is :func:`agent_r1.pipeline.stages.run_pipeline` and the RL loop
:meth:`agent_r1.pipeline.rl_driver.RLTrainer.run`, the same code ``agent-r1 train`` runs; here a
:class:`TaskRunner` makes each stage and each phase of an RL iteration a task, and nothing else.
The RL trainer (model, optimizer, DeepSpeed engine) lives in this process: the per-iteration
tasks share it, and their results are never persisted or cached by Prefect. MLflow gets one
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

import functools
import re
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import flows  # noqa: F401  (contained, offline settings before Prefect is imported)
from prefect import flow, task
from prefect.artifacts import create_markdown_artifact, create_progress_artifact, update_progress_artifact
from prefect.cache_policies import NO_CACHE
from prefect.client.orchestration import get_client
from prefect.runtime import flow_run
from prefect.states import Completed, State
from prefect.utilities.annotations import opaque
from pydantic import BaseModel, Field

from agent_r1.config import RunConfig, load_config, parse_overrides
from agent_r1.pipeline import stages
from agent_r1.pipeline.dvc_lock import record_in_dvc_lock
from agent_r1.pipeline.health import needs_a_look
from agent_r1.pipeline.record import StageLog
from agent_r1.pipeline.runner import Runner
from agent_r1.progress import Progress
from agent_r1.tracking import Tracker
from agent_r1.trajectory import TrainBatch

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
RETRIES = {"prepare": {"retries": 2, "retry_delay_seconds": 5}, "evaluate": {"retries": 1, "retry_delay_seconds": 5},
           "register": {"retries": 1, "retry_delay_seconds": 5}}


@functools.cache
def stage_task(name: str, fn):
    """The stage function ``fn`` as the Prefect task ``name`` (with its retries)."""
    return task(fn, name=name, **IN_PROCESS, **RETRIES.get(name, {}))


prepare = stage_task("prepare", stages.prepare)  # versioned data: writes the parquet files, returns their hash
evaluate = stage_task("evaluate", stages.evaluate)


@functools.cache
def phase_task(fn):
    """The RL phase function ``fn`` as a Prefect task of the same name (no retries: a DeepSpeed
    step that failed half-way has already moved the optimizer state)."""
    return task(fn, name=fn.__name__, **IN_PROCESS)


class TaskRunner(Runner):
    """The pipeline's stage sequence and RL loop with each stage and each RL phase a Prefect task.

    A phase's task run is named ``<phase>-<method>-<iteration>`` (``sample_episodes-grpo-3``).
    Trajectories and batches pass as ``opaque``: Prefect links the tasks without walking every
    token id. Prefect links a task's inputs to the task that returned them by ``id()`` (for lists
    and dicts, which it cannot weak-reference: prefect issue 20558), so a result freed early lets
    a later object reuse its id and be linked to the wrong task: the runner holds each phase's
    last result until the next iteration's replaces it.
    """

    def __init__(self):
        self._held: dict[str, Any] = {}

    def stage(self, name, fn, *args, **kwargs):
        self._held.clear()
        return stage_task(name, fn)(*args, **kwargs)

    def phase(self, trainer, fn, *args):
        run_name = f"{fn.__name__}-{trainer.method}-{trainer.iteration + 1}"
        args = [opaque(a) if isinstance(a, (list, dict, TrainBatch)) else a for a in args]
        self._held[fn.__name__] = out = phase_task(fn).with_options(task_run_name=run_name)(*args)
        return out


class ArtifactProgress(Progress):
    """Progress as on the command line, and for work with a known length (the RL iterations) a
    Prefect progress artifact that follows it."""

    def __init__(self, pipeline: str):
        super().__init__()
        self.pipeline = pipeline

    @contextmanager
    def task(self, label: str, total: int | None = None):
        with super().task(label, total) as report:
            if total is None:
                yield report
                return
            artifact = create_progress_artifact(0.0, key=artifact_key(self.pipeline, label, "progress"),
                                                description=label)

            def both(desc: str, frac: float | None = None) -> None:
                report(desc, frac)
                if frac is not None:
                    update_progress_artifact(artifact, 100.0 * frac, description=f"{label}: {desc}")

            yield both


# ------------------------------------------------------------------------------ pieces shared by the flows
def artifact_key(*parts: str) -> str:
    """A Prefect artifact key (lowercase letters, digits and dashes only)."""
    return re.sub(r"[^a-z0-9-]+", "-", "-".join(parts).lower()).strip("-")


def eval_markdown(results: dict, split: str) -> str:
    """The held-out evaluation as a markdown table: the overall split, then by number of hops."""
    rows = ["| split | method | EM | F1 | reward | n | tool calls | format err | turns |", "|---|---|---|---|---|---|---|---|---|"]
    for name in [split] + sorted(s for s in results if s != split and s.startswith(split)):
        for method, m in results.get(name, {}).items():
            rows.append(f"| {name} | {method} | {m.get('em', float('nan')):.3f} | {m.get('f1', float('nan')):.3f} | {m.get('reward', float('nan')):.3f} | "
                        f"{m['n']} | {m['tool_calls']:.2f} | {m['format_error_rate']:.3f} | {m['turns']:.2f} |")
    return "\n".join(rows)


def register_markdown(reg: dict | None) -> str:
    if reg is None:
        return "Not registered (`register_agent: false`)."
    return f"Registered **{reg['model']}** version {reg['version']} as **{reg['alias']}**: {reg['reason']}."


def health_markdown(alarms: dict[str, list[str]]) -> str:
    look = needs_a_look(alarms)
    return f"**Needs a look**: alarms raised ({look}); see docs/health.md." if look else "No health alarm raised."


NEEDS_A_LOOK = "needs-a-look"  # the tag of a flow run whose RL raised health alarms


def marked(out: dict[str, Any]) -> dict[str, Any] | State:
    """The flow's result ``out``; when its RL raised health alarms (``out["health"]``), as a Completed
    state with the message "needs a look: ..." and the flow run tagged ``needs-a-look``."""
    look = needs_a_look(out["health"])
    if not look:
        return out
    with get_client(sync_client=True) as client:
        tags = client.read_flow_run(flow_run.id).tags
        client.update_flow_run(flow_run.id, tags=[*tags, NEEDS_A_LOOK])
    return Completed(data=out, message=f"needs a look: {look}")


# ------------------------------------------------------------------------------ the flow
@flow(name="training", persist_result=False)
def training_flow(params: TrainingParams = TrainingParams()) -> dict[str, Any] | State:
    """Train one pipeline end to end: data → SFT → RL → held-out evaluation → registry. A run whose RL
    raised health alarms ends Completed with the message "needs a look: ..." and the tag needs-a-look."""
    cfg = params.config()
    plan = stages.Plan(control=params.with_control, register=params.register_agent)
    out = stages.run_pipeline(cfg, plan, Tracker(), ArtifactProgress(cfg.name), TaskRunner())
    record_in_dvc_lock(cfg, params.config_file, params.overrides, "register" if params.register_agent else "evaluate")
    create_markdown_artifact(
        f"# Training: pipeline `{cfg.name}`\n\n"
        f"Data version `{out['data_version']}`; MLflow run `{out['mlflow_run_id']}`; outputs `{cfg.out}`.\n\n"
        f"## Held-out evaluation\n\n{eval_markdown(out['eval'], cfg.eval.split)}\n\n"
        f"## Registry\n\n{register_markdown(out['register'])}\n\n"
        f"## Health\n\n{health_markdown(out['health'])}\n\n"
        f"## Wall time\n\n{stages.timings_markdown(out['timings'])}\n",
        key=artifact_key(cfg.name, "training"), description=f"training of pipeline {cfg.name}")
    return marked(out)


if __name__ == "__main__":
    import argparse
    import time

    t_command = time.perf_counter()

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
    print(health_markdown(out["health"]))
    print(f"MLflow run {out['mlflow_run_id']} (agent-r1 mlflow-ui); data version {out['data_version']}")
    print(f"\nWall time of the stages ({cfg.out / 'metrics' / 'timings.json'}):\n")
    print(stages.timings_markdown(out["timings"]))
    print(f"\nthe flow: {time.perf_counter() - t_command:.0f} s from its start (the stages, its Prefect server and the records)")
