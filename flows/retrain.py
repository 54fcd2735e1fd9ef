"""The retraining flow (scheduled by ``flows.deploy``): keep the champion agent current.

1. prepare the data the config names now (new data → a new data version);
2. RL starting from the current ``champion`` (``models:/<registry.model_name>/<its version>``;
   an explicit ``rl.init_from`` wins); with no champion yet, SFT first and RL from it;
3. evaluate the new agent and the champion on the same held-out tasks;
4. register the new agent as ``challenger``; it becomes ``champion`` only if its score beats the
   champion's score on those tasks (strictly). The markdown artifact and the return value say
   which and why.
"""

from __future__ import annotations

import time
from typing import Any

import flows  # noqa: F401  (contained, offline settings before Prefect is imported)
from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact

from agent_r1.pipeline import stages
from agent_r1.pipeline.record import Recorder
from agent_r1.tracking import Tracker
from flows.training import (PipelineParams, artifact_key, eval_markdown, evaluate, prepare, register,
                            register_markdown, sft, train_rl)


@flow(name="retraining", persist_result=False)
def retraining_flow(params: PipelineParams = PipelineParams()) -> dict[str, Any]:
    """Retrain from the champion on the newest data; promote the result only if it is better."""
    logger = get_run_logger()
    cfg = params.config()
    tracker = Tracker()
    name = cfg.registry.model_name
    champion = tracker.alias_version(name, "champion")
    # Pin the champion's version: a promotion elsewhere during this run changes nothing here.
    champion_uri = f"models:/{name}/{champion['version']}" if champion else None
    if champion_uri and cfg.rl.init_from is None:
        cfg = cfg.model_copy(update={"rl": cfg.rl.model_copy(update={"init_from": champion_uri})})
    logger.info("champion: %s; RL starts from %s", champion_uri or "none",
                cfg.rl.init_from or "this pipeline's SFT checkpoint")
    rec = Recorder(cfg, tracker)
    run_id = rec.open()
    timings: dict[str, float] = {}
    t0 = time.perf_counter()
    with rec.timed_stage("prepare", timings) as slog:
        data = prepare(cfg, slog)
    if cfg.rl.init_from is None:
        with rec.timed_stage("sft", timings) as slog:
            sft(cfg, slog)
    with rec.timed_stage("train", timings) as slog:
        train_rl(cfg, slog, tracker)
    method = stages.rl_method(cfg)
    checkpoints = {method: str(stages.checkpoint_dir(cfg, method))}
    if champion_uri:
        checkpoints["champion"] = champion_uri
    with rec.timed_stage("evaluate", timings) as slog:
        results = evaluate(cfg, slog, checkpoints, tracker)
    r = cfg.registry
    champion_score = float(results[r.split]["champion"][r.metric]) if champion_uri else None
    with rec.timed_stage("register", timings):
        reg = register(cfg, tracker, run_id, champion_score=champion_score, method=method)
    timings["total_s"] = time.perf_counter() - t0
    rec.close()
    logger.info(register_markdown(reg))
    create_markdown_artifact(
        f"# Retraining: pipeline `{cfg.name}`\n\n"
        f"Data version `{data['data_version']}`; RL from `{cfg.rl.init_from or 'SFT'}`; MLflow run `{run_id}`.\n\n"
        f"## Held-out evaluation: new agent (`{method}`) vs champion, same tasks\n\n"
        f"{eval_markdown(results, cfg.eval.split)}\n\n"
        f"## Decision ({r.split} {r.metric})\n\n{register_markdown(reg)}\n",
        key=artifact_key(cfg.name, "retraining"), description=f"retraining of pipeline {cfg.name}")
    return {"mlflow_run_id": run_id, "data_version": data["data_version"], "champion": champion_uri,
            "init_from": cfg.rl.init_from, "eval": results, "register": reg, "promoted": reg["alias"] == "champion",
            "timings": timings}
