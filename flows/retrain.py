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

from typing import Any

import flows  # noqa: F401  (contained, offline settings before Prefect is imported)
from prefect import flow, get_run_logger
from prefect.artifacts import create_markdown_artifact
from prefect.states import State

from agent_r1.pipeline import stages
from agent_r1.pipeline.rl_driver import matched_method
from agent_r1.pipeline.state import checkpoint_dir
from agent_r1.tracking import Tracker
from flows.training import (ArtifactProgress, PipelineParams, TaskRunner, artifact_key, eval_markdown, health_markdown, marked,
                            register_markdown)


@flow(name="retraining", persist_result=False)
def retraining_flow(params: PipelineParams = PipelineParams()) -> dict[str, Any] | State:
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
    method = matched_method(cfg)  # the one the register stage registers
    checkpoints = {method: str(checkpoint_dir(cfg, method))} | ({"champion": champion_uri} if champion_uri else {})
    plan = stages.Plan(sft=cfg.rl.init_from is None, checkpoints=checkpoints, champion=champion_uri)
    out = stages.run_pipeline(cfg, plan, tracker, ArtifactProgress(cfg.name), TaskRunner())
    reg, r = out["register"], cfg.registry
    logger.info(register_markdown(reg))
    create_markdown_artifact(
        f"# Retraining: pipeline `{cfg.name}`\n\n"
        f"Data version `{out['data_version']}`; RL from `{cfg.rl.init_from or 'SFT'}`; MLflow run `{out['mlflow_run_id']}`.\n\n"
        f"## Held-out evaluation: new agent (`{method}`) vs champion, same tasks\n\n"
        f"{eval_markdown(out['eval'], cfg.eval.split)}\n\n"
        f"## Decision ({r.split} {r.metric})\n\n{register_markdown(reg)}\n\n"
        f"## Health\n\n{health_markdown(out['health'])}\n",
        key=artifact_key(cfg.name, "retraining"), description=f"retraining of pipeline {cfg.name}")
    return marked(out | {"champion": champion_uri, "init_from": cfg.rl.init_from, "promoted": reg["alias"] == "champion"})
