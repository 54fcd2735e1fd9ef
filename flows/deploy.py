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

With ``--pool NAME`` it registers the same three deployments with the process work pool NAME
instead, and exits; the workers of that pool (``prefect worker start --pool NAME``, one per
machine; ``infra/gpu_pool.sh`` for GPU hosts) run them, in this folder (the job variable
``working_dir``: register from a checkout at the path the workers have)::

    prefect work-pool create agent-r1-gpu --type process
    python -m flows.deploy --pool agent-r1-gpu
    prefect worker start --pool agent-r1-gpu --limit 1
"""

from __future__ import annotations

import argparse
import os
import sys

import flows  # noqa: F401  (contained, offline settings before Prefect is imported)
from prefect import deploy, serve
from prefect.deployments.runner import EntrypointType, RunnerDeployment
from prefect.settings import PREFECT_API_URL

from flows.evaluation import evaluation_flow
from flows.retrain import retraining_flow
from flows.training import training_flow

WEEKLY = "0 3 * * 1"  # Mondays 03:00 (the server's time zone: UTC unless configured)


def deployments(pipeline: str = "default", config_file: str = "pipelines.yaml", cron: str = WEEKLY,
                job_variables: dict | None = None) -> list[RunnerDeployment]:
    """The three deployments; their default parameters run ``pipeline`` of ``config_file``
    (``job_variables``: a work pool's settings for their runs)."""
    params = {"params": {"pipeline": pipeline, "config_file": config_file}}
    common = {"parameters": params, "tags": ["agent-r1", pipeline], "job_variables": job_variables,
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
    ap.add_argument("--pool", help="register the deployments with this process work pool (its workers run them) and exit")
    a = ap.parse_args(argv)
    if not PREFECT_API_URL.value():  # the environment or the active Prefect profile
        sys.exit("PREFECT_API_URL is not set. Start a server with `prefect server start --host 127.0.0.1` and\n"
                 "export PREFECT_API_URL=http://127.0.0.1:4200/api")
    if a.pool:
        try:
            ids = deploy(*deployments(a.pipeline, a.config, a.cron, {"working_dir": os.getcwd()}), work_pool_name=a.pool,
                         build=False, push=False, print_next_steps_message=False, ignore_warnings=True)
        except ValueError as e:  # e.g. no such work pool
            sys.exit(f"error: {e}")
        print(f"registered {len(ids)} deployments with work pool {a.pool!r}; start its worker with: "
              f"prefect worker start --pool {a.pool} --limit 1")
        return
    serve(*deployments(a.pipeline, a.config, a.cron), limit=a.limit)


if __name__ == "__main__":
    main()
