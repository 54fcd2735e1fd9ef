"""Deploy and serve the three flows against a Prefect server: one command.

Start a server (its UI at http://127.0.0.1:4200) and point this process at it::

    PREFECT_SERVER_ANALYTICS_ENABLED=false prefect server start --host 127.0.0.1
    export PREFECT_API_URL=http://127.0.0.1:4200/api
    python -m flows.deploy                     # retraining every Monday 03:00
    python -m flows.deploy --cron "0 2 * * *"  # ... or daily at 02:00

This registers the deployments ``training/training``, ``evaluation/evaluation`` and
``retraining/retraining`` (the last on the cron schedule) and then runs, in subprocesses of
this one, every flow run the server schedules for them: runs started from the UI ("Run" on a
deployment, parameters as a form), by the schedule, or by ``prefect deployment run``. Runs
execute in this process's working directory, so relative paths in the config (pipelines.yaml,
outputs/, mlruns/) are the project's. Stop with Ctrl-C (the schedule is paused on shutdown).
"""

from __future__ import annotations

import argparse
import os
import sys

import flows  # noqa: F401  (contained, offline settings before Prefect is imported)
from prefect import serve
from prefect.deployments.runner import EntrypointType, RunnerDeployment
from prefect.settings import PREFECT_API_URL

from flows.evaluation import evaluation_flow
from flows.retrain import retraining_flow
from flows.training import training_flow

WEEKLY = "0 3 * * 1"  # Mondays 03:00 (the server's time zone: UTC unless configured)


def deployments(pipeline: str = "default", config_file: str = "pipelines.yaml", cron: str = WEEKLY) -> list[RunnerDeployment]:
    """The three deployments; their default parameters run ``pipeline`` of ``config_file``."""
    params = {"params": {"pipeline": pipeline, "config_file": config_file}}
    common = {"parameters": params, "tags": ["agent-r1", pipeline],
              # by module path: the flow runs import `flows.*` from the installed project
              "entrypoint_type": EntrypointType.MODULE_PATH}
    return [
        training_flow.to_deployment("training", description="data → SFT → RL → evaluation → registry", **common),
        evaluation_flow.to_deployment("evaluation", description="held-out evaluation of checkpoints or registered agents",
                                      **common),
        retraining_flow.to_deployment("retraining", cron=cron, description=f"retrain from the champion ({cron})",
                                      **common),
    ]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m flows.deploy", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cron", default=os.environ.get("AGENT_R1_RETRAIN_CRON", WEEKLY),
                    help=f"the retraining schedule (default {WEEKLY!r}, or $AGENT_R1_RETRAIN_CRON)")
    ap.add_argument("-p", "--pipeline", default="default", help="the deployments' default pipeline")
    ap.add_argument("--config", default="pipelines.yaml", help="the deployments' default pipelines file")
    ap.add_argument("--limit", type=int, default=1,
                    help="flow runs at once (default 1: runs share this machine and their output folders)")
    a = ap.parse_args(argv)
    if not PREFECT_API_URL.value():  # the environment or the active Prefect profile
        sys.exit("PREFECT_API_URL is not set. Start a server with `prefect server start --host 127.0.0.1` and\n"
                 "export PREFECT_API_URL=http://127.0.0.1:4200/api")
    serve(*deployments(a.pipeline, a.config, a.cron), limit=a.limit)


if __name__ == "__main__":
    main()
