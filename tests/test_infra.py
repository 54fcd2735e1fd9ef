"""infra/: the pieces that run beyond one laptop, checked with real components on one machine.

- an MLflow tracking server (subprocess, SQLite + an artifacts folder, ``--serve-artifacts``,
  the ``--allowed-hosts`` of infra/docker-compose.yml) used through ``agent_r1.tracking.Tracker``
  over HTTP: the artifacts land in the server's destination folder, not on the client;
- the DeepSpeed configs of infra/deepspeed/: their stages, their agreement with the keys the
  learner sets, DeepSpeed's own parser, and (slow) two ranks training under ``torchrun``;
- a single-process learner's process group listens on the loopback interface only;
- infra/local.sh (slow): both servers up on 127.0.0.1, healthy, and down again;
- infra/docker-compose.yml: parses, binds only 127.0.0.1, and passes ``docker compose config``
  where Docker Compose is installed.
"""

from __future__ import annotations

import http.client
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
INFRA = ROOT / "infra"
COMPOSE = INFRA / "docker-compose.yml"
DS_CONFIGS = {  # file -> (ZeRO stage, optimizer offloaded, parameters offloaded)
    "zero2.json": (2, False, False),
    "zero2_offload.json": (2, True, False),
    "zero3.json": (3, False, False),
    "zero3_offload.json": (3, True, True),
}
QUIET = {"MLFLOW_DISABLE_TELEMETRY": "true", "DO_NOT_TRACK": "1", "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def _compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def _flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


# ------------------------------------------------------------------------------ MLflow server
@pytest.fixture(scope="module")
def mlflow_server(tmp_path_factory):
    """``mlflow server`` on a free 127.0.0.1 port; yields (url, artifacts destination folder). Without
    MLflow's server jobs (a job-runner process beside the server, for GenAI jobs nothing here runs):
    the server was healthy after 9-13 s instead of 19-20 s."""
    tmp = tmp_path_factory.mktemp("mlflow-server")
    port, artifacts = _free_port(), tmp / "artifacts"
    allowed = _flag(_compose()["services"]["mlflow"]["command"], "--allowed-hosts")
    cmd = [
        sys.executable, "-m", "mlflow", "server",
        "--backend-store-uri", f"sqlite:///{tmp / 'mlflow.db'}",
        "--artifacts-destination", str(artifacts), "--serve-artifacts",
        "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
        "--allowed-hosts", allowed,
    ]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    with open(tmp / "server.log", "wb") as log:
        proc = subprocess.Popen(
            cmd, cwd=tmp, stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
            env=os.environ | QUIET | {"MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"},
        )
        try:
            deadline = time.monotonic() + 120
            while not _healthy(f"{url}/health"):
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"mlflow server did not start:\n{(tmp / 'server.log').read_text()[-3000:]}")
                time.sleep(0.3)
            yield url, artifacts
        finally:
            os.killpg(proc.pid, signal.SIGTERM)  # the server and the uvicorn process it spawned
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.mark.slow  # starting the server: 8-25 s on 2 busy cores
def test_tracker_logs_through_the_server_and_artifacts_land_in_its_destination(mlflow_server, tmp_path):
    from agent_r1.tracking import Tracker

    url, artifacts = mlflow_server
    tracker = Tracker(uri=url, experiment="infra-test")
    parent = tracker.start_pipeline_run("infra-test", {"rl": {"learner": {"zero_stage": 3}}})
    run = tracker.stage_run(parent, "train")
    tracker.log_metrics(run, {"reward_mean": 0.25}, step=1)
    tracker.log_metrics(run, {"reward_mean": 0.5}, step=2)
    local = tmp_path / "trajectories.jsonl"
    local.write_text('{"task": "mona", "reward": 1.0}\n')
    tracker.log_artifact(run, local, "samples")
    tracker.end_run(run)
    tracker.end_run(parent)

    assert tracker.metric_history(run, "reward_mean") == [(1, 0.25), (2, 0.5)]
    assert tracker.run_info(parent)["params"]["rl.learner.zero_stage"] == "3"
    info = tracker.client.get_run(run).info
    assert info.artifact_uri.startswith("mlflow-artifacts:/"), info.artifact_uri  # proxied, not a path
    # the server wrote the file into its --artifacts-destination ...
    landed = artifacts / info.experiment_id / run / "artifacts" / "samples" / "trajectories.jsonl"
    assert landed.read_text() == local.read_text()
    # ... and gives it back over HTTP
    back = Path(tracker.client.download_artifacts(run, "samples/trajectories.jsonl", str(tmp_path / "dl")))
    assert back.read_text() == local.read_text()


