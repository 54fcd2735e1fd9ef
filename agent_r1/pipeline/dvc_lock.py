"""Record a whole-pipeline run (the training flow, ``agent-r1 train``) in ``dvc.lock``, so that
``dvc repro`` of the same config finds its outputs current instead of running every stage again.

DVC deletes a stage's outputs before it runs the stage, so the stages' own check for finished
work (the fingerprint markers in :mod:`agent_r1.pipeline.stages`) never gets the chance: without
a lock entry, ``dvc repro`` after ``make run`` would retrain SFT and RL from scratch. This is
``dvc commit --force`` of each stage whose outputs exist (in dvc.yaml's order, stopping at the
first that lacks one): DVC hashes the outputs into its cache and writes their hashes, with those
of the code and params, into dvc.lock.

Recorded only when the run is the one dvc.yaml describes; otherwise dvc.lock would claim outputs
for params they were not made with: the working directory holds dvc.yaml and .dvc/, the
pipeline is dvc.yaml's ``vars.pipeline``, read from ./pipelines.yaml without overrides, into
``outputs/<pipeline>``.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

import yaml

from agent_r1.config import RunConfig

log = logging.getLogger(__name__)


def _dvc_pipeline(dvc_yaml: Path) -> str | None:
    """The pipeline dvc.yaml runs (its ``vars: - pipeline: <name>``)."""
    for item in (yaml.safe_load(dvc_yaml.read_text()) or {}).get("vars") or []:
        if isinstance(item, dict) and "pipeline" in item:
            return item["pipeline"]
    return None


def untracked_inherited_keys(pipeline: str, dvc_yaml: Path = Path("dvc.yaml"),
                             config_file: Path = Path("pipelines.yaml")) -> str | None:
    """Why DVC may not run ``pipeline`` (None: it may): a pipeline built with ``extends`` must
    write out every pipelines.yaml key that dvc.yaml tracks as a param. DVC reads the params from
    the file as written and fails on a missing one, at the stage that tracks it: after the
    stages before it ran."""
    if not config_file.is_file():
        return None
    own = ((yaml.safe_load(config_file.read_text()) or {}).get("pipelines") or {}).get(pipeline) or {}
    if "extends" not in own:
        return None
    prefix, missing = f"pipelines.{pipeline}.", []
    for stage in (yaml.safe_load(dvc_yaml.read_text()) or {}).get("stages", {}).values():
        for entry in stage.get("params") or []:
            if isinstance(entry, dict) and Path(next(iter(entry))).name == config_file.name:
                keys = [k.replace("${pipeline}", pipeline)[len(prefix):] for k in next(iter(entry.values()))]
                missing += [k for k in keys if not _written(own, k.split("."))]
    if not missing:
        return None
    return (f"pipeline {pipeline!r} extends {own['extends']!r} and does not write out the {config_file.name} keys "
            f"{dvc_yaml.name} tracks as params: {', '.join(dict.fromkeys(missing))}; write them out under "
            f"pipelines.{pipeline} (as the textworld pipeline does) or run it without DVC: agent-r1 train -p {pipeline}")


def _written(d, keys: list[str]) -> bool:
    for key in keys:
        if not isinstance(d, dict) or key not in d:
            return False
        d = d[key]
    return True


def why_not_recorded(cfg: RunConfig, config_file: str | Path | None, overrides: list[str] | dict | None) -> str | None:
    """Why this run's outputs may not go into dvc.lock (None: they may)."""
    if not (Path("dvc.yaml").is_file() and Path(".dvc").is_dir()):
        return "no dvc.yaml and .dvc/ in the working directory"
    if overrides:
        return "the run had overrides that pipelines.yaml does not hold"
    if not Path("pipelines.yaml").is_file() or Path(config_file or "pipelines.yaml").resolve() != Path("pipelines.yaml").resolve():
        return "the config did not come from ./pipelines.yaml (dvc.yaml's params file)"
    if _dvc_pipeline(Path("dvc.yaml")) != cfg.name:
        return f"dvc.yaml runs pipeline {_dvc_pipeline(Path('dvc.yaml'))!r}, not {cfg.name!r}"
    if cfg.out.resolve() != (Path("outputs") / cfg.name).resolve():
        return f"output_dir {cfg.output_dir} is not outputs/{cfg.name}, where dvc.yaml's outputs are"
    return None


def record_in_dvc_lock(cfg: RunConfig, config_file: str | Path | None, overrides: list[str] | dict | None,
                       last_stage: str = "register") -> list[str]:
    """``dvc commit --force`` every stage of dvc.yaml up to ``last_stage`` (the last one this run
    ran) whose outputs exist; returns their names (none when :func:`why_not_recorded` gives a
    reason, which is logged)."""
    reason = why_not_recorded(cfg, config_file, overrides)
    if reason:
        log.info("outputs not recorded in dvc.lock: %s", reason)
        return []
    from dvc.exceptions import DvcException
    from dvc.repo import Repo

    t0, done = time.perf_counter(), []
    try:
        with Repo(".") as repo:
            for stage in repo.index.stages:
                missing = [str(out) for out in stage.outs if not out.exists]
                if missing:
                    log.info("dvc.lock: stage %s and later not recorded (missing %s)", stage.name, ", ".join(missing))
                    break
                repo.commit(stage.addressing, force=True)
                done.append(stage.name)
                if stage.name == last_stage:
                    break
    except (DvcException, OSError) as e:  # e.g. not a git checkout: the run itself succeeded
        log.warning("outputs not recorded in dvc.lock (`dvc repro` will run the stages again): %s", e)
    log.info("dvc.lock records stages %s (%.0f s): `dvc repro` finds them current", ", ".join(done) or "none",
             time.perf_counter() - t0)
    return done
