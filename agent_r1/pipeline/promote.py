"""The register stage: the trained agent goes to the MLflow registry as ``challenger`` and is
promoted to ``champion`` only if it beats the champion."""

from __future__ import annotations

import json

from agent_r1.config import RunConfig
from agent_r1.pipeline.rl_driver import matched_method
from agent_r1.pipeline.state import checkpoint_dir, write_json


def promotion(new_score: float, champion_score: float | None) -> tuple[bool, str]:
    """The gate: promote only a strictly better agent (or the first one)."""
    if champion_score is None:
        return True, f"no champion yet; the new agent ({new_score:.4f}) becomes champion"
    if new_score > champion_score:
        return True, f"new agent {new_score:.4f} beats champion {champion_score:.4f}"
    return False, f"new agent {new_score:.4f} does not beat champion {champion_score:.4f}; it stays challenger"


def register(cfg: RunConfig, tracker, run_id: str, champion_score: float | None = None, method: str | None = None) -> dict:
    """Log the trained agent to MLflow, register a version as ``challenger``; promote it to
    ``champion`` when its held-out score beats ``champion_score`` (the current champion's score
    on the same tasks; ``None`` = use the score recorded on the champion version). The agent is
    ``method``'s, by default :func:`~agent_r1.pipeline.rl_driver.matched_method`'s.
    """
    method = method or matched_method(cfg)
    r = cfg.registry
    results = json.loads((cfg.out / "metrics" / "eval.json").read_text())
    try:
        score = float(results[r.split][method][r.metric])
    except KeyError:
        raise KeyError(f"metrics/eval.json has no {r.split}/{method}/{r.metric}: run the evaluate stage first") from None
    current = tracker.alias_version(r.model_name, "champion")
    if champion_score is None and current is not None:
        champion_score = float(current["tags"].get("score", "nan"))
    version = tracker.log_agent(run_id, checkpoint_dir(cfg, method), r.model_name, alias="challenger",
                                tags={"score": str(score), "metric": f"{r.split}/{r.metric}", "method": method})
    promote, why = promotion(score, champion_score)
    if promote:
        tracker.set_alias(r.model_name, "champion", version)
    out = {"model": r.model_name, "version": version, "alias": "champion" if promote else "challenger",
           "score": score, "champion_score": champion_score, "reason": why}
    write_json(cfg.out / "metrics" / "register.json", out)
    return out
