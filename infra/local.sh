#!/usr/bin/env bash
# One machine, shared servers: an MLflow tracking server and a Prefect server, bound to 127.0.0.1.
#
#   infra/local.sh up       start both (if not running), wait until healthy, print the exports
#   infra/local.sh env      print the exports (and the venv first on PATH):  eval "$(infra/local.sh env)"
#   infra/local.sh status   health of both
#   infra/local.sh down     stop both
#
# State stays in the project, in the same places the embedded defaults use, so the servers show
# the runs you made before starting them:
#   MLflow:  mlruns/mlflow.db (SQLite) + mlruns/artifacts/ (proxied: --serve-artifacts)
#   Prefect: .prefect/ (PREFECT_HOME; its SQLite database is .prefect/prefect.db)
# Logs and pid files: mlruns/server.{log,pid}, .prefect/server.{log,pid}.
#
# Settings (environment): PROJECT_DIR (default: this repository), VENV (default:
# $PROJECT_DIR/.venv), MLFLOW_PORT (5000), PREFECT_PORT (4200), MLFLOW_WORKERS (1),
# START_TIMEOUT (seconds to wait for health, 180).
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
PROJECT_DIR="$(cd "${PROJECT_DIR:-$here/..}" && pwd)"
VENV="${VENV:-$PROJECT_DIR/.venv}"
MLFLOW_PORT="${MLFLOW_PORT:-5000}"
PREFECT_PORT="${PREFECT_PORT:-4200}"
MLFLOW_WORKERS="${MLFLOW_WORKERS:-1}"
START_TIMEOUT="${START_TIMEOUT:-180}"
HOST=127.0.0.1

MLRUNS="$PROJECT_DIR/mlruns"
export PREFECT_HOME="$PROJECT_DIR/.prefect"
export PREFECT_SERVER_ANALYTICS_ENABLED=false
export MLFLOW_DISABLE_TELEMETRY=true
export DO_NOT_TRACK=1
export OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}"

MLFLOW_URL="http://$HOST:$MLFLOW_PORT"
PREFECT_URL="http://$HOST:$PREFECT_PORT/api"

healthy() {  # healthy URL: 0 when it answers 2xx
    "$VENV/bin/python" - "$1" <<'EOF' 2>/dev/null
import sys, urllib.request
try:
    with urllib.request.urlopen(sys.argv[1], timeout=2) as r:
        sys.exit(0 if 200 <= r.status < 300 else 1)
except Exception:
    sys.exit(1)
EOF
}

alive() {  # alive PIDFILE: 0 when the process group it names is running
    [[ -f "$1" ]] && kill -0 -- "-$(cat "$1")" 2>/dev/null
}

start() {  # start NAME PIDFILE LOG HEALTH_URL CMD...
    local name=$1 pidfile=$2 log=$3 url=$4
    shift 4
    if alive "$pidfile"; then
        echo "$name: already running (pid $(cat "$pidfile"))" >&2
        return
    fi
    if healthy "$url"; then
        echo "$name: something else already answers at $url; set another port" >&2
        return 1
    fi
    # its own session, so that `down` stops the server and every process it spawned
    setsid "$@" >"$log" 2>&1 </dev/null &
    echo $! >"$pidfile"
    echo "$name: starting (pid $!, log $log)" >&2
}

wait_healthy() {  # wait_healthy NAME PIDFILE LOG URL
    local name=$1 pidfile=$2 log=$3 url=$4 t0=$SECONDS
    until healthy "$url"; do
        if ! alive "$pidfile"; then
            echo "$name: exited during start; last lines of $log:" >&2
            tail -n 20 "$log" >&2
            return 1
        fi
        if ((SECONDS - t0 > START_TIMEOUT)); then
            echo "$name: not healthy after ${START_TIMEOUT}s; see $log" >&2
            return 1
        fi
        sleep 0.5
    done
    echo "$name: healthy at $url ($((SECONDS - t0)) s)" >&2
}

stop() {  # stop NAME PIDFILE
    local name=$1 pidfile=$2
    if alive "$pidfile"; then
        local pgid
        pgid=$(cat "$pidfile")
        kill -TERM -- "-$pgid" 2>/dev/null || true
        for _ in $(seq 1 40); do
            kill -0 -- "-$pgid" 2>/dev/null || break
            sleep 0.25
        done
        kill -KILL -- "-$pgid" 2>/dev/null || true
        echo "$name: stopped" >&2
    else
        echo "$name: not running" >&2
    fi
    rm -f "$pidfile"
}

print_env() {
    cat <<EOF
export MLFLOW_TRACKING_URI=$MLFLOW_URL
export PREFECT_API_URL=$PREFECT_URL
export PREFECT_HOME=$PREFECT_HOME
export PREFECT_SERVER_ANALYTICS_ENABLED=false
export MLFLOW_DISABLE_TELEMETRY=true
export PATH="$VENV/bin:\$PATH"
EOF
}

up() {
    mkdir -p "$MLRUNS/artifacts" "$PREFECT_HOME"
    start mlflow "$MLRUNS/server.pid" "$MLRUNS/server.log" "$MLFLOW_URL/health" \
        "$VENV/bin/mlflow" server \
        --backend-store-uri "sqlite:///$MLRUNS/mlflow.db" \
        --artifacts-destination "$MLRUNS/artifacts" --serve-artifacts \
        --host "$HOST" --port "$MLFLOW_PORT" --workers "$MLFLOW_WORKERS"
    start prefect "$PREFECT_HOME/server.pid" "$PREFECT_HOME/server.log" "$PREFECT_URL/health" \
        "$VENV/bin/prefect" server start --host "$HOST" --port "$PREFECT_PORT" --analytics-off
    wait_healthy mlflow "$MLRUNS/server.pid" "$MLRUNS/server.log" "$MLFLOW_URL/health"
    wait_healthy prefect "$PREFECT_HOME/server.pid" "$PREFECT_HOME/server.log" "$PREFECT_URL/health"
    echo "MLflow UI: $MLFLOW_URL   Prefect UI: http://$HOST:$PREFECT_PORT" >&2
    echo "# point the pipeline at them:" >&2
    print_env
}

status() {
    local rc=0
    if healthy "$MLFLOW_URL/health"; then echo "mlflow: up at $MLFLOW_URL"; else echo "mlflow: down"; rc=1; fi
    if healthy "$PREFECT_URL/health"; then echo "prefect: up at $PREFECT_URL"; else echo "prefect: down"; rc=1; fi
    return $rc
}

case "${1:-}" in
    up) up ;;
    down)
        stop mlflow "$MLRUNS/server.pid"
        stop prefect "$PREFECT_HOME/server.pid"
        ;;
    env) print_env ;;
    status) status ;;
    *)
        sed -n '2,7p' "$0" | sed 's/^# \{0,1\}//'
        exit 2
        ;;
esac
