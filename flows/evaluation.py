"""The evaluation flow: held-out evaluation of a pipeline's checkpoints or of registered agents.

``models`` maps a name (the method column of the table) to a checkpoint folder, a hub id or a
registry URI such as ``models:/agent-r1@champion`` (downloaded through MLflow); empty means the
pipeline's own checkpoints (baselines, SFT, RL). A named model is evaluated with the env settings it
was trained with where it records them, except those the overrides set. The results are merged into
``<output_dir>/metrics/eval.json`` and logged to a new MLflow run with an ``evaluate`` stage.
"""

from __future__ import annotations

from typing import Any

import flows  # noqa: F401  (contained, offline settings before Prefect is imported)
from prefect import flow
from prefect.artifacts import create_markdown_artifact
from pydantic import Field

from agent_r1.config import parse_overrides
from agent_r1.pipeline.record import StageLog
from agent_r1.progress import Progress
from agent_r1.tracking import Tracker
from flows.training import PipelineParams, artifact_key, eval_markdown, evaluate, prepare


class EvaluationParams(PipelineParams):
    models: dict[str, str] = Field(
        default_factory=dict,
        description='name → checkpoint folder or registry URI, e.g. {"champion": "models:/agent-r1@champion"}; '
                    "empty: the pipeline's own checkpoints",
    )


@flow(name="evaluation", persist_result=False)
def evaluation_flow(params: EvaluationParams = EvaluationParams()) -> dict[str, Any]:
    """Evaluate agents on the pipeline's held-out tasks (greedy decoding)."""
    cfg = params.config()
    tracker = Tracker()
    run_id = tracker.start_pipeline_run(f"{cfg.name}-evaluation", cfg.model_dump(mode="json"),
                                        {"pipeline": cfg.name, "flow": "evaluation"})
    try:
        data = prepare(cfg, StageLog(tracker, run_id))  # the same versioned data as training
        slog = StageLog(tracker, tracker.stage_run(run_id, "evaluate"))
        # named models in the env settings they were trained with, but for those the overrides set
        env_set = sorted(parse_overrides(params.overrides).get("env") or {}) if params.models else None
        results = evaluate(cfg, slog, Progress(), dict(params.models) or None, tracker, merge=True, env_set=env_set)
    except BaseException:
        tracker.end_run(run_id, "FAILED")
        raise
    slog.end()
    tracker.end_run(run_id)
    shown = {split: {m: v for m, v in by_method.items() if not params.models or m in params.models}
             for split, by_method in results.items()}
    create_markdown_artifact(
        f"# Evaluation: pipeline `{cfg.name}`\n\n"
        f"Data version `{data['data_version']}`; MLflow run `{run_id}`.\n\n{eval_markdown(shown, cfg.eval.split)}\n",
        key=artifact_key(cfg.name, "evaluation"), description=f"held-out evaluation, pipeline {cfg.name}")
    return {"mlflow_run_id": run_id, "data_version": data["data_version"], "eval": shown}
