"""A flow that starts another through its deployment: ``run_deployment`` puts a run of, say,
``training/training`` on the deployment's work pool, a worker of that pool (a GPU host) runs it,
and this flow waits for it (a subflow in the UI) and fails if it fails.

    python -m flows.dispatch training/training -s rl.iterations=20
"""

from __future__ import annotations

from typing import Any

import flows  # noqa: F401  (contained, offline settings before Prefect is imported)
from prefect import flow, get_run_logger
from prefect.deployments import run_deployment


@flow(name="dispatch", persist_result=False)
def dispatch_flow(deployment: str = "training/training", params: dict[str, Any] | None = None,
                  timeout_s: float = 24 * 3600, poll_interval_s: float = 5) -> dict[str, str]:
    """Run ``deployment`` (``flow/deployment``) with ``params`` (its ``params`` parameter) and wait
    for it; returns the flow run's id and state."""
    run = run_deployment(deployment, parameters={"params": params or {}}, timeout=timeout_s,
                         poll_interval=poll_interval_s)
    get_run_logger().info("%s: flow run %s ended %s", deployment, run.id, run.state.name)
    if not run.state.is_completed():
        raise RuntimeError(f"{deployment}: flow run {run.id} ended {run.state.name}")
    return {"flow_run_id": str(run.id), "state": run.state.name}


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(prog="python -m flows.dispatch", description=dispatch_flow.__doc__)
    ap.add_argument("deployment", nargs="?", default="training/training")
    ap.add_argument("-p", "--pipeline", default="default")
    ap.add_argument("-s", "--set", dest="overrides", action="append", default=[], help="key.path=value")
    a = ap.parse_args()
    print(dispatch_flow(a.deployment, {"pipeline": a.pipeline, "overrides": a.overrides}))