@pytest.mark.slow
@pytest.mark.parametrize(("host", "status"), [("mlflow:5000", 200), ("127.0.0.1:5000", 200), ("evil.example.com", 403)])
def test_server_accepts_the_compose_host_names_and_rejects_others(mlflow_server, host, status):
    """The compose file's --allowed-hosts lets services call http://mlflow:5000 (MLflow 3's
    default would answer 403 to that Host header) and still blocks foreign names."""
    port = int(mlflow_server[0].rsplit(":", 1)[1])
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/api/2.0/mlflow/experiments/search?max_results=1", headers={"Host": host})
    assert conn.getresponse().status == status
    conn.close()


# ------------------------------------------------------------------------------ DeepSpeed configs
@pytest.mark.parametrize("name", sorted(DS_CONFIGS))
def test_deepspeed_config_stage_offload_and_learner_keys(name):
    from deepspeed.runtime.config import DeepSpeedConfig

    from agent_r1.learner.learner import LearnerConfig, _ds_config

    stage, offload_opt, offload_param = DS_CONFIGS[name]
    cfg = json.loads((INFRA / "deepspeed" / name).read_text())
    zero = cfg["zero_optimization"]
    assert zero["stage"] == stage
    assert ("offload_optimizer" in zero) == offload_opt
    assert ("offload_param" in zero) == offload_param
    assert cfg["bf16"] == {"enabled": True}
    # the learner passes its own AdamW: no optimizer/scheduler block, and offloading a client
    # optimizer must be allowed explicitly
    assert "optimizer" not in cfg and "scheduler" not in cfg
    assert cfg.get("zero_force_ds_cpu_optimizer", True) is (not offload_opt)
    # every key the learner sets has the learner's value (micro-batching is the learner's job)
    for key, value in _ds_config(LearnerConfig(zero_stage=stage)).items():
        if key != "zero_optimization":
            assert cfg[key] == value, key
    parsed = DeepSpeedConfig(cfg)  # DeepSpeed's own validation (a typo in zero_optimization fails)
    assert parsed.zero_optimization_stage == stage
    assert (parsed.zero_config.offload_optimizer is not None) == offload_opt
    assert (parsed.zero_config.offload_param is not None) == offload_param


@pytest.mark.slow
def test_deepspeed_configs_train_two_ranks_under_torchrun():
    """Two CPU ranks (gloo) under torchrun, every infra config and the learner's own stages 0
    and 3: each initialises with the learner's optimizer, the weights move, and both ranks end
    with the same weights (the gradients were averaged)."""
    configs = [str(INFRA / "deepspeed" / name) for name in sorted(DS_CONFIGS)]
    cmd = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
        str(INFRA / "deepspeed" / "smoke.py"), "--config", *configs, "--zero-stage", "0", "3", "--steps", "2",
    ]  # fmt: skip
    env = os.environ | {"OMP_NUM_THREADS": "1"}
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False, timeout=300, env=env)
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    reports = {r["config"]: r for r in map(json.loads, (x for x in out.stdout.splitlines() if x.startswith("{")))}
    assert len(reports) == len(DS_CONFIGS) + 2
    for name, (stage, offload_opt, _) in DS_CONFIGS.items():
        r = reports[str(INFRA / "deepspeed" / name)]
        assert (r["world_size"], r["zero_stage"], r["bf16"], r["offload"]) == (2, stage, True, offload_opt)
    for r in reports.values():
        assert r["ranks_agree"] and r["params_moved"].split("/")[0] != "0", r
    assert reports["zero_stage=3"]["zero_stage"] == 3 and not reports["zero_stage=3"]["bf16"]


