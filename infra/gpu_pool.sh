#!/usr/bin/env bash
# The GPU work pool: a Prefect process pool whose workers are GPU hosts, one flow run at a time each.
#
#   export PREFECT_API_URL=http://PREFECT-SERVER:4200/api MLFLOW_TRACKING_URI=http://MLFLOW-SERVER:5000
#   infra/gpu_pool.sh create            # once: the pool (POOL, default agent-r1-gpu)
#   infra/gpu_pool.sh deploy            # once per checkout: training, evaluation, retraining (cron) on the pool
#   infra/gpu_pool.sh worker            # on every GPU host, from a checkout at the same path: limit 1
#
# A worker runs each flow run as a subprocess in the checkout's folder (the deployments' working_dir),
# with this shell's environment (CUDA_VISIBLE_DEVICES, MLFLOW_TRACKING_URI, ...). Extra arguments go
# to `python -m flows.deploy` (deploy: --pipeline, --cron) or `prefect worker start` (worker).
set -euo pipefail
cd "$(dirname "$0")/.."
POOL=${POOL:-agent-r1-gpu}
PY=${VENV:-.venv}/bin/python
case "${1:-}" in
  create) "$PY" -m prefect work-pool create "$POOL" --type process --overwrite ;;
  deploy) shift; exec "$PY" -m flows.deploy --pool "$POOL" "$@" ;;
  worker) shift; exec "$PY" -m prefect worker start --pool "$POOL" --limit 1 --name "gpu-$(hostname)" "$@" ;;
  *) sed -n '2,12p' "$0"; exit 2 ;;
esac