def test_a_single_process_learner_listens_on_loopback_only(tmp_path):
    """learner.distributed starts a single process's rendezvous in memory and gloo on the
    loopback interface: nothing it listens on is reachable from another machine. It builds no
    C++ op either: DeepSpeed's shared-memory all-reduce has no peer in one process (an empty
    extensions cache stays empty)."""
    pytest.importorskip("psutil")
    code = (
        "import json, psutil\n"
        "from agent_r1.learner.distributed import init_distributed\n"
        "init_distributed()\n"
        "from deepspeed.comm import comm\n"
        "print(json.dumps({'shm': comm.cdb.shm_comm_op is not None,\n"
        "  'listening': [c.laddr.ip for c in psutil.Process().net_connections('tcp') if c.status == 'LISTEN']}))"
    )
    launcher = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "GLOO_SOCKET_IFNAME", "NCCL_SOCKET_IFNAME")
    env = {k: v for k, v in os.environ.items() if k not in launcher} | {"TORCH_EXTENSIONS_DIR": str(tmp_path)}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["listening"] and set(got["listening"]) <= {"127.0.0.1", "::1"}, got
    assert not got["shm"] and not list(tmp_path.iterdir())


# ------------------------------------------------------------------------------ local.sh
@pytest.mark.slow
def test_local_sh_starts_both_servers_on_loopback_and_stops_them(tmp_path):
    env = os.environ | {
        "PROJECT_DIR": str(tmp_path),
        "VENV": sys.prefix,
        "MLFLOW_PORT": str(_free_port()),
        "PREFECT_PORT": str(_free_port()),
        "START_TIMEOUT": "150",
    }
    script = str(INFRA / "local.sh")
    try:
        up = subprocess.run([script, "up"], env=env, capture_output=True, text=True, check=False, timeout=200)
        assert up.returncode == 0, up.stderr[-3000:]
        exports = dict(
            line.removeprefix("export ").split("=", 1) for line in up.stdout.splitlines() if line.startswith("export ")
        )
        assert exports["MLFLOW_TRACKING_URI"] == f"http://127.0.0.1:{env['MLFLOW_PORT']}"
        assert exports["PREFECT_API_URL"] == f"http://127.0.0.1:{env['PREFECT_PORT']}/api"
        assert exports["PREFECT_HOME"] == str(tmp_path / ".prefect")
        assert _healthy(exports["MLFLOW_TRACKING_URI"] + "/health")
        assert _healthy(exports["PREFECT_API_URL"] + "/health")
        assert (tmp_path / "mlruns" / "mlflow.db").exists() and (tmp_path / ".prefect" / "prefect.db").exists()
    finally:
        down = subprocess.run([script, "down"], env=env, capture_output=True, text=True, check=False, timeout=60)
    assert down.returncode == 0, down.stderr
    status = subprocess.run([script, "status"], env=env, capture_output=True, text=True, check=False, timeout=30)
    assert status.returncode == 1 and "mlflow: down" in status.stdout and "prefect: down" in status.stdout


# ------------------------------------------------------------------------------ docker compose
def test_compose_file_services_and_loopback_ports():
    services = _compose()["services"]
    assert {"postgres", "minio", "buckets", "mlflow", "prefect-server", "worker"} <= set(services)
    for name, svc in services.items():
        for port in svc.get("ports", []):
            assert str(port).startswith("127.0.0.1:"), (name, port)
    mlflow = services["mlflow"]["command"]
    assert "--serve-artifacts" in mlflow
    assert _flag(mlflow, "--backend-store-uri").startswith("postgresql+psycopg://")
    assert _flag(mlflow, "--artifacts-destination").startswith("s3://")
    prefect_db = services["prefect-server"]["environment"]["PREFECT_API_DATABASE_CONNECTION_URL"]
    assert prefect_db.startswith("postgresql+asyncpg://")
    worker_env = services["worker"]["environment"]
    assert worker_env["MLFLOW_TRACKING_URI"] == "http://mlflow:5000"
    assert worker_env["PREFECT_API_URL"] == "http://prefect-server:4200/api"


def _compose_cli() -> list[str] | None:
    if (
        shutil.which("docker")
        and subprocess.run(["docker", "compose", "version"], capture_output=True, check=False).returncode == 0
    ):
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    return None


def test_compose_file_passes_docker_compose_config():
    cli = _compose_cli()
    if cli is None:
        pytest.skip("Docker Compose is not installed")
    out = subprocess.run(
        [*cli, "-f", str(COMPOSE), "config", "-q"], capture_output=True, text=True, check=False, timeout=60
    )
    assert out.returncode == 0, out.stderr
